// Reliability across the stack: determinism across runs and thread counts, concurrent
// forward passes on one shared const model, the optional NaN/Inf check on every module, and
// validation that spans the modules (B = 0, T = max_positions + 1 for the encoder and token
// decoder, rank mismatches, batches whose activations overflow an index).
//
// The model is model_small (tests/data/model_small/config.json) with weights from
// init_parameters(model, 3); the inputs are the model_small reference inputs
// (B = 2, T = 37), so every module runs on realistic activations.
//
// ReliabilityConcurrent.* is what the tsan preset runs (ctest -R Concurrent), with
// ContextConcurrentThrows.* (unit/core/test_context.cpp) and TokenizerConcurrent.*.
//
// 1 vs 2 threads: each op splits its work into tasks with disjoint outputs, but
// the split changes the shapes of the sub-products and so their summation order:
// the results are not bitwise equal. They must agree within the float32 tolerance,
// 1e-5 absolute + 1e-5 relative; the test records the largest differences as
// properties (--gtest_output=xml). At a fixed thread count the results are bitwise
// stable.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <latch>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ldlm/ldlm.hpp"
#include "support/reference.hpp"
#include "support/configs.hpp"
#include "support/modules.hpp"

namespace system_reliability {
namespace {

using namespace ldlm;
using ldlm::test::bitwise_equal;
using ldlm::test::data_path;
using ldlm::test::error_of;
using ldlm::test::open_reference;
using ldlm::test::read_tensor;
using ldlm::test::small_config;
using ldlm::test::Tolerance;
using ::testing::AllOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

using ldlm::test::largest_config;

constexpr Tolerance kAcrossThreadCounts{1e-5, 1e-5};

LDLM<float> make_small_model() {
  LDLM<float> m(small_config());
  init_parameters(m, 3);
  return m;
}

/// Shared by every test here, and by the concurrent readers: never modified.
const LDLM<float>& small_model() {
  static const LDLM<float> m = make_small_model();
  return m;
}

struct Inputs {
  TokenTensor tokens;
  Tensor3<float> features, latents, hidden, x_t, self_cond;
  Tensor1<float> t;
};

const Inputs& small_inputs() {
  static const Inputs in = [] {
    Inputs i;
    i.tokens = read_tensor<std::int64_t, 2>(open_reference("model_small/feature_model.inputs.safetensors"), "tokens");
    i.features = read_tensor<float, 3>(open_reference("model_small/encoder.inputs.safetensors"), "features");
    i.latents = read_tensor<float, 3>(open_reference("model_small/latent_decoder.inputs.safetensors"), "latents");
    i.hidden = read_tensor<float, 3>(open_reference("model_small/token_decoder.inputs.safetensors"), "hidden");
    const auto den = open_reference("model_small/denoiser.inputs.safetensors");
    i.x_t = read_tensor<float, 3>(den, "x_t");
    i.self_cond = read_tensor<float, 3>(den, "self_cond");
    i.t = read_tensor<float, 1>(den, "t");
    return i;
  }();
  return in;
}

/// One forward of every module, each on its own reference input.
struct Outputs {
  Tensor3<float> features, latents, hidden, logits, x0;
};

Outputs run_all(const LDLM<float>& m, const Inputs& in, Context& ctx) {
  Outputs out;
  out.features = m.feature_model.forward(ctx, in.tokens);
  out.latents = m.encoder.forward(ctx, in.features);
  out.hidden = m.latent_decoder.forward(ctx, in.latents);
  out.logits = m.token_decoder.forward(ctx, in.hidden);
  out.x0 = m.denoiser.forward(ctx, in.x_t, in.t, in.self_cond);
  return out;
}

template <class F>
void for_each_output(const Outputs& a, const Outputs& b, F&& f) {
  f("features", a.features, b.features);
  f("latents", a.latents, b.latents);
  f("hidden", a.hidden, b.hidden);
  f("logits", a.logits, b.logits);
  f("x0", a.x0, b.x0);
}

void expect_bitwise_equal(const Outputs& got, const Outputs& want, const std::string& label) {
  for_each_output(got, want, [&](const char* name, const Tensor3<float>& a, const Tensor3<float>& b) {
    EXPECT_TRUE(bitwise_equal(label + " " + name, a, b));
  });
}

// ---------------------------------------------------------------------------
// 1. Determinism
// ---------------------------------------------------------------------------

TEST(ReliabilityDeterminism, RepeatedRunsAreBitwiseIdentical) {
  const auto& m = small_model();
  const auto& in = small_inputs();
  for (int threads : {1, 2}) {
    SCOPED_TRACE(std::to_string(threads) + " thread(s)");
    // The second run reuses the first one's arena, whose blocks now hold stale
    // values: a kernel reading scratch it did not write would show up here.
    Context ctx(threads);
    const Outputs first = run_all(m, in, ctx);
    const Outputs second = run_all(m, in, ctx);
    Context fresh(threads);
    const Outputs third = run_all(m, in, fresh);
    expect_bitwise_equal(second, first, "same context, second run:");
    expect_bitwise_equal(third, first, "fresh context:");
  }
}

TEST(ReliabilityDeterminism, OneAndTwoThreadsAgree) {
  const auto& m = small_model();
  const auto& in = small_inputs();
  Context one(1), two(2);
  const Outputs a = run_all(m, in, one), b = run_all(m, in, two);
  for_each_output(b, a, [&](const char* name, const Tensor3<float>& got, const Tensor3<float>& want) {
    std::ostringstream observed;
    observed << ldlm::test::max_abs_diff(got, want);
    ::testing::Test::RecordProperty(std::string(name) + ".max_abs_diff_1_vs_2_threads", observed.str());
    EXPECT_TRUE(ldlm::test::all_close(name, got.data(), want.data(), shape_of(want), kAcrossThreadCounts));
  });
}

// ---------------------------------------------------------------------------
// 2. Concurrency: one shared const model, one Context per calling thread
// ---------------------------------------------------------------------------

TEST(ReliabilityConcurrent, FourThreadsShareOneConstModel) {
  const LDLM<float>& m = small_model();
  const auto& in = small_inputs();
  // References computed alone, per thread count (each caller's Context owns 1 or 2 threads).
  Context ref1(1), ref2(2);
  const Outputs reference[2] = {run_all(m, in, ref1), run_all(m, in, ref2)};

  constexpr int kCallers = 4, kRounds = 3;
  std::latch start(kCallers);
  std::vector<std::vector<Outputs>> results(kCallers);
  std::vector<std::string> errors(kCallers);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      try {
        Context ctx(1 + c % 2);
        start.arrive_and_wait();  // all callers inside forward at the same time
        for (int r = 0; r < kRounds; ++r) results[std::size_t(c)].push_back(run_all(m, in, ctx));
      } catch (const std::exception& e) {
        errors[std::size_t(c)] = e.what();
      }
    });
  }
  for (auto& t : callers) t.join();

  for (int c = 0; c < kCallers; ++c) {
    SCOPED_TRACE("caller " + std::to_string(c) + " with " + std::to_string(1 + c % 2) + " thread(s)");
    EXPECT_EQ(errors[std::size_t(c)], "");
    ASSERT_EQ(results[std::size_t(c)].size(), std::size_t(errors[std::size_t(c)].empty() ? kRounds : 0));
    for (int r = 0; r < kRounds; ++r)
      expect_bitwise_equal(results[std::size_t(c)][std::size_t(r)], reference[c % 2],
                           "round " + std::to_string(r) + ":");
  }
}

