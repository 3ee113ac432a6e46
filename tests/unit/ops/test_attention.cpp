// Parity of the four attention modules with their PyTorch dumps (B = 2, T = 37: a
// partial query tile), the kernel against a naive double-precision attention
// beyond one tile (T = tile + 44, Tq != Tk, causal, softcap), proof that the
// dumps catch the classic bugs (interleaved rotary, softcap before the scale, q/k
// norm over the full width, no softcap), shape errors with their messages, and
// agreement across thread counts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ldlm/io/state_dict.hpp"
#include "ldlm/ldlm.hpp"
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
using ::testing::HasSubstr;

// float32 against the dumps (support/reference.hpp): 1e-5 + 1e-5·|ref|; no case needs more.
constexpr Tolerance kTol = ldlm::test::kFp32Dump;
// The float32 kernel against the naive float64 attention: the same target.
constexpr Tolerance kKernelTol{1e-5, 1e-5};
// The double kernel against the naive float64 attention: both are float64, so only
// summation order separates them.
constexpr Tolerance kDoubleKernelTol{1e-12, 1e-12};
// A planted bug must move the result by far more than the tolerance: at least 100×.
constexpr double kBugGap = 100 * kTol.atol;
// Different thread counts split GEMMs differently; the results may differ by rounding only.
constexpr double kThreadTol = 1e-6;

/// Fills every parameter of `module` from the dump's `param.<name>` tensors (strict:
/// every param.* tensor must be claimed).
template <class M>
void load_case_parameters(M& module, const SafetensorsFile& file) {
  LoadOptions options;
  options.scope = "param.";
  load_parameters(module, file, "param.", options);
}

/// The module's configuration from the case's `config` metadata.
nn::AttentionModuleConfig config_of(const SafetensorsFile& file) {
  const auto config = nlohmann::json::parse(file.metadata().at("config"));
  nn::AttentionModuleConfig s;
  s.d_model = config.at("d_model").get<Index>();
  s.heads = config.at("n_heads").get<Index>();
  s.head_dim = config.at("head_dim").get<Index>();
  s.options.softcap = config.at("softcap").get<double>();
  s.rope_base = config.at("rope_base").get<double>();
  s.rms_eps = config.at("eps").get<double>();
  s.rotary = config.at("rotary").get<std::string>() == "half_split";
  s.options.causal = config.value("causal", false);
  return s;
}

/// The bug's output must fail the tolerance against the true reference, by far.
template <class S, int Rank>
void expect_caught(const Tensor<S, Rank>& buggy, const SafetensorsFile& file, const std::string& bug,
                   const std::string& truth = "output.y") {
  EXPECT_FALSE(matches_reference(buggy, file, truth, kTol)) << bug;
  const double gap = max_abs_diff(buggy, read_tensor<float, Rank>(file, truth));
  EXPECT_GT(gap, kBugGap) << bug;
  ::testing::Test::RecordProperty("gap: " + bug, std::to_string(gap));
}

/// Two reference outputs of one dump must be far apart (the dump distinguishes them).
void expect_distinct(const SafetensorsFile& file, const std::string& a, const std::string& b) {
  const double gap = max_abs_diff(read_tensor<float, 3>(file, a), read_tensor<float, 3>(file, b));
  EXPECT_GT(gap, kBugGap) << a << " vs " << b;
  ::testing::Test::RecordProperty("gap: " + a + " vs " + b, std::to_string(gap));
}

// ------------------------------------------------------------ the naive reference

/// softmax(cap(q·k/√hd)) v per (batch, head), in double, straight from the definition.
/// Rows are (b, t), columns (h, i). cap_before_scale gives the wrong order
/// cap(q·k)/√hd, as a bug would compute it.
Matrix<double> naive_attention(const Matrix<double>& q, const Matrix<double>& k, const Matrix<double>& v,
                               const AttentionShape& shape, double softcap, bool causal,
                               bool cap_before_scale = false) {
  const Index B = shape.batch, Tq = shape.q_len, Tk = shape.kv_len, H = shape.heads, hd = shape.head_dim;
  const auto cap = [&](double s) { return softcap > 0 ? softcap * std::tanh(s / softcap) : s; };
  Matrix<double> out = Matrix<double>::Zero(B * Tq, H * hd);
  std::vector<double> logits(static_cast<std::size_t>(Tk));
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < Tq; ++i) {
        double max_logit = -std::numeric_limits<double>::infinity();
        for (Index j = 0; j < Tk; ++j) {
          double dot = 0;
          for (Index e = 0; e < hd; ++e) dot += q(b * Tq + i, h * hd + e) * k(b * Tk + j, h * hd + e);
          const double s = cap_before_scale ? cap(dot) / std::sqrt(double(hd)) : cap(dot / std::sqrt(double(hd)));
          logits[j] = causal && j > i ? -std::numeric_limits<double>::infinity() : s;
          max_logit = std::max(max_logit, logits[j]);
        }
        double total = 0;
        for (Index j = 0; j < Tk; ++j) total += logits[j] = std::exp(logits[j] - max_logit);
        for (Index j = 0; j < Tk; ++j)
          for (Index e = 0; e < hd; ++e) out(b * Tq + i, h * hd + e) += logits[j] / total * v(b * Tk + j, h * hd + e);
      }
  return out;
}

/// Deterministic values in [-amplitude, amplitude), exactly representable in float,
/// from splitmix64 (std distributions are implementation-defined).
Matrix<double> random_matrix(Index rows, Index cols, std::uint64_t seed, double amplitude) {
  Matrix<double> m(rows, cols);
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull;
  for (Index i = 0; i < m.size(); ++i) {
    z += 0x9E3779B97F4A7C15ull;
    std::uint64_t r = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    r = (r ^ (r >> 27)) * 0x94D049BB133111EBull;
    r ^= r >> 31;
    m.data()[i] = amplitude * (static_cast<double>(r >> 40) / double(1 << 23) - 1.0);
  }
  return m;
}

