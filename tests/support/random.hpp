// Test support: deterministic inputs that do not depend on the standard library.
#pragma once

#include <cstdint>

#include "ldlm/core/tensor.hpp"

namespace ldlm::test {

/// Deterministic values in [-amplitude, amplitude), exactly representable in float,
/// from splitmix64 (std distributions are implementation-defined).
inline Matrix<double> random_matrix(Index rows, Index cols, std::uint64_t seed, double amplitude) {
  Matrix<double> m(rows, cols);
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull;
  for (Index i = 0; i < m.size(); ++i) {
    z += 0x9E3779B97F4A7C15ull;
    std::uint64_t r = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    r = (r ^ (r >> 27)) * 0x94D049BB133111EBull;
    r ^= r >> 31;
    m.data()[i] = amplitude * (static_cast<double>(r >> 40) / double(1 << 23) - 1.0);
  }
  return m;
}

}  // namespace ldlm::test
