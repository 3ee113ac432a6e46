// nn::Linear (nn/linear.hpp) against its PyTorch dump in tests/data/primitives, with and
// without bias.
#include <gtest/gtest.h>

#include "ldlm/ldlm.hpp"
#include "support/errors.hpp"
#include "support/reference.hpp"

namespace unit_nn_linear {
namespace {

using ldlm::test::expect_matches;

using namespace ldlm;
using ldlm::test::load_case_parameters;
using ldlm::test::open_reference;
using ldlm::test::read_tensor;
using ldlm::test::Tolerance;

constexpr Tolerance kTol = ldlm::test::kFp32Dump;

TEST(LinearModule, ModuleWithAndWithoutBias) {
  const auto file = open_reference("primitives/linear.safetensors");
  nn::Linear<float> with_bias(24, 40, true), without_bias(24, 40, false);
  load_case_parameters(with_bias, file);
  // The bias-free module does not claim param.bias.
  load_case_parameters(without_bias, file, /*reject_unexpected=*/false);
  const auto x = read_tensor<float, 3>(file, "input.x");
  Tensor3<float> y(2, 7, 40), y_nobias(2, 7, 40);
  Context ctx;
  with_bias.forward(ctx, as_matrix(x), as_matrix(y));
  without_bias.forward(ctx, as_matrix(x), as_matrix(y_nobias));
  expect_matches(y, file, "output.y", kTol, " (nn::Linear)");
  expect_matches(y_nobias, file, "output.y_nobias", kTol, " (nn::Linear)");
}

}  // namespace
}  // namespace unit_nn_linear
