// Products of activations (ops/gemm.hpp): gemm on strided blocks in both layouts with alpha
// and beta, at S = float and S = double; the bf16 products, their fused activations and
// gated adds, against double on the same operands (bf16-rounded in bf16 mode).
//
// Tolerance of the products: 1e-5 + 1e-5·|ref| with K up to 300: both sides multiply
// identical operands; only the fp32 summation order of ldlm's kernel remains.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "ldlm/ldlm.hpp"
#include "support/modules.hpp"
#include "support/reference.hpp"

namespace unit_ops_gemm {
namespace {

using namespace ldlm;
using ldlm::test::error_of;
using ldlm::test::Tolerance;
using ::testing::HasSubstr;

// gemm maps row-major operands onto the column-major BLAS call (when built with
// one); checked here against a plain double loop on strided sub-blocks, with
// alpha and beta away from 0 and 1, for both layouts of b.
template <class S>
void check_gemm_on_strided_blocks() {
  constexpr Index M = 37, N = 29, K = 70;
  const Matrix<S> big_a = Matrix<S>::Random(M + 3, K + 5), big_bt = Matrix<S>::Random(N + 2, K + 4);
  const Matrix<S> big_b = big_bt.transpose();  // [K + 4, N + 2]
  Matrix<S> c0 = Matrix<S>::Random(M + 4, N + 6);
  const auto a = big_a.block(2, 3, M, K);
  const auto bt = big_bt.block(1, 2, N, K);  // [N, K]
  const auto b = big_b.block(2, 1, K, N);    // [K, N], the same numbers
  const S alpha = S(0.75), beta = S(-0.5);
  Eigen::MatrixXd expected(M, N);
  for (Index i = 0; i < M; ++i)
    for (Index j = 0; j < N; ++j) {
      double dot = 0;
      for (Index k = 0; k < K; ++k) dot += double(a(i, k)) * double(b(k, j));
      expected(i, j) = double(alpha) * dot + double(beta) * double(c0(i + 1, j + 2));
    }
  const auto run = [&](bool transpose_b, S a_scale, S c_scale, MatRef<S> c) {
    if (transpose_b)
      gemm<S>(a, bt, true, a_scale, c_scale, c);
    else
      gemm<S>(a, b, false, a_scale, c_scale, c);
  };
  for (const bool transpose_b : {true, false}) {
    Matrix<S> c = c0;
    run(transpose_b, alpha, beta, c.block(1, 2, M, N));
    const Eigen::ArrayXXd err = (c.block(1, 2, M, N).template cast<double>() - expected).array().abs();
    EXPECT_TRUE((err <= 1e-5 + 1e-5 * expected.array().abs()).all())
        << "transpose_b = " << transpose_b << ": max |error| " << err.maxCoeff();
    // Outside the target block, c is untouched.
    Matrix<S> outside = c - c0;
    outside.block(1, 2, M, N).setZero();
    EXPECT_EQ(outside.cwiseAbs().maxCoeff(), S(0)) << "transpose_b = " << transpose_b;
    // beta = 0 never reads c: NaN already there must not survive.
    c.block(1, 2, M, N).setConstant(std::numeric_limits<S>::quiet_NaN());
    run(transpose_b, S(1), S(0), c.block(1, 2, M, N));
    EXPECT_TRUE(c.allFinite()) << "transpose_b = " << transpose_b;
  }
  // A single row, bound from a row vector.
  const Eigen::Matrix<S, 1, Eigen::Dynamic> a_row = a.row(0);
  Eigen::Matrix<S, 1, Eigen::Dynamic> c_row(N);
  gemm<S>(a_row, bt, true, S(1), S(0), c_row);
  const Eigen::RowVectorXd expected_row = a_row.template cast<double>() * b.template cast<double>();
  EXPECT_LT((c_row.template cast<double>() - expected_row).cwiseAbs().maxCoeff(), 1e-5);
  // An operand of the wrong shape is refused, not read out of bounds.
  Matrix<S> c = c0;
  const auto message = error_of<ShapeError>([&] { gemm<S>(a, b, true, S(1), S(0), c.block(1, 2, M, N)); });
  EXPECT_NE(message.find("b must be [29, 70]"), std::string::npos) << message;
}

TEST(Gemm, StridedBlocksBothLayoutsAlphaBeta) { check_gemm_on_strided_blocks<float>(); }
TEST(Gemm, StridedBlocksWithDoubleScalar) { check_gemm_on_strided_blocks<double>(); }

// The MLPs' first product writes activation(x · W + b) as the second one's bf16
// operand (PackedMatrix::multiply_activated). With W the identity, each output is the
// activation of one value: gelu_tanh and gelu_erf differ by 2.8 % of GELU's value at
// x = -2.5 and by more further left, far beyond the 2^-8 of bf16's rounding, so each
// must match its own definition (in double) and fail the other's. rtol 2^-8 + 1e-5
// (oneDNN's tanh and erf approximations), atol 1e-6.
TEST(GemmBf16, ActivatedProductsWriteEachActivationInBf16AndBf16InputsMultiplyAsRounded) {
  if (!bf16_operands_native()) GTEST_SKIP() << "no bf16 kernel: the MLPs activate and round separately";
  constexpr Index M = 40, K = 64;
  const PackedMatrix identity =
      PackedMatrix::pack(Matrix<float>::Identity(K, K), WeightLayout::out_in, Precision::bf16);
  Matrix<float> x(M, K);
  for (Index i = 0; i < x.size(); ++i) x.data()[i] = -4.0f + 8.0f * static_cast<float>(i % 97) / 96.0f;
  std::vector<float> bias(static_cast<std::size_t>(K));
  for (Index j = 0; j < K; ++j) bias[static_cast<std::size_t>(j)] = 0.03125f * static_cast<float>(j % 5);
  std::vector<std::byte> scratch_storage(identity.scratch_bytes(M) + 64);
  std::byte* scratch = scratch_storage.data() + (64 - reinterpret_cast<std::uintptr_t>(scratch_storage.data()) % 64);

  auto gelu = [](Activation a, double v) {
    return a == Activation::gelu_erf ? 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)))
                                     : 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
  };
  for (const Activation activation : {Activation::gelu_tanh, Activation::gelu_erf}) {
    const Activation other = activation == Activation::gelu_tanh ? Activation::gelu_erf : Activation::gelu_tanh;
    std::vector<bf16> y(static_cast<std::size_t>(M * K));
    identity.multiply(x.data(), K, M, bias.data(), ProductOutput::activated(y.data(), K, activation), scratch);
    double worst = 0, worst_other = 0;
    Index at = 0;
    for (Index i = 0; i < M * K; ++i) {
      const double v = double(round_to_bf16(x.data()[i])) + bias[static_cast<std::size_t>(i % K)];
      const double got = bf16_to_float(y[static_cast<std::size_t>(i)]);
      auto ratio = [&](double want) { return std::abs(got - want) / (1e-6 + (1.0 / 256 + 1e-5) * std::abs(want)); };
      if (ratio(gelu(activation, v)) > worst) worst = ratio(gelu(activation, v)), at = i;
      worst_other = std::max(worst_other, ratio(gelu(other, v)));
    }
    const double v_at = double(round_to_bf16(x.data()[at])) + bias[static_cast<std::size_t>(at % K)];
    EXPECT_LE(worst, 1.0) << "activation " << static_cast<int>(activation) << ": worst at " << at << ", got "
                          << bf16_to_float(y[static_cast<std::size_t>(at)]) << ", reference " << gelu(activation, v_at);
    EXPECT_GT(worst_other, 1.0) << "the test cannot tell activation " << static_cast<int>(activation) << " from "
                                << static_cast<int>(other);
  }

  // x already in bf16 (the activated rows) multiplies exactly as x rounded by multiply().
  Matrix<float> from_float(M, K), from_bf16(M, K);
  std::vector<bf16> xb(static_cast<std::size_t>(M * (K + 8)));  // rows 8 wider: a strided input
  for (Index r = 0; r < M; ++r) to_bf16(x.row(r).data(), K, xb.data() + r * (K + 8));
  identity.multiply(x.data(), K, M, bias.data(), ProductOutput::rows(from_float.data(), K), scratch);
  identity.multiply(xb.data(), K + 8, M, bias.data(), ProductOutput::rows(from_bf16.data(), K), scratch);
  EXPECT_TRUE(from_float == from_bf16) << "max |difference| " << (from_float - from_bf16).cwiseAbs().maxCoeff();
}

