// The deterministic parameter generator shared with tools/reference/ldlm_init.py
// (specified in tests/data/README.md). Values depend only on the seed, the full
// state-dict name and the element index, so C++ and PyTorch build bit-identical
// weights and real-width references need no committed weights.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <optional>
#include <string_view>
#include <type_traits>

#include "ldlm/core/parameter.hpp"
#include "ldlm/core/random.hpp"

namespace ldlm {

namespace detail {
constexpr std::uint64_t fnv1a64(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

/// Uniform in [-1, 1), exactly representable in float32.
inline float uniform_pm1(std::uint64_t key, std::uint64_t index) {
  const std::uint64_t z = splitmix64(key + (index + 1) * kGolden);
  return static_cast<float>(z >> 40) / 8388608.0f - 1.0f;
}
}  // namespace detail

/// Elements [first, first + count) (flat, row-major) of the parameter of this shape
/// and full name that the generator of `seed` makes, into out: any block of a
/// parameter can be made alone, bit for bit as when it is made whole.
template <class S>
void init_values(std::string_view full_name, const Shape& shape, std::uint64_t seed, std::int64_t first,
                 std::int64_t count, S* out) {
  float offset = 0.0f, scale = 0.1f;
  if (shape.size() >= 2) {
    scale = 1.0f / std::sqrt(static_cast<float>(shape.back()));
  } else if (full_name.ends_with(".weight") || full_name.ends_with(".gamma")) {
    offset = 1.0f;  // norm gains sit around one, but not at one, so a dropped gain shows
    scale = 0.25f;
  }
  const std::uint64_t key = detail::fnv1a64(full_name) ^ (seed * detail::kGolden);
  for (std::int64_t i = 0; i < count; ++i) {
    const double u = detail::uniform_pm1(key, static_cast<std::uint64_t>(first + i));
    out[i] = static_cast<S>(static_cast<float>(static_cast<double>(offset) + static_cast<double>(scale) * u));
  }
}

/// Fills one parameter from (seed, full_name); allocates it if needed.
template <class P>
void init_parameter(P& p, std::string_view full_name, std::uint64_t seed) {
  init_values(full_name, p.shape(), seed, 0, p.numel(), (p.allocate(), p.data()));
}

/// Allocates and fills every parameter of a module, named with `prefix`, and packs
/// each matrix-product weight for `pack` right after filling it (so a bf16 model
/// never holds all its weights in fp32 at once); std::nullopt keeps them plain. At
/// int8 a weight int8 quantizes is made and quantized a block of rows at a time
/// (pack_int8_from_blocks), never whole in fp32.
template <class M>
void init_parameters(M& module, std::uint64_t seed, const std::string& prefix = "",
                     std::optional<Precision> pack = Precision::fp32) {
  module.visit(prefix, [&](const std::string& name, auto& p) {
    const auto make = [&](std::int64_t first, std::int64_t count, float* dst) {
      init_values(name, p.shape(), seed, first, count, dst);
    };
    if (pack_int8_from_blocks(p, pack, make)) return;
    init_parameter(p, name, seed);
    pack_if_matmul_weight(p, pack);
  });
}

}  // namespace ldlm
