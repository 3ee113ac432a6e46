// GPT-2's byte-level BPE tokenizer, as OpenAI's tiktoken runs its `gpt2` encoding, plus
// ldlm's two added tokens (pad and mask). See docs/model.md for how the model uses them.
//
// Encoding. The text (which must be valid UTF-8) is cut into pieces by GPT-2's
// pre-tokenization pattern, matched by PCRE2 in UTF + UCP mode (JIT-compiled where
// available). Each piece's bytes are mapped to tokens by BPE: starting from one token per
// byte, the adjacent pair whose concatenation has the lowest merge rank is merged (the
// leftmost of equal ranks) until no pair is a token. The rank of a token is the line of
// the merges file that creates it. This is tiktoken's rule; for GPT-2's files, whose ids
// are 256 + merge line, it is also the original encoder's.
//
// Special tokens. The files' vocabulary (GPT-2: 50257 tokens, the last <|endoftext|>) is
// followed by two added tokens: pad = base size (50257) and mask = base size + 1 (50258),
// so vocab_size() is 50259 for GPT-2. They decode to the texts "<|pad|>" and "<|mask|>".
// encode() treats every text as plain text, like tiktoken's encode_ordinary: the string
// "<|endoftext|>" in the input becomes the ids of its characters, never id 50256, so
// user text cannot inject control tokens. Put special ids into a sequence by id.
//
//
// The pieces: io/utf8.hpp (validating the text), io/byte_level_bpe.hpp (the byte map,
// the pattern, the merge loop and its cache), io/tokenizer_files.hpp (the three file
// formats, checked as untrusted input).
//
// Threads: loading uses no shared mutable state; encode() and decode() are const and
// may run concurrently on one Tokenizer (the BPE cache is sharded behind mutexes).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ldlm/core/error.hpp"
#include "ldlm/io/byte_level_bpe.hpp"
#include "ldlm/io/tokenizer_files.hpp"
#include "ldlm/io/utf8.hpp"

namespace ldlm {

class Tokenizer {
 public:
  static constexpr std::string_view kPadText = "<|pad|>";
  static constexpr std::string_view kMaskText = "<|mask|>";

  /// Reads a tokenizer directory: encoder.json + vocab.bpe (OpenAI), vocab.json +
  /// merges.txt (Hugging Face), or tokenizer.json (a Hugging Face fast tokenizer with a
  /// byte-level BPE model), tried in that order.
  static Tokenizer load(const std::string& dir) {
    namespace fs = std::filesystem;
    const std::string expected = " (expected encoder.json + vocab.bpe, vocab.json + merges.txt, or tokenizer.json)";
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) throw IoError("tokenizer: '" + dir + "' is not a directory" + expected);
    const fs::path root(dir);
    auto exists = [&](const char* name) { return fs::exists(root / name, ec); };
    for (const auto& [vocab, merges] :
         {std::pair{"encoder.json", "vocab.bpe"}, std::pair{"vocab.json", "merges.txt"}}) {
      const bool has_vocab = exists(vocab), has_merges = exists(merges);
      if (!has_vocab && !has_merges) continue;
      if (!has_vocab || !has_merges)
        throw IoError("tokenizer: '" + dir + "' has " + (has_vocab ? vocab : merges) + " but no " +
                      (has_vocab ? merges : vocab));
      const std::string v = detail::tok::read_file(root / vocab), m = detail::tok::read_file(root / merges);
      return from_vocab_and_merges(v, m, (root / vocab).string(), (root / merges).string());
    }
    if (exists("tokenizer.json"))
      return from_tokenizer_json(detail::tok::read_file(root / "tokenizer.json"), (root / "tokenizer.json").string());
    throw IoError("tokenizer: '" + dir + "' holds no tokenizer files" + expected);
  }

  /// From the texts of a vocabulary (encoder.json / vocab.json: token -> id) and its
  /// merges (vocab.bpe / merges.txt); the names appear in error messages.
  static Tokenizer from_vocab_and_merges(std::string_view vocab_json, std::string_view merges,
                                         const std::string& vocab_name = "vocab.json",
                                         const std::string& merges_name = "merges.txt") {
    const detail::tok::Source vocab{vocab_name, vocab_json}, merge_src{merges_name, merges};
    auto tokens = detail::tok::parse_vocab(vocab, detail::tok::read_vocab_json(vocab), "");
    return Tokenizer(std::move(tokens), detail::tok::parse_merges_text(merge_src), vocab, merge_src,
                     std::filesystem::path(vocab_name).filename().string());
  }

