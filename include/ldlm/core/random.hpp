// Deterministic random numbers that do not depend on the standard library:
// splitmix64, which the parameter generator (core/init.hpp) hashes with, and the
// sampler's Gaussian noise (NormalGenerator), and the noise of a batch that joins
// independent requests (GroupedNormalGenerator).
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <span>
#include <string>
#include <vector>

#include "ldlm/core/error.hpp"
#include "ldlm/core/tensor.hpp"

namespace ldlm {

namespace detail {
constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;

constexpr std::uint64_t splitmix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace detail

/// Standard normal values from a seed: xoshiro256** (state from splitmix64) and
/// Box–Muller on 53-bit uniforms. Values come in pairs; the sequence depends
/// only on the seed.
class NormalGenerator {
 public:
  explicit NormalGenerator(std::uint64_t seed) {
    std::uint64_t s = seed;
    for (auto& word : state_) word = detail::splitmix64(s += detail::kGolden);
  }

  double next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - uniform();  // (0, 1]: log(u1) is finite
    const double u2 = uniform();
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * std::numbers::pi * u2;
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

  template <class S>
  void fill(S* out, Index n) {
    for (Index i = 0; i < n; ++i) out[i] = static_cast<S>(next());
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

  std::uint64_t next_bits() {
    const std::uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const std::uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  double uniform() { return static_cast<double>(next_bits() >> 11) * 0x1.0p-53; }  // [0, 1)

  std::uint64_t state_[4];
  double spare_ = 0;
  bool has_spare_ = false;
};

/// A run of consecutive sequences of a batch that draws its noise from its own seed.
struct NoiseGroup {
  Index rows = 1;  // sequences
  std::uint64_t seed = 0;
};

/// The noise of a batch made of groups of consecutive sequences, each with its own
/// NormalGenerator: every fill of the whole batch gives each group the values its
/// generator gives a fill of the group's rows alone, in the same order. So a request of
/// n sequences at rows [r, r + n) of a batch draws exactly what it draws as a batch of
/// n, at the start and at every later draw (stochastic solvers, RePaint). One group is
/// NormalGenerator(seed) itself.
class GroupedNormalGenerator {
 public:
  explicit GroupedNormalGenerator(std::uint64_t seed) : GroupedNormalGenerator(std::vector<NoiseGroup>{{1, seed}}) {}

  explicit GroupedNormalGenerator(std::span<const NoiseGroup> groups) {
    if (groups.empty()) throw InvalidArgument("noise groups: at least one group is needed");
    for (const NoiseGroup& g : groups) {
      if (g.rows < 1) throw InvalidArgument("noise groups: a group must have >= 1 rows, got " + std::to_string(g.rows));
      rows_.push_back(g.rows);
      generators_.emplace_back(g.seed);
      total_rows_ += g.rows;
    }
  }

  Index rows() const { return total_rows_; }

  /// n values over every group's rows, which all hold n / rows() values.
  template <class S>
  void fill(S* out, Index n) {
    if (n % total_rows_ != 0)
      throw InvalidArgument("noise groups: " + std::to_string(n) + " values do not split into " +
                            std::to_string(total_rows_) + " equal rows");
    const Index per_row = n / total_rows_;
    for (std::size_t g = 0; g < generators_.size(); ++g) {
      const Index count = rows_[g] * per_row;
      generators_[g].fill(out, count);
      out += count;
    }
  }

 private:
  std::vector<Index> rows_;
  std::vector<NormalGenerator> generators_;
  Index total_rows_ = 0;
};

}  // namespace ldlm
