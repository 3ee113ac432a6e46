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
// Files are untrusted input: sizes are bounded and every id, merge and byte token is
// checked; errors name the file, the line or JSON key, what was expected and what was
// found (FormatError for malformed content, IoError for unreadable files).
//
// Threads: loading uses no shared mutable state; encode() and decode() are const and
// may run concurrently on one Tokenizer (the BPE cache is sharded behind mutexes).
#pragma once

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>
#if PCRE2_MAJOR < 10 || (PCRE2_MAJOR == 10 && PCRE2_MINOR < 40)
#error "ldlm's tokenizer needs PCRE2 10.40 or newer (\\p{White_Space} in GPT-2's pattern)"
#endif

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <queue>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ldlm/core/error.hpp"

namespace ldlm {

namespace detail::tok {

inline constexpr std::size_t kMaxFileBytes = std::size_t(64) << 20;  // GPT-2's largest file is 1.4 MB
inline constexpr std::size_t kMaxTokens = 1'000'000;
inline constexpr std::size_t kMaxTokenBytes = 4096;  // GPT-2's longest token has 128 bytes
inline constexpr int kMaxJsonDepth = 16;
inline constexpr std::size_t kMaxCachedPieceBytes = 64;
inline constexpr std::size_t kCacheShards = 16;
inline constexpr std::size_t kCacheEntriesPerShard = 4096;

/// GPT-2's pre-tokenization pattern as tiktoken runs it, with `\s` written as
/// \p{White_Space}: Rust's `\s` (tiktoken) is Unicode's White_Space property, while
/// PCRE2's `\s` also matches U+180E, which Unicode no longer counts as white space.
inline constexpr std::string_view kGpt2Pattern =
    R"('(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\p{White_Space}\p{L}\p{N}]+)"
    R"(|\p{White_Space}+(?!\P{White_Space})|\p{White_Space}+)";

// ---------------------------------------------------------------------------
// Text helpers
// ---------------------------------------------------------------------------

inline std::string hex_byte(unsigned char b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", b);
  return buf;
}

inline std::string code_point_name(char32_t c) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "U+%04X", static_cast<unsigned>(c));
  return buf;
}