// --------------------------------------------------------------- the dumped forms

struct SelfAttentionCase {
  SafetensorsFile file;
  nn::AttentionModuleConfig config;
  Tensor3<float> x;
  Index B, T;
};

SelfAttentionCase self_attention_case(const std::string& name) {
  auto file = open_reference("attention/" + name + ".safetensors");
  auto config = config_of(file);
  auto x = read_tensor<float, 3>(file, "input.x");
  const Index B = x.dimension(0), T = x.dimension(1);
  return {std::move(file), config, std::move(x), B, T};
}

/// Runs a row-form self-attention module (FusedSelfAttention, SelfAttention) on x.
template <class M>
Tensor3<float> run_self_attention(const M& attention, const Tensor3<float>& x, Context& ctx) {
  const Index B = x.dimension(0), T = x.dimension(1);
  Tensor3<float> y(B, T, x.dimension(2));
  attention.forward(ctx, as_matrix(x), B, T, nullptr, as_matrix(y));
  return y;
}
template <class M>
Tensor3<float> run_self_attention(const M& attention, const Tensor3<float>& x) {
  Context ctx;
  return run_self_attention(attention, x, ctx);
}

TEST(DenoiserSelfAttention, MatchesReference) {
  const auto c = self_attention_case("denoiser_self_attention");
  ASSERT_TRUE(c.config.rotary);
  ASSERT_EQ(c.config.options.softcap, 5.0);
  nn::FusedSelfAttention<float> attention(c.config);
  load_case_parameters(attention, c.file);
  expect_matches(run_self_attention(attention, c.x), c.file, "output.y", kTol);
}

TEST(DenoiserSelfAttention, InterleavedRotaryIsCaught) {
  const auto c = self_attention_case("denoiser_self_attention");
  auto config = c.config;
  config.rotary_interleaved = true;
  nn::FusedSelfAttention<float> attention(config);
  load_case_parameters(attention, c.file);
  const auto y = run_self_attention(attention, c.x);
  expect_matches(y, c.file, "output.y_interleaved", kTol);
  expect_caught(y, c.file, "interleaved rotary");
}

TEST(DenoiserSelfAttention, NoSoftcapIsCaught) {
  const auto c = self_attention_case("denoiser_self_attention");
  auto config = c.config;
  config.options.softcap = 0.0;
  nn::FusedSelfAttention<float> attention(config);
  load_case_parameters(attention, c.file);
  expect_caught(run_self_attention(attention, c.x), c.file, "no softcap");
}

/// The denoiser attention composed from the ops, with the attention itself computed
/// naively in double, so the logit order (cap, then scale, or the reverse) is ours.
Tensor3<float> composed_denoiser_attention(const SelfAttentionCase& c, const nn::FusedSelfAttention<float>& module,
                                           bool cap_before_scale) {
  const auto& s = c.config;
  const Index rows = c.B * c.T, d = s.d_model;
  Context ctx;
  Arena::Scope scope(ctx.arena());
  Matrix<float> qkv(rows, 3 * d);
  module.attn_qkv.forward(ctx, as_matrix(c.x), qkv);
  const auto table = make_rotary_table<float>(ctx.arena(), c.T, s.head_dim, s.rope_base);
  apply_rotary_inplace<float>(ctx, qkv, 0, 2 * s.heads, s.head_dim, c.T, table);
  const Matrix<double> q = qkv.leftCols(d).cast<double>(), k = qkv.middleCols(d, d).cast<double>(),
                       v = qkv.rightCols(d).cast<double>();
  const Matrix<float> a =
      naive_attention(q, k, v, s.shape(c.B, c.T, c.T), s.options.softcap, false, cap_before_scale).cast<float>();
  Tensor3<float> y(c.B, c.T, d);
  module.attn_out.forward(ctx, a, as_matrix(y));
  return y;
}

TEST(DenoiserSelfAttention, SoftcapBeforeScaleIsCaught) {
  const auto c = self_attention_case("denoiser_self_attention");
  nn::FusedSelfAttention<float> attention(c.config);
  load_case_parameters(attention, c.file);
  // The dump itself tells the two orders apart...
  expect_distinct(c.file, "output.y", "output.y_cap_before_scale");
  // ...the composition in the right order reproduces output.y (so it is a faithful
  // stand-in), and in the wrong order reproduces the bug and fails the reference.
  expect_matches(composed_denoiser_attention(c, attention, false), c.file, "output.y", kTol, " (composed)");
  const auto wrong_order = composed_denoiser_attention(c, attention, true);
  expect_matches(wrong_order, c.file, "output.y_cap_before_scale", kTol, " (composed)");
  expect_caught(wrong_order, c.file, "softcap before scale (composed)");
}

TEST(TokenDecoderSelfAttention, MatchesReference) {
  const auto c = self_attention_case("token_decoder_self_attention");
  nn::SelfAttention<float> attention(c.config);
  load_case_parameters(attention, c.file);
  expect_matches(run_self_attention(attention, c.x), c.file, "output.y", kTol);
}

TEST(TokenDecoderSelfAttention, RecSwitchesMatchTheirDumpsAndDifferFromTheDefault) {
  const auto c = self_attention_case("token_decoder_self_attention");
  struct Variant {
    const char* output;
    void (*change)(nn::AttentionModuleConfig&);
  };
  const Variant variants[] = {
      {"output.y_interleaved", [](nn::AttentionModuleConfig& s) { s.rotary_interleaved = true; }},
      {"output.y_no_rotary", [](nn::AttentionModuleConfig& s) { s.rotary = false; }},
      {"output.y_no_softcap", [](nn::AttentionModuleConfig& s) { s.options.softcap = 0.0; }},
  };
  for (const auto& variant : variants) {
    SCOPED_TRACE(variant.output);
    auto config = c.config;
    variant.change(config);
    nn::SelfAttention<float> attention(config);
    load_case_parameters(attention, c.file);
    const auto y = run_self_attention(attention, c.x);
    expect_matches(y, c.file, variant.output, kTol);
    expect_caught(y, c.file, variant.output);
  }
}

