// The tokenizer's file formats: OpenAI's encoder.json + vocab.bpe, Hugging Face's
// vocab.json + merges.txt, and a Hugging Face tokenizer.json whose model is GPT-2's
// byte-level BPE. Files are untrusted input: sizes are bounded and every id, merge and
// byte token is checked; errors name the file, the line or JSON key, what was
// expected and what was found (FormatError for malformed content, IoError for
// unreadable files).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ldlm/core/error.hpp"
#include "ldlm/io/byte_level_bpe.hpp"
#include "ldlm/io/json.hpp"
#include "ldlm/io/utf8.hpp"

namespace ldlm::detail::tok {

inline constexpr std::size_t kMaxFileBytes = std::size_t(64) << 20;  // GPT-2's largest file is 1.4 MB
inline constexpr std::size_t kMaxTokens = 1'000'000;
inline constexpr std::size_t kMaxTokenBytes = 4096;  // GPT-2's longest token has 128 bytes

/// One tokenizer file: its name for messages and its contents.
struct Source {
  std::string name;
  std::string_view text;

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw FormatError("tokenizer " + name + ": " + (where.empty() ? "" : where + ": ") + what);
  }
  void check_size() const {
    if (text.size() > kMaxFileBytes)
      fail("", "file is " + std::to_string(text.size()) + " bytes, more than the limit of " +
                   std::to_string(kMaxFileBytes));
  }
};

/// A file read whole, bounded by kMaxFileBytes.
inline std::string read_file(const std::filesystem::path& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status))
    throw IoError("tokenizer: cannot open '" + path.string() + "': no such file");
  if (!std::filesystem::is_regular_file(status))
    throw IoError("tokenizer: '" + path.string() + "' is not a regular file");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw IoError("tokenizer: cannot open '" + path.string() + "': " + std::strerror(errno));
  std::string out;
  char buf[1 << 16];
  while (const std::size_t n = std::fread(buf, 1, sizeof buf, f.get())) {
    if (out.size() + n > kMaxFileBytes)
      throw FormatError("tokenizer " + path.string() + ": file is more than the limit of " +
                        std::to_string(kMaxFileBytes) + " bytes");
    out.append(buf, n);
  }
  if (std::ferror(f.get())) throw IoError("tokenizer: reading '" + path.string() + "' failed");
  return out;
}

/// A vocabulary as written: token (byte-level characters) -> id value, in file order.
using VocabEntries = std::vector<std::pair<std::string, nlohmann::json>>;

/// Reads a flat vocabulary file (encoder.json, vocab.json): one object of token ->
/// scalar, streamed in file order (read_json_members). A token written twice is
/// refused when the tables are built, naming both ids.
inline VocabEntries read_vocab_json(const Source& src) {
  src.check_size();
  VocabEntries entries;
  read_json_members(
      src.text,
      [&](const JsonProblem& p) {
        if (p.kind == JsonProblem::Kind::not_an_object)
          src.fail("", "expected an object of token -> id, found " + p.found);
        if (p.kind == JsonProblem::Kind::nested_value)
          src.fail("key " + quote(p.key), "expected a non-negative integer id, found " + p.found);
        src.fail("", p.message);
      },
      [&](std::string token, nlohmann::json id) {
        if (entries.size() >= kMaxTokens)
          src.fail("", "more than the limit of " + std::to_string(kMaxTokens) + " tokens");
        entries.emplace_back(std::move(token), std::move(id));
      });
  return entries;
}

/// Parses tokenizer.json whole (read_json: strict, nesting bounded, no repeated key).
inline nlohmann::json parse_json(const Source& src) {
  src.check_size();
  return read_json(src.text, [&](const JsonProblem& p) { src.fail("", p.message); });
}