// Products of few rows (adaLN's one per sequence) are split over threads by blocks of
// output columns where the packed layout allows it. Against the same product on one
// thread, at the products' rounding (rtol 1e-5, atol 1e-6): K = 80, which the layout
// pads to 96, so a block found at n0 · K instead of n0 · 96 shows; N = 337 ends in a
// partial block; M = 3 goes through scratch, M = 1 does not; a bias shifted by a block shows.
TEST(GemmBf16, FewRowsSplitByColumnBlocksMatchOneThread) {
  // (Widened weights split by their 256-column blocks: WidenedBf16WeightsMultiply...)
  if (!bf16_operands_native()) GTEST_SKIP() << "no bf16 kernel";
  constexpr Index K = 80, N = 337;
  const PackedMatrix packed = PackedMatrix::pack(Matrix<float>::Random(N, K), WeightLayout::out_in, Precision::bf16);
  if (packed.column_block() == 0) GTEST_SKIP() << packed.kernel() << " packs no column blocks";
  std::vector<float> bias(N);
  for (Index j = 0; j < N; ++j) bias[static_cast<std::size_t>(j)] = 0.5f * static_cast<float>(j % 7);
  for (const Index M : {1, 3, 20}) {
    const Matrix<float> x = Matrix<float>::Random(M, K);
    Matrix<float> one(M, N), split(M, N);
    Context serial(1);
    linear(serial, x, packed, bias.data(), one);
    for (const int threads : {2, 6}) {  // 6: one block per thread, the last one partial (17 columns)
      Context pool(threads);
      linear(pool, x, packed, bias.data(), split);
      const Eigen::ArrayXXf ratio = (split - one).array().abs() / (1e-6f + 1e-5f * one.array().abs());
      Index r = 0, c = 0;
      EXPECT_LE(ratio.maxCoeff(&r, &c), 1.0f) << "M = " << M << ", " << threads << " threads: worst at [" << r << ", "
                                              << c << "], got " << split(r, c) << ", one thread " << one(r, c);
    }
  }
  std::vector<std::byte> scratch(packed.scratch_bytes(1) + 64);
  Matrix<float> y(1, N);
  const Matrix<float> x = Matrix<float>::Zero(1, K);
  EXPECT_THAT(ldlm::test::error_of<InvalidArgument>([&] {
                packed.multiply(x.data(), K, 1, nullptr, ProductOutput::rows(y.data(), N).block(32, 64),
                                scratch.data());
              }),
              HasSubstr("columns [32, 96) of 337 are not whole blocks of " + std::to_string(packed.column_block())));
}