/// 'text' for messages: control bytes escaped, at most ~48 bytes (cut at a character boundary).
inline std::string quote(std::string_view s) {
  constexpr std::size_t kMax = 48;
  std::size_t n = s.size();
  if (n > kMax) {
    n = kMax;
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  }
  std::string out = "'";
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x20 || b == 0x7F || b == '\'' || b == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", b);
      out += buf;
    } else {
      out += static_cast<char>(b);
    }
  }
  out += '\'';
  if (n < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

inline void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

struct Utf8Error {
  std::size_t offset;  // of the first byte of the ill-formed sequence
  std::string reason;
};

/// The first ill-formed sequence of `s` (Unicode's table 3-7 of well-formed UTF-8), if any.
inline std::optional<Utf8Error> find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    if (i + 8 <= n) {  // ASCII runs, eight bytes at a time
      std::uint64_t w;
      std::memcpy(&w, p + i, 8);
      if ((w & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    const unsigned char b = p[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    std::size_t len;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;  // no overlong forms
      if (b == 0xED) hi = 0x9F;  // no surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    } else {
      const char* why = b < 0xC0   ? "a continuation byte without a lead byte"
                        : b < 0xC2 ? "the lead byte of an overlong encoding"
                                   : "not a UTF-8 byte";
      return Utf8Error{i, "byte " + hex_byte(b) + " is " + why};
    }
    for (std::size_t k = 1; k < len; ++k) {
      if (i + k >= n)
        return Utf8Error{i, "the " + std::to_string(len) + "-byte sequence starting with " + hex_byte(b) +
                                " is cut off by the end of the text"};
      const unsigned char c = p[i + k];
      const unsigned char min = k == 1 ? lo : 0x80, max = k == 1 ? hi : 0xBF;
      if (c < min || c > max)
        return Utf8Error{i, "byte " + hex_byte(c) + " cannot follow " + hex_byte(b) + (k > 1 ? " ... " : " ") +
                                "in a well-formed sequence" +
                                (k == 1 && c >= 0x80 && c <= 0xBF ? (b == 0xED   ? " (a surrogate)"
                                                                     : b == 0xF4 ? " (above U+10FFFF)"
                                                                                 : " (overlong)")
                                                                  : std::string())};
    }
    i += len;
  }
  return std::nullopt;
}

/// Decodes one code point of valid UTF-8 at s[i], advancing i.
inline char32_t next_code_point(std::string_view s, std::size_t& i) {
  const auto b = static_cast<unsigned char>(s[i]);
  const std::size_t len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  char32_t c = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
  for (std::size_t k = 1; k < len; ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += len;
  return c;
}

// ---------------------------------------------------------------------------
// GPT-2's byte <-> character map
// ---------------------------------------------------------------------------

/// GPT-2's reversible map between bytes and 256 printable characters, so that every
/// token can be written as text: printable Latin-1 bytes stand for themselves, the
/// other 68 (controls, space, NBSP, soft hyphen) move to U+0100 onwards in byte order.
/// " the" is written "Ġthe".
class ByteLevel {
 public:
  static const ByteLevel& get() {
    static const ByteLevel map;
    return map;
  }

  char32_t character(unsigned char b) const { return to_char_[b]; }

  /// The bytes of a token written in byte-level characters; nullopt names the first
  /// character outside the map in `bad`.
  std::optional<std::string> bytes(std::string_view text, char32_t& bad) const {
    std::string out;
    out.reserve(text.size());
    for (std::size_t i = 0; i < text.size();) {
      const char32_t c = next_code_point(text, i);
      if (c >= to_byte_.size() || to_byte_[c] < 0) {
        bad = c;
        return std::nullopt;
      }
      out += static_cast<char>(to_byte_[c]);
    }
    return out;
  }

  std::string text(std::string_view bytes) const {
    std::string out;
    for (char b : bytes) append_utf8(out, to_char_[static_cast<unsigned char>(b)]);
    return out;
  }

 private:
  ByteLevel() {
    to_byte_.fill(-1);
    int moved = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char_[b] = printable ? char32_t(b) : char32_t(256 + moved++);
      to_byte_[to_char_[b]] = static_cast<std::int16_t>(b);
    }
  }
  std::array<char32_t, 256> to_char_{};
  std::array<std::int16_t, 256 + 68> to_byte_{};
};

// ---------------------------------------------------------------------------
// The pre-tokenization pattern (PCRE2)
// ---------------------------------------------------------------------------

/// GPT-2's pattern, compiled once per process (PCRE2 allows sharing compiled code
/// between threads; each match uses its own match data).
class Gpt2Pattern {
 public:
  static const Gpt2Pattern& get() {
    static const Gpt2Pattern pattern;
    return pattern;
  }
  Gpt2Pattern(const Gpt2Pattern&) = delete;
  Gpt2Pattern& operator=(const Gpt2Pattern&) = delete;
  ~Gpt2Pattern() { pcre2_code_free_8(code_); }

  /// Per-call matching state over one text.
  class Matcher {
   public:
    explicit Matcher(const Gpt2Pattern& p)
        : pattern_(p), data_(pcre2_match_data_create_from_pattern_8(p.code_, nullptr)) {
      if (!data_) throw std::bad_alloc();
    }
    Matcher(const Matcher&) = delete;
    Matcher& operator=(const Matcher&) = delete;
    ~Matcher() { pcre2_match_data_free_8(data_); }

    /// End of the piece that starts at `pos` (< text.size()); the pattern is anchored
    /// and matches at least one character wherever it starts.
    std::size_t piece_end(std::string_view text, std::size_t pos) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR8>(text.data());
      int rc = pattern_.jit_ ? pcre2_jit_match_8(pattern_.code_, subject, text.size(), pos, 0, data_, nullptr)
                             : PCRE2_ERROR_JIT_BADOPTION;
      if (rc < 0)  // no JIT, or its stack ran out: the interpreter keeps its frames on the heap
        rc =
            pcre2_match_8(pattern_.code_, subject, text.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, data_, nullptr);
      if (rc < 0)
        throw Error("Tokenizer::encode: PCRE2 failed to match GPT-2's pattern at byte offset " + std::to_string(pos) +
                    ": " + error_text(rc));
      const PCRE2_SIZE end = pcre2_get_ovector_pointer_8(data_)[1];
      if (end <= pos)
        throw Error("Tokenizer::encode: GPT-2's pattern matched nothing at byte offset " + std::to_string(pos));
      return end;
    }

   private:
    const Gpt2Pattern& pattern_;
    pcre2_match_data_8* data_;
  };

  static std::string error_text(int code) {
    PCRE2_UCHAR8 buf[256];
    pcre2_get_error_message_8(code, buf, sizeof buf);
    return reinterpret_cast<const char*>(buf);
  }

 private:
  Gpt2Pattern() {
    int code = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile_8(reinterpret_cast<PCRE2_SPTR8>(kGpt2Pattern.data()), kGpt2Pattern.size(),
                            PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &code, &offset, nullptr);
    if (!code_)
      throw Error("Tokenizer: PCRE2 cannot compile GPT-2's pattern at offset " + std::to_string(offset) + ": " +
                  error_text(code) + " (PCRE2 10.40 or newer is needed for \\p{White_Space})");
    jit_ = pcre2_jit_compile_8(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  pcre2_code_8* code_ = nullptr;
  bool jit_ = false;
};

// ---------------------------------------------------------------------------
// Lookup structures
// ---------------------------------------------------------------------------

/// Open-addressing map from token bytes (slices of an arena the caller passes in) to ids.
class BytesIndex {
 public:
  void reserve(std::size_t n) {
    std::size_t capacity = 16;
    while (capacity < 2 * n) capacity *= 2;
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
  }

  /// The id of `key`, or -1.
  std::int32_t find(std::string_view arena, std::string_view key) const {
    const std::size_t h = std::hash<std::string_view>{}(key);
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.hash == static_cast<std::uint32_t>(h) && s.size == key.size() &&
          std::memcmp(arena.data() + s.offset, key.data(), key.size()) == 0)
        return s.id;
    }
  }

  /// Adds arena[offset, offset + size) -> id; reserve() must have room. False if present.
  bool insert(std::string_view arena, std::uint32_t offset, std::uint32_t size, std::int32_t id) {
    const std::string_view key = arena.substr(offset, size);
    const std::size_t h = std::hash<std::string_view>{}(key);
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.id < 0) {
        s = Slot{offset, size, static_cast<std::uint32_t>(h), id};
        return true;
      }
      if (s.hash == static_cast<std::uint32_t>(h) && s.size == size &&
          std::memcmp(arena.data() + s.offset, key.data(), size) == 0)
        return false;
    }
  }

 private:
  struct Slot {
    std::uint32_t offset = 0, size = 0, hash = 0;
    std::int32_t id = -1;
  };
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
};

