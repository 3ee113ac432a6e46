// Parity of every primitive with its PyTorch dump in tests/data/primitives, and
// proof that the dumps catch the classic bugs: a swapped GELU, a dropped d^-1/2
// position scale, sqrt(mean + eps) instead of the RMS clamp, the interleaved
// rotary pairing. Several primitives also run with S = double: the scalar is a
// template parameter and must work for both.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ldlm/io/state_dict.hpp"
#include "ldlm/ldlm.hpp"
#include "support/errors.hpp"
#include "support/reference.hpp"

namespace {

using ldlm::test::bitwise_equal;
using ldlm::test::error_of;
using ldlm::test::expect_matches;

using namespace ldlm;
using ldlm::test::matches_reference;
using ldlm::test::max_abs_diff;
using ldlm::test::open_reference;
using ldlm::test::read_tensor;
using ldlm::test::Tolerance;

// The float32 target for every primitive, at S = float and S = double alike
// (support/reference.hpp says why): 1e-5 + 1e-5·|ref|. No case needs more.
constexpr Tolerance kTol = ldlm::test::kFp32Dump;
// A planted bug must move the result by far more than the tolerance: at least 100×.
constexpr double kBugGap = 100 * kTol.atol;

/// Fills every parameter of `module` from the dump's `param.<name>` tensors; every
/// param.* tensor must be claimed (strict loading), so a misnamed parameter fails.
template <class M>
void load_case_parameters(M& module, const SafetensorsFile& file, bool reject_unexpected = true) {
  LoadOptions options;
  options.scope = "param.";
  options.reject_unexpected = reject_unexpected;
  load_parameters(module, file, "param.", options);
}

template <class S, int Rank>
Tensor<S, Rank> zeros_like(const Tensor<S, Rank>& t) {
  Tensor<S, Rank> z(t.dimensions());
  z.setZero();
  return z;
}

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

TEST(LayerNormGain, MatchesReferenceAtD768) { check_layer_norm_gain<float>(); }
TEST(LayerNormGain, MatchesReferenceWithDoubleScalar) { check_layer_norm_gain<double>(); }

TEST(LayerNormGain, HasExactlyOneGainPerFeature) {
  const nn::LayerNormGain<float> norm(768, 1e-5);
  const ParameterCounts counts = count_parameters(norm);
  EXPECT_EQ(counts.total(), 768);
  EXPECT_EQ(counts.trained, 768);
}

TEST(LayerNormBias, MatchesReference) {
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

TEST(RmsNorm, MatchesReference) { check_rms_norm<float>(); }
TEST(RmsNorm, MatchesReferenceWithDoubleScalar) { check_rms_norm<double>(); }

// Row [1, 3] of the input is scaled by 1e-7 so its RMS is below eps: only the clamp
// max(rms, eps) reproduces it; sqrt(mean + eps) or an unclamped rms would not.
TEST(RmsNorm, ClampedRowMatchesAndTheClampIsLive) {
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

// ------------------------------------------------------------------------- linear

template <class S>
void check_linear_free_function() {
  const auto file = open_reference("primitives/linear.safetensors");
  const auto x = read_tensor<S, 3>(file, "input.x");
  const auto w = read_tensor<S, 2>(file, "param.weight");
  const auto b = read_tensor<S, 1>(file, "param.bias");
  Tensor3<S> y(2, 7, 40), y_nobias(2, 7, 40);
  Context ctx;
  linear<S>(ctx, as_matrix(x), as_matrix(w), b.data(), as_matrix(y));
  linear<S>(ctx, as_matrix(x), as_matrix(w), nullptr, as_matrix(y_nobias));
  const std::string variant = std::is_same_v<S, double> ? " (ldlm::linear, double)" : " (ldlm::linear)";
  expect_matches(y, file, "output.y", kTol, variant);
  expect_matches(y_nobias, file, "output.y_nobias", kTol, variant);
}

TEST(Linear, FreeFunctionWithAndWithoutBias) { check_linear_free_function<float>(); }
TEST(Linear, FreeFunctionWithDoubleScalar) { check_linear_free_function<double>(); }

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

TEST(Linear, ModuleWithAndWithoutBias) {
  const auto file = open_reference("primitives/linear.safetensors");
  nn::Linear<float> with_bias(24, 40, true), without_bias(24, 40, false);
  load_case_parameters(with_bias, file);
  // The bias-free module does not claim param.bias.
  load_case_parameters(without_bias, file, /*reject_unexpected=*/false);
  const auto x = read_tensor<float, 3>(file, "input.x");
  Tensor3<float> y(2, 7, 40), y_nobias(2, 7, 40);
  Context ctx;
  with_bias.forward(ctx, as_matrix(x), as_matrix(y));
  without_bias.forward(ctx, as_matrix(x), as_matrix(y_nobias));
  expect_matches(y, file, "output.y", kTol, " (nn::Linear)");
  expect_matches(y_nobias, file, "output.y_nobias", kTol, " (nn::Linear)");
}

// -------------------------------------------------------------------- activations

template <class S>
Tensor1<S> apply_activation(const Tensor1<S>& x, void (*activation)(S*, Index)) {
  Tensor1<S> y = x;
  activation(y.data(), y.size());
  return y;
}

template <class S>
void check_activations() {
  const auto file = open_reference("primitives/activations.safetensors");
  const auto x = read_tensor<S, 1>(file, "input.x");
  const std::string variant = std::is_same_v<S, double> ? " (double)" : "";
  expect_matches(apply_activation<S>(x, gelu_erf_inplace<S>), file, "output.gelu_erf", kTol, variant);
  expect_matches(apply_activation<S>(x, gelu_tanh_inplace<S>), file, "output.gelu_tanh", kTol, variant);
  expect_matches(apply_activation<S>(x, silu_inplace<S>), file, "output.silu", kTol, variant);
}

TEST(Activations, MatchReference) { check_activations<float>(); }
TEST(Activations, MatchReferenceWithDoubleScalar) { check_activations<double>(); }

// The Perceiver FFN needs the exact (erf) GELU, the denoiser the tanh one: the dump
// must tell them apart, so swapping them anywhere is caught. The two forms differ by
// at most ~4.7e-4 (near |x| = 2): ~47× the tolerance, not 100×, hence a gap of its own.
TEST(Activations, SwappingTheGeluFormsIsCaught) {
  constexpr double kGeluGap = 20 * kTol.atol;
  const auto file = open_reference("primitives/activations.safetensors");
  const auto x = read_tensor<float, 1>(file, "input.x");
  const auto gelu_erf_ref = read_tensor<float, 1>(file, "output.gelu_erf");
  const auto gelu_tanh_ref = read_tensor<float, 1>(file, "output.gelu_tanh");
  const auto tanh_result = apply_activation<float>(x, gelu_tanh_inplace<float>);
  const auto erf_result = apply_activation<float>(x, gelu_erf_inplace<float>);
  EXPECT_FALSE(matches_reference(tanh_result, file, "output.gelu_erf", kTol));
  EXPECT_FALSE(matches_reference(erf_result, file, "output.gelu_tanh", kTol));
  EXPECT_GT(max_abs_diff(tanh_result, gelu_erf_ref), kGeluGap);
  EXPECT_GT(max_abs_diff(erf_result, gelu_tanh_ref), kGeluGap);
}

// A row's values must not depend on where the row starts: Eigen's vector
// expressions peel elements up to an aligned address, and a kernel that computed
// those (or the tail) with other functions than the body would round them
// differently. Each activation runs on the first n of the same 1000 values, for
// lengths from 0 to 1000 and at 16 offsets from a 64-byte boundary, against the
// whole row at offset 0 bit for bit.
template <class S>
void expect_values_independent_of_the_rows_address() {
  constexpr Index kLength = 1000, kOffsets = 16;
  std::mt19937 generator(11);
  std::normal_distribution<S> normal(S(0), S(3));
  std::vector<S> x(static_cast<std::size_t>(kLength));
  for (S& v : x) v = normal(generator);
  struct Named {
    const char* name;
    void (*activation)(S*, Index);
  };
  for (const Named& f : {Named{"gelu_tanh", gelu_tanh_inplace<S>}, Named{"gelu_erf", gelu_erf_inplace<S>},
                         Named{"silu", silu_inplace<S>}}) {
    alignas(64) std::array<S, static_cast<std::size_t>(kLength + kOffsets)> buffer;
    std::copy(x.begin(), x.end(), buffer.begin());
    f.activation(buffer.data(), kLength);
    const std::vector<S> whole_row(buffer.begin(), buffer.begin() + kLength);
    for (Index n : {kLength, Index(0), Index(1), Index(7), Index(15), Index(16), Index(17), Index(33)})
      for (Index offset = 0; offset < kOffsets; ++offset) {
        S* const row = buffer.data() + offset;
        std::copy_n(x.begin(), n, row);
        f.activation(row, n);
        EXPECT_TRUE(bitwise_equal(std::string(f.name) + " (" + std::to_string(sizeof(S)) +
                                      "-byte values), n = " + std::to_string(n) + " at offset " +
                                      std::to_string(offset) + ", against the whole row at offset 0",
                                  row, whole_row.data(), static_cast<std::size_t>(n)));
      }
  }
}

TEST(Activations, ValuesDoNotDependOnTheRowsAddress) {
  expect_values_independent_of_the_rows_address<float>();
  expect_values_independent_of_the_rows_address<double>();
}

// ------------------------------------------------------------------ feed-forwards

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

TEST(SwiGLU, MatchesReference) { check_swiglu<float>(); }
TEST(SwiGLU, MatchesReferenceWithDoubleScalar) { check_swiglu<double>(); }

TEST(PerceiverFFN, MatchesReference) {
  const auto file = open_reference("primitives/perceiver_ffn.safetensors");
  nn::PerceiverFFN<float> ffn(32, 128, 1e-5);
  load_case_parameters(ffn, file);
  const auto x = read_tensor<float, 3>(file, "input.x");
  auto y = zeros_like(x);
  Context ctx;
  ffn.forward(ctx, as_matrix(x), as_matrix(y));
  expect_matches(y, file, "output.y", kTol);
}

// ---------------------------------------------------------- modulation and masking

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

TEST(ScaleMask, ChecksTheOutputShape) {
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

// The norms check x, the gain's length (x's width) and y together, and name all three.
TEST(Norms, CheckShapes) {
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

TEST(ScaleMask, MatchesReference) {
  const auto file = open_reference("primitives/scale_mask.safetensors");
  nn::ScaleMask<float> scale_mask;
  load_case_parameters(scale_mask, file);
  const auto x = read_tensor<float, 3>(file, "input.x");
  auto y = zeros_like(x);
  Context ctx;
  scale_mask.forward(ctx, as_matrix(x), as_matrix(y));
  expect_matches(y, file, "output.y", kTol);
}

// ------------------------------------------------------------ position embeddings

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

TEST(Positions, MatchReference) { check_positions<float>(); }
TEST(Positions, MatchReferenceWithDoubleScalar) { check_positions<double>(); }

TEST(Positions, DroppingTheScaleIsCaught) {
  const auto file = open_reference("primitives/positions.safetensors");
  const auto table = read_tensor<float, 2>(file, "param.emb.weight");
  const Tensor2<float> unscaled = table.slice(std::array<Index, 2>{0, 0}, std::array<Index, 2>{7, 16});
  EXPECT_FALSE(matches_reference(unscaled, file, "output.pos", kTol));
  EXPECT_GT(max_abs_diff(unscaled, read_tensor<float, 2>(file, "output.pos")), kBugGap);
}

TEST(Positions, AddPositionsChecksShapes) {
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

TEST(TimestepEmbedding, CosSinMatchesAndFlipSwitchGivesSinCos) {
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

// ------------------------------------------------------------------------- rotary

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
