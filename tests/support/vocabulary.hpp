// Test support: small byte-level BPE vocabularies written as GPT-2 writes its files.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ldlm/io/byte_level_bpe.hpp"

namespace ldlm::test {

/// The text of one byte as GPT-2 writes it in its files ("Ġ" for a space).
inline std::string char_of(unsigned char b) { return detail::tok::ByteLevel::get().text(std::string(1, char(b))); }

/// A vocabulary file: the 256 byte tokens (id = byte), then `extra` tokens.
inline std::string vocab_json(const std::vector<std::string>& extra) {
  std::string s = "{";
  for (int b = 0; b < 256; ++b)
    s += nlohmann::json(char_of(static_cast<unsigned char>(b))).dump() + ": " + std::to_string(b) + ", ";
  for (std::size_t i = 0; i < extra.size(); ++i)
    s += nlohmann::json(extra[i]).dump() + ": " + std::to_string(256 + i) + ", ";
  s.resize(s.size() - 2);
  return s + "}";
}

}  // namespace ldlm::test
