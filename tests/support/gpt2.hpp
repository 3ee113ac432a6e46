// Test support: GPT-2's tokenizer files of tools/assets/gpt2, loaded once, and whole
// files as text.
#pragma once

#include <fstream>
#include <iterator>
#include <string>

#include "ldlm/io/tokenizer.hpp"

namespace ldlm::test {

inline const std::string kGpt2Dir = LDLM_GPT2_TOKENIZER_DIR;

inline const Tokenizer& gpt2() {
  static const Tokenizer tokenizer = Tokenizer::load(kGpt2Dir);
  return tokenizer;
}

/// The bytes of the file at `path` ("" when it cannot be read).
inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace ldlm::test