TEST(ReliabilityConcurrent, ContextsSharingOnePoolAreSerialised) {
  // Context(ThreadPool&) lets callers share workers; the pool serialises their
  // parallel_for calls, so two callers on one pool still get exact results.
  const LDLM<float>& m = small_model();
  const auto& in = small_inputs();
  ThreadPool pool(2);
  Context alone(pool);
  const Outputs reference = run_all(m, in, alone);

  constexpr int kCallers = 2;
  std::latch start(kCallers);
  std::vector<Outputs> results(kCallers);
  std::vector<std::string> errors(kCallers);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      try {
        Context ctx(pool);
        start.arrive_and_wait();
        results[std::size_t(c)] = run_all(m, in, ctx);
      } catch (const std::exception& e) {
        errors[std::size_t(c)] = e.what();
      }
    });
  }
  for (auto& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) {
    SCOPED_TRACE("caller " + std::to_string(c));
    EXPECT_EQ(errors[std::size_t(c)], "");
    if (errors[std::size_t(c)].empty()) expect_bitwise_equal(results[std::size_t(c)], reference, "shared pool:");
  }
}

// ---------------------------------------------------------------------------
// 3. The optional NaN/Inf check (Context::check_finite)
// ---------------------------------------------------------------------------

TEST(ReliabilityFiniteCheck, NonFiniteWeightThrowsOnlyWhenChecking) {
  struct Case {
    const char* parameter;  // poisoned with a NaN or an Inf
    float value;
    const char* module;  // what the error must name
    const char* tensor;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const Case cases[] = {
      {"feature_model.h.0.ln_1.weight", nan, "feature_model", "features"},
      {"encoder.output_norm.gamma", nan, "encoder", "latents"},
      {"latent_decoder.mask_vector", inf, "latent_decoder", "hidden"},
      {"token_decoder.lm_head.weight", nan, "token_decoder", "logits"},
      {"denoiser.output_layer.linear.bias", nan, "denoiser", "x0"},
  };
  const auto& in = small_inputs();
  for (const Case& k : cases) {
    SCOPED_TRACE(k.parameter);
    LDLM<float> m(small_config());
    init_parameters(m, 3, "", /*pack=*/std::nullopt);
    bool poisoned = false;
    m.visit("", [&](const std::string& name, auto& p) {
      if (name == k.parameter) p.data()[0] = k.value, poisoned = true;
    });
    ASSERT_TRUE(poisoned) << "no parameter named " << k.parameter;
    pack_parameters(m, Precision::fp32);

    auto forward = [&](Context& ctx) -> Tensor3<float> {
      const std::string module = k.module;
      if (module == "feature_model") return m.feature_model.forward(ctx, in.tokens);
      if (module == "encoder") return m.encoder.forward(ctx, in.features);
      if (module == "latent_decoder") return m.latent_decoder.forward(ctx, in.latents);
      if (module == "token_decoder") return m.token_decoder.forward(ctx, in.hidden);
      return m.denoiser.forward(ctx, in.x_t, in.t, in.self_cond);
    };

    Context checking;
    checking.check_finite = true;
    EXPECT_THAT(error_of<NumericError>([&] { forward(checking); }),
                AllOf(HasSubstr(std::string(k.module) + ": non-finite value"),
                      HasSubstr(std::string("'") + k.tensor + "'"), HasSubstr("at row ")));

    // Off (the default): no check, no throw; the non-finite value reaches the output.
    Context unchecked;
    Tensor3<float> out;
    EXPECT_NO_THROW(out = forward(unchecked));
    bool non_finite = false;
    for (Index i = 0; i < out.size(); ++i) non_finite = non_finite || !std::isfinite(out.data()[i]);
    EXPECT_TRUE(non_finite) << "the poisoned weight did not reach '" << k.tensor << "'; the case tests nothing";
  }
}

TEST(ReliabilityFiniteCheck, FiniteModelPassesTheCheck) {
  Context ctx;
  ctx.check_finite = true;
  Context plain;
  expect_bitwise_equal(run_all(small_model(), small_inputs(), ctx), run_all(small_model(), small_inputs(), plain),
                       "check_finite on vs off:");
}

// ---------------------------------------------------------------------------
// 4. API-boundary validation across the modules (unit/model/test_common.cpp covers
//    token ids, T = 0 / T = 49 for the feature model, encoder, latent decoder and
//    denoiser, feature widths, self_cond and t; thread counts and worker arenas are in
//    unit/core/test_context.cpp, config keys in unit/model/test_config.cpp)
// ---------------------------------------------------------------------------

TEST(ReliabilityInputs, EmptyBatchIsRejectedByEveryModule) {
  const auto& m = small_model();
  Context ctx;
  Tensor3<float> empty(0, 5, 64);
  Tensor1<float> no_t(0);
  EXPECT_THAT(error_of<ShapeError>([&] { m.feature_model.forward(ctx, TokenTensor(0, 5)); }),
              AllOf(HasSubstr("feature_model: tensor 'tokens' has shape [0, 5]"), HasSubstr("need B >= 1")));
  EXPECT_THAT(error_of<ShapeError>([&] { m.encoder.forward(ctx, empty); }),
              AllOf(HasSubstr("encoder: tensor 'features' has shape [0, 5, 64]"), HasSubstr("need B >= 1")));
  EXPECT_THAT(error_of<ShapeError>([&] { m.latent_decoder.forward(ctx, empty); }),
              AllOf(HasSubstr("latent_decoder: tensor 'latents' has shape [0, 5, 64]"), HasSubstr("need B >= 1")));
  EXPECT_THAT(error_of<ShapeError>([&] { m.token_decoder.forward(ctx, empty); }),
              AllOf(HasSubstr("token_decoder: tensor 'hidden' has shape [0, 5, 64]"), HasSubstr("need B >= 1")));
  EXPECT_THAT(error_of<ShapeError>([&] { m.denoiser.forward(ctx, empty, no_t, empty); }),
              AllOf(HasSubstr("denoiser: tensor 'x_t' has shape [0, 5, 64]"), HasSubstr("need B >= 1")));
}

TEST(ReliabilityInputs, OnePastMaxPositionsForEncoderAndTokenDecoder) {
  const auto& m = small_model();
  Context ctx;
  const Index T = small_config().max_positions + 1;
  Tensor3<float> too_long(1, T, 64);
  too_long.setZero();
  EXPECT_THAT(
      error_of<ShapeError>([&] { m.encoder.forward(ctx, too_long); }),
      AllOf(HasSubstr("encoder: tensor 'features' has shape [1, 49, 64]"), HasSubstr("1 <= T <= max_positions = 48")));
  EXPECT_THAT(error_of<ShapeError>([&] { m.token_decoder.forward(ctx, too_long); }),
              AllOf(HasSubstr("token_decoder: tensor 'hidden' has shape [1, 49, 64]"),
                    HasSubstr("1 <= T <= max_positions = 48")));
  // T = max_positions itself is fine.
  Tensor3<float> longest(1, T - 1, 64);
  longest.setZero();
  EXPECT_NO_THROW(m.encoder.forward(ctx, longest));
  EXPECT_NO_THROW(m.token_decoder.forward(ctx, longest));
}

TEST(ReliabilityInputs, DenoiserInputWidth) {
  const auto& m = small_model();
  Context ctx;
  Tensor3<float> wide(2, 5, 65), x(2, 5, 64);
  wide.setZero();
  x.setZero();
  Tensor1<float> t(2);
  t.setConstant(0.5f);
  EXPECT_THAT(error_of<ShapeError>([&] { m.denoiser.forward(ctx, wide, t, x); }),
              HasSubstr("denoiser: tensor 'x_t' expected shape [*, *, 64], got [2, 5, 65]"));
  EXPECT_THAT(error_of<ShapeError>([&] { m.denoiser.forward(ctx, x, t, wide); }),
              HasSubstr("denoiser: tensor 'self_cond' expected shape [2, 5, 64], got [2, 5, 65]"));
}

TEST(ReliabilityInputs, RankMismatchNamesBothShapes) {
  EXPECT_THAT(error_of<ShapeError>([] {
                check_shape("op", "x", {2, 3}, Shape{2, 3, 1});
              }),
              HasSubstr("op: tensor 'x' expected shape [2, 3], got [2, 3, 1]"));
  EXPECT_THAT(error_of<ShapeError>([] {
                check_shape("op", "x", {-1, 64}, Shape{64});
              }),
              HasSubstr("op: tensor 'x' expected shape [*, 64], got [64]"));

  // A checkpoint whose weight was flattened to rank 1 (same element count).
  const fs::path dir = fs::temp_directory_path() / ("ldlm_reliability_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "flat.safetensors").string();
  SafetensorsWriter writer;
  LDLM<float> plain(small_config());
  init_parameters(plain, 3, "", /*pack=*/std::nullopt);
  visit_parameters(plain, "", [&](const std::string& name, const auto& p) {
    const Shape shape = name == "denoiser.input_proj.weight" ? Shape{p.numel()} : p.shape();
    writer.add(name, shape, p.data());
  });
  writer.write(path);
  LDLM<float> loaded(small_config());
  EXPECT_THAT(
      error_of<CheckpointError>([&] { load_parameters(loaded, SafetensorsFile::open(path)); }),
      AllOf(HasSubstr(path), HasSubstr("tensor 'denoiser.input_proj.weight' expected shape [64, 128], got [8192]")));
  fs::remove_all(dir);
}

TEST(ReliabilityOverflow, BatchWhoseActivationsOverflowAnIndexIsRejected) {
  // The largest config: B · T · widest_row = 2^20 · 2^20 · 2^22 = 2^62 fits, twice that does not.
  const Config c = largest_config();
  const Index T = c.max_positions;
  EXPECT_NO_THROW(check_sampling_arguments("generate", c, Index{1} << 20, T, 1));
  EXPECT_THAT(error_of<InvalidArgument>([&] { check_sampling_arguments("generate", c, Index{1} << 21, T, 1); }),
              HasSubstr("generate: a batch of B = 2097152 sequences of T = 1048576 is too large: its [B, T, 4194304] "
                        "activations have more elements than a 64-bit index can count"));
  EXPECT_THAT(error_of<ShapeError>([&] { check_batch_fits("token_decoder", std::numeric_limits<Index>::max(), 1, c); }),
              HasSubstr("token_decoder: a batch of B = 9223372036854775807 sequences of T = 1 is too large"));

  // Through the public API, before any allocation: generate on model_small with an
  // absurd batch (the old check only required B >= 1).
  const Pipeline<float> pipeline(small_model());
  Context ctx;
  SamplerOptions options;
  options.steps = 1;
  EXPECT_THAT(error_of<InvalidArgument>([&] { pipeline.generate(ctx, Index{1} << 60, 48, options); }),
              HasSubstr("generate: a batch of B = 1152921504606846976 sequences of T = 48 is too large"));
  EXPECT_EQ(ctx.arena().capacity(), 0u);
}

}  // namespace
}  // namespace system_reliability
