// The norms of ops/norm.hpp check their shapes and name them.
#include <gtest/gtest.h>

#include "ldlm/ldlm.hpp"
#include "support/errors.hpp"
#include "support/reference.hpp"

namespace unit_ops_norm {
namespace {

using ldlm::test::error_of;

using namespace ldlm;

// The norms check x, the gain's length (x's width) and y together, and name all three.
TEST(Norm, CheckShapes) {
  Context ctx;
  const Matrix<float> x = Matrix<float>::Ones(6, 4), shift = Matrix<float>::Zero(2, 4);
  const Vector<float> gain = Vector<float>::Ones(4), bias = Vector<float>::Zero(4);
  Matrix<float> short_y(5, 4), wide_y(6, 5);
  const auto error = [&](auto&& call) { return error_of<ShapeError>(call); };
  EXPECT_EQ(error([&] { rms_norm<float>(ctx, x, gain.data(), 1e-6f, short_y); }),
            "rms_norm: x [6, 4], weight [4], y [5, 4] do not fit");
  EXPECT_EQ(error([&] { layer_norm<float>(ctx, x, gain.data(), bias.data(), 1e-5f, wide_y); }),
            "layer_norm: x [6, 4], weight [4], y [6, 5] do not fit");
  EXPECT_EQ(error([&] { layer_norm_gain<float>(ctx, x, gain.data(), 1e-5f, short_y); }),
            "layer_norm_gain: x [6, 4], weight [4], y [5, 4] do not fit");
  EXPECT_EQ(error([&] { layer_norm_modulate<float>(ctx, x, gain.data(), 1e-5f, shift, shift, 3, wide_y); }),
            "layer_norm_modulate: x [6, 4], weight [4], y [6, 5] do not fit");
}

}  // namespace
}  // namespace unit_ops_norm