// A gated residual's product on bf16 kernels adds gate ⊙ (x · W + b) to the residual
// where it writes (oneDNN's binary and sum post-ops). Against the unfused order, on
// the same bf16 products: the two differ only in how the last multiply and add round
// (an FMA or not), rtol 1e-6 of |residual| + |gate · product|. B = 3 sequences of
// T = 30 rows on 2 threads, whose row split (45 + 45) cuts the middle sequence, so
// each row must get its own sequence's gate row.
TEST(GemmBf16, GatedAddsAddTheGatedProductOfEachSequenceToTheResidual) {
  if (!bf16_operands_native()) GTEST_SKIP() << "no bf16 kernel: gated residuals add in a separate pass";
  constexpr Index B = 3, T = 30, K = 96, N = 64;
  const Matrix<float> w = Matrix<float>::Random(N, K), x = Matrix<float>::Random(B * T, K);
  const Matrix<float> gate = Matrix<float>::Random(B, N), start = Matrix<float>::Random(B * T, N);
  const std::vector<float> bias = [] {
    std::vector<float> b(N);
    for (Index j = 0; j < N; ++j) b[static_cast<std::size_t>(j)] = 0.01f * static_cast<float>(j) - 0.3f;
    return b;
  }();
  const PackedMatrix packed = PackedMatrix::pack(w, WeightLayout::out_in, Precision::bf16);
  Context ctx(2);
  Matrix<float> product(B * T, N);
  linear(ctx, x, packed, bias.data(), product);
  Matrix<float> want = start;
  for (Index r = 0; r < B * T; ++r) want.row(r) += gate.row(r / T).cwiseProduct(product.row(r));

  auto check = [&](const Matrix<float>& got, const char* input) {
    double worst = 0;
    Index at = 0;
    for (Index i = 0; i < got.size(); ++i) {
      const Index r = i / N, j = i % N;
      const double scale = std::abs(start(r, j)) + std::abs(gate(r / T, j) * product(r, j));
      const double ratio = std::abs(double(got(r, j)) - want(r, j)) / (1e-6 * scale + 1e-7);
      if (ratio > worst) worst = ratio, at = i;
    }
    EXPECT_LE(worst, 1.0) << input << ": worst at row " << at / N << ", column " << at % N << ", got "
                          << got(at / N, at % N) << ", reference " << want(at / N, at % N);
  };
  Matrix<float> residual = start;
  linear(ctx, x, packed, bias.data(), GatedResidual<float>{residual, gate, T});
  check(residual, "fp32 x");

  std::vector<bf16> xb(static_cast<std::size_t>(B * T * K));
  to_bf16(x.data(), x.size(), xb.data());
  residual = start;
  linear(ctx, BF16Rows{xb.data(), B * T, K, K}, packed, bias.data(), GatedResidual<float>{residual, gate, T});
  check(residual, "bf16 x");
}

