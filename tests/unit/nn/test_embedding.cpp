// The embedding modules of nn/embedding.hpp (PositionalEmbedding, ScaleMask) against their
// PyTorch dumps; the dump catches a dropped d^-1/2 position scale.
#include <gtest/gtest.h>

#include <array>

#include "ldlm/ldlm.hpp"
#include "support/errors.hpp"
#include "support/reference.hpp"

namespace unit_nn_embedding {
namespace {

using ldlm::test::expect_matches;

using namespace ldlm;
using ldlm::test::load_case_parameters;
using ldlm::test::matches_reference;
using ldlm::test::max_abs_diff;
using ldlm::test::open_reference;
using ldlm::test::read_tensor;
using ldlm::test::Tolerance;
using ldlm::test::zeros_like;

constexpr Tolerance kTol = ldlm::test::kFp32Dump;
// A planted bug must move the result by far more than the tolerance: at least 100×.
constexpr double kBugGap = 100 * kTol.atol;

TEST(EmbeddingScaleMask, MatchesReference) {
  const auto file = open_reference("primitives/scale_mask.safetensors");
  nn::ScaleMask<float> scale_mask;
  load_case_parameters(scale_mask, file);
  const auto x = read_tensor<float, 3>(file, "input.x");
  auto y = zeros_like(x);
  Context ctx;
  scale_mask.forward(ctx, as_matrix(x), as_matrix(y));
  expect_matches(y, file, "output.y", kTol);
}

template <class S>
void check_positions() {
  const auto file = open_reference("primitives/positions.safetensors");
  nn::PositionalEmbedding<S> positions(32, 16);
  load_case_parameters(positions, file);
  Tensor2<S> pos(7, 16);
  pos.setZero();
  Context ctx;
  positions.add_to(ctx, 7, as_matrix(pos));
  expect_matches(pos, file, "output.pos", kTol, std::is_same_v<S, double> ? " (double)" : "");
}

TEST(EmbeddingPositional, MatchReference) { check_positions<float>(); }
TEST(EmbeddingPositional, MatchReferenceWithDoubleScalar) { check_positions<double>(); }

TEST(EmbeddingPositional, DroppingTheScaleIsCaught) {
  const auto file = open_reference("primitives/positions.safetensors");
  const auto table = read_tensor<float, 2>(file, "param.emb.weight");
  const Tensor2<float> unscaled = table.slice(std::array<Index, 2>{0, 0}, std::array<Index, 2>{7, 16});
  EXPECT_FALSE(matches_reference(unscaled, file, "output.pos", kTol));
  EXPECT_GT(max_abs_diff(unscaled, read_tensor<float, 2>(file, "output.pos")), kBugGap);
}

}  // namespace
}  // namespace unit_nn_embedding
