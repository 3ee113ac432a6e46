// libFuzzer target for the tokenizer files' parsers. The input is read twice: as a
// vocabulary file and a merges file split at the first NUL byte
// (Tokenizer::from_vocab_and_merges), and whole as a tokenizer.json. Only
// ldlm::Error may escape; a crash, a sanitizer report, a leaked nlohmann exception
// or std::bad_alloc is a bug. Whatever loads must encode and decode exactly.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ldlm/io/tokenizer.hpp"

namespace {

void check(const ldlm::Tokenizer& t, std::string_view input) {
  for (std::int64_t id = 0; id < t.vocab_size(); ++id)
    if (t.token(id).empty()) __builtin_trap();
  // Text that reaches every byte token and the merges the input may hold.
  std::string text = "Hello world! It's 2024.\n\n  \xc2\xa0\xe4\xbd\xa0\xf0\x9f\x98\x80 ab";
  for (const char c : input.substr(0, 64))
    if (static_cast<unsigned char>(c) < 0x80) text += c;
  const auto ids = t.encode(text);
  for (const auto id : ids)
    if (id < 0 || id >= t.pad_id()) __builtin_trap();
  if (t.decode(ids) != text) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  if (const std::size_t nul = input.find('\0'); nul != std::string_view::npos) {
    try {
      check(ldlm::Tokenizer::from_vocab_and_merges(input.substr(0, nul), input.substr(nul + 1)), input);
    } catch (const ldlm::Error&) {
      // Rejected input: expected.
    }
  }
  try {
    check(ldlm::Tokenizer::from_tokenizer_json(input), input);
  } catch (const ldlm::Error&) {
  }
  return 0;
}