TEST(GemmBf16, GatedAddsRejectAGateOrResidualThatDoesNotFit) {
  if (!bf16_operands_native()) GTEST_SKIP() << "no bf16 kernel";
  const PackedMatrix packed = PackedMatrix::pack(Matrix<float>::Zero(64, 32), WeightLayout::out_in, Precision::bf16);
  Context ctx;
  Matrix<float> x = Matrix<float>::Zero(6, 32), residual = Matrix<float>::Zero(6, 64);
  const Matrix<float> gate = Matrix<float>::Zero(2, 64), short_gate = Matrix<float>::Zero(2, 48);
  using ldlm::test::error_of;
  EXPECT_THAT(error_of<ShapeError>([&] {
                linear(ctx, x, packed, nullptr, GatedResidual<float>{residual, short_gate, 3});
              }),
              HasSubstr("with T = 3 needs a gate [2, 64], got [2, 48]"));
  EXPECT_THAT(error_of<ShapeError>([&] {
                linear(ctx, x, packed, nullptr, GatedResidual<float>{residual, gate, 4});
              }),
              HasSubstr("a gated residual's 6 rows are not whole sequences of T = 4"));
  EXPECT_THAT(error_of<ShapeError>([&] {
                linear(ctx, x.leftCols(16), packed, nullptr, GatedResidual<float>{residual, gate, 3});
              }),
              HasSubstr("linear: x [6, 16], weight [64, 32], y [6, 64] do not fit"));
  // A weight of no input features has no oneDNN packing: it takes the eigen path,
  // which neither gates in its product nor writes bf16. A gated residual then adds in
  // the unfused order: the product is the bias alone, gated.
  const PackedMatrix empty = PackedMatrix::pack(Matrix<float>::Zero(64, 0), WeightLayout::out_in, Precision::bf16);
  EXPECT_EQ(empty.path(), ProductPath::eigen);
  const std::vector<float> half(64, 0.5f);
  Matrix<float> twos = Matrix<float>::Constant(6, 64, 2.0f);
  linear(ctx, Matrix<float>(6, 0), empty, half.data(),
         GatedResidual<float>{twos, Matrix<float>::Constant(2, 64, 3.0f), 3});
  EXPECT_TRUE((twos.array() == 3.5f).all()) << "max " << twos.maxCoeff() << ", min " << twos.minCoeff();
  Arena arena;
  const auto activated = OperandBuffer<float>::allocate(arena, 6, 64, RowForm::bf16);
  EXPECT_THAT(
      error_of<InvalidArgument>([&] {
        linear(ctx, Matrix<float>(6, 0), empty, nullptr, ActivatedRows<float>{activated, Activation::gelu_tanh});
      }),
      HasSubstr("a bf16 output needs a weight packed for bf16 kernels (path bf16_native); this one is bf16 on "
                "eigen (path eigen)"));
}

