// adaLN modulation, the gated residual, the fused norm + modulate and scale_mask
// (ops/modulate.hpp): parity with the PyTorch dump and shape checks.
#include <gtest/gtest.h>

#include <string>

#include "ldlm/ldlm.hpp"
#include "support/errors.hpp"
#include "support/reference.hpp"

namespace unit_ops_modulate {
namespace {

using ldlm::test::error_of;
using ldlm::test::expect_matches;

using namespace ldlm;
using ldlm::test::open_reference;
using ldlm::test::read_tensor;
using ldlm::test::Tolerance;
using ldlm::test::zeros_like;

constexpr Tolerance kTol = ldlm::test::kFp32Dump;

TEST(Modulate, ModulateAndGatedResidualMatchReference) {
  const auto file = open_reference("primitives/modulate.safetensors");
  const auto x = read_tensor<float, 3>(file, "input.x");
  const auto shift = read_tensor<float, 2>(file, "input.shift");
  const auto scale = read_tensor<float, 2>(file, "input.scale");
  const auto gate = read_tensor<float, 2>(file, "input.gate");
  auto residual = read_tensor<float, 3>(file, "input.residual");
  const Index T = x.dimension(1);
  auto modulated = zeros_like(x);
  Context ctx;
  modulate<float>(ctx, as_matrix(x), as_matrix(shift), as_matrix(scale), T, as_matrix(modulated));
  gated_residual_add<float>(ctx, as_matrix(residual), as_matrix(gate), as_matrix(x), T);
  expect_matches(modulated, file, "output.modulated", kTol);
  expect_matches(residual, file, "output.gated", kTol);

  // In place, as the denoiser calls it.
  auto in_place = x;
  modulate<float>(ctx, as_matrix(in_place), as_matrix(shift), as_matrix(scale), T, as_matrix(in_place));
  expect_matches(in_place, file, "output.modulated", kTol, " (in place)");
}

// The denoiser's fused norm + modulate must be exactly the two ops in sequence
// (whose parities are tested above): same float operations, same order.
TEST(Modulate, FusedLayerNormModulateEqualsTheComposition) {
  const auto file = open_reference("primitives/modulate.safetensors");
  const auto x = read_tensor<float, 3>(file, "input.x");
  const auto shift = read_tensor<float, 2>(file, "input.shift");
  const auto scale = read_tensor<float, 2>(file, "input.scale");
  const Index T = x.dimension(1), d = x.dimension(2);
  const Vector<float> gamma = Vector<float>::LinSpaced(d, 0.5f, 1.5f);
  Context ctx;
  auto composed = zeros_like(x);
  layer_norm_gain<float>(ctx, as_matrix(x), gamma.data(), 1e-5f, as_matrix(composed));
  modulate<float>(ctx, as_matrix(composed), as_matrix(shift), as_matrix(scale), T, as_matrix(composed));
  auto fused = zeros_like(x);
  layer_norm_modulate<float>(ctx, as_matrix(x), gamma.data(), 1e-5f, as_matrix(shift), as_matrix(scale), T,
                             as_matrix(fused));
  EXPECT_EQ(as_matrix(fused), as_matrix(composed));
  auto in_place = x;
  layer_norm_modulate<float>(ctx, as_matrix(in_place), gamma.data(), 1e-5f, as_matrix(shift), as_matrix(scale), T,
                             as_matrix(in_place));
  EXPECT_EQ(as_matrix(in_place), as_matrix(composed));

  // shift with the wrong batch: the message names the op and both shapes.
  const Matrix<float> short_shift = as_matrix(shift).topRows(1);
  const auto message = error_of<ShapeError>([&] {
    layer_norm_modulate<float>(ctx, as_matrix(x), gamma.data(), 1e-5f, short_shift, as_matrix(scale), T,
                               as_matrix(fused));
  });
  EXPECT_NE(message.find("layer_norm_modulate"), std::string::npos) << message;
  EXPECT_NE(message.find("needs shift and scale [2, 16], got [1, 16] and [2, 16]"), std::string::npos) << message;
  const auto ragged = error_of<ShapeError>([&] {
    layer_norm_modulate<float>(ctx, as_matrix(x), gamma.data(), 1e-5f, as_matrix(shift), as_matrix(scale), T + 1,
                               as_matrix(fused));
  });
  EXPECT_NE(ragged.find("x [14, 16] is not a whole number of sequences of T = 8 rows"), std::string::npos) << ragged;
  Matrix<float> short_y(13, d);
  const auto small_y =
      error_of<ShapeError>([&] { modulate<float>(ctx, as_matrix(x), as_matrix(shift), as_matrix(scale), T, short_y); });
  EXPECT_NE(small_y.find("modulate: y [13, 16] must match x [14, 16]"), std::string::npos) << small_y;
}

// gated_residual_add checks its operands like modulate: whole sequences of T rows,
// a gate row per sequence, a residual of x's shape.
TEST(Modulate, GatedResidualAddChecksShapes) {
  Context ctx;
  Matrix<float> residual = Matrix<float>::Zero(6, 4), x = Matrix<float>::Ones(6, 4), gate = Matrix<float>::Ones(2, 4);
  gated_residual_add<float>(ctx, residual, gate, x, 3);
  EXPECT_EQ(residual, Matrix<float>::Ones(6, 4));

  const auto error = [&](auto&& call) { return error_of<ShapeError>(call); };
  EXPECT_EQ(error([&] { gated_residual_add<float>(ctx, residual, gate, x, 4); }),
            "gated_residual_add: x [6, 4] is not a whole number of sequences of T = 4 rows");
  EXPECT_EQ(error([&] { gated_residual_add<float>(ctx, residual, gate, x, 0); }),
            "gated_residual_add: x [6, 4] is not a whole number of sequences of T = 0 rows");
  // T = 2 makes 3 sequences, but there are 2 gate rows (reading gate row 2 would overrun).
  EXPECT_EQ(error([&] { gated_residual_add<float>(ctx, residual, gate, x, 2); }),
            "gated_residual_add: tensor 'gate' expected shape [3, 4], got [2, 4]");
  const Matrix<float> narrow_gate = Matrix<float>::Ones(2, 3);
  EXPECT_EQ(error([&] { gated_residual_add<float>(ctx, residual, narrow_gate, x, 3); }),
            "gated_residual_add: tensor 'gate' expected shape [2, 4], got [2, 3]");
  Matrix<float> short_residual = Matrix<float>::Zero(5, 4);
  EXPECT_EQ(error([&] { gated_residual_add<float>(ctx, short_residual, gate, x, 3); }),
            "gated_residual_add: tensor 'residual' expected shape [6, 4], got [5, 4]");
  EXPECT_EQ(residual, Matrix<float>::Ones(6, 4)) << "a rejected call must not write";
}

TEST(ModulateScaleMask, ChecksTheOutputShape) {
  Context ctx;
  const Matrix<float> x = Matrix<float>::Ones(6, 4);
  Matrix<float> y(6, 4), short_y(5, 4), wide_y(6, 5);
  scale_mask<float>(ctx, x, 0.5f, 0.25f, y);
  EXPECT_EQ(y, Matrix<float>::Constant(6, 4, 1.75f));
  EXPECT_EQ(error_of<ShapeError>([&] { scale_mask<float>(ctx, x, 0.5f, 0.25f, short_y); }),
            "scale_mask: tensor 'y' expected shape [6, 4], got [5, 4]");
  EXPECT_EQ(error_of<ShapeError>([&] { scale_mask<float>(ctx, x, 0.5f, 0.25f, wide_y); }),
            "scale_mask: tensor 'y' expected shape [6, 4], got [6, 5]");
}

}  // namespace
}  // namespace unit_ops_modulate