/// The files' tokens as bytes, by id. Checks: at least one token, ids dense (0..n-1,
/// each once), every token non-empty and written in byte-level characters. `label`
/// prefixes keys in messages ("key 'x'" or "model.vocab key 'x'").
inline std::vector<std::string> parse_vocab(const Source& src, const VocabEntries& entries, const std::string& label) {
  const std::size_t n = entries.size();
  const std::string where = label.empty() ? std::string() : label;
  if (n == 0) src.fail(where, "the vocabulary is empty (expected at least the 256 byte tokens)");
  if (n > kMaxTokens)
    src.fail(where, std::to_string(n) + " tokens, more than the limit of " + std::to_string(kMaxTokens));
  const ByteLevel& bl = ByteLevel::get();
  std::vector<std::string> tokens(n);
  std::vector<bool> used(n, false);
  for (const auto& [text, id_value] : entries) {
    const std::string entry = (label.empty() ? std::string("key ") : label + " key ") + quote(text);
    if (!id_value.is_number_integer())
      src.fail(entry, "expected a non-negative integer id, found " + json_summary(id_value));
    if (!id_value.is_number_unsigned() || id_value.get<std::uint64_t>() >= n)
      src.fail(entry, "id " + id_value.dump() + " is outside [0, " + std::to_string(n) + "): the ids of " +
                          std::to_string(n) + " tokens must be 0.." + std::to_string(n - 1) + ", each once");
    const auto id = id_value.get<std::size_t>();
    if (used[id])
      src.fail(entry, "id " + std::to_string(id) + " is already the id of " + quote(bl.text(tokens[id])) +
                          " (ids must be unique)");
    if (text.empty()) src.fail(entry, "a token cannot be empty");
    char32_t bad = 0;
    auto bytes = bl.bytes(text, bad);
    if (!bytes)
      src.fail(entry, "character " + code_point_name(bad) +
                          " is not one of GPT-2's 256 byte-level characters (a space is written U+0120 'Ġ')");
    if (bytes->size() > kMaxTokenBytes)
      src.fail(entry, "the token has " + std::to_string(bytes->size()) + " bytes, more than the limit of " +
                          std::to_string(kMaxTokenBytes));
    used[id] = true;
    tokens[id] = std::move(*bytes);
  }
  return tokens;
}

/// One merge as written (byte-level characters); `position` is its line in a merges
/// file or its index in tokenizer.json's model.merges.
struct MergeText {
  std::string_view left, right;
  std::size_t position;
};

struct MergeList {
  std::vector<MergeText> items;
  bool in_json = false;
  std::string where(std::size_t i) const {
    const std::string p = std::to_string(items[i].position);
    return in_json ? "model.merges[" + p + "]" : "line " + p;
  }
};

/// Splits "LEFT RIGHT" at its one space; false if that is not the form.
inline bool split_merge(std::string_view s, MergeText& m) {
  const std::size_t space = s.find(' ');
  if (space == std::string_view::npos || space == 0 || space + 1 == s.size() ||
      s.find(' ', space + 1) != std::string_view::npos)
    return false;
  m.left = s.substr(0, space);
  m.right = s.substr(space + 1);
  return true;
}

/// vocab.bpe / merges.txt: an optional "#version" first line, then "LEFT RIGHT" per
/// line; blank lines only at the end. The result views src.text.
inline MergeList parse_merges_text(const Source& src) {
  src.check_size();
  if (auto bad = find_invalid_utf8(src.text)) {
    const auto line = 1 + std::count(src.text.begin(), src.text.begin() + std::ptrdiff_t(bad->offset), '\n');
    src.fail("line " + std::to_string(line),
             "not valid UTF-8 at byte offset " + std::to_string(bad->offset) + ": " + bad->reason);
  }
  MergeList merges;
  std::size_t line_no = 0, blank_line = 0;
  for (std::size_t pos = 0; pos < src.text.size();) {
    std::size_t end = src.text.find('\n', pos);
    if (end == std::string_view::npos) end = src.text.size();
    std::string_view line = src.text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line_no == 1 && line.starts_with("#version")) continue;
    if (line.empty()) {
      if (!blank_line) blank_line = line_no;
      continue;
    }
    if (blank_line)
      src.fail("line " + std::to_string(blank_line),
               "empty line before more merges (line " + std::to_string(line_no) + ")");
    MergeText m{{}, {}, line_no};
    if (!split_merge(line, m))
      src.fail("line " + std::to_string(line_no),
               "expected 'LEFT RIGHT' (two tokens and one space), found " + quote(line));
    merges.items.push_back(m);
  }
  return merges;
}