// The denoiser block's two gated residuals go through the modules' GatedResidual
// forms. In fp32 they must give the bits of the unfused order (the module's output,
// then gated_residual_add); in bf16 the residual adds inside the last product, off
// by the rounding of one multiply-add: rtol 1e-6 of |residual| + |gate · output|.
template <class Module, class Forward>
void expect_gated_form_matches_unfused(const char* name, Precision precision, const Module& module, Index B, Index T,
                                       Forward&& forward) {
  const Index d = 64;
  const Matrix<float> x = Matrix<float>::Random(B * T, d), gate = Matrix<float>::Random(B, d);
  const Matrix<float> start = Matrix<float>::Random(B * T, d);
  Context ctx(2);
  Matrix<float> output(B * T, d), want = start, got = start;
  forward(ctx, module, x, output);
  gated_residual_add<float>(ctx, want, gate, output, T);
  forward(ctx, module, x, GatedResidual<float>{got, gate, T});
  // A residual of strided rows (a column block of wider ones) takes the unfused
  // order on every kernel: the product into the arena, then the gated add.
  Matrix<float> wide = Matrix<float>::Constant(B * T, d + 8, 7.0f);
  wide.leftCols(d) = start;
  forward(ctx, module, x, GatedResidual<float>{wide.leftCols(d), gate, T});
  EXPECT_TRUE(wide.leftCols(d) == want && (wide.rightCols(8).array() == 7.0f).all())
      << name << " " << precision_name(precision) << ", strided residual: max |difference| "
      << (wide.leftCols(d) - want).cwiseAbs().maxCoeff();
  if (precision == Precision::fp32) {
    EXPECT_TRUE(got == want) << name << " fp32: max |difference| " << (got - want).cwiseAbs().maxCoeff();
    return;
  }
  const Eigen::ArrayXXf scale = start.array().abs() + (want - start).array().abs();
  const Eigen::ArrayXXf ratio = (got - want).array().abs() / (1e-6f * scale + 1e-7f);
  Index r = 0, c = 0;
  EXPECT_LE(ratio.maxCoeff(&r, &c), 1.0f)
      << name << " bf16: worst at [" << r << ", " << c << "], got " << got(r, c) << ", reference " << want(r, c);
}

TEST(GemmBf16, GatedResidualFormsOfTheDenoiserModulesMatchTheUnfusedOrder) {
  Config config;
  config.d_model = 64, config.n_heads = 2, config.head_dim = 32;
  for (const Precision precision : {Precision::fp32, Precision::bf16}) {
    nn::FusedSelfAttention<float> attention(denoiser_attention_config(config));
    init_parameters(attention, 3, "attn.", precision);
    expect_gated_form_matches_unfused("FusedSelfAttention", precision, attention, 2, 24,
                                      [](Context& ctx, const auto& m, const Matrix<float>& x, auto&& out) {
                                        m.forward(ctx, x, 2, 24, nullptr, out);
                                      });
    nn::GeluMLP<float> mlp(config.d_model, 4 * config.d_model);
    init_parameters(mlp, 4, "mlp.", precision);
    expect_gated_form_matches_unfused(
        "GeluMLP", precision, mlp, 2, 24,
        [](Context& ctx, const auto& m, const Matrix<float>& x, auto&& out) { m.forward(ctx, x, out); });
  }
}