/// Piece -> BPE ids, shared by every thread that encodes with one Tokenizer. Bounded:
/// a full shard is emptied (text with endless distinct words cannot grow it).
class BpeCache {
 public:
  bool find(std::string_view piece, std::vector<std::int64_t>& out) {
    Shard& s = shard(piece);
    const std::lock_guard lock(s.mutex);
    const auto it = s.map.find(piece);
    if (it == s.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }

  void insert(std::string_view piece, std::span<const std::int32_t> ids) {
    Shard& s = shard(piece);
    const std::lock_guard lock(s.mutex);
    if (s.map.size() >= kCacheEntriesPerShard) s.map.clear();
    s.map.try_emplace(std::string(piece), ids.begin(), ids.end());
  }

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Shard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<std::int32_t>, Hash, std::equal_to<>> map;
  };
  Shard& shard(std::string_view piece) { return shards_[Hash{}(piece) % kCacheShards]; }
  std::array<Shard, kCacheShards> shards_;
};

// ---------------------------------------------------------------------------
// Parsing the files
// ---------------------------------------------------------------------------

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

/// "string \"abc\"", "number 7", "null": a JSON value's type and (cut) text for messages.
inline std::string json_summary(const nlohmann::json& v) {
  if (v.is_null()) return "null";
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 40) {
    std::size_t n = 40;
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // whole characters only
    s = s.substr(0, n) + "...";
  }
  return std::string(v.type_name()) + " " + s;
}

/// A vocabulary as written: token (byte-level characters) -> id value, in file order.
using VocabEntries = std::vector<std::pair<std::string, nlohmann::json>>;