TEST(GPT2Attention, MatchesReferenceCausalConv1D) {
  const auto c = self_attention_case("gpt2_attention");
  ASSERT_TRUE(c.config.options.causal);
  nn::GPT2Attention<float> attention(c.config, Role::frozen);
  load_case_parameters(attention, c.file);
  Tensor3<float> y(c.B, c.T, c.config.d_model);
  Context ctx;
  attention.forward(ctx, as_matrix(c.x), c.B, c.T, as_matrix(y));
  expect_matches(y, c.file, "output.y", kTol);

  // Without the causal mask the result must be far off (the mask is exercised).
  auto unmasked = attention;
  unmasked.config.options.causal = false;
  Tensor3<float> y_unmasked(c.B, c.T, c.config.d_model);
  unmasked.forward(ctx, as_matrix(c.x), c.B, c.T, as_matrix(y_unmasked));
  expect_caught(y_unmasked, c.file, "no causal mask");
}

// ------------------------------------------------------------- latent attention

struct LatentCase {
  SafetensorsFile file;
  nn::LatentAttention<float> module;
  Tensor3<float> context, queries;
  Index B, Tc, Tq;
};

LatentCase latent_case(const std::string& name) {
  auto file = open_reference("attention/" + name + ".safetensors");
  auto config = config_of(file);
  config.qk_norm = true;
  nn::LatentAttention<float> module(config);
  load_case_parameters(module, file);
  auto context = read_tensor<float, 3>(file, "input.context");
  auto queries = read_tensor<float, 3>(file, "input.queries");
  const Index B = context.dimension(0), Tc = context.dimension(1), Tq = queries.dimension(1);
  return {std::move(file), std::move(module), std::move(context), std::move(queries), B, Tc, Tq};
}

Tensor3<float> run_latent(const nn::LatentAttention<float>& module, const LatentCase& c, Context& ctx) {
  Tensor3<float> y(c.B, c.Tq, module.config.d_model);
  module.forward(ctx, as_matrix(c.context), c.Tc, as_matrix(c.queries), c.B, c.Tq, as_matrix(y));
  return y;
}
Tensor3<float> run_latent(const nn::LatentAttention<float>& module, const LatentCase& c) {
  Context ctx;
  return run_latent(module, c, ctx);
}

/// The latent attention composed from the ops with q/k RMSNorm over all d features
/// (the gain tiled once per head): the bug of normalising the full width.
Tensor3<float> composed_latent_full_width_norm(const LatentCase& c) {
  const auto& m = c.module;
  const Index d = m.config.d_model, H = m.config.heads, hd = m.config.head_dim, L = c.Tq + c.Tc;
  Context ctx;
  Matrix<float> cn(c.B * c.Tc, d), xn(c.B * c.Tq, d), q(c.B * c.Tq, d), kv(c.B * L, 2 * d), a(c.B * c.Tq, d);
  m.norm_embeddings.forward(ctx, as_matrix(c.context), cn);
  m.norm_latents.forward(ctx, as_matrix(c.queries), xn);
  m.latents_to_Q.forward(ctx, xn, q);
  for (Index b = 0; b < c.B; ++b) {
    m.latents_to_KV.forward(ctx, xn.middleRows(b * c.Tq, c.Tq), kv.middleRows(b * L, c.Tq));
    m.embeddings_to_KV.forward(ctx, cn.middleRows(b * c.Tc, c.Tc), kv.middleRows(b * L + c.Tq, c.Tc));
  }
  const Vector<float> query_gain = m.query_norm.gamma.vector().transpose().replicate(H, 1);
  const Vector<float> key_gain = m.key_norm.gamma.vector().transpose().replicate(H, 1);
  rms_norm<float>(ctx, q, query_gain.data(), m.query_norm.eps, q);
  rms_norm<float>(ctx, kv.leftCols(d), key_gain.data(), m.key_norm.eps, kv.leftCols(d));
  attention<float>(ctx, {q.data(), d}, {kv.data(), 2 * d}, {kv.data() + d, 2 * d}, a.data(), d, {c.B, c.Tq, L, H, hd},
                   {m.config.options.softcap, false});
  Tensor3<float> y(c.B, c.Tq, d);
  m.projector_latents.forward(ctx, a, as_matrix(y));
  return y;
}

class LatentAttentionDump : public ::testing::TestWithParam<const char*> {};

TEST_P(LatentAttentionDump, MatchesReference) {
  const auto c = latent_case(GetParam());
  expect_matches(run_latent(c.module, c), c.file, "output.y", kTol);
}

TEST_P(LatentAttentionDump, RecSwitchesMatchTheirDumpsAndDifferFromTheDefault) {
  const auto c = latent_case(GetParam());
  auto no_softcap = c.module;
  no_softcap.config.options.softcap = 0.0;
  const auto y_no_softcap = run_latent(no_softcap, c);
  expect_matches(y_no_softcap, c.file, "output.y_no_softcap", kTol);
  expect_caught(y_no_softcap, c.file, "no softcap");

  auto no_qk_norm = c.module;
  no_qk_norm.config.qk_norm = false;
  const auto y_no_qk_norm = run_latent(no_qk_norm, c);
  expect_matches(y_no_qk_norm, c.file, "output.y_no_qk_norm", kTol);
  expect_caught(y_no_qk_norm, c.file, "no q/k norm");
}

TEST_P(LatentAttentionDump, QkNormOverTheFullWidthIsCaught) {
  const auto c = latent_case(GetParam());
  expect_distinct(c.file, "output.y", "output.y_qknorm_full_width");
  const auto full_width = composed_latent_full_width_norm(c);
  expect_matches(full_width, c.file, "output.y_qknorm_full_width", kTol, " (composed)");
  expect_caught(full_width, c.file, "q/k norm over the full width (composed)");
}

