// Weights packed once (ops/packed_matrix.hpp): their products against double on the same
// operands for every shape, layout and stride, in fp32 and bf16; resident bytes, widened
// bf16 weights, and the released plain values.
//
// Tolerance of the products: 1e-5 + 1e-5·|ref| with K up to 300: both sides multiply
// identical operands (bf16-rounded in bf16 mode); only the fp32 summation order of
// ldlm's kernel remains.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <optional>
#include <sstream>
#include <string>

#include "ldlm/ldlm.hpp"
#include "support/modules.hpp"
#include "support/reference.hpp"

namespace unit_ops_packed_matrix {
namespace {

using namespace ldlm;
using ::testing::HasSubstr;

/// y = x·Wᵀ + b in double, on operands rounded to bf16 when `bf16`.
Eigen::MatrixXd reference_linear(const Matrix<float>& x, const Matrix<float>& w_out_in, const Vector<float>* bias,
                                 bool bf16_operands) {
  auto operand = [&](const Matrix<float>& m) {
    Matrix<float> r = m;
    if (bf16_operands) round_to_bf16(r.data(), r.size(), r.data());
    return Eigen::MatrixXd(r.cast<double>());
  };
  Eigen::MatrixXd y = operand(x) * operand(w_out_in).transpose();
  if (bias) y.rowwise() += bias->cast<double>().transpose();
  return y;
}

struct ProductCase {
  Index M, N, K;
};

class PackedMatrixProduct : public ::testing::TestWithParam<Precision> {};

TEST_P(PackedMatrixProduct, MatchesDoubleOnTheSameOperandsForEveryShapeLayoutAndStride) {
  const Precision precision = GetParam();
  const bool bf16_mode = precision == Precision::bf16;
  // Row counts around the per-task minimum (16) and a tall one; odd N and K.
  for (const ProductCase c : {ProductCase{1, 40, 24}, {3, 29, 70}, {16, 64, 64}, {37, 130, 300}, {300, 33, 17}}) {
    SCOPED_TRACE(testing::Message() << "M " << c.M << ", N " << c.N << ", K " << c.K);
    const Matrix<float> w = Matrix<float>::Random(c.N, c.K);  // [out, in]
    const Vector<float> b = Vector<float>::Random(c.N);
    const Matrix<float> big_x = Matrix<float>::Random(c.M + 2, c.K + 3);
    const auto x = big_x.block(1, 2, c.M, c.K);  // strided rows
    for (const WeightLayout layout : {WeightLayout::out_in, WeightLayout::in_out}) {
      const Matrix<float> stored = layout == WeightLayout::out_in ? w : Matrix<float>(w.transpose());
      const PackedMatrix packed = PackedMatrix::pack(stored, layout, precision);
      EXPECT_EQ(packed.precision(), precision);
      EXPECT_EQ(packed.weight_shape(), (Shape{stored.rows(), stored.cols()}));
      for (const bool with_bias : {true, false}) {
        for (const int threads : {1, 2}) {
          Context ctx(threads);
          Matrix<float> big_y = Matrix<float>::Constant(c.M + 1, c.N + 4, 7.0f);
          auto y = big_y.block(1, 3, c.M, c.N);  // strided output
          linear(ctx, x, packed, with_bias ? b.data() : nullptr, y);
          const Eigen::MatrixXd want = reference_linear(x, w, with_bias ? &b : nullptr, bf16_mode);
          const Eigen::ArrayXXd err = (big_y.block(1, 3, c.M, c.N).cast<double>() - want).array().abs();
          EXPECT_TRUE((err <= 1e-5 + 1e-5 * want.array().abs()).all())
              << "layout " << int(layout) << ", bias " << with_bias << ", threads " << threads << ": max |error| "
              << err.maxCoeff();
          Matrix<float> outside = big_y;
          outside.block(1, 3, c.M, c.N).setConstant(7.0f);
          EXPECT_TRUE((outside.array() == 7.0f).all()) << "wrote outside y";
        }
      }
    }
  }
}

TEST_P(PackedMatrixProduct, Bf16DiffersFromFp32ByTheOperandRounding) {
  // The mode is not vacuous: bf16 products are off from fp32 by about 2^-9 relative
  // per operand, far beyond the 1e-5 that the fp32 products hold.
  const Precision precision = GetParam();
  const Matrix<float> w = Matrix<float>::Random(64, 96), x = Matrix<float>::Random(32, 96);
  Context ctx;
  Matrix<float> y(32, 64);
  linear(ctx, x, PackedMatrix::pack(w, WeightLayout::out_in, precision), nullptr, y);
  const double err = (y.cast<double>() - reference_linear(x, w, nullptr, false)).cwiseAbs().maxCoeff();
  if (precision == Precision::bf16)
    EXPECT_GT(err, 1e-3);
  else
    EXPECT_LT(err, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Precisions, PackedMatrixProduct, ::testing::Values(Precision::fp32, Precision::bf16),
                         [](const auto& info) { return std::string(precision_name(info.param)); });

TEST(PackedMatrixProduct, ShapeErrorsNameTheWeight) {
  const PackedMatrix packed = PackedMatrix::pack(Matrix<float>::Zero(192, 64), WeightLayout::out_in, Precision::bf16);
  Context ctx;
  Matrix<float> x(5, 32), y(5, 192);
  EXPECT_THAT(ldlm::test::error_of<ShapeError>([&] { linear(ctx, x, packed, nullptr, y); }),
              HasSubstr("linear: x [5, 32], weight [192, 64], y [5, 192] do not fit"));
}

// On bf16 kernels and on fp32 kernels alike (widened blocks): the memory target of
// the bf16 mode holds on every CPU.
TEST(PackedMatrixWeights, Bf16HalvesTheResidentBytesOnEveryPath) {
  const Matrix<float> w = Matrix<float>::Random(768, 3072);
  const auto fp32 = PackedMatrix::pack(w, WeightLayout::out_in, Precision::fp32);
  const auto bf16 = PackedMatrix::pack(w, WeightLayout::out_in, Precision::bf16);
  EXPECT_GE(fp32.bytes(), std::size_t(768) * 3072 * 4);
  EXPECT_LE(bf16.bytes(), std::size_t(768) * 3072 * 2 + 4096) << bf16.kernel();
  EXPECT_EQ(bf16.path() == ProductPath::bf16_widened, !bf16_operands_native()) << bf16.kernel();
}

// Without bf16 kernels a bf16 weight stays in bf16 and each block of its columns is
// widened right before the fp32 kernels multiply it: the product is the fp32 one of
// the bf16-rounded weight and input, up to summation order (rtol 1e-5, atol 1e-5 for
// sums near zero of K terms of order 1). Both layouts; K = 70 and N = 600, three
// blocks, the last one partial, so a block found at the wrong offset shows; a square
// 300 x 300 weight, where a transposed block would still fit; row strides wider than
// the rows; with and without bias; 1, 3 and 40 rows, which 2 threads split by
// column blocks (1, 3) or by rows (40), and 300, rounded in chunks of kWidenedRows
// with a partial last one. (Planted: every block of a product read from the first
// block of its range, and the out_in weight read as in_out; both fail. Every chunk
// of rows read from the first chunk's rows; fails.)
TEST(PackedMatrixWeights, WidenedBf16WeightsMultiplyAsTheRoundedFp32Product) {
  const Matrix<float> probe = Matrix<float>::Random(8, 8);
  if (PackedMatrix::pack(probe, WeightLayout::out_in, Precision::bf16).path() != ProductPath::bf16_widened)
    GTEST_SKIP() << "bf16 runs on bf16 kernels here; ldlm_path_avx2 and ldlm_path_eigen take this path";
  struct Case {
    Index K, N;
    WeightLayout layout;
  };
  for (const Case c : {Case{70, 600, WeightLayout::out_in}, Case{70, 600, WeightLayout::in_out},
                       Case{300, 300, WeightLayout::out_in}, Case{300, 300, WeightLayout::in_out}}) {
    const bool out_in = c.layout == WeightLayout::out_in;
    const Matrix<float> w = Matrix<float>::Random(out_in ? c.N : c.K, out_in ? c.K : c.N);
    Matrix<float> w_rounded = w;
    round_to_bf16(w_rounded.data(), w_rounded.size(), w_rounded.data());
    const PackedMatrix widened = PackedMatrix::pack(w, c.layout, Precision::bf16);
    const PackedMatrix reference = PackedMatrix::pack(w_rounded, c.layout, Precision::fp32);
    ASSERT_EQ(widened.path(), ProductPath::bf16_widened);
    EXPECT_EQ(widened.column_block(), PackedMatrix::kWidenedBlock);
    const Matrix<float> bias_row = Matrix<float>::Random(1, c.N);
    for (const bool with_bias : {false, true})
      for (const Index M : {Index{1}, Index{3}, Index{40}, 2 * PackedMatrix::kWidenedRows + 44})
        for (const int threads : {1, 2}) {
          const Matrix<float> x_wide = Matrix<float>::Random(M, c.K + 5);
          const ConstMatRef<float> x = x_wide.leftCols(c.K);
          Matrix<float> x_rounded = x;
          round_to_bf16(x_rounded.data(), x_rounded.size(), x_rounded.data());
          Matrix<float> got_wide = Matrix<float>::Constant(M, c.N + 3, 7.0f), want(M, c.N);
          MatRef<float> got = got_wide.leftCols(c.N);
          const float* bias = with_bias ? bias_row.data() : nullptr;
          Context ctx(threads);
          linear(ctx, x, widened, bias, got);
          linear(ctx, x_rounded, reference, bias, want);
          const Eigen::ArrayXXf ratio = (got - want).array().abs() / (1e-5f + 1e-5f * want.array().abs());
          Index r = 0, col = 0;
          EXPECT_LE(ratio.maxCoeff(&r, &col), 1.0f)
              << "K " << c.K << ", N " << c.N << (out_in ? " [out, in]" : " [in, out]") << ", M " << M << ", "
              << threads << " threads" << (with_bias ? ", bias" : "") << ": worst at [" << r << ", " << col << "], got "
              << got(r, col) << ", reference " << want(r, col);
          EXPECT_TRUE((got_wide.rightCols(3).array() == 7.0f).all()) << "wrote past the row";
        }
  }
}

#if defined(LDLM_HAVE_ONEDNN)
// The fused forms of a packed product (the MLPs' activated first product, the gated
// residual add of attn_out and fc2) are only worth having on the plain product's
// kernel: oneDNN takes a post-op chain its blocked kernel cannot run to a slower
// implementation, silently. Every ldlm-base weight shape, at one row and at many.
TEST(PackedMatrixWeights, FusedProductsRunOnThePlainProductsKernel) {
  if (gemm_backend() != GemmBackend::onednn || !bf16_operands_native())
    GTEST_SKIP() << "no oneDNN bf16 kernel: the products are not fused";
  namespace dd = ldlm::detail::onednn;
  const std::array<std::array<Index, 2>, 4> out_in = {{{768, 768}, {3 * 768, 768}, {3072, 768}, {768, 3072}}};
  for (const auto& [N, K] : out_in) {
    const dd::memory::desc weights = dd::packed_weight_desc(N, K, dd::memory::data_type::bf16);
    for (const Index M : {Index(1), Index(40), Index(1024)}) {
      const std::string plain = dd::packed_matmul(weights, M, true).kernel;
      std::ostringstream where;
      where << "[" << M << ", " << K << "] x [" << K << ", " << N << "]";
      EXPECT_TRUE(dd::bf16_instructions(plain)) << where.str() << ": " << plain;
      EXPECT_EQ(dd::packed_matmul(weights, M, true, Activation::none, /*gated=*/true).kernel, plain) << where.str();
      EXPECT_EQ(dd::packed_matmul(weights, M, false, Activation::none, /*gated=*/true).kernel, plain) << where.str();
      for (const Activation activation : {Activation::gelu_tanh, Activation::gelu_erf})
        EXPECT_EQ(dd::packed_matmul(weights, M, true, activation).kernel, plain)
            << where.str() << ", activation " << static_cast<int>(activation);
    }
  }
}
#endif

TEST(PackedMatrixWeights, PackingReleasesThePlainValuesWithAClearError) {
  nn::Linear<float> layer(8, 4, true);
  init_parameters(layer, 1, "layer.", Precision::bf16);
  EXPECT_EQ(layer.precision(), Precision::bf16);
  ASSERT_NE(layer.weight.packed(), nullptr);
  EXPECT_THAT(ldlm::test::error_of<Error>([&] { (void)std::as_const(layer.weight).matrix(); }),
              HasSubstr("packed for the matrix products and its plain values released"));
  // Plain loading keeps them, and the layer then runs on the plain fp32 path.
  nn::Linear<float> plain(8, 4, true);
  init_parameters(plain, 1, "layer.", std::nullopt);
  EXPECT_EQ(plain.weight.packed(), nullptr);
  EXPECT_EQ(plain.precision(), Precision::fp32);
  EXPECT_NO_THROW((void)std::as_const(plain.weight).matrix());
}

}  // namespace
}  // namespace unit_ops_packed_matrix