/// tokenizer.json's model.merges: strings "LEFT RIGHT" or pairs ["LEFT", "RIGHT"]. The
/// result views `merges`.
inline MergeList parse_merges_json(const Source& src, const nlohmann::json& merges) {
  if (!merges.is_array()) src.fail("model.merges", "expected an array of merges, found " + json_summary(merges));
  MergeList out;
  out.in_json = true;
  out.items.reserve(merges.size());
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const auto& m = merges[i];
    const auto fail = [&](const std::string& what) { src.fail("model.merges[" + std::to_string(i) + "]", what); };
    MergeText t{{}, {}, i};
    if (m.is_string()) {
      if (!split_merge(m.get_ref<const std::string&>(), t))
        fail("expected 'LEFT RIGHT' (two tokens and one space), found " + quote(m.get_ref<const std::string&>()));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string() &&
               !m[0].get_ref<const std::string&>().empty() && !m[1].get_ref<const std::string&>().empty()) {
      t.left = m[0].get_ref<const std::string&>();
      t.right = m[1].get_ref<const std::string&>();
    } else {
      fail("expected \"LEFT RIGHT\" or [\"LEFT\", \"RIGHT\"] (non-empty), found " + json_summary(m));
    }
    out.items.push_back(t);
  }
  return out;
}

/// obj[key], or an error naming `where` and the key.
inline const nlohmann::json& member(const Source& src, const nlohmann::json& obj, const char* key,
                                    const std::string& where) {
  const auto it = obj.find(key);
  if (it == obj.end()) src.fail(where, std::string("missing key '") + key + "'");
  return *it;
}

/// tokenizer.json's "model", after checking that the file describes GPT-2's kind of
/// tokenizer: a BPE model, no normalizer, a ByteLevel pre-tokenizer without a prefix space.
inline const nlohmann::json& byte_level_bpe_model(const Source& src, const nlohmann::json& root) {
  using nlohmann::json;
  if (!root.is_object()) src.fail("", "expected a JSON object, found " + json_summary(root));
  const json& model = member(src, root, "model", "");
  if (!model.is_object()) src.fail("model", "expected an object, found " + json_summary(model));
  if (const auto t = model.find("type"); t != model.end() && *t != "BPE")
    src.fail("model.type", "expected \"BPE\", found " + json_summary(*t));
  if (const auto n = root.find("normalizer"); n != root.end() && !n->is_null())
    src.fail("normalizer", "expected null (GPT-2 does not normalize text), found " + json_summary(*n));
  if (const auto p = root.find("pre_tokenizer"); p != root.end() && !p->is_null()) {
    if (!p->is_object() || p->value("type", json()) != "ByteLevel")
      src.fail("pre_tokenizer",
               "expected {\"type\": \"ByteLevel\"} (GPT-2's pre-tokenization), found " + json_summary(*p));
    if (p->value("add_prefix_space", json(false)) != false)
      src.fail("pre_tokenizer.add_prefix_space", "expected false (GPT-2 adds no space before the text)");
    if (p->value("use_regex", json(true)) != true)
      src.fail("pre_tokenizer.use_regex", "expected true (GPT-2's pattern splits the text)");
  }
  return model;
}

inline VocabEntries vocab_entries(const Source& src, const nlohmann::json& model) {
  const nlohmann::json& vocab = member(src, model, "vocab", "model");
  if (!vocab.is_object()) src.fail("model.vocab", "expected an object of token -> id, found " + json_summary(vocab));
  VocabEntries entries;
  entries.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) entries.emplace_back(token, id);
  return entries;
}

/// tokenizer.json's added_tokens must be tokens of the vocabulary already (GPT-2's
/// <|endoftext|>): ldlm's own added tokens, pad and mask, follow the vocabulary.
inline void check_added_tokens(const Source& src, const nlohmann::json& root, const std::vector<std::string>& tokens) {
  const auto added = root.find("added_tokens");
  if (added == root.end() || added->is_null()) return;
  if (!added->is_array()) src.fail("added_tokens", "expected an array, found " + json_summary(*added));
  for (std::size_t i = 0; i < added->size(); ++i) {
    const nlohmann::json& t = (*added)[i];
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("id") || !t.contains("content") || !t["id"].is_number_unsigned() ||
        !t["content"].is_string())
      src.fail(where, "expected an object with an unsigned \"id\" and a string \"content\", found " + json_summary(t));
    const auto id = t["id"].get<std::uint64_t>();
    const auto& content = t["content"].get_ref<const std::string&>();
    if (id >= tokens.size())
      src.fail(where, "id " + std::to_string(id) + " (" + quote(content) + ") is not in model.vocab of " +
                          std::to_string(tokens.size()) + " tokens; ldlm adds only pad and mask after the vocabulary");
    if (tokens[id] != content)
      src.fail(where, "content " + quote(content) + " differs from model.vocab's token " + std::to_string(id) + ", " +
                          quote(tokens[id]));
  }
}

}  // namespace ldlm::detail::tok
