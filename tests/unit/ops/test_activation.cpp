// The activations of ops/activation.hpp against their PyTorch dump, at S = float and S =
// double; the dump tells the two GELU forms apart; a row's values do not depend on its address.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <random>
#include <string>
#include <vector>

#include "ldlm/ldlm.hpp"
#include "support/errors.hpp"
#include "support/reference.hpp"

namespace unit_ops_activation {
namespace {

using ldlm::test::bitwise_equal;
using ldlm::test::expect_matches;

using namespace ldlm;
using ldlm::test::matches_reference;
using ldlm::test::max_abs_diff;
using ldlm::test::open_reference;
using ldlm::test::read_tensor;
using ldlm::test::Tolerance;

constexpr Tolerance kTol = ldlm::test::kFp32Dump;

template <class S>
Tensor1<S> apply_activation(const Tensor1<S>& x, void (*activation)(S*, Index)) {
  Tensor1<S> y = x;
  activation(y.data(), y.size());
  return y;
}

template <class S>
void check_activations() {
  const auto file = open_reference("primitives/activations.safetensors");
  const auto x = read_tensor<S, 1>(file, "input.x");
  const std::string variant = std::is_same_v<S, double> ? " (double)" : "";
  expect_matches(apply_activation<S>(x, gelu_erf_inplace<S>), file, "output.gelu_erf", kTol, variant);
  expect_matches(apply_activation<S>(x, gelu_tanh_inplace<S>), file, "output.gelu_tanh", kTol, variant);
  expect_matches(apply_activation<S>(x, silu_inplace<S>), file, "output.silu", kTol, variant);
}

TEST(Activation, MatchReference) { check_activations<float>(); }
TEST(Activation, MatchReferenceWithDoubleScalar) { check_activations<double>(); }

// The Perceiver FFN needs the exact (erf) GELU, the denoiser the tanh one: the dump
// must tell them apart, so swapping them anywhere is caught. The two forms differ by
// at most ~4.7e-4 (near |x| = 2): ~47× the tolerance, not 100×, hence a gap of its own.
TEST(Activation, SwappingTheGeluFormsIsCaught) {
  constexpr double kGeluGap = 20 * kTol.atol;
  const auto file = open_reference("primitives/activations.safetensors");
  const auto x = read_tensor<float, 1>(file, "input.x");
  const auto gelu_erf_ref = read_tensor<float, 1>(file, "output.gelu_erf");
  const auto gelu_tanh_ref = read_tensor<float, 1>(file, "output.gelu_tanh");
  const auto tanh_result = apply_activation<float>(x, gelu_tanh_inplace<float>);
  const auto erf_result = apply_activation<float>(x, gelu_erf_inplace<float>);
  EXPECT_FALSE(matches_reference(tanh_result, file, "output.gelu_erf", kTol));
  EXPECT_FALSE(matches_reference(erf_result, file, "output.gelu_tanh", kTol));
  EXPECT_GT(max_abs_diff(tanh_result, gelu_erf_ref), kGeluGap);
  EXPECT_GT(max_abs_diff(erf_result, gelu_tanh_ref), kGeluGap);
}

// A row's values must not depend on where the row starts: Eigen's vector
// expressions peel elements up to an aligned address, and a kernel that computed
// those (or the tail) with other functions than the body would round them
// differently. Each activation runs on the first n of the same 1000 values, for
// lengths from 0 to 1000 and at 16 offsets from a 64-byte boundary, against the
// whole row at offset 0 bit for bit.
template <class S>
void expect_values_independent_of_the_rows_address() {
  constexpr Index kLength = 1000, kOffsets = 16;
  std::mt19937 generator(11);
  std::normal_distribution<S> normal(S(0), S(3));
  std::vector<S> x(static_cast<std::size_t>(kLength));
  for (S& v : x) v = normal(generator);
  struct Named {
    const char* name;
    void (*activation)(S*, Index);
  };
  for (const Named& f : {Named{"gelu_tanh", gelu_tanh_inplace<S>}, Named{"gelu_erf", gelu_erf_inplace<S>},
                         Named{"silu", silu_inplace<S>}}) {
    alignas(64) std::array<S, static_cast<std::size_t>(kLength + kOffsets)> buffer;
    std::copy(x.begin(), x.end(), buffer.begin());
    f.activation(buffer.data(), kLength);
    const std::vector<S> whole_row(buffer.begin(), buffer.begin() + kLength);
    for (Index n : {kLength, Index(0), Index(1), Index(7), Index(15), Index(16), Index(17), Index(33)})
      for (Index offset = 0; offset < kOffsets; ++offset) {
        S* const row = buffer.data() + offset;
        std::copy_n(x.begin(), n, row);
        f.activation(row, n);
        EXPECT_TRUE(bitwise_equal(std::string(f.name) + " (" + std::to_string(sizeof(S)) +
                                      "-byte values), n = " + std::to_string(n) + " at offset " +
                                      std::to_string(offset) + ", against the whole row at offset 0",
                                  row, whole_row.data(), static_cast<std::size_t>(n)));
      }
  }
}

TEST(Activation, ValuesDoNotDependOnTheRowsAddress) {
  expect_values_independent_of_the_rows_address<float>();
  expect_values_independent_of_the_rows_address<double>();
}

}  // namespace
}  // namespace unit_ops_activation