// On bf16 kernels the denoiser block norms straight into bf16 rows, the operand its
// products would round from float32 rows themselves: the rows, and every module's
// result from them, must be the same bits as from the float32 rows.
TEST(GemmBf16, Bf16NormedRowsGiveTheBitsOfTheFloatRowsTheyRound) {
  Config config;
  config.d_model = 64, config.n_heads = 2, config.head_dim = 32;
  constexpr Index B = 2, T = 40, d = 64;
  const Matrix<float> x = Matrix<float>::Random(B * T, d) * 3.0f, shift = Matrix<float>::Random(B, d),
                      scale = Matrix<float>::Random(B, d), gate = Matrix<float>::Random(B, d);
  nn::LayerNormGain<float> norm(d, 1e-5);
  init_parameters(norm, 5, "norm.", Precision::bf16);
  Context ctx(2);
  Matrix<float> normed(B * T, d);
  norm.forward_modulated(ctx, x, shift, scale, T, normed);
  std::vector<bf16> rows(static_cast<std::size_t>(B * T * d)), rounded(rows.size());
  norm.forward_modulated(ctx, x, shift, scale, T, rows.data());
  to_bf16(normed.data(), normed.size(), rounded.data());
  for (std::size_t i = 0; i < rows.size(); ++i)
    ASSERT_EQ(bf16_to_float(rows[i]), bf16_to_float(rounded[i])) << "element " << i;
  if (!bf16_operands_native()) GTEST_SKIP() << "no bf16 kernel: the block norms into float32 rows";

  const BF16Rows input{rows.data(), B * T, d, d};
  const Matrix<float> start = Matrix<float>::Random(B * T, d);
  nn::FusedSelfAttention<float> attention(denoiser_attention_config(config));
  init_parameters(attention, 3, "attn.", Precision::bf16);
  nn::GeluMLP<float> mlp(d, 4 * d);
  init_parameters(mlp, 4, "mlp.", Precision::bf16);
  ASSERT_TRUE(attention.input_form() == RowForm::bf16 && mlp.input_form() == RowForm::bf16);
  Matrix<float> from_float = start, from_bf16 = start;
  attention.forward(ctx, normed, B, T, nullptr, GatedResidual<float>{from_float, gate, T});
  attention.forward(ctx, input, B, T, nullptr, GatedResidual<float>{from_bf16, gate, T});
  EXPECT_TRUE(from_float == from_bf16) << "attention: max |difference| "
                                       << (from_float - from_bf16).cwiseAbs().maxCoeff();
  mlp.forward(ctx, normed, GatedResidual<float>{from_float, gate, T});
  mlp.forward(ctx, input, GatedResidual<float>{from_bf16, gate, T});
  EXPECT_TRUE(from_float == from_bf16) << "MLP: max |difference| " << (from_float - from_bf16).cwiseAbs().maxCoeff();

  // Inside the attention module, attention writes attn_out's bf16 operand itself: the
  // bits of attn_out rounding attention's float result.
  {
    Arena::Scope scope(ctx.arena());
    MatrixMap<float> qkv(ctx.arena().allocate<float>(B * T * 3 * d), B * T, 3 * d);
    attention.attn_qkv.forward(ctx, normed, qkv);
    Matrix<float> a(B * T, d), unfused = start, fused = start;
    nn::detail::attend_qkv<float>(ctx, attention.config, Precision::bf16, qkv, B, T, nullptr, a.data());
    attention.attn_out.forward(ctx, a, GatedResidual<float>{unfused, gate, T});
    attention.forward(ctx, normed, B, T, nullptr, GatedResidual<float>{fused, gate, T});
    EXPECT_TRUE(fused == unfused) << "attention through bf16 rows of its own: max |difference| "
                                  << (fused - unfused).cwiseAbs().maxCoeff();
  }

  // bf16 rows only feed bf16 kernels.
  nn::GeluMLP<float> fp32_mlp(d, 4 * d);
  init_parameters(fp32_mlp, 4, "mlp.", Precision::fp32);
  EXPECT_EQ(fp32_mlp.input_form(), RowForm::fp32);
  EXPECT_THAT(ldlm::test::error_of<InvalidArgument>([&] {
                fp32_mlp.forward(ctx, input, GatedResidual<float>{from_bf16, gate, T});
              }),
              HasSubstr("PackedMatrix [256, 64]: a bf16 input needs a weight packed for bf16 kernels (path "
                        "bf16_native); this one is fp32 on"));
}