/// Reads a flat vocabulary file (encoder.json, vocab.json) with nlohmann's SAX parser:
/// one object of token -> scalar. Faster than building a DOM of 50k values
/// (bench/results/README.md), and nothing nests, so hostile nesting cannot recurse.
inline VocabEntries read_vocab_json(const Source& src) {
  using json = nlohmann::json;
  src.check_size();
  struct Reader : nlohmann::json_sax<json> {
    const Source& src;
    VocabEntries entries;
    int depth = 0;
    explicit Reader(const Source& s) : src(s) {}

    [[noreturn]] void not_flat(const char* found) {
      if (depth == 0) src.fail("", std::string("expected an object of token -> id, found ") + found);
      src.fail("key " + quote(entries.back().first), std::string("expected a non-negative integer id, found ") + found);
    }
    bool value(json v) {
      if (depth != 1) not_flat(json_summary(v).c_str());
      entries.back().second = std::move(v);
      return true;
    }
    bool null() override { return value(nullptr); }
    bool boolean(bool v) override { return value(v); }
    bool number_integer(number_integer_t v) override { return value(v); }
    bool number_unsigned(number_unsigned_t v) override { return value(v); }
    bool number_float(number_float_t v, const string_t&) override { return value(v); }
    bool string(string_t& v) override { return value(std::move(v)); }
    bool binary(binary_t&) override { not_flat("binary data"); }
    bool start_object(std::size_t) override {
      if (depth != 0) not_flat("an object");
      ++depth;
      return true;
    }
    bool key(string_t& k) override {
      if (entries.size() >= kMaxTokens)
        src.fail("", "more than the limit of " + std::to_string(kMaxTokens) + " tokens");
      entries.emplace_back(std::move(k), nullptr);
      return true;
    }
    bool end_object() override {
      --depth;
      return true;
    }
    bool start_array(std::size_t) override { not_flat("an array"); }
    bool end_array() override { return true; }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
      src.fail("", std::string("not valid JSON: ") + e.what());
    }
  } reader(src);
  json::sax_parse(src.text.begin(), src.text.end(), &reader);
  return std::move(reader.entries);
}

