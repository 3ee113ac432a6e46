// libFuzzer target for the safetensors reader: validation of hostile headers,
// reading every tensor of whatever passes, and the checkpoint metadata ldlm reads
// from `__metadata__` (ldlm.config, ldlm.feature_model_init_seed), and the loader's
// path for quantized weights (ldlm.quantization: `q.weight` as I8 with its F32
// `q.weight.scale`, read into a Linear that int8 quantizes, dequantized). Only ldlm::Error
// may escape the library; anything else (a crash, a sanitizer report,
// std::bad_alloc, a nlohmann exception leaking through) is a bug.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "ldlm/io/safetensors.hpp"
#include "ldlm/model/checkpoint.hpp"
#include "ldlm/nn/linear.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto* p = reinterpret_cast<const std::byte*>(data);
  try {
    const auto file = ldlm::SafetensorsFile::from_buffer(std::vector<std::byte>(p, p + size));
    for (const auto& t : file.tensors()) {
      const auto values = file.read<float>(t.name);
      if (static_cast<std::int64_t>(values.size()) != t.numel()) __builtin_trap();
      if (file.bytes(t.name).size() != t.size) __builtin_trap();
    }
    (void)ldlm::read_config(file);
    (void)ldlm::read_feature_model_init_seed(file);
    ldlm::nn::Linear<float> linear(8, 4, /*with_bias=*/true);
    linear.weight.quantize_at_int8();
    ldlm::LoadOptions options = ldlm::LoadOptions::scoped("q.");
    options.pack = std::nullopt;
    ldlm::load_parameters(linear, file, "q.", options);
  } catch (const ldlm::Error&) {
    // Rejected input: expected.
  }
  return 0;
}