// latent_attention_tq: 20 queries against 37 context positions (57 keys).
INSTANTIATE_TEST_SUITE_P(Dumps, LatentAttentionDump, ::testing::Values("latent_attention", "latent_attention_tq"),
                         [](const auto& info) { return std::string(info.param); });

// ------------------------------------------- the kernel beyond one tile, vs naive

struct KernelCase {
  Index batch, q_len, kv_len, heads, head_dim;
  double softcap;
  bool causal;
};

std::string describe(const KernelCase& k) {
  return "B " + std::to_string(k.batch) + ", Tq " + std::to_string(k.q_len) + ", Tk " + std::to_string(k.kv_len) +
         ", H " + std::to_string(k.heads) + ", hd " + std::to_string(k.head_dim) + ", softcap " +
         std::to_string(k.softcap) + (k.causal ? ", causal" : "");
}

// Lengths around the query tile: a partial second tile, Tq != Tk both ways, and
// a causal case one query past a whole tile.
constexpr Index kTile = kAttentionQueryTile, kLong = kTile + 44;
const KernelCase kKernelCases[] = {
    {2, kLong, kLong, 3, 16, 0.0, false},      {2, kLong, kLong, 3, 16, 0.0, true},
    {2, kLong, kLong, 3, 16, 5.0, false},      {2, kLong, kLong, 3, 16, 5.0, true},
    {2, kLong, kLong + 30, 3, 16, 5.0, false}, {2, 37, kLong + 50, 2, 16, 5.0, false},
    {1, kLong + 30, 20, 2, 8, 0.0, false},     {3, kTile + 1, kTile + 1, 2, 16, 5.0, true},
};

/// Runs ldlm::attention on q as columns [d, 2d) of a [B*Tq, 2d] buffer and k | v as one
/// [B*Tk, 2d] buffer (the strided head views the modules use), in scalar S.
template <class S>
Matrix<S> run_kernel(Context& ctx, const Matrix<double>& q, const Matrix<double>& k, const Matrix<double>& v,
                     const KernelCase& kc) {
  const Index d = kc.heads * kc.head_dim;
  Matrix<S> q_buffer = Matrix<S>::Zero(q.rows(), 2 * d), kv(k.rows(), 2 * d), out(q.rows(), d);
  q_buffer.rightCols(d) = q.cast<S>();
  kv.leftCols(d) = k.cast<S>();
  kv.rightCols(d) = v.cast<S>();
  attention<S>(ctx, {q_buffer.data() + d, 2 * d}, {kv.data(), 2 * d}, {kv.data() + d, 2 * d}, out.data(), d,
               {kc.batch, kc.q_len, kc.kv_len, kc.heads, kc.head_dim}, {kc.softcap, kc.causal});
  return out;
}

/// Inputs rounded to float, so the float kernel and the double reference see the same
/// values. Amplitude 3 makes the logits reach ~±10, where softcap 5 bites.
struct KernelInputs {
  Matrix<double> q, k, v;
};
KernelInputs kernel_inputs(const KernelCase& kc, std::uint64_t seed) {
  const Index d = kc.heads * kc.head_dim;
  auto as_float_values = [](Matrix<double> m) { return Matrix<double>(m.cast<float>().cast<double>()); };
  return {as_float_values(random_matrix(kc.batch * kc.q_len, d, seed, 3.0)),
          as_float_values(random_matrix(kc.batch * kc.kv_len, d, seed + 1, 3.0)),
          as_float_values(random_matrix(kc.batch * kc.kv_len, d, seed + 2, 3.0))};
}

template <class S>
::testing::AssertionResult kernel_matches_naive(const KernelCase& kc, Context& ctx, Tolerance tol) {
  const auto in = kernel_inputs(kc, 17);
  const Matrix<S> got = run_kernel<S>(ctx, in.q, in.k, in.v, kc);
  const Matrix<double> ref =
      naive_attention(in.q, in.k, in.v, {kc.batch, kc.q_len, kc.kv_len, kc.heads, kc.head_dim}, kc.softcap, kc.causal);
  return ldlm::test::all_close("attention (" + describe(kc) + ")", got.data(), ref.data(),
                               Shape{ref.rows(), ref.cols()}, tol);
}

TEST(AttentionKernel, FloatMatchesNaiveDoubleBeyondOneQueryTile) {
  Context ctx;
  for (const auto& kc : kKernelCases) {
    const auto result = kernel_matches_naive<float>(kc, ctx, kKernelTol);
    EXPECT_TRUE(result);
    if (result) RecordProperty(describe(kc), result.message());
  }
}

TEST(AttentionKernel, DoubleScalarMatchesNaiveDouble) {
  Context ctx(2);
  for (const auto& kc : kKernelCases) {
    const auto result = kernel_matches_naive<double>(kc, ctx, kDoubleKernelTol);
    EXPECT_TRUE(result);
    if (result) RecordProperty(describe(kc) + " (double)", result.message());
  }
}

TEST(AttentionKernel, SoftcapBeforeScaleIsCaughtBeyondOneTile) {
  const KernelCase kc{2, kLong, kLong, 3, 16, 5.0, true};
  const auto in = kernel_inputs(kc, 17);
  Context ctx;
  const Matrix<float> got = run_kernel<float>(ctx, in.q, in.k, in.v, kc);
  const Matrix<double> wrong = naive_attention(in.q, in.k, in.v, {2, kLong, kLong, 3, 16}, 5.0, true, true);
  EXPECT_GT((got.cast<double>() - wrong).cwiseAbs().maxCoeff(), kBugGap);
}

// ------------------------------------------------------------------ shape errors

/// A one-block denoiser at the attention cases' width with 48 positions.
Config small_config() {
  Config c;
  c.d_model = 64;
  c.n_heads = 4;
  c.head_dim = 16;
  c.max_positions = 48;
  c.denoiser_blocks = 1;
  c.validate();
  return c;
}

Tensor3<float> filled(Index B, Index T, Index d) {
  Tensor3<float> x(B, T, d);
  x.setConstant(0.25f);
  return x;
}