/// Parses tokenizer.json whole, refusing nesting deeper than kMaxJsonDepth and
/// repeated keys (nlohmann would keep the last one silently).
inline nlohmann::json parse_json(const Source& src) {
  using nlohmann::json;
  src.check_size();
  std::vector<std::set<std::string>> keys(std::size_t(kMaxJsonDepth) + 2);
  auto check = [&](int depth, json::parse_event_t event, json& value) {
    const auto d = static_cast<std::size_t>(depth);
    if (event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) {
      if (depth >= kMaxJsonDepth)
        src.fail("", "JSON is nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
      if (event == json::parse_event_t::object_start) keys[d + 1].clear();
    } else if (event == json::parse_event_t::key && !keys[d].insert(value.get<std::string>()).second) {
      src.fail("",
               "duplicate key " + quote(value.get<std::string>()) + " in an object at depth " + std::to_string(depth));
    }
    return true;
  };
  try {
    return json::parse(src.text.begin(), src.text.end(), check);
  } catch (const json::exception& e) {
    src.fail("", std::string("not valid JSON: ") + e.what());
  }
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

}  // namespace detail::tok

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
    if (auto bad = detail::tok::find_invalid_utf8(text))
      throw InvalidArgument("Tokenizer::encode: the text is not valid UTF-8 at byte offset " +
                            std::to_string(bad->offset) + ": " + bad->reason);
    std::vector<std::int64_t> ids;
    ids.reserve(text.size() / 4 + 1);
    detail::tok::Gpt2Pattern::Matcher matcher(detail::tok::Gpt2Pattern::get());
    Scratch scratch;
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

  std::string_view bytes_of(std::int64_t id) const {
    const auto& d = *data_;
    const auto i = static_cast<std::size_t>(id);
    return std::string_view(d.arena).substr(d.offsets[i], d.offsets[i + 1] - d.offsets[i]);
  }

  struct Data {
    std::string arena;                   // the bytes of every token, in id order
    std::vector<std::uint32_t> offsets;  // token id spans arena[offsets[id], offsets[id + 1])
    std::vector<std::int32_t> rank;      // merge line that creates the token; -1 for bytes and unmergeable tokens
    std::array<std::int32_t, 256> byte_token{};
    detail::tok::BytesIndex mergeable;  // bytes -> id of the byte tokens and every merge result
  };

  /// Reused buffers of one encode() call.
  struct Scratch {
    struct Part {  // a token covering bytes [its index, next) of the piece
      std::int32_t id, prev, next;
      bool alive;
    };
    struct Candidate {  // parts `left` and `right` (with these ids) would merge into `merged`
      std::int32_t rank, left, right, left_id, right_id, merged;
      bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::vector<Part> parts;
    std::vector<Candidate> heap;
    std::vector<std::int32_t> ids;
  };

  /// `vocab_label` names the vocabulary in merge errors ("encoder.json", "model.vocab").
  Tokenizer(std::vector<std::string> tokens, const detail::tok::MergeList& merges, const detail::tok::Source& vocab_src,
            const detail::tok::Source& merges_src, const std::string& vocab_label)
      : data_(build(std::move(tokens), merges, vocab_src, merges_src, vocab_label)),
        cache_(std::make_shared<detail::tok::BpeCache>()) {}

  static std::shared_ptr<const Data> build(std::vector<std::string> tokens, const detail::tok::MergeList& merge_list,
                                           const detail::tok::Source& vocab_src, const detail::tok::Source& merges_src,
                                           const std::string& vocab_label) {
    using detail::tok::quote;
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
        detail::tok::append_utf8(character, bl.character(static_cast<unsigned char>(b)));
        vocab_src.fail("", "no token for byte " + detail::tok::hex_byte(static_cast<unsigned char>(b)) +
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
          fail("character " + detail::tok::code_point_name(bad) + " in " + quote(part) +
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

  void encode_piece(std::string_view piece, std::vector<std::int64_t>& out, Scratch& scratch) const {
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
    bpe(piece, scratch);
    out.insert(out.end(), scratch.ids.begin(), scratch.ids.end());
    if (cached) cache_->insert(piece, scratch.ids);
  }

  /// BPE of one piece into scratch.ids. The parts form a linked list over byte
  /// positions (a part keeps the position of its first byte); a min-heap holds every
  /// adjacent pair whose bytes are a token, by (rank, position), so equal ranks go to
  /// the leftmost pair as in tiktoken. Entries made stale by a later merge are skipped.
  /// O(n log n) for n bytes, so one huge word cannot stall encode().
  void bpe(std::string_view piece, Scratch& s) const {
    const Data& d = *data_;
    const auto n = static_cast<std::int32_t>(piece.size());
    auto& parts = s.parts;
    parts.resize(piece.size());
    for (std::int32_t i = 0; i < n; ++i)
      parts[std::size_t(i)] = {d.byte_token[static_cast<unsigned char>(piece[std::size_t(i)])], i - 1, i + 1, true};
    s.heap.clear();
    const auto push = [&](std::int32_t left) {  // the pair of `left` and its right neighbour, if a token
      const std::int32_t right = parts[std::size_t(left)].next;
      if (right >= n) return;
      const std::int32_t stop = parts[std::size_t(right)].next;
      const std::int32_t merged = d.mergeable.find(d.arena, piece.substr(std::size_t(left), std::size_t(stop - left)));
      if (merged < 0) return;
      s.heap.push_back({d.rank[std::size_t(merged)], left, right, parts[std::size_t(left)].id,
                        parts[std::size_t(right)].id, merged});
      std::push_heap(s.heap.begin(), s.heap.end(), std::greater<>());
    };
    for (std::int32_t i = 0; i + 1 < n; ++i) push(i);
    while (!s.heap.empty()) {
      std::pop_heap(s.heap.begin(), s.heap.end(), std::greater<>());
      const Scratch::Candidate c = s.heap.back();
      s.heap.pop_back();
      auto& left = parts[std::size_t(c.left)];
      auto& right = parts[std::size_t(c.right)];
      if (!left.alive || !right.alive || left.next != c.right || left.id != c.left_id || right.id != c.right_id)
        continue;
      left.id = c.merged;
      left.next = right.next;
      right.alive = false;
      if (left.next < n) parts[std::size_t(left.next)].prev = c.left;
      if (left.prev >= 0) push(left.prev);
      push(c.left);
    }
    s.ids.clear();
    for (std::int32_t i = 0; i < n; i = parts[std::size_t(i)].next) s.ids.push_back(parts[std::size_t(i)].id);
  }

  std::shared_ptr<const Data> data_;
  std::shared_ptr<detail::tok::BpeCache> cache_;
};

}  // namespace ldlm