  /// From the text of a Hugging Face tokenizer.json whose model is GPT-2-style byte-level BPE.
  static Tokenizer from_tokenizer_json(std::string_view text, const std::string& name = "tokenizer.json") {
    const detail::tok::Source src{name, text};
    const nlohmann::json root = detail::tok::parse_json(src);
    const nlohmann::json& model = detail::tok::byte_level_bpe_model(src, root);
    auto tokens = detail::tok::parse_vocab(src, detail::tok::vocab_entries(src, model), "model.vocab");
    const auto merges = detail::tok::parse_merges_json(src, detail::tok::member(src, model, "merges", "model"));
    detail::tok::check_added_tokens(src, root, tokens);
    return Tokenizer(std::move(tokens), merges, src, src, "model.vocab");
  }

  /// GPT-2 token ids of UTF-8 text (plain text: special-token strings are not recognised).
  /// Invalid UTF-8 is an InvalidArgument naming the byte offset.
  std::vector<std::int64_t> encode(std::string_view text) const {
    if (auto bad = detail::find_invalid_utf8(text))
      throw InvalidArgument("Tokenizer::encode: the text is not valid UTF-8 at byte offset " +
                            std::to_string(bad->offset) + ": " + bad->reason);
    std::vector<std::int64_t> ids;
    ids.reserve(text.size() / 4 + 1);
    detail::tok::Gpt2Pattern::Matcher matcher(detail::tok::Gpt2Pattern::get());
    detail::tok::BpeScratch scratch;
    for (std::size_t pos = 0; pos < text.size();) {
      const std::size_t end = matcher.piece_end(text, pos);
      encode_piece(text.substr(pos, end - pos), ids, scratch);
      pos = end;
    }
    return ids;
  }

