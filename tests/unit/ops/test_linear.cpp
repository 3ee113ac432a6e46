// ldlm::linear (ops/linear.hpp) against its PyTorch dump in tests/data/primitives, with
// and without bias, at S = float and S = double.
#include <gtest/gtest.h>

#include <string>

#include "ldlm/ldlm.hpp"
#include "support/errors.hpp"
#include "support/reference.hpp"

namespace unit_ops_linear {
namespace {

using ldlm::test::expect_matches;

using namespace ldlm;
using ldlm::test::open_reference;
using ldlm::test::read_tensor;
using ldlm::test::Tolerance;

constexpr Tolerance kTol = ldlm::test::kFp32Dump;

template <class S>
void check_linear_free_function() {
  const auto file = open_reference("primitives/linear.safetensors");
  const auto x = read_tensor<S, 3>(file, "input.x");
  const auto w = read_tensor<S, 2>(file, "param.weight");
  const auto b = read_tensor<S, 1>(file, "param.bias");
  Tensor3<S> y(2, 7, 40), y_nobias(2, 7, 40);
  Context ctx;
  const LinearWeight<S> weight(as_matrix(w), WeightLayout::out_in);
  linear<S>(ctx, as_matrix(x), weight, b.data(), as_matrix(y));
  linear<S>(ctx, as_matrix(x), weight, nullptr, as_matrix(y_nobias));
  const std::string variant = std::is_same_v<S, double> ? " (ldlm::linear, double)" : " (ldlm::linear)";
  expect_matches(y, file, "output.y", kTol, variant);
  expect_matches(y_nobias, file, "output.y_nobias", kTol, variant);
}

TEST(Linear, FreeFunctionWithAndWithoutBias) { check_linear_free_function<float>(); }
TEST(Linear, FreeFunctionWithDoubleScalar) { check_linear_free_function<double>(); }

}  // namespace
}  // namespace unit_ops_linear
