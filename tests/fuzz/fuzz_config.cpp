// libFuzzer target for the JSON configuration: Config::parse of arbitrary bytes.
// Only ldlm::Error may escape (ConfigError for bad JSON, unknown keys, wrong types
// and invalid combinations); anything else (a crash, a sanitizer report, a stack
// overflow on deep nesting, a nlohmann exception leaking through) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "ldlm/core/tensor.hpp"
#include "ldlm/model/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const ldlm::Config c = ldlm::Config::parse(std::string(reinterpret_cast<const char*>(data), size));
    // Whatever is accepted must be valid and survive a round trip unchanged.
    c.validate();
    // The config bounds keep a batch of up to 2^20 sequences of max_positions
    // (the widest activation rows) inside a 64-bit index.
    if (!ldlm::checked_product<std::int64_t>({std::int64_t{1} << 20, c.max_positions, c.widest_row()}))
      __builtin_trap();
    if (ldlm::Config::parse(c.to_json().dump()).to_json() != c.to_json()) __builtin_trap();
  } catch (const ldlm::Error&) {
    // Rejected input: expected.
  }
  return 0;
}
