// Byte-level BPE as GPT-2 defines it: the reversible map between bytes and printable
// characters in which its files write tokens, its pre-tokenization pattern (PCRE2 in
// UTF + UCP mode, JIT-compiled where available), the tables BPE runs on, the merge loop
// and the cache of merged pieces shared by the threads that encode with one Tokenizer.
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
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ldlm/core/error.hpp"
#include "ldlm/io/utf8.hpp"

namespace ldlm::detail::tok {

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
// BPE
// ---------------------------------------------------------------------------

/// A vocabulary as BPE runs on it.
struct BpeTables {
  std::string arena;                   // the bytes of every token, in id order
  std::vector<std::uint32_t> offsets;  // token id spans arena[offsets[id], offsets[id + 1])
  std::vector<std::int32_t> rank;      // merge line that creates the token; -1 for bytes and unmergeable tokens
  std::array<std::int32_t, 256> byte_token{};
  BytesIndex mergeable;  // bytes -> id of the byte tokens and every merge result

  std::string_view bytes_of(std::size_t id) const {
    return std::string_view(arena).substr(offsets[id], offsets[id + 1] - offsets[id]);
  }
};

/// Reused buffers of one encode() call.
struct BpeScratch {
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

/// BPE of one piece into s.ids. The parts form a linked list over byte positions (a
/// part keeps the position of its first byte); a min-heap holds every adjacent pair
/// whose bytes are a token, by (rank, position), so equal ranks go to the leftmost
/// pair as in tiktoken. Entries made stale by a later merge are skipped. O(n log n)
/// for n bytes, so one huge word cannot stall encode().
inline void merge_piece(const BpeTables& d, std::string_view piece, BpeScratch& s) {
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
    s.heap.push_back(
        {d.rank[std::size_t(merged)], left, right, parts[std::size_t(left)].id, parts[std::size_t(right)].id, merged});
    std::push_heap(s.heap.begin(), s.heap.end(), std::greater<>());
  };
  for (std::int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end(), std::greater<>());
    const BpeScratch::Candidate c = s.heap.back();
    s.heap.pop_back();
    auto& left = parts[std::size_t(c.left)];
    auto& right = parts[std::size_t(c.right)];
    if (!left.alive || !right.alive || left.next != c.right || left.id != c.left_id || right.id != c.right_id) continue;
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

}  // namespace ldlm::detail::tok
