// Rotary position embedding (ops/rotary.hpp) against its PyTorch dump: the half-split
// default and the interleaved switch, at S = float and S = double; the dump tells them apart.
#include <gtest/gtest.h>

#include <string>

#include "ldlm/ldlm.hpp"
#include "support/errors.hpp"
#include "support/reference.hpp"

namespace unit_ops_rotary {
namespace {

using ldlm::test::expect_matches;

using namespace ldlm;
using ldlm::test::max_abs_diff;
using ldlm::test::open_reference;
using ldlm::test::read_tensor;
using ldlm::test::Tolerance;

constexpr Tolerance kTol = ldlm::test::kFp32Dump;
// A planted bug must move the result by far more than the tolerance: at least 100×.
constexpr double kBugGap = 100 * kTol.atol;

/// The dump's x is [B, H, T, hd]: as a [B*H*T, hd] matrix, row r is position r % T.
template <class S>
Tensor4<S> rotate(const Tensor4<S>& x, bool interleaved) {
  const Index T = x.dimension(2), hd = x.dimension(3);
  Tensor4<S> y = x;
  Context ctx;
  Arena::Scope scope(ctx.arena());
  const auto table = make_rotary_table<S>(ctx.arena(), T, hd, 10000.0);
  apply_rotary_inplace<S>(ctx, as_matrix(y), 0, 1, hd, T, table, interleaved);
  return y;
}

template <class S>
void check_rotary() {
  const auto file = open_reference("primitives/rotary.safetensors");
  const auto x = read_tensor<S, 4>(file, "input.x");
  const std::string variant = std::is_same_v<S, double> ? " (double)" : "";
  expect_matches(rotate(x, false), file, "output.y", kTol, variant);
  expect_matches(rotate(x, true), file, "output.y_interleaved", kTol, variant);
}

TEST(Rotary, HalfSplitAndInterleavedSwitchMatchReference) { check_rotary<float>(); }
TEST(Rotary, MatchReferenceWithDoubleScalar) { check_rotary<double>(); }

TEST(Rotary, HalfSplitIsTheDefaultAndDiffersFromInterleaved) {
  const auto file = open_reference("primitives/rotary.safetensors");
  const auto x = read_tensor<float, 4>(file, "input.x");
  auto by_default = x;
  Context ctx;
  Arena::Scope scope(ctx.arena());
  const auto table = make_rotary_table<float>(ctx.arena(), 7, 16, 10000.0);
  apply_rotary_inplace<float>(ctx, as_matrix(by_default), 0, 1, 16, 7, table);
  expect_matches(by_default, file, "output.y", kTol, " (default pairing)");
  EXPECT_GT(max_abs_diff(by_default, read_tensor<float, 4>(file, "output.y_interleaved")), kBugGap);
  EXPECT_GT(max_abs_diff(rotate(x, true), read_tensor<float, 4>(file, "output.y")), kBugGap);
}

}  // namespace
}  // namespace unit_ops_rotary