TEST(AttentionShapes, WrongFeatureWidthIsRejectedWithShapes) {
  Denoiser<float> denoiser(small_config());
  init_parameters(denoiser, 1, "denoiser.");
  Tensor1<float> t(2);
  t.setValues({0.3f, 0.85f});
  Context ctx;
  const auto message = error_of<ShapeError>([&] { denoiser.forward(ctx, filled(2, 37, 32), t, filled(2, 37, 32)); });
  EXPECT_THAT(message, HasSubstr("denoiser"));
  EXPECT_THAT(message, HasSubstr("'x_t'"));
  EXPECT_THAT(message, HasSubstr("[*, *, 64]"));
  EXPECT_THAT(message, HasSubstr("[2, 37, 32]"));

  const auto self_cond = error_of<ShapeError>([&] { denoiser.forward(ctx, filled(2, 37, 64), t, filled(2, 37, 32)); });
  EXPECT_THAT(self_cond, HasSubstr("'self_cond'"));
  EXPECT_THAT(self_cond, HasSubstr("[2, 37, 64]"));
  EXPECT_THAT(self_cond, HasSubstr("[2, 37, 32]"));

  // The row form of an attention module fails in its first projection, naming the shapes.
  const auto c = self_attention_case("denoiser_self_attention");
  nn::FusedSelfAttention<float> attention(c.config);
  load_case_parameters(attention, c.file);
  Matrix<float> x = Matrix<float>::Ones(74, 32), y(74, 64);
  const auto row_form = error_of<ShapeError>([&] { attention.forward(ctx, x, 2, 37, nullptr, y); });
  EXPECT_THAT(row_form, HasSubstr("linear"));
  EXPECT_THAT(row_form, HasSubstr("[74, 32]"));
  EXPECT_THAT(row_form, HasSubstr("[192, 64]"));
}

TEST(AttentionShapes, HeadCountThatDoesNotDivideTheWidthIsAConfigError) {
  Config c = small_config();
  c.n_heads = 5;
  c.head_dim = 12;
  const auto message = error_of<ConfigError>([&] { c.validate(); });
  EXPECT_THAT(message, HasSubstr("'n_heads'"));
  EXPECT_THAT(message, HasSubstr("5 * 12 != 64"));

  const auto parsed = error_of<ConfigError>([] { Config::parse(R"({"d_model": 64, "n_heads": 5, "head_dim": 12})"); });
  EXPECT_THAT(parsed, HasSubstr("'n_heads'"));
  EXPECT_THAT(parsed, HasSubstr("5 * 12 != 64"));
}

TEST(AttentionShapes, SequenceLongerThanThePositionLimitIsRejected) {
  Denoiser<float> denoiser(small_config());
  init_parameters(denoiser, 1, "denoiser.");
  Tensor1<float> t(2);
  t.setValues({0.3f, 0.85f});
  Context ctx;
  EXPECT_NO_THROW(denoiser.forward(ctx, filled(2, 48, 64), t, filled(2, 48, 64)));
  const auto message = error_of<ShapeError>([&] { denoiser.forward(ctx, filled(2, 49, 64), t, filled(2, 49, 64)); });
  EXPECT_THAT(message, HasSubstr("denoiser"));
  EXPECT_THAT(message, HasSubstr("'x_t'"));
  EXPECT_THAT(message, HasSubstr("[2, 49, 64]"));
  EXPECT_THAT(message, HasSubstr("max_positions = 48"));
}

TEST(AttentionShapes, CausalKernelNeedsAsManyQueriesAsKeys) {
  const KernelCase kc{1, 20, 30, 2, 8, 0.0, true};
  const auto in = kernel_inputs(kc, 3);
  Context ctx;
  const auto message = error_of<ShapeError>([&] { run_kernel<float>(ctx, in.q, in.k, in.v, kc); });
  EXPECT_THAT(message, HasSubstr("attention"));
  EXPECT_THAT(message, HasSubstr("Tq = 20, Tk = 30"));
}

// ------------------------------------------------------------------ softmax rows

// exp(capped(s) − max) against the same function in double. The result's relative
// error is the absolute error of the capped, shifted score, a few ulp of the
// row's largest |score| (up to 50 with softcap 50: about 3e-6), hence rtol 2e-5.
constexpr Tolerance kSoftmaxRowTol{1e-30, 2e-5};

std::vector<double> exp_shifted_capped_in_double(const std::vector<float>& scores, double cap, double scale) {
  std::vector<double> e(scores.size());
  double max = -std::numeric_limits<double>::infinity();
  for (std::size_t j = 0; j < scores.size(); ++j) {
    const double s = scale * scores[j];
    e[j] = cap > 0 ? cap * std::tanh(s / cap) : s;
    max = std::max(max, e[j]);
  }
  for (double& v : e) v = std::exp(v - max);
  return e;
}

std::vector<float> random_scores(std::size_t n, float spread, std::uint64_t seed) {
  const Matrix<double> m = random_matrix(1, static_cast<Index>(n), seed, spread);
  return std::vector<float>(m.data(), m.data() + n);
}

/// Worst |got − ref| / (atol + rtol·|ref|) over the row, and the sum's.
template <class Kernel>
double worst_softmax_row_ratio(Kernel kernel, const std::vector<float>& scores, float cap) {
  std::vector<float> row = scores;
  const float sum = kernel(row.data(), static_cast<Index>(row.size()), cap);
  const std::vector<double> ref = exp_shifted_capped_in_double(scores, cap, 1.0);
  double ref_sum = 0, worst = 0;
  for (std::size_t j = 0; j < row.size(); ++j) {
    ref_sum += ref[j];
    worst = std::max(worst, std::abs(row[j] - ref[j]) / (kSoftmaxRowTol.atol + kSoftmaxRowTol.rtol * std::abs(ref[j])));
  }
  return std::max(worst, std::abs(sum - ref_sum) / (kSoftmaxRowTol.rtol * ref_sum));
}