// On bf16 kernels each MLP's first product applies the activation itself
// (up_activate_down_bf16): it must be the module's own, which the module tests
// against PyTorch cannot tell from the other GELU (bf16 rounding hides their gap at
// small arguments). Inputs in [-4, 4] and up weights scaled by 4 give pre-activations
// of standard deviation 2–5, where the two GELUs differ by several bf16 ulps (2.8 % of
// the value at -2.5). The down map copies the first d hidden values (weight a
// selection, bias zero), so the output is those bf16 values themselves. The reference
// is the unfused order: up's product in fp32, ldlm's fp32 activation, one rounding.
// oneDNN's activation differs from ldlm's by float ulps, which can turn a value into
// its bf16 neighbour: rtol 2^-7 (one bf16 ulp), atol 1e-6 (the far negative tail,
// where both compute a cancelling 1 + erf or 1 + tanh). The other GELU must fail it.
// Every form of each module's forward: GeluMLP's gated ones (residual zero, gate one,
// so the residual becomes the output), on float and on bf16 rows, are the
// denoiser's.
TEST(GemmBf16, EachMlpFusesItsOwnActivation) {
  if (!bf16_operands_native()) GTEST_SKIP() << "no bf16 kernel: the MLPs activate and round separately";
  std::srand(7);
  constexpr Index rows = 48, d = 64;
  Context ctx(2);
  const Matrix<float> x = Matrix<float>::Random(rows, d) * 4.0f;
  std::vector<bf16> x_bf16(static_cast<std::size_t>(rows * d));
  to_bf16(x.data(), x.size(), x_bf16.data());
  const BF16Rows x_rows{x_bf16.data(), rows, d, d};
  const Matrix<float> gate = Matrix<float>::Ones(1, d);
  using Form = std::function<void(Matrix<float>&)>;

  auto check = [&](const char* name, auto& module, const std::string& up_weight, const std::string& down,
                   const auto& up, Activation own, const std::vector<std::pair<const char*, Form>>& forms) {
    init_parameters(module, 6, "", std::nullopt);
    module.visit("", [&](const std::string& parameter, auto& p) {
      if (parameter == up_weight) {
        for (std::int64_t i = 0; i < p.numel(); ++i) p.data()[i] *= 4.0f;
      } else if (parameter == down + "weight") {  // [d, h] or Conv1D's [h, d]: ones at (j, j)
        std::fill_n(p.data(), p.numel(), 0.0f);
        for (Index j = 0; j < d; ++j) p.data()[j * p.shape()[1] + j] = 1.0f;
      } else if (parameter == down + "bias") {
        std::fill_n(p.data(), p.numel(), 0.0f);
      }
      pack_if_matmul_weight(p, Precision::bf16);
    });
    Matrix<float> up_input = x;
    if constexpr (requires { module.norm; }) module.norm.forward(ctx, x, up_input);
    auto unfused = [&](Activation activation) {
      Matrix<float> h(rows, up.out_features());
      up.forward(ctx, up_input, h);
      for (Index r = 0; r < rows; ++r) activation_inplace<float>(activation)(h.row(r).data(), h.cols());
      round_to_bf16(h.data(), h.size(), h.data());
      return Matrix<float>(h.leftCols(d));
    };
    const Activation other = own == Activation::gelu_tanh ? Activation::gelu_erf : Activation::gelu_tanh;
    const Matrix<float> want = unfused(own), wrong = unfused(other);
    constexpr Tolerance kOneBf16Ulp{1e-6, 1.0 / 128};
    for (const auto& [form, forward] : forms) {
      Matrix<float> fused = Matrix<float>::Zero(rows, d);
      forward(fused);
      // Appended in place: GCC 12 warns (-Warray-bounds, falsely) on std::string(name) + ", " + form.
      std::string what = name;
      what += ", ";
      what += form;
      EXPECT_TRUE(ldlm::test::all_close(what, fused.data(), want.data(), Shape{rows, d}, kOneBf16Ulp));
      EXPECT_FALSE(ldlm::test::all_close(what + " against the other GELU", fused.data(), wrong.data(), Shape{rows, d},
                                         kOneBf16Ulp));
    }
  };
  {
    nn::PerceiverFFN<float> ffn(d, 4 * d, 1e-5);
    check("PerceiverFFN (gelu_erf)", ffn, "ffd.1.weight", "ffd.4.", ffn.up, Activation::gelu_erf,
          {{"rows", [&](Matrix<float>& y) { ffn.forward(ctx, x, y); }}});
  }
  {
    nn::GeluMLP<float> mlp(d, 4 * d);
    check("GeluMLP (gelu_tanh)", mlp, "0.weight", "2.", mlp.fc1, Activation::gelu_tanh,
          {{"rows", [&](Matrix<float>& y) { mlp.forward(ctx, x, y); }},
           {"gated residual",
            [&](Matrix<float>& y) {
              mlp.forward(ctx, x, GatedResidual<float>{y, gate, rows});
            }},
           {"bf16 rows, gated residual", [&](Matrix<float>& y) {
              mlp.forward(ctx, x_rows, GatedResidual<float>{y, gate, rows});
            }}});
  }
  {
    nn::GPT2MLP<float> mlp(d, 4 * d, Role::frozen);
    check("GPT2MLP (gelu_tanh)", mlp, "c_fc.weight", "c_proj.", mlp.c_fc, Activation::gelu_tanh,
          {{"rows", [&](Matrix<float>& y) { mlp.forward(ctx, x, y); }}});
  }
}

