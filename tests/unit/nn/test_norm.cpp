// Parity of the norm modules of nn/norm.hpp (LayerNormGain, LayerNorm, RMSNorm) with their
// PyTorch dumps in tests/data/primitives, at S = float and S = double, and proof that the
// dump catches sqrt(mean + eps) instead of the RMS clamp.
#include <gtest/gtest.h>

#include <array>
#include <cmath>

#include "ldlm/ldlm.hpp"
#include "support/errors.hpp"
#include "support/reference.hpp"

namespace unit_nn_norm {
namespace {

using ldlm::test::expect_matches;

using namespace ldlm;
using ldlm::test::load_case_parameters;
using ldlm::test::max_abs_diff;
using ldlm::test::open_reference;
using ldlm::test::read_tensor;
using ldlm::test::Tolerance;
using ldlm::test::zeros_like;

constexpr Tolerance kTol = ldlm::test::kFp32Dump;
// A planted bug must move the result by far more than the tolerance: at least 100×.
constexpr double kBugGap = 100 * kTol.atol;

// ------------------------------------------------------------------ normalisation

template <class S>
void check_layer_norm_gain() {
  const auto file = open_reference("primitives/layer_norm_gain.safetensors");
  nn::LayerNormGain<S> norm(768, 1e-5);
  load_case_parameters(norm, file);
  const auto x = read_tensor<S, 3>(file, "input.x");
  auto y = zeros_like(x);
  Context ctx;
  norm.forward(ctx, as_matrix(x), as_matrix(y));
  expect_matches(y, file, "output.y", kTol, std::is_same_v<S, double> ? " (double)" : "");
}

TEST(NormLayerNormGain, MatchesReferenceAtD768) { check_layer_norm_gain<float>(); }
TEST(NormLayerNormGain, MatchesReferenceWithDoubleScalar) { check_layer_norm_gain<double>(); }

TEST(NormLayerNormGain, HasExactlyOneGainPerFeature) {
  const nn::LayerNormGain<float> norm(768, 1e-5);
  const ParameterCounts counts = count_parameters(norm);
  EXPECT_EQ(counts.total(), 768);
  EXPECT_EQ(counts.trained, 768);
}

TEST(NormLayerNormBias, MatchesReference) {
  const auto file = open_reference("primitives/layer_norm_bias.safetensors");
  nn::LayerNorm<float> norm(48, 1e-5);
  load_case_parameters(norm, file);
  const auto x = read_tensor<float, 3>(file, "input.x");
  auto y = zeros_like(x);
  Context ctx;
  norm.forward(ctx, as_matrix(x), as_matrix(y));
  expect_matches(y, file, "output.y", kTol);
}

template <class S>
void check_rms_norm() {
  const auto file = open_reference("primitives/rms_norm.safetensors");
  nn::RMSNorm<S> norm(48, 1e-5);
  load_case_parameters(norm, file);
  const auto x = read_tensor<S, 3>(file, "input.x");
  auto y = zeros_like(x);
  Context ctx;
  norm.forward(ctx, as_matrix(x), as_matrix(y));
  expect_matches(y, file, "output.y", kTol, std::is_same_v<S, double> ? " (double)" : "");
}

TEST(NormRms, MatchesReference) { check_rms_norm<float>(); }
TEST(NormRms, MatchesReferenceWithDoubleScalar) { check_rms_norm<double>(); }

// Row [1, 3] of the input is scaled by 1e-7 so its RMS is below eps: only the clamp
// max(rms, eps) reproduces it; sqrt(mean + eps) or an unclamped rms would not.
TEST(NormRms, ClampedRowMatchesAndTheClampIsLive) {
  const auto file = open_reference("primitives/rms_norm.safetensors");
  nn::RMSNorm<float> norm(48, 1e-5);
  load_case_parameters(norm, file);
  const auto x = read_tensor<float, 3>(file, "input.x");
  const auto ref = read_tensor<float, 3>(file, "output.y");
  constexpr Index kClampedRow = 1 * 7 + 3;
  const auto xm = as_matrix(x);
  ASSERT_LT(xm.row(kClampedRow).norm() / std::sqrt(48.0f), norm.eps) << "the dump's clamp row is not clamped";

  Tensor2<float> y(1, 48);
  Context ctx;
  norm.forward(ctx, xm.middleRows(kClampedRow, 1), as_matrix(y));
  const Tensor2<float> ref_row = ref.chip(1, 0).chip(3, 0).reshape(std::array<Index, 2>{1, 48});
  EXPECT_TRUE(ldlm::test::all_close("output.y[1, 3]", y.data(), ref_row.data(), Shape{1, 48}, kTol));

  // The two classic alternatives land far from the reference on this row.
  const auto row = xm.row(kClampedRow);
  const float mean_square = row.squaredNorm() / 48.0f;
  Tensor2<float> wrong_sqrt(1, 48), unclamped(1, 48);
  for (Index i = 0; i < 48; ++i) {
    wrong_sqrt(0, i) = row(i) / std::sqrt(mean_square + norm.eps) * norm.gamma.data()[i];
    unclamped(0, i) = row(i) / std::sqrt(mean_square) * norm.gamma.data()[i];
  }
  EXPECT_GT(max_abs_diff(wrong_sqrt, ref_row), kBugGap);
  EXPECT_GT(max_abs_diff(unclamped, ref_row), kBugGap);
}

}  // namespace
}  // namespace unit_nn_norm
