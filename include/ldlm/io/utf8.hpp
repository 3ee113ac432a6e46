// UTF-8 for the tokenizer and the JSON reader: validation by Unicode's table 3-7,
// decoding and encoding one code point, and quoting untrusted text for messages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace ldlm::detail {

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

}  // namespace ldlm::detail