// Attention's bf16 products (gemm_bf16) on fixed-shape primitives: alpha and beta are
// baked into each primitive and part of its cache key, dense operands get oneDNN's
// blocked (AMX) kernels and strided ones its GEMM inside the same primitive. Every
// combination against double on the same bf16 operands, at the products' tolerance.
TEST(GemmBf16, FixedShapeProductsMatchDoubleForEveryLayoutStrideAlphaAndBeta) {
  if (!bf16_operands_native()) GTEST_SKIP() << "no bf16 kernel: attention rounds fp32 operands instead";
  std::srand(5);
  constexpr Index M = 70, N = 90, K = 64;
  auto bf16_matrix = [](Index rows, Index cols) {
    const Matrix<float> values = Matrix<float>::Random(rows, cols);
    std::vector<bf16> out(static_cast<std::size_t>(rows * cols));
    to_bf16(values.data(), values.size(), out.data());
    return out;
  };
  // Both operands inside wider buffers: row stride `pad` more than the extent.
  for (const Index pad : {Index(0), Index(24)}) {
    const Index lda = K + pad, ldb_n = K + pad, ldb_k = N + pad;
    const std::vector<bf16> a = bf16_matrix(M, lda), b_nk = bf16_matrix(N, ldb_n), b_kn = bf16_matrix(K, ldb_k);
    const Matrix<float> c0 = Matrix<float>::Random(M, N);
    for (const bool transpose_b : {true, false})
      for (const float alpha : {0.125f, 1.0f})  // the same shape twice: alpha must key the primitive
        for (const float beta : {0.0f, -0.5f}) {
          SCOPED_TRACE(testing::Message()
                       << "pad " << pad << ", transpose_b " << transpose_b << ", alpha " << alpha << ", beta " << beta);
          Matrix<float> c = c0;
          const BF16Rows b = transpose_b ? BF16Rows{b_nk.data(), N, K, ldb_n} : BF16Rows{b_kn.data(), K, N, ldb_k};
          gemm_bf16({a.data(), M, K, lda}, b, transpose_b, alpha, beta, c);
          double worst = 0, worst_want = 0;
          Index wi = 0, wj = 0;
          for (Index i = 0; i < M; ++i)
            for (Index j = 0; j < N; ++j) {
              double dot = 0;
              for (Index k = 0; k < K; ++k)
                dot += double(bf16_to_float(a[i * lda + k])) *
                       double(bf16_to_float(transpose_b ? b_nk[j * ldb_n + k] : b_kn[k * ldb_k + j]));
              const double want = alpha * dot + beta * double(c0(i, j));
              const double scaled = std::abs(c(i, j) - want) / (1e-5 + 1e-5 * std::abs(want));
              if (scaled > worst) std::tie(worst, worst_want, wi, wj) = std::tuple(scaled, want, i, j);
            }
          EXPECT_LE(worst, 1.0) << "worst at [" << wi << ", " << wj << "]: got " << c(wi, wj) << ", reference "
                                << worst_want << " (tolerance 1e-5 + 1e-5·|ref|)";
        }
  }
}

}  // namespace
}  // namespace unit_ops_gemm
