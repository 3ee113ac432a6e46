// Parity of the attention modules of nn/attention.hpp with their PyTorch dumps (B = 2,
// T = 37: a partial query tile), proof that the dumps catch the classic bugs (interleaved
// rotary, softcap before the scale, q/k norm over the full width, no softcap), shape errors
// with their messages, and agreement across thread counts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ldlm/ldlm.hpp"
#include "support/reference.hpp"
#include "support/attention_reference.hpp"

namespace unit_nn_attention {
namespace {

using ldlm::test::bitwise_equal;
using ldlm::test::error_of;
using ldlm::test::expect_matches;

using namespace ldlm;
using ldlm::test::load_case_parameters;
using ldlm::test::matches_reference;
using ldlm::test::max_abs_diff;
using ldlm::test::naive_attention;
using ldlm::test::open_reference;
using ldlm::test::read_tensor;
using ldlm::test::Tolerance;
using ::testing::HasSubstr;

constexpr Tolerance kTol = ldlm::test::kFp32Dump;
// A planted bug must move the result by far more than the tolerance: at least 100×.
constexpr double kBugGap = 100 * kTol.atol;
// Different thread counts split GEMMs differently; the results may differ by rounding only.
constexpr double kThreadTol = 1e-6;

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

TEST(AttentionDenoiserSelf, MatchesReference) {
  const auto c = self_attention_case("denoiser_self_attention");
  ASSERT_TRUE(c.config.rotary);
  ASSERT_EQ(c.config.options.softcap, 5.0);
  nn::FusedSelfAttention<float> attention(c.config);
  load_case_parameters(attention, c.file);
  expect_matches(run_self_attention(attention, c.x), c.file, "output.y", kTol);
}

TEST(AttentionDenoiserSelf, InterleavedRotaryIsCaught) {
  const auto c = self_attention_case("denoiser_self_attention");
  auto config = c.config;
  config.rotary_interleaved = true;
  nn::FusedSelfAttention<float> attention(config);
  load_case_parameters(attention, c.file);
  const auto y = run_self_attention(attention, c.x);
  expect_matches(y, c.file, "output.y_interleaved", kTol);
  expect_caught(y, c.file, "interleaved rotary");
}

TEST(AttentionDenoiserSelf, NoSoftcapIsCaught) {
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

TEST(AttentionDenoiserSelf, SoftcapBeforeScaleIsCaught) {
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

TEST(AttentionTokenDecoderSelf, MatchesReference) {
  const auto c = self_attention_case("token_decoder_self_attention");
  nn::SelfAttention<float> attention(c.config);
  load_case_parameters(attention, c.file);
  expect_matches(run_self_attention(attention, c.x), c.file, "output.y", kTol);
}

TEST(AttentionTokenDecoderSelf, RecSwitchesMatchTheirDumpsAndDifferFromTheDefault) {
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

TEST(AttentionGpt2, MatchesReferenceCausalConv1D) {
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

class AttentionLatentDump : public ::testing::TestWithParam<const char*> {};

TEST_P(AttentionLatentDump, MatchesReference) {
  const auto c = latent_case(GetParam());
  expect_matches(run_latent(c.module, c), c.file, "output.y", kTol);
}

TEST_P(AttentionLatentDump, RecSwitchesMatchTheirDumpsAndDifferFromTheDefault) {
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

TEST_P(AttentionLatentDump, QkNormOverTheFullWidthIsCaught) {
  const auto c = latent_case(GetParam());
  expect_distinct(c.file, "output.y", "output.y_qknorm_full_width");
  const auto full_width = composed_latent_full_width_norm(c);
  expect_matches(full_width, c.file, "output.y_qknorm_full_width", kTol, " (composed)");
  expect_caught(full_width, c.file, "q/k norm over the full width (composed)");
}

// latent_attention_tq: 20 queries against 37 context positions (57 keys).
INSTANTIATE_TEST_SUITE_P(Dumps, AttentionLatentDump, ::testing::Values("latent_attention", "latent_attention_tq"),
                         [](const auto& info) { return std::string(info.param); });

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

}  // namespace
}  // namespace unit_nn_attention
