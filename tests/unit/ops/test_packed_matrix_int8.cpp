// int8 products (ProductPath::int8_native, ops/packed_matrix.hpp): weights quantized
// to s8 per output channel at packing, rows quantized to s8 per row at each product.
//
// Two references, both in double:
// - quantize-dequantize: the same s8 values and scales, computed here by a scalar
//   quantizer of this file's own, summed exactly. int8 sums are exact (s32), so only
//   the scaling's float rounding remains: tolerance 1e-5 · max|ref| of the row.
// - fp32: the unquantized product. The error is s8 rounding, about K^½ · (scale_x ·
//   scale_w) / 2; stated tolerance 2e-2 · max|ref| of the row with K ≤ 300.
// The operands have rows and channels whose magnitudes differ by up to 10^4, so that a
// per-tensor weight scale or a row's scale taken from another row is far outside the
// first tolerance; and an int8 weight multiplied in fp32 would not match the
// quantize-dequantize reference either (its error is the second tolerance's size).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ldlm/ldlm.hpp"
#include "support/modules.hpp"
#include "support/reference.hpp"

namespace unit_ops_packed_matrix_int8 {
namespace {

using namespace ldlm;
using ::testing::HasSubstr;

/// m with row r scaled by 10^(spread · ((r · 7) mod 5 − 2) / 2): magnitudes over 10^(2·spread).
Matrix<float> spread_rows(Matrix<float> m, double spread) {
  for (Index r = 0; r < m.rows(); ++r) m.row(r) *= static_cast<float>(std::pow(10.0, spread * ((r * 7 % 5) - 2) / 2.0));
  return m;
}

/// Each row of m quantized symmetrically to s8 with scale max|row| / 127 and
/// dequantized, in double.
Eigen::MatrixXd quantize_dequantize_rows(const Matrix<float>& m) {
  Eigen::MatrixXd out(m.rows(), m.cols());
  for (Index r = 0; r < m.rows(); ++r) {
    float largest = 0.0f;
    for (Index c = 0; c < m.cols(); ++c) largest = std::max(largest, std::fabs(m(r, c)));
    const float inverse = largest > 0.0f ? 127.0f / largest : 0.0f;
    const double scale = largest > 0.0f ? largest / 127.0f : 1.0f;
    for (Index c = 0; c < m.cols(); ++c)
      out(r, c) = std::clamp(std::nearbyint(m(r, c) * inverse), -127.0f, 127.0f) * scale;
  }
  return out;
}

/// Worst |got − ref| / (max|ref row| + floor) over all elements, and where.
struct RowRelativeError {
  double worst = 0.0;
  Index row = 0, col = 0;
  double got = 0.0, ref = 0.0;
};
RowRelativeError row_relative_error(const Matrix<float>& got, const Eigen::MatrixXd& ref) {
  RowRelativeError e;
  for (Index r = 0; r < ref.rows(); ++r) {
    const double row_max = ref.row(r).cwiseAbs().maxCoeff() + 1e-30;
    for (Index c = 0; c < ref.cols(); ++c) {
      const double err = std::abs(got(r, c) - ref(r, c)) / row_max;
      if (err > e.worst) e = {err, r, c, got(r, c), ref(r, c)};
    }
  }
  return e;
}
void expect_row_relative_within(const Matrix<float>& got, const Eigen::MatrixXd& ref, double tolerance,
                                const std::string& what) {
  const RowRelativeError e = row_relative_error(got, ref);
  EXPECT_LE(e.worst, tolerance) << what << ": worst element (" << e.row << ", " << e.col << "): got " << e.got
                                << ", reference " << e.ref << ", error " << e.worst << " of the row's max|ref|";
}

bool int8_available() { return int8_unavailable_reason().empty(); }

struct ProductCase {
  Index M, N, K;
};

TEST(PackedMatrixInt8, MatchesQuantizeDequantizeAndStaysNearFp32) {
  if (!int8_available()) GTEST_SKIP() << int8_unavailable_reason();
  for (const ProductCase c : {ProductCase{1, 40, 24}, {3, 29, 70}, {16, 64, 64}, {37, 130, 300}, {300, 33, 17}}) {
    SCOPED_TRACE(testing::Message() << "M " << c.M << ", N " << c.N << ", K " << c.K);
    const Matrix<float> w = spread_rows(Matrix<float>::Random(c.N, c.K), 2.0);  // [out, in], channels over 10^4
    const Vector<float> b = Vector<float>::Random(c.N) * 0.01f;
    const Matrix<float> big_x = spread_rows(Matrix<float>::Random(c.M + 2, c.K + 3), 2.0);
    const auto x = big_x.block(1, 2, c.M, c.K);  // strided rows
    const Matrix<float> x_dense = x;
    const Eigen::MatrixXd dequantized = quantize_dequantize_rows(x_dense) * quantize_dequantize_rows(w).transpose();
    const Eigen::MatrixXd exact = x_dense.cast<double>() * w.cast<double>().transpose();
    for (const WeightLayout layout : {WeightLayout::out_in, WeightLayout::in_out}) {
      const Matrix<float> stored = layout == WeightLayout::out_in ? w : Matrix<float>(w.transpose());
      const PackedMatrix packed = PackedMatrix::pack(stored, layout, Precision::int8);
      EXPECT_EQ(packed.path(), ProductPath::int8_native);
      EXPECT_EQ(packed.precision(), Precision::int8);
      EXPECT_EQ(packed.weight_scales().size(), static_cast<std::size_t>(c.N));
      for (const bool with_bias : {true, false}) {
        for (const bool strided_y : {false, true}) {
          SCOPED_TRACE(testing::Message() << (layout == WeightLayout::out_in ? "out_in" : "in_out")
                                          << (with_bias ? ", bias" : "") << (strided_y ? ", strided y" : ""));
          Matrix<float> big_y = Matrix<float>::Constant(c.M, c.N + (strided_y ? 5 : 0), 7.0f);
          auto y = big_y.leftCols(c.N);
          Context ctx(2);
          linear(ctx, x, packed, with_bias ? b.data() : nullptr, y);
          const Eigen::RowVectorXd bias_row =
              with_bias ? Eigen::RowVectorXd(b.cast<double>().transpose()) : Eigen::RowVectorXd::Zero(c.N);
          const Matrix<float> got = y;
          expect_row_relative_within(got, dequantized.rowwise() + bias_row, 1e-5, "against quantize-dequantize");
          expect_row_relative_within(got, exact.rowwise() + bias_row, 2e-2, "against fp32");
        }
      }
    }
  }
}

TEST(PackedMatrixInt8, ReportsItsVnniOrAmxKernelAndRefusesWhereThereIsNone) {
  if (!int8_available()) {
    // Refused, with the reason, rather than run in another precision.
    EXPECT_THAT([] { PackedMatrix::pack(Matrix<float>::Ones(8, 8), WeightLayout::out_in, Precision::int8); },
                ::testing::ThrowsMessage<InvalidArgument>(HasSubstr("precision int8: ")));
    EXPECT_THAT(gemm_paths().int8_linear, HasSubstr("unavailable: "));
    return;
  }
  const PackedMatrix packed = PackedMatrix::pack(Matrix<float>::Ones(64, 64), WeightLayout::out_in, Precision::int8);
  const bool int8_instructions =
      packed.kernel().find("vnni") != std::string::npos || packed.kernel().find("amx") != std::string::npos;
  EXPECT_TRUE(int8_instructions) << packed.kernel();
  EXPECT_THAT(gemm_paths().int8_linear, HasSubstr(packed.kernel()));
}

TEST(PackedMatrixInt8, QuantizesRowsLikeTheScalarDefinition) {
  // quantize_s8's vector body against its scalar tail's arithmetic, on 37 values (two
  // vectors and a tail), ties included (x · 127 / max = k + ½).
  std::vector<float> x(37);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = (static_cast<float>(i) - 18.0f) * 0.75f;
  x[5] = 13.5f;  // max|x| = 13.5: 127/13.5 · 13.5 = 127
  std::vector<std::int8_t> q(x.size());
  const float scale = quantize_s8(x.data(), static_cast<std::int64_t>(x.size()), q.data());
  EXPECT_FLOAT_EQ(scale, 13.5f / 127.0f);
  for (std::size_t i = 0; i < x.size(); ++i)
    EXPECT_EQ(q[i], static_cast<std::int8_t>(std::nearbyint(x[i] * (127.0f / 13.5f)))) << "element " << i;
  std::vector<float> zeros(20, 0.0f);
  EXPECT_EQ(quantize_s8(zeros.data(), 20, q.data()), 1.0f);
  // A NaN or an infinity, in the vector body or the tail, makes the scale NaN, so the
  // row's products are NaN as in fp32.
  for (const std::size_t at : {std::size_t(3), std::size_t(35)})
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      std::vector<float> y = x;
      y[at] = bad;
      EXPECT_TRUE(std::isnan(quantize_s8(y.data(), static_cast<std::int64_t>(y.size()), q.data())))
          << bad << " at " << at;
    }
}

/// y = x · W + b through lin's packed weight.
Matrix<float> linear_output(const nn::Linear<float>& lin, const Matrix<float>& x) {
  Matrix<float> y(x.rows(), lin.out_features());
  Context ctx(2);
  linear(ctx, x, *lin.weight.packed(), lin.bias.data(), y);
  return y;
}

TEST(PackedMatrixInt8, AWeightMadeOrReadInBlocksOfRowsPacksAsTheWholeWeight) {
  // At int8, a weight int8 quantizes is generated, or read from a float file, a block of
  // rows at a time and quantized as it comes (MatmulWeight::pack_int8_from_blocks), never
  // whole in float. 600 output channels are three blocks of 256 rows, the last short:
  // each block's values and scales must land at its own rows.
  if (!int8_available()) GTEST_SKIP() << int8_unavailable_reason();
  nn::Linear<float> blank(40, 600, /*with_bias=*/true);
  blank.weight.quantize_at_int8();
  nn::Linear<float> whole = blank, generated = blank;
  init_parameters(whole, 3, "lin.", std::nullopt);
  const Matrix<float> values = whole.weight.matrix();
  const Vector<float> bias = whole.bias.vector().transpose();
  pack_parameters(whole, Precision::int8);
  init_parameters(generated, 3, "lin.", Precision::int8);
  const Matrix<float> x = Matrix<float>::Random(7, 40);
  const Matrix<float> want = linear_output(whole, x);
  auto expect_same = [&](const nn::Linear<float>& got, const Matrix<float>& reference, const char* what) {
    ASSERT_EQ(got.weight.packed()->path(), ProductPath::int8_native) << what;
    const Matrix<float> y = linear_output(got, x);
    Index row = 0, col = 0;
    const float worst = (y - reference).cwiseAbs().maxCoeff(&row, &col);
    EXPECT_EQ(worst, 0.0f) << what << ": worst element (" << row << ", " << col << "): got " << y(row, col)
                           << ", whole weight quantized " << reference(row, col);
  };
  EXPECT_EQ(generated.weight.packed()->weight_scales(), whole.weight.packed()->weight_scales());
  expect_same(generated, want, "generated by blocks");

  // Read from an F32 and a BF16 file: the BF16 weight against the whole bf16-rounded one.
  const std::string dir = ::testing::TempDir();
  Matrix<float> rounded = values;
  std::vector<bf16> bf16_values(static_cast<std::size_t>(values.size()));
  to_bf16(values.data(), values.size(), bf16_values.data());
  bf16_to_float(bf16_values.data(), values.size(), rounded.data());
  nn::Linear<float> whole_bf16 = blank;
  whole_bf16.weight.matrix() = rounded;
  whole_bf16.bias.vector() = bias.transpose();
  pack_parameters(whole_bf16, Precision::int8);
  for (const bool in_bf16 : {false, true}) {
    const std::string path = dir + (in_bf16 ? "/int8_rows_bf16.safetensors" : "/int8_rows_f32.safetensors");
    SafetensorsWriter writer;
    if (in_bf16)
      writer.add("lin.weight", DType::BF16, {600, 40}, std::as_bytes(std::span<const bf16>(bf16_values)));
    else
      writer.add("lin.weight", {600, 40}, values.data());
    writer.add("lin.bias", {600}, bias.data());
    writer.write(path);
    nn::Linear<float> loaded = blank;
    LoadOptions options;
    options.pack = Precision::int8;
    load_parameters(loaded, SafetensorsFile::open(path), "lin.", options);
    expect_same(loaded, linear_output(in_bf16 ? whole_bf16 : whole, x), in_bf16 ? "read from BF16" : "read from F32");
    std::remove(path.c_str());
  }
}

TEST(PackedMatrixInt8, EveryMapOfTheTrainedModulesButTheDenoisersConditioningIsQuantized) {
  if (!int8_available()) GTEST_SKIP() << int8_unavailable_reason();
  LDLM<float> model(test::small_config());
  init_parameters(model, 7, "", Precision::int8);
  int quantized = 0;
  visit_parameters(model, "", [&](const std::string& name, const auto& p) {
    if constexpr (requires { p.packed(); }) {
      const bool expected = test::quantized_at_int8(name), int8 = p.packed()->path() == ProductPath::int8_native;
      EXPECT_EQ(int8, expected) << name;
      if (!expected) {
        EXPECT_EQ(p.packed()->precision(), Precision::bf16) << name;
      }
      quantized += int8;
    }
  });
  EXPECT_EQ(quantized, test::int8_weight_count(test::small_config()));
}

// The denoiser's MLP on int8 weights into a gated residual (fc1's GELU and fc2's gated
// add run after the int8 products' epilogue) against the same module computed in double
// on quantize-dequantized weights and rows, fc2's rows quantized from the float GELU
// output as ldlm does. Tolerance 2e-3 · max|ref| of the row: the hidden rows are
// float sums in ldlm and double sums here, so a hidden value near a rounding tie may
// land on the neighbouring s8 value (one quantum of one term).
TEST(PackedMatrixInt8, GeluMlpIntoAGatedResidualMatchesQuantizeDequantize) {
  if (!int8_available()) GTEST_SKIP() << int8_unavailable_reason();
  const Index B = 2, T = 21, d = 48, hidden = 160;
  nn::GeluMLP<float> plain(d, hidden), quantized(d, hidden);
  quantized.fc1.weight.quantize_at_int8();
  quantized.fc2.weight.quantize_at_int8();
  init_parameters(plain, 5, "mlp.", std::nullopt);
  init_parameters(quantized, 5, "mlp.", Precision::int8);
  ASSERT_EQ(quantized.fc2.weight.packed()->path(), ProductPath::int8_native);
  const Matrix<float> x = spread_rows(Matrix<float>::Random(B * T, d), 1.0);
  const Matrix<float> gate = Matrix<float>::Random(B, d);
  const Matrix<float> residual = Matrix<float>::Random(B * T, d);

  Matrix<float> got = residual;
  Context ctx(2);
  quantized.forward(ctx, x, GatedResidual<float>{got, gate, T});

  auto dequantized_weight = [](const nn::Linear<float>& l) { return quantize_dequantize_rows(l.weight.matrix()); };
  Eigen::MatrixXd h = quantize_dequantize_rows(x) * dequantized_weight(plain.fc1).transpose();
  h.rowwise() += plain.fc1.bias.vector().cast<double>();
  Matrix<float> h_float = h.cast<float>();
  gelu_tanh_inplace(h_float.data(), h_float.size());
  Eigen::MatrixXd y = quantize_dequantize_rows(h_float) * dequantized_weight(plain.fc2).transpose();
  y.rowwise() += plain.fc2.bias.vector().cast<double>();
  Eigen::MatrixXd added(B * T, d);  // gate ⊙ y alone: the residual is exact on both sides
  for (Index r = 0; r < B * T; ++r) added.row(r) = gate.row(r / T).cast<double>().cwiseProduct(y.row(r));
  const Matrix<float> got_added = got - residual;
  expect_row_relative_within(got_added, added, 2e-3, "gate ⊙ mlp(x) against quantize-dequantize");
}

// The whole denoiser of model_small in int8 against fp32 and bf16 on its committed
// weights: the model-level error of quantization, stated as a tolerance of 2e-2 ·
// max|x0 fp32| (measured 3.5e-3 on an AMD EPYC Zen 5).
TEST(PackedMatrixInt8, SmallDenoiserStaysNearFp32) {
  if (!int8_available()) GTEST_SKIP() << int8_unavailable_reason();
  const Config& config = test::small_config();
  const Index B = 2, T = 24, d = config.d_model;
  auto run = [&](Precision precision) {
    Denoiser<float> denoiser(config);
    LoadOptions options;
    options.scope = "denoiser.";
    options.pack = precision;
    load_parameters(denoiser, test::open_reference("model_small/weights.safetensors"), "denoiser.", options);
    Arena arena;
    const auto rotary = make_rotary_table<float>(arena, T, config.head_dim, config.rope_base);
    const Matrix<float> x_t = Matrix<float>::Random(B * T, d), self_cond = Matrix<float>::Random(B * T, d);
    const std::vector<float> t = {0.3f, 0.8f};
    Matrix<float> x0(B * T, d);
    Context ctx(2);
    denoiser.forward(ctx, x_t, t.data(), self_cond, B, T, rotary, x0);
    return x0;
  };
  std::srand(3);
  const Matrix<float> fp32 = run(Precision::fp32);
  std::srand(3);
  const Matrix<float> int8 = run(Precision::int8);
  const double scale = fp32.cwiseAbs().maxCoeff();
  const double worst = (int8 - fp32).cwiseAbs().maxCoeff() / scale;
  EXPECT_LE(worst, 2e-2) << "max|int8 − fp32| / max|fp32|";
  EXPECT_GT(worst, 1e-5) << "int8 gave fp32's values: its products did not run in int8";
  std::cout << "[ info ] small denoiser, max|int8 - fp32| / max|fp32| = " << worst << "\n";
}

}  // namespace
}  // namespace unit_ops_packed_matrix_int8
