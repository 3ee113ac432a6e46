// add_positions and timestep_embedding (ops/embedding.hpp): shape checks, and the
// timestep embedding's two orders against the PyTorch dump.
#include <gtest/gtest.h>

#include "ldlm/ldlm.hpp"
#include "support/errors.hpp"
#include "support/reference.hpp"

namespace unit_ops_embedding {
namespace {

using ldlm::test::error_of;
using ldlm::test::expect_matches;

using namespace ldlm;
using ldlm::test::max_abs_diff;
using ldlm::test::open_reference;
using ldlm::test::read_tensor;
using ldlm::test::Tolerance;

constexpr Tolerance kTol = ldlm::test::kFp32Dump;
// A planted bug must move the result by far more than the tolerance: at least 100×.
constexpr double kBugGap = 100 * kTol.atol;

TEST(Embedding, AddPositionsChecksShapes) {
  Context ctx;
  const Matrix<float> table = Matrix<float>::Ones(8, 4);  // [max_positions, d]
  Matrix<float> x = Matrix<float>::Zero(6, 4);            // B = 2 sequences of T = 3
  add_positions<float>(ctx, table, 3, x);
  EXPECT_EQ(x, Matrix<float>::Constant(6, 4, 0.5f));  // d^-1/2 = 1/2

  const auto error = [&](Index T, auto& target, const Matrix<float>& t) {
    return error_of<ShapeError>([&] { add_positions<float>(ctx, t, T, target); });
  };
  // Rows that are not whole sequences of T: row r would get position r % T of a
  // sequence that does not exist.
  EXPECT_EQ(error(4, x, table), "add_positions: x [6, 4] is not a whole number of sequences of T = 4 rows");
  EXPECT_EQ(error(0, x, table), "add_positions: x [6, 4] is not a whole number of sequences of T = 0 rows");
  EXPECT_EQ(error(-3, x, table), "add_positions: x [6, 4] is not a whole number of sequences of T = -3 rows");
  Matrix<float> long_x = Matrix<float>::Zero(9, 4);
  EXPECT_EQ(error(9, long_x, table), "add_positions: position table [8, 4] cannot serve T = 9 with 4 features");
  Matrix<float> wide_x = Matrix<float>::Zero(6, 5);
  EXPECT_EQ(error(3, wide_x, table), "add_positions: position table [8, 4] cannot serve T = 3 with 5 features");
  EXPECT_EQ(x, Matrix<float>::Constant(6, 4, 0.5f)) << "a rejected call must not write";
}

TEST(EmbeddingTimestep, CosSinMatchesAndFlipSwitchGivesSinCos) {
  const auto file = open_reference("primitives/timestep_embedding.safetensors");
  const auto t = read_tensor<float, 1>(file, "input.t");
  const Index B = t.dimension(0);
  Tensor2<float> emb(B, 768), emb_flip(B, 768);
  timestep_embedding<float>(t.data(), B, 10.0, /*flip=*/false, as_matrix(emb));
  timestep_embedding<float>(t.data(), B, 10.0, /*flip=*/true, as_matrix(emb_flip));
  expect_matches(emb, file, "output.emb", kTol);
  expect_matches(emb_flip, file, "output.emb_flip", kTol);
  // The two orders must be distinguishable, or the switch would be untested.
  EXPECT_GT(max_abs_diff(emb, read_tensor<float, 2>(file, "output.emb_flip")), kBugGap);
}

}  // namespace
}  // namespace unit_ops_embedding