using SoftmaxRowKernel = float (*)(float*, Index, float);

/// Every kernel of exp_shifted_capped this CPU can run.
std::vector<std::pair<const char*, SoftmaxRowKernel>> softmax_row_kernels() {
  std::vector<std::pair<const char*, SoftmaxRowKernel>> kernels = {
      {"generic", detail::exp_shifted_capped_generic<float>}};
#if defined(LDLM_HAVE_AVX512_SOFTMAX)
  if (cpu_features().avx512f && cpu_features().avx512dq)
    kernels.push_back({"avx512", detail::exp_shifted_capped_avx512});
  if (cpu_features().avx2 && cpu_features().fma) kernels.push_back({"avx2", detail::exp_shifted_capped_avx2});
#endif
  return kernels;
}

TEST(SoftmaxRow, EveryKernelMatchesTheDefinitionInDouble) {
  const auto kernels = softmax_row_kernels();
  std::uint64_t seed = 1;
  for (const auto& [name, kernel] : kernels)
    for (std::size_t n : {1, 2, 15, 16, 17, 31, 33, 100, 1023, 1024, 1025})
      // Spreads below and far above the cap: tanh's series and its exponential form.
      for (float spread : {0.5f, 8.0f, 300.0f})
        for (float cap : {0.0f, 50.0f, 1.0f}) {
          const double ratio = worst_softmax_row_ratio(kernel, random_scores(n, spread, ++seed), cap);
          EXPECT_LE(ratio, 1.0) << name << ": n = " << n << ", spread " << spread << ", cap " << cap;
        }
}

#if defined(LDLM_HAVE_AVX512_SOFTMAX)
// The AVX2 and AVX-512 kernels, one template on two vector types and two forms
// (softmax_simd::Form), agree with each other on a CPU that runs both, element by
// element and in the sum: each is within kSoftmaxRowTol of the definition, so twice
// that bounds their difference. (Planted: the fewer_multiplies form without the sign
// of tanh in its large lanes; fails.)
TEST(SoftmaxRow, Avx2AndAvx512KernelsAgree) {
  if (!(cpu_features().avx512f && cpu_features().avx512dq && cpu_features().avx2 && cpu_features().fma))
    GTEST_SKIP() << "this CPU does not run both kernels";
  const Tolerance both{2 * kSoftmaxRowTol.atol, 2 * kSoftmaxRowTol.rtol};
  std::uint64_t seed = 100;
  for (std::size_t n : {1, 7, 15, 16, 17, 31, 33, 100, 1025})
    for (float spread : {0.5f, 8.0f, 300.0f})
      for (float cap : {0.0f, 50.0f, 1.0f}) {
        const std::vector<float> scores = random_scores(n, spread, ++seed);
        std::vector<float> wide = scores, narrow = scores;
        const float wide_sum = detail::exp_shifted_capped_avx512(wide.data(), static_cast<Index>(n), cap);
        const float narrow_sum = detail::exp_shifted_capped_avx2(narrow.data(), static_cast<Index>(n), cap);
        const std::string where =
            "n = " + std::to_string(n) + ", spread " + std::to_string(spread) + ", cap " + std::to_string(cap);
        EXPECT_LE(std::abs(wide_sum - narrow_sum), both.allowed(narrow_sum)) << where << ": sums";
        for (std::size_t j = 0; j < n; ++j)
          ASSERT_LE(std::abs(wide[j] - narrow[j]), both.allowed(narrow[j]))
              << where << ": j = " << j << ", avx512 " << wide[j] << ", avx2 " << narrow[j];
      }
}
#endif

// Every kernel, and the one exp_shifted_capped picks. (Planted: the generic kernel
// in Eigen's vector expressions, built with -mavx2, fails at 14 of 15 offsets.)
TEST(SoftmaxRow, ResultDoesNotDependOnTheRowsAddress) {
  auto kernels = softmax_row_kernels();
  kernels.push_back({"dispatched", exp_shifted_capped<float>});
  const std::vector<float> scores = random_scores(1000, 20.0f, 7);
  for (const auto& [name, kernel] : kernels) {
    std::vector<float> first;
    for (std::size_t offset = 0; offset < 16; ++offset) {
      std::vector<float> buffer(offset + scores.size());
      std::copy(scores.begin(), scores.end(), buffer.begin() + static_cast<std::ptrdiff_t>(offset));
      kernel(buffer.data() + offset, static_cast<Index>(scores.size()), 50.0f);
      const std::vector<float> row(buffer.begin() + static_cast<std::ptrdiff_t>(offset), buffer.end());
      if (offset == 0)
        first = row;
      else
        EXPECT_TRUE(row == first) << name << ": offset " << offset << " floats";
    }
  }
}

TEST(SoftmaxRow, NanScoreMakesTheSumNanAsTheDefinitionDoes) {
  for (float cap : {0.0f, 50.0f}) {
    std::vector<float> row = random_scores(40, 4.0f, 3);
    row[21] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(std::isnan(exp_shifted_capped(row.data(), 40, cap))) << "cap " << cap;
    EXPECT_TRUE(std::isnan(row[21]));
  }
  // An infinite score is capped to ±cap.
  std::vector<float> row = {std::numeric_limits<float>::infinity(), 0.0f, -std::numeric_limits<float>::infinity()};
  EXPECT_NEAR(exp_shifted_capped(row.data(), 3, 50.0f), 1.0 + std::exp(-50.0) + std::exp(-100.0), 1e-6);
  EXPECT_EQ(row[0], 1.0f);
}

