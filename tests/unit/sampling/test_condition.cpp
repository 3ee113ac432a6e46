// Conditioned sampling (docs/model.md §Conditioning; sampling/condition.hpp, the
// resampling of solvers.hpp integrate, Pipeline::sample and generate with known ids):
// the replacements' exact values at every step, a fully masked condition as
// unconditional sampling, and bad input. Parity with the PyTorch reference is in
// test_sampler_parity.cpp (SamplerParity/ConditionDump).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "ldlm/ldlm.hpp"
#include "support/reference.hpp"

namespace ldlm {
namespace unit_sampling_condition {
namespace {

using ::testing::HasSubstr;

constexpr Index kRows = 6, kD = 4, kN = kRows * kD;
constexpr double kSpread = 0.5;

/// x̂0 of Gaussian data with standard deviation kSpread, in float, recording every call's
/// time and input.
struct RecordingGaussian {
  explicit RecordingGaussian(const TangentSchedule& s) : schedule(s) {}
  TangentSchedule schedule;
  std::vector<double> times;
  std::vector<std::vector<float>> inputs;
  void operator()(const float* x, double t, const float*, float* x0) {
    times.push_back(t);
    inputs.emplace_back(x, x + kN);
    const double a = schedule.alpha(t), s = schedule.sigma(t);
    for (Index i = 0; i < kN; ++i)
      x0[i] = static_cast<float>(a * kSpread * kSpread * x[i] / (a * a * kSpread * kSpread + s * s));
  }
};

KnownRows<float> some_known_rows() {
  KnownRows<float> known;
  known.rows = {0, 2, 3};
  known.z.resize(3, kD);
  NormalGenerator g(42);
  g.fill(known.z.data(), known.z.size());
  return known;
}

/// The value docs/model.md §Conditioning gives x at a known row and time t: the forward
/// process α(t) z + σ(t) ε of the start's noise ε, computed in double and rounded once.
float on_path(const TangentSchedule& schedule, double t, float z, float eps) {
  return static_cast<float>(schedule.alpha(t) * double(z) + schedule.sigma(t) * double(eps));
}

// The x replacement, checked where it must hold: x at the known rows as each step's first
// call sees it (the step from t_i starts where the replacement after the step to t_i left
// it, at t_i's α and σ, not the previous step's), and the result at t_min. Resampling's
// later attempts start from re-noised x and Heun's second call from its predictor, so
// those calls are not on the path. The x̂0 replacement: after every call at t <= from_t,
// x̂0 at the known rows is z exactly, and nothing else changes.
TEST(ConditionHooks, ReplacementsHoldExactlyAtEveryStep) {
  const TangentSchedule schedule;
  const KnownRows<float> known = some_known_rows();
  const std::vector<bool> is_known{true, false, true, true, false, false};
  int checked_x = 0, checked_x0 = 0;
  for (const SamplerInfo& info : kSamplers)
    for (ConditionMethod method : {ConditionMethod::x, ConditionMethod::x0, ConditionMethod::both})
      for (int resample : {0, 2})
        for (double from_t : {1.0, 0.5}) {
          const std::string what = std::string(info.name) + " " + std::string(condition_method_info(method).name) +
                                   " resample " + std::to_string(resample) + " from_t " + std::to_string(from_t);
          const std::vector<double> times = time_grid(5, 0.05, schedule, TimeGridOptions{});
          std::vector<float> x(kN);
          NormalGenerator rng(7);
          rng.fill(x.data(), kN);
          const std::vector<float> start = x;
          ConditionOptions options;
          options.method = method;
          options.resample = resample;
          options.from_t = from_t;
          const SolverHooks<float> applied = condition_hooks(known, start.data(), kD, schedule, options);
          SolverHooks<float> hooks = applied;
          RecordingGaussian denoise(schedule);
          if (applied.on_denoised)
            hooks.on_denoised = [&](double t, float* x0) {
              std::vector<float> before(x0, x0 + kN);
              applied.on_denoised(t, x0);
              for (Index r = 0, k = 0; r < kRows; ++r) {
                const bool replaced = is_known[r] && t <= from_t;
                for (Index j = 0; j < kD; ++j) {
                  const float want = replaced ? known.z(k, j) : before[r * kD + j];
                  ASSERT_EQ(x0[r * kD + j], want) << what << ": x0 row " << r << " at t " << t;
                }
                if (is_known[r]) ++k;
              }
              ++checked_x0;
            };
          SolverSettings settings;
          settings.kind = info.kind;
          settings.resample = resample;
          Arena arena;
          integrate<float>(denoise, settings, schedule, times, kN, x.data(), rng, arena, hooks);

          if (method == ConditionMethod::x0) continue;
          // Reports the first mismatch of a run only: the later ones follow from it.
          const auto on_path_at = [&](const float* v, double t, const std::string& where) {
            for (std::size_t k = 0; k < known.rows.size(); ++k)
              for (Index j = 0; j < kD; ++j) {
                const Index e = known.rows[k] * kD + j;
                const float want = on_path(schedule, t, known.z(Index(k), j), start[e]);
                if (v[e] != want) {
                  ADD_FAILURE() << what << ": " << where << ", known row " << known.rows[k] << " at t " << t << ": x "
                                << v[e] << ", alpha(t) z + sigma(t) eps " << want;
                  return false;
                }
              }
            ++checked_x;
            return true;
          };
          std::size_t call = 0;
          bool ok = true;
          for (std::size_t i = 0; i + 1 < times.size(); ++i) {
            ASSERT_LT(call, denoise.times.size()) << what;
            ASSERT_EQ(denoise.times[call], times[i]) << what << ": first call of step " << i;
            if (ok && i > 0 && times[i] <= from_t)
              ok = on_path_at(denoise.inputs[call].data(), times[i], "input of step " + std::to_string(i));
            const int attempts = 1 + (times[i] < 1.0 ? resample : 0);  // not the step from t = 1
            call += static_cast<std::size_t>(attempts * info.calls_per_step);
          }
          EXPECT_EQ(call, denoise.times.size()) << what;
          if (ok) on_path_at(x.data(), times.back(), "the result");
        }
  EXPECT_GT(checked_x, 100);
  EXPECT_GT(checked_x0, 100);
}

// ---------------------------------------------------------------- the pipeline
const LDLM<float>& small_model() {
  static const LDLM<float> model = [] {
    LDLM<float> m(Config::load(test::data_path("model_small/config.json")));
    load_parameters(m, test::open_reference("model_small/weights.safetensors"));
    return m;
  }();
  return model;
}

TokenTensor all_masked(Index B, Index T) {
  TokenTensor ids(B, T);
  ids.setConstant(mask_id(small_model().config));
  return ids;
}

TEST(Condition, FullyMaskedIsUnconditionalSamplingBitForBit) {
  const Pipeline<float> pipeline(small_model());
  Context ctx(1);
  const TokenTensor ids = all_masked(2, 8);
  for (SamplerKind kind : {SamplerKind::dpmpp_2m, SamplerKind::heun, SamplerKind::dpmpp_3m_sde, SamplerKind::unipc})
    for (auto [method, fill, resample, from_t] : {std::tuple{ConditionMethod::x0, KnownFill::mask, 0, 1.0},
                                                  std::tuple{ConditionMethod::both, KnownFill::separate, 2, 0.5},
                                                  std::tuple{ConditionMethod::x, KnownFill::pad, 1, 1.0}}) {
      SamplerOptions o;
      o.kind = kind;
      o.steps = 4;
      o.seed = 5;
      ConditionOptions c;
      c.method = method;
      c.fill = fill;
      c.resample = resample;
      c.from_t = from_t;
      const std::string what = std::string(sampler_info(kind).name) + " " +
                               std::string(condition_method_info(method).name) + " resample " +
                               std::to_string(resample);
      SamplingStats conditioned, unconditional;
      const Tensor3<float> got = pipeline.sample(ctx, ids, o, c, &conditioned);
      const Tensor3<float> want = pipeline.sample(ctx, 2, 8, o, &unconditional);
      EXPECT_TRUE(test::bitwise_equal(what, got, want));
      EXPECT_EQ(conditioned.denoiser_calls, unconditional.denoiser_calls) << what;
      const TokenTensor tokens = pipeline.generate(ctx, ids, o, c);
      const TokenTensor plain = pipeline.generate(ctx, 2, 8, o);
      EXPECT_TRUE(test::bitwise_equal(what + " tokens", tokens, plain));
    }
}

TEST(Condition, ResamplingCostsItsCallsAndKeepsTheGivenIds) {
  const Pipeline<float> pipeline(small_model());
  Context ctx(1);
  TokenTensor ids = all_masked(1, 8);
  ids(0, 0) = 17;
  ids(0, 7) = 8;
  SamplerOptions o;
  o.kind = SamplerKind::heun;
  o.steps = 3;
  ConditionOptions c;
  c.resample = 2;
  GenerationStats stats;
  const TokenTensor tokens = pipeline.generate(ctx, ids, o, c, &stats);
  // The step from t = 1 once, the two others three times each, two calls per attempt.
  EXPECT_EQ(stats.denoiser_calls, 2 * (1 + 2 * 3));
  EXPECT_EQ(tokens(0, 0), 17);
  EXPECT_EQ(tokens(0, 7), 8);
}

// ---------------------------------------------------------------- bad input
TEST(Condition, BadInputIsAClearError) {
  const Pipeline<float> pipeline(small_model());
  const Config& c = small_model().config;
  Context ctx(1);
  SamplerOptions o;
  o.steps = 2;
  const auto message = [&](const TokenTensor& ids, const ConditionOptions& condition) -> std::string {
    try {
      pipeline.generate(ctx, ids, o, condition);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "no error";
  };
  TokenTensor ids = all_masked(2, 8);
  ids(1, 3) = c.vocab_size;
  EXPECT_THAT(message(ids, {}),
              HasSubstr("generate: token id 101 at sequence 1, position 3 is outside the vocabulary [0, 101)"));
  ids = all_masked(2, 8);
  ids(0, 5) = -1;
  EXPECT_THAT(message(ids, {}), HasSubstr("token id -1 at sequence 0, position 5"));
  EXPECT_THAT(message(all_masked(1, c.max_positions + 1), {}), HasSubstr("more than the model's max_positions = 48"));

  ConditionOptions bad;
  bad.resample = -1;
  EXPECT_THAT(message(all_masked(1, 4), bad), HasSubstr("generate: resample must be >= 0, got -1"));
  for (double from_t : {0.0, -0.5, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    bad = {};
    bad.from_t = from_t;
    EXPECT_THAT(message(all_masked(1, 4), bad), HasSubstr("generate: the condition's from_t must be in (0, 1], got"))
        << from_t;
  }

  // Known rows handed to the sampler directly: ascending, within the rows, z matching.
  const auto sample_message = [&](const KnownRows<float>& known) -> std::string {
    try {
      detail::sample_latent_tensor("sample", ctx, small_model().denoiser, 1, 4, o, nullptr, {}, &known);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  KnownRows<float> known;
  known.rows = {3, 2};
  known.z = Matrix<float>::Zero(2, c.d_model);
  EXPECT_THAT(sample_message(known), HasSubstr("sample: known row 1 is 2; known rows must ascend within [0, 4)"));
  known.rows = {1, 4};
  EXPECT_THAT(sample_message(known), HasSubstr("known row 1 is 4; known rows must ascend within [0, 4)"));
  known.rows = {1};
  EXPECT_THAT(sample_message(known), HasSubstr("known z"));

  SolverSettings settings;
  settings.resample = -2;
  const TangentSchedule schedule;
  const std::vector<double> times{1.0, 0.5};
  std::vector<float> x(kN);
  NormalGenerator rng(0);
  Arena arena;
  RecordingGaussian denoise(schedule);
  try {
    integrate<float>(denoise, settings, schedule, times, kN, x.data(), rng, arena);
    ADD_FAILURE() << "integrate accepted resample -2";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("sample: resample must be >= 0, got -2"));
  }
}

}  // namespace
}  // namespace unit_sampling_condition
}  // namespace ldlm
