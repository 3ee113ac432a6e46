// The feed-forwards of nn/mlp.hpp (SwiGLU, the Perceiver FFN) against their PyTorch dumps.
#include <gtest/gtest.h>

#include "ldlm/ldlm.hpp"
#include "support/errors.hpp"
#include "support/reference.hpp"

namespace unit_nn_mlp {
namespace {

using ldlm::test::expect_matches;

using namespace ldlm;
using ldlm::test::load_case_parameters;
using ldlm::test::open_reference;
using ldlm::test::read_tensor;
using ldlm::test::Tolerance;
using ldlm::test::zeros_like;

constexpr Tolerance kTol = ldlm::test::kFp32Dump;

template <class S>
void check_swiglu() {
  const auto file = open_reference("primitives/swiglu.safetensors");
  nn::SwiGLU<S> mlp(32, 48);
  load_case_parameters(mlp, file);
  const auto x = read_tensor<S, 3>(file, "input.x");
  auto y = zeros_like(x);
  Context ctx;
  mlp.forward(ctx, as_matrix(x), as_matrix(y));
  expect_matches(y, file, "output.y", kTol, std::is_same_v<S, double> ? " (double)" : "");
}

TEST(MlpSwiGLU, MatchesReference) { check_swiglu<float>(); }
TEST(MlpSwiGLU, MatchesReferenceWithDoubleScalar) { check_swiglu<double>(); }

TEST(MlpPerceiverFFN, MatchesReference) {
  const auto file = open_reference("primitives/perceiver_ffn.safetensors");
  nn::PerceiverFFN<float> ffn(32, 128, 1e-5);
  load_case_parameters(ffn, file);
  const auto x = read_tensor<float, 3>(file, "input.x");
  auto y = zeros_like(x);
  Context ctx;
  ffn.forward(ctx, as_matrix(x), as_matrix(y));
  expect_matches(y, file, "output.y", kTol);
}

}  // namespace
}  // namespace unit_nn_mlp