// Terms far below the row's maximum are zero on every kernel, in the vector body
// and in the tail: the generic and AVX-512 kernels round e^-104 and below to zero,
// the AVX2 one flushes everything below 2^-125 (e^-86.6). (Planted: the AVX2 kernel
// without its flush, which leaves 2^-125 in each such lane; fails.)
TEST(SoftmaxRow, TermsFarBelowTheMaximumAreZero) {
  for (const auto& [name, kernel] : softmax_row_kernels()) {
    std::vector<float> row(45, -200.0f);  // 32 in the body, a tail of 13 over both halves
    row[5] = 0.0f;
    row[20] = -1000.0f;
    row[33] = -std::numeric_limits<float>::infinity();
    row[42] = -1000.0f;
    EXPECT_EQ(kernel(row.data(), 45, 0.0f), 1.0f) << name;
    for (std::size_t j = 0; j < row.size(); ++j) EXPECT_EQ(row[j], j == 5 ? 1.0f : 0.0f) << name << ": j = " << j;
  }
}

#if defined(LDLM_HAVE_AVX512_SOFTMAX)
// The softmax row of bf16 attention on AMX: probabilities e_j / Σ rounded to bf16,
// against the definition in double. Rounding to bf16's 8 significant bits moves a
// value by up to 2^-8 of itself, and the float is within a few ulp of the exponent
// of the true value: up to 2 · c · log2 e with softcap c (c ≤ 100 here), and
// |scale · s · log2 e| up to about 430 without a cap at spread 300, at most about
// 1e-5: rtol 2^-8 + 2e-5. atol covers probabilities that underflow (below 1e-38,
// flushed to zero by the instruction). Caps up to 64 take the kernel's path without a
// shift by the row's maximum, larger ones (and none) the shifted path: 64 sits below,
// 88 and 100 above (unshifted, a row of e^±88 or e^±100 would overflow or underflow).
constexpr Tolerance kBf16ProbabilityTol{1e-37, 1.0 / 256 + 2e-5};

TEST(SoftmaxRow, Bf16ProbabilitiesMatchTheDefinitionInDoubleAndPadWithZeros) {
  const CpuFeatures& cpu = cpu_features();
  if (!(cpu.avx512f && cpu.avx512dq && cpu.avx512bw && cpu.avx512_bf16)) GTEST_SKIP() << "needs AVX512_BF16";
  std::uint64_t seed = 100;
  for (Index n : {1, 15, 16, 17, 31, 32, 33, 100, 1000, 1024})
    for (float spread : {0.5f, 8.0f, 300.0f})
      for (float cap : {0.0f, 50.0f, 1.0f, 64.0f, 88.0f, 100.0f})
        for (float scale : {1.0f, 0.125f, 0.3f}) {
          const std::vector<float> scores = random_scores(static_cast<std::size_t>(n), spread, ++seed);
          const Index padded = (n + 31) / 32 * 32 + 32;  // one block of zeros beyond the rounding
          std::vector<float> row = scores;
          std::vector<bf16> p(static_cast<std::size_t>(padded), float_to_bf16(7.0f));
          detail::softmax_row_to_bf16_avx512(row.data(), n, padded, scale, cap, p.data());
          const std::vector<double> e = exp_shifted_capped_in_double(scores, cap, scale);
          double sum = 0;
          for (double v : e) sum += v;
          double worst = 0;
          Index worst_at = 0;
          for (Index j = 0; j < n; ++j) {
            const double ref = e[static_cast<std::size_t>(j)] / sum;
            const double ratio = std::abs(bf16_to_float(p[static_cast<std::size_t>(j)]) - ref) /
                                 (kBf16ProbabilityTol.atol + kBf16ProbabilityTol.rtol * ref);
            if (ratio > worst) worst = ratio, worst_at = j;
          }
          EXPECT_LE(worst, 1.0) << "n = " << n << ", spread " << spread << ", cap " << cap << ", scale " << scale
                                << ": worst at " << worst_at << ", got "
                                << bf16_to_float(p[static_cast<std::size_t>(worst_at)]) << ", reference "
                                << e[static_cast<std::size_t>(worst_at)] / sum;
          for (Index j = n; j < padded; ++j)
            ASSERT_EQ(bf16_to_float(p[static_cast<std::size_t>(j)]), 0.0f) << "n = " << n << ", padding at " << j;
        }
}

// Without the shift, a row whose every score is capped near ±c has exponentials near
// e^±c. For c ≤ 64 those are normal floats and 4096 of them sum without overflow, so
// the row is still a softmax, not 0 / 0 or ∞ / ∞. At and above the threshold.
TEST(SoftmaxRow, Bf16ProbabilitiesOfARowCappedNearTheCapAreUniform) {
  const CpuFeatures& cpu = cpu_features();
  if (!(cpu.avx512f && cpu.avx512dq && cpu.avx512bw && cpu.avx512_bf16)) GTEST_SKIP() << "needs AVX512_BF16";
  for (float cap : {50.0f, 64.0f, 88.0f, 100.0f})
    for (float score : {-1e6f, 1e6f}) {
      std::vector<float> row(4096, score);
      std::vector<bf16> p(4096);
      detail::softmax_row_to_bf16_avx512(row.data(), 4096, 4096, 1.0f, cap, p.data());
      for (Index j = 0; j < 4096; ++j)
        ASSERT_EQ(bf16_to_float(p[static_cast<std::size_t>(j)]), 1.0f / 4096)
            << "cap " << cap << ", every score " << score << ", key " << j;
    }
}

TEST(SoftmaxRow, Bf16ProbabilitiesRejectARowThatDoesNotFitItsPadding) {
  const CpuFeatures& cpu = cpu_features();
  if (!(cpu.avx512f && cpu.avx512dq && cpu.avx512bw && cpu.avx512_bf16)) GTEST_SKIP() << "needs AVX512_BF16";
  std::vector<float> row(64, 1.0f);
  std::vector<bf16> p(64);
  EXPECT_THAT(
      error_of<InvalidArgument>([&] { detail::softmax_row_to_bf16_avx512(row.data(), 40, 48, 1, 0, p.data()); }),
      HasSubstr("got visible 40, padded 48"));
  EXPECT_THAT(
      error_of<InvalidArgument>([&] { detail::softmax_row_to_bf16_avx512(row.data(), 40, 32, 1, 0, p.data()); }),
      HasSubstr("got visible 40, padded 32"));
}