  /// The exact bytes of the tokens (not necessarily valid UTF-8: ids may end inside a
  /// character). An id outside [0, vocab_size()) is an InvalidArgument naming it and its position.
  std::string decode(std::span<const std::int64_t> ids) const {
    std::size_t total = 0;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (!in_vocabulary(ids[i])) outside_vocabulary("decode", ids[i], " at position " + std::to_string(i));
      total += bytes_of(ids[i]).size();
    }
    std::string out;
    out.reserve(total);
    for (const std::int64_t id : ids) out += bytes_of(id);
    return out;
  }

  /// The bytes of one token ("<|pad|>" and "<|mask|>" for the added tokens).
  std::string_view token(std::int64_t id) const {
    if (!in_vocabulary(id)) outside_vocabulary("token", id, "");
    return bytes_of(id);
  }

  /// Tokens of the files plus pad and mask: 50259 for GPT-2.
  std::int64_t vocab_size() const { return static_cast<std::int64_t>(data_->offsets.size()) - 1; }
  std::int64_t pad_id() const { return vocab_size() - 2; }
  std::int64_t mask_id() const { return vocab_size() - 1; }

 private:
  bool in_vocabulary(std::int64_t id) const { return id >= 0 && id < vocab_size(); }

  [[noreturn]] void outside_vocabulary(const char* function, std::int64_t id, const std::string& where) const {
    throw InvalidArgument(std::string("Tokenizer::") + function + ": id " + std::to_string(id) + where +
                          " is outside the vocabulary [0, " + std::to_string(vocab_size()) + ")");
  }

  std::string_view bytes_of(std::int64_t id) const { return data_->bytes_of(static_cast<std::size_t>(id)); }

  using Data = detail::tok::BpeTables;

  /// `vocab_label` names the vocabulary in merge errors ("encoder.json", "model.vocab").
  Tokenizer(std::vector<std::string> tokens, const detail::tok::MergeList& merges, const detail::tok::Source& vocab_src,
            const detail::tok::Source& merges_src, const std::string& vocab_label)
      : data_(build(std::move(tokens), merges, vocab_src, merges_src, vocab_label)),
        cache_(std::make_shared<detail::tok::BpeCache>()) {}

  static std::shared_ptr<const Data> build(std::vector<std::string> tokens, const detail::tok::MergeList& merge_list,
                                           const detail::tok::Source& vocab_src, const detail::tok::Source& merges_src,
                                           const std::string& vocab_label) {
    using detail::quote;
    const auto& bl = detail::tok::ByteLevel::get();
    const std::size_t n = tokens.size();
    auto d = std::make_shared<Data>();
    std::size_t bytes = kPadText.size() + kMaskText.size();
    for (const auto& t : tokens) bytes += t.size();
    d->arena.reserve(bytes);
    d->offsets.reserve(n + 3);
    for (const auto& t : tokens) {
      d->offsets.push_back(static_cast<std::uint32_t>(d->arena.size()));
      d->arena += t;
    }
    for (std::string_view added : {kPadText, kMaskText}) {
      d->offsets.push_back(static_cast<std::uint32_t>(d->arena.size()));
      d->arena += added;
    }
    d->offsets.push_back(static_cast<std::uint32_t>(d->arena.size()));
    tokens.clear();

    // Every token by its bytes (unique: distinct keys are distinct byte strings).
    detail::tok::BytesIndex all;
    all.reserve(n);
    for (std::size_t id = 0; id < n; ++id) {
      const std::uint32_t size = d->offsets[id + 1] - d->offsets[id];
      if (!all.insert(d->arena, d->offsets[id], size, static_cast<std::int32_t>(id))) {
        const std::string_view bytes = std::string_view(d->arena).substr(d->offsets[id], size);
        vocab_src.fail("", "token " + quote(bl.text(bytes)) + " appears twice, with ids " +
                               std::to_string(all.find(d->arena, bytes)) + " and " + std::to_string(id));
      }
    }
    d->mergeable.reserve(n);
    for (int b = 0; b < 256; ++b) {
      const char c = static_cast<char>(b);
      const std::int32_t id = all.find(d->arena, std::string_view(&c, 1));
      if (id < 0) {
        std::string character;
        detail::append_utf8(character, bl.character(static_cast<unsigned char>(b)));
        vocab_src.fail("", "no token for byte " + detail::hex_byte(static_cast<unsigned char>(b)) +
                               " (expected the key " + quote(character) + ": every byte needs a token)");
      }
      d->byte_token[static_cast<std::size_t>(b)] = id;
      d->mergeable.insert(d->arena, d->offsets[id], 1, id);
    }

    // Merges: both parts must already be mergeable (a byte or an earlier merge's
    // result), and the result a token that no earlier merge made.
    const auto& merges = merge_list.items;
    if (merges.size() > n)
      merges_src.fail("", std::to_string(merges.size()) + " merges for " + std::to_string(n) +
                              " tokens (each merge makes a new token)");
    d->rank.assign(n + 2, -1);
    std::vector<std::size_t> made_by(n + 2, 0);
    for (std::size_t i = 0; i < merges.size(); ++i) {
      const auto& m = merges[i];
      const auto fail = [&](const std::string& what) {
        merges_src.fail(merge_list.where(i),
                        "merge " + quote(std::string(m.left) + " " + std::string(m.right)) + ": " + what);
      };
      std::string joined;
      for (const std::string_view part : {m.left, m.right}) {
        char32_t bad = 0;
        const auto bytes = bl.bytes(part, bad);
        if (!bytes)
          fail("character " + detail::code_point_name(bad) + " in " + quote(part) +
               " is not one of GPT-2's 256 byte-level characters");
        if (d->mergeable.find(d->arena, *bytes) < 0)
          fail("part " + quote(part) +
               (all.find(d->arena, *bytes) < 0 ? " is not in " + vocab_label
                                               : " is neither a byte nor made by an earlier merge"));
        joined += *bytes;
      }
      const std::int32_t id = all.find(d->arena, joined);
      if (id < 0) fail("the result " + quote(bl.text(joined)) + " is not in " + vocab_label);
      const auto slot = static_cast<std::size_t>(id);
      if (d->rank[slot] >= 0)
        fail("the result " + quote(bl.text(joined)) + " is already made by " + merge_list.where(made_by[slot]));
      d->rank[slot] = static_cast<std::int32_t>(i);
      made_by[slot] = i;
      d->mergeable.insert(d->arena, d->offsets[slot], static_cast<std::uint32_t>(joined.size()), id);
    }
    return d;
  }

  void encode_piece(std::string_view piece, std::vector<std::int64_t>& out, detail::tok::BpeScratch& scratch) const {
    const Data& d = *data_;
    if (piece.size() == 1) {
      out.push_back(d.byte_token[static_cast<unsigned char>(piece[0])]);
      return;
    }
    if (const std::int32_t id = d.mergeable.find(d.arena, piece); id >= 0) {
      out.push_back(id);
      return;
    }
    const bool cached = piece.size() <= detail::tok::kMaxCachedPieceBytes;
    if (cached && cache_->find(piece, out)) return;
    detail::tok::merge_piece(d, piece, scratch);
    out.insert(out.end(), scratch.ids.begin(), scratch.ids.end());
    if (cached) cache_->insert(piece, scratch.ids);
  }

  std::shared_ptr<const Data> data_;
  std::shared_ptr<detail::tok::BpeCache> cache_;
};

}  // namespace ldlm