TEST(SoftmaxRow, Bf16ProbabilitiesOfARowWithANanAreNan) {
  const CpuFeatures& cpu = cpu_features();
  if (!(cpu.avx512f && cpu.avx512dq && cpu.avx512bw && cpu.avx512_bf16)) GTEST_SKIP() << "needs AVX512_BF16";
  for (float cap : {0.0f, 50.0f}) {
    std::vector<float> row = random_scores(40, 4.0f, 3);
    row[21] = std::numeric_limits<float>::quiet_NaN();
    std::vector<bf16> p(64);
    detail::softmax_row_to_bf16_avx512(row.data(), 40, 64, 0.125f, cap, p.data());
    EXPECT_TRUE(std::isnan(bf16_to_float(p[0]))) << "cap " << cap;
    EXPECT_TRUE(std::isnan(bf16_to_float(p[39]))) << "cap " << cap;
  }
}
#endif

// ------------------------------------------------------------------ AMX operand tiles

// The packing of the AMX attention kernel against the layout its header documents,
// on any CPU. Every value (128 + d) · 2^(t − 16) is exact in bf16 and distinct, so
// a misplaced or transposed element shows.
float distinct_value(Index t, Index d) { return std::ldexp(128.0f + static_cast<float>(d), static_cast<int>(t) - 16); }

TEST(AmxAttention, KeyAndValueTilesHoldTheDocumentedPairs) {
  constexpr Index hd = 64, ld = hd + 8;  // rows of a wider buffer, as q | k | v are
  std::vector<float> x(static_cast<std::size_t>(32 * ld));
  for (Index t = 0; t < 32; ++t)
    for (Index d = 0; d < hd; ++d) x[static_cast<std::size_t>(t * ld + d)] = distinct_value(t, d);
  // Element (r, n, e) of every tile against the source value (row, column) it must hold.
  auto expect_tiles = [&](const char* what, const std::vector<bf16>& tiles, Index count, auto source) {
    for (Index tile = 0; tile < static_cast<Index>(tiles.size()) / 512; ++tile)
      for (Index r = 0; r < 16; ++r)
        for (Index n = 0; n < 16; ++n)
          for (Index e = 0; e < 2; ++e) {
            const auto [t, d] = source(tile, r, n, e);
            ASSERT_EQ(bf16_to_float(tiles[static_cast<std::size_t>(tile * 512 + r * 32 + 2 * n + e)]),
                      t < count ? distinct_value(t, d) : 0.0f)
                << what << " tile " << tile << ", element (" << r << ", " << n << ", " << e << ")";
          }
  };

  constexpr Index key_count = 13, value_count = 29;  // the rest of each block is zero
  std::vector<bf16> keys(static_cast<std::size_t>(16 * hd), float_to_bf16(7.0f));
  detail::amx::pack_key_block(x.data(), ld, key_count, hd, keys.data());
  expect_tiles("key", keys, key_count, [](Index c, Index r, Index n, Index e) {
    return std::pair{n, 32 * c + 2 * r + e};  // key n, depth 32c + 2r + e
  });
  std::vector<bf16> values(static_cast<std::size_t>(32 * hd), float_to_bf16(7.0f));
  detail::amx::pack_value_block(x.data(), ld, value_count, hd, values.data());
  expect_tiles("value", values, value_count, [](Index ct, Index r, Index n, Index e) {
    return std::pair{2 * r + e, 16 * ct + n};  // value 2r + e, column 16ct + n
  });
}

// ------------------------------------------------------------------ thread counts

TEST(AttentionThreads, OneAndTwoThreadsAgreeAndRepeatsAreBitwiseIdentical) {
  const auto c = self_attention_case("denoiser_self_attention");
  nn::FusedSelfAttention<float> attention(c.config);
  load_case_parameters(attention, c.file);
  Context one(1), two(2);
  const auto y1 = run_self_attention(attention, c.x, one);
  const auto y2 = run_self_attention(attention, c.x, two);
  EXPECT_LE(max_abs_diff(y1, y2), kThreadTol);
  EXPECT_TRUE(matches_reference(y2, c.file, "output.y", kTol));
  EXPECT_TRUE(bitwise_equal("self-attention, 1 thread, again", run_self_attention(attention, c.x, one), y1));
  EXPECT_TRUE(bitwise_equal("self-attention, 2 threads, again", run_self_attention(attention, c.x, two), y2));
  // A fresh context with the same thread count gives the same bits too.
  Context another_two(2);
  EXPECT_TRUE(
      bitwise_equal("self-attention, a fresh 2-thread context", run_self_attention(attention, c.x, another_two), y2));

  const auto latent = latent_case("latent_attention_tq");
  const auto l1 = run_latent(latent.module, latent, one);
  const auto l2 = run_latent(latent.module, latent, two);
  EXPECT_LE(max_abs_diff(l1, l2), kThreadTol);
  EXPECT_TRUE(bitwise_equal("latent attention, 1 thread, again", run_latent(latent.module, latent, one), l1));
  EXPECT_TRUE(bitwise_equal("latent attention, 2 threads, again", run_latent(latent.module, latent, two), l2));
}

TEST(AttentionThreads, KernelBeyondOneTileAgreesAcrossThreadCounts) {
  const KernelCase kc{2, kLong, kLong, 3, 16, 5.0, true};
  const auto in = kernel_inputs(kc, 5);
  Context one(1), two(2);
  const Matrix<float> a = run_kernel<float>(one, in.q, in.k, in.v, kc);
  const Matrix<float> b = run_kernel<float>(two, in.q, in.k, in.v, kc);
  EXPECT_LE((a - b).cwiseAbs().maxCoeff(), kThreadTol);
  EXPECT_TRUE(a == run_kernel<float>(one, in.q, in.k, in.v, kc));
  EXPECT_TRUE(b == run_kernel<float>(two, in.q, in.k, in.v, kc));
}

}  // namespace
