// The solvers of docs/model.md §Solvers (sampling/solvers.hpp) on an analytic denoiser:
// Gaussian data z ~ N(0, s²I) has x̂0(x, t) = α s² x / (α² s² + σ²), and its probability-flow
// ODE the closed form x(t) = x(t_0) · sqrt(α(t)² s² + σ(t)²) / sqrt(α(t_0)² s² + σ(t_0)²).
// The error at N and 2N steps gives each solver's observed order. Also: Euler steps and
// single steps of the other solvers against hand computation, self-conditioning, hooks,
// call counts and bad input.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <tuple>
#include <utility>
#include <vector>

#include "ldlm/ldlm.hpp"
#include "support/schedule_reference.hpp"

namespace ldlm {
namespace unit_sampling_solvers {
namespace {

using ::testing::HasSubstr;

using test::ref_alpha;
using test::ref_beta;
using test::ref_sigma;

constexpr double kSpread = 0.5;  // s: the data's standard deviation (≠ 1, or x̂0 would be trivial)

struct Gaussian {
  TangentSchedule schedule;
  double s = kSpread;
  int calls = 0;
  void operator()(const double* x, double t, const double*, double* x0) {
    ++calls;
    const double a = schedule.alpha(t), sg = schedule.sigma(t);
    for (int i = 0; i < 16; ++i) x0[i] = a * s * s * x[i] / (a * a * s * s + sg * sg);
  }
  double spread(double t) const {
    const double a = schedule.alpha(t), sg = schedule.sigma(t);
    return std::sqrt(a * a * s * s + sg * sg);
  }
};

constexpr Index kValues = 16;

/// Largest |x_N − x(t_min)| over kValues start values, for `steps` steps from t_0.
double solver_error(SamplerKind kind, int steps, double t0, Endpoint endpoint = Endpoint::sample,
                    UniPCVariant variant = UniPCVariant::bh2) {
  Gaussian g;
  std::vector<double> times = time_grid(steps, 0.05);
  for (int i = 0; i <= steps; ++i) times[i] = t0 - (t0 - 0.05) * i / steps;
  times.back() = 0.05;
  std::vector<double> start(kValues), x(kValues);
  NormalGenerator noise(3);
  noise.fill(start.data(), kValues);
  for (Index i = 0; i < kValues; ++i) x[i] = start[i] * g.spread(t0);  // x(t_0) on the ODE's path from t = 1
  NormalGenerator rng(0);
  Arena arena;
  SolverSettings settings;
  settings.kind = kind;
  settings.endpoint = endpoint;
  settings.unipc_variant = variant;
  integrate<double>(g, settings, g.schedule, times, kValues, x.data(), rng, arena);
  double worst = 0;
  for (Index i = 0; i < kValues; ++i) {
    const double exact_x = start[i] * g.spread(0.05);
    const double a = g.schedule.alpha(0.05), sg = g.schedule.sigma(0.05);
    const double exact =
        endpoint == Endpoint::sample ? exact_x : a * g.s * g.s * exact_x / (a * a * g.s * g.s + sg * sg);
    worst = std::max(worst, std::abs(x[i] - exact));
  }
  return worst;
}

double observed_order(SamplerKind kind, int steps, double t0, UniPCVariant variant = UniPCVariant::bh2) {
  return std::log2(solver_error(kind, steps, t0, Endpoint::sample, variant) /
                   solver_error(kind, 2 * steps, t0, Endpoint::sample, variant));
}

// Below t = 0.95 the clipped β is the true one, so every solver integrates the same ODE.
TEST(SolversOrder, FirstOrderSolversConvergeAtOrderOne) {
  for (SamplerKind kind : {SamplerKind::ode, SamplerKind::ddim}) {
    const double order = observed_order(kind, 32, 0.9);
    EXPECT_GT(order, 0.8) << sampler_info(kind).name;
    EXPECT_LT(order, 1.3) << sampler_info(kind).name;
  }
}

TEST(SolversOrder, SecondOrderSolversConvergeAtOrderTwo) {
  for (double t0 : {0.9, 1.0}) {
    for (SamplerKind kind : {SamplerKind::heun, SamplerKind::dpmpp_2m}) {
      // 64 and 128 steps: at 32, 2M is not yet asymptotic (its error changes sign near 16).
      const double order = observed_order(kind, 64, t0);
      EXPECT_GT(order, 1.7) << sampler_info(kind).name << " from t0 = " << t0;
      EXPECT_LT(order, 2.6) << sampler_info(kind).name << " from t0 = " << t0;
    }
  }
  // From t = 1 the exponential solvers need no clip: ddim is still first order there.
  const double ddim = observed_order(SamplerKind::ddim, 32, 1.0);
  EXPECT_GT(ddim, 0.8);
  EXPECT_LT(ddim, 1.3);
}

TEST(SolversOrder, ThirdOrderSolversConvergeFasterThanSecondOrder) {
  // UniPC's steps are third order (2M predictor and corrector) and fourth (3M predictor);
  // the published 3M update is second order (its quadratic term is half the Taylor term:
  // docs/model.md §Solvers), with a smaller constant than 2M. The first steps have no
  // history, and at 64 and 128 steps the observed orders lie below the asymptotic ones
  // (measured: 3M 2.3, UniPC 2.6, UniPC 3M 3.3 from t0 = 0.9). At equal calls each is below
  // 2M's error (64 steps from t0 = 0.9: 2M 1.8e-3, 3M 8.5e-4, UniPC 1.25e-3, UniPC 3M below 6e-4).
  for (double t0 : {0.9, 1.0}) {
    const double second = solver_error(SamplerKind::dpmpp_2m, 64, t0);
    for (auto [kind, low, high] :
         {std::tuple{SamplerKind::dpmpp_3m, 1.9, 3.5}, std::tuple{SamplerKind::unipc, 2.3, 3.6},
          std::tuple{SamplerKind::unipc_3m, 2.8, 5.2}}) {
      const double order = observed_order(kind, 64, t0);
      EXPECT_GT(order, low) << sampler_info(kind).name << " from t0 = " << t0;
      EXPECT_LT(order, high) << sampler_info(kind).name << " from t0 = " << t0;
      EXPECT_LT(solver_error(kind, 64, t0), second) << sampler_info(kind).name << " from t0 = " << t0;
    }
  }
}

TEST(SolversOrder, UniPCWithBh1KeepsItsOrder) {
  // B(h) = h weights the 2M predictor's D1 by α' h / 2 instead of α'(1 − e^{−h}) / 2: the
  // two differ by O(h²), so the predictor stays second order and the corrected step third.
  // Measured at 64 → 128 steps from t0 = 0.9 (1.0): unipc 2.74 (2.70), against bh2's 2.58
  // (2.52), with an error 1.9x bh2's at 64 steps (2.3e-3, 2M's 1.8e-3); unipc-3m uses the 2M
  // predictor at its second step only, and its error equals bh2's to three digits.
  for (double t0 : {0.9, 1.0})
    for (auto [kind, low, high] : {std::tuple{SamplerKind::unipc, 2.3, 3.6}, std::tuple{SamplerKind::unipc_3m, 2.8, 5.2}}) {
      const double order = observed_order(kind, 64, t0, UniPCVariant::bh1);
      EXPECT_GT(order, low) << sampler_info(kind).name << " bh1 from t0 = " << t0;
      EXPECT_LT(order, high) << sampler_info(kind).name << " bh1 from t0 = " << t0;
    }
}

TEST(SolversOrder, IpndmConvergesFasterThanSecondOrder) {
  // iPNDM's fixed Adams–Bashforth weights assume equal steps in ν = α/σ, which a grid
  // uniform in t does not have, and its first-order first step bounds the asymptotic
  // order by two (docs/model.md §Solvers). Measured at 64 → 128 steps: 1.87 from t0 = 0.9,
  // 1.84 from 1.0, with errors at 64 steps of 1.27e-3 and 1.54e-3, below 2M's (1.8e-3,
  // 2.1e-3) and above 3M's (8.5e-4, 1.1e-3).
  for (double t0 : {0.9, 1.0}) {
    const double order = observed_order(SamplerKind::ipndm, 64, t0);
    const double error = solver_error(SamplerKind::ipndm, 64, t0);
    const double second = solver_error(SamplerKind::dpmpp_2m, 64, t0);
    EXPECT_GT(order, 1.6) << "from t0 = " << t0;
    EXPECT_LT(order, 2.6) << "from t0 = " << t0;
    EXPECT_LT(error, second) << "from t0 = " << t0 << ": 2M's error " << second;
  }
}

TEST(SolversOrder, DeisConvergesAtItsOrder) {
  // DEIS's polynomial in t through 2 (tAB2) or 3 (tAB3) x̂0's, integrated exactly against
  // e^λ: second and third order once the history has filled, after first-order first
  // steps. Measured at 64 → 128 steps: tAB2 2.39 from t0 = 0.9 and 2.42 from 1.0, tAB3 2.67
  // and 2.61; errors at 64 steps 8.3e-4 and 3.8e-4 from 0.9, below 2M's 1.8e-3.
  for (double t0 : {0.9, 1.0}) {
    const double second = solver_error(SamplerKind::dpmpp_2m, 64, t0);
    for (auto [kind, low, high] :
         {std::tuple{SamplerKind::deis_2, 1.7, 2.9}, std::tuple{SamplerKind::deis_3, 2.3, 3.6}}) {
      const double order = observed_order(kind, 64, t0);
      EXPECT_GT(order, low) << sampler_info(kind).name << " from t0 = " << t0;
      EXPECT_LT(order, high) << sampler_info(kind).name << " from t0 = " << t0;
      EXPECT_LT(solver_error(kind, 64, t0), second) << sampler_info(kind).name << " from t0 = " << t0;
    }
    EXPECT_LT(solver_error(SamplerKind::deis_3, 64, t0), solver_error(SamplerKind::deis_2, 64, t0)) << t0;
  }
}

TEST(SolversOrder, SecondOrderBeatsFirstOrderAtEqualCalls) {
  // 64 denoiser calls each: 2M's error is 0.0021, Heun's (32 steps) 0.0088, ddim's 0.033.
  const double ddim = solver_error(SamplerKind::ddim, 64, 1.0);
  EXPECT_LT(solver_error(SamplerKind::dpmpp_2m, 64, 1.0) * 10, ddim);
  EXPECT_LT(solver_error(SamplerKind::heun, 32, 1.0) * 3, ddim);
}

struct WideGaussian {
  static constexpr Index kN = 40000;
  TangentSchedule schedule;
  void operator()(const double* x, double t, const double*, double* x0) const {
    const double a = schedule.alpha(t), sg = schedule.sigma(t);
    for (Index i = 0; i < kN; ++i) x0[i] = a * kSpread * kSpread * x[i] / (a * a * kSpread * kSpread + sg * sg);
  }
};

// The reverse SDE keeps the marginals: with Gaussian data, x at each t has variance
// α² s² + σ². Checked at t_{N−1}, the last time whose x carries noise.
TEST(SolversDistribution, SdeSolversKeepTheMarginalVariance) {
  for (SamplerKind kind : {SamplerKind::dpmpp_2m_sde, SamplerKind::dpmpp_3m_sde}) {
    WideGaussian w;
    const int steps = 40;
    const auto times = time_grid(steps, 0.05);
    std::vector<double> x(WideGaussian::kN);
    NormalGenerator rng(5);
    rng.fill(x.data(), WideGaussian::kN);
    double variance = -1;
    SolverHooks<double> hooks;
    hooks.on_step = [&](double t_next, bool last, double* values) {
      if (t_next != times[steps - 1] || last) return;
      double sum = 0;
      for (Index i = 0; i < WideGaussian::kN; ++i) sum += values[i] * values[i];
      variance = sum / WideGaussian::kN;
    };
    Arena arena;
    SolverSettings settings;
    settings.kind = kind;
    integrate<double>(w, settings, w.schedule, times, WideGaussian::kN, x.data(), rng, arena, hooks);
    const double a = w.schedule.alpha(times[steps - 1]), sg = w.schedule.sigma(times[steps - 1]);
    const double expected = a * a * kSpread * kSpread + sg * sg;
    // 40000 values: the sample variance's own spread is 0.7 %; the solver's error adds a little.
    EXPECT_NEAR(variance, expected, 0.04 * expected) << sampler_info(kind).name;
  }
}

TEST(SolversStep, DdimFromPureNoiseIsExactAndFinite) {
  // At t = 1, α = 0: x' = σ' x + α' x̂0, with nothing divided by zero.
  const TangentSchedule s;
  const double t_next = 0.8;
  std::vector<double> x = {0.5, -1.5}, start = x;
  const std::vector<double> d = {0.25, 2.0};
  auto denoise = [&](const double*, double, const double*, double* out) { std::copy(d.begin(), d.end(), out); };
  NormalGenerator rng(0);
  Arena arena;
  SolverSettings settings;
  settings.kind = SamplerKind::ddim;
  settings.endpoint = Endpoint::sample;
  const std::vector<double> times = {1.0, t_next};
  integrate<double>(denoise, settings, s, times, 2, x.data(), rng, arena);
  for (int i = 0; i < 2; ++i) EXPECT_NEAR(x[i], s.sigma(t_next) * start[i] + s.alpha(t_next) * d[i], 1e-15);
}

TEST(SolversStep, Dpmpp2mSecondStepMatchesHandComputation) {
  // docs/model.md §Solvers: D̄ = D_i + h_i/(2 h_{i−1}) (D_i − D_{i−1}), from a grid that
  // starts below 1 so that the first step's h is finite.
  const TangentSchedule s;
  const std::vector<double> times = {0.8, 0.6, 0.3};
  std::vector<double> x = {0.7};
  int call = 0;
  const double predictions[2] = {0.4, -0.2};
  auto denoise = [&](const double*, double, const double*, double* out) { out[0] = predictions[call++]; };
  NormalGenerator rng(0);
  Arena arena;
  SolverSettings settings;
  settings.kind = SamplerKind::dpmpp_2m;
  settings.endpoint = Endpoint::sample;
  integrate<double>(denoise, settings, s, times, 1, x.data(), rng, arena);
  auto lam = [&](double t) { return std::log(s.alpha(t) / s.sigma(t)); };
  long double hand = 0.7L;
  // Step 0, first order.
  double h = lam(0.6) - lam(0.8);
  hand = s.sigma(0.6) / s.sigma(0.8) * hand + s.alpha(0.6) * (1 - std::exp(-h)) * 0.4;
  // Step 1, the multistep correction.
  const double h_prev = h;
  h = lam(0.3) - lam(0.6);
  const double d_bar = -0.2 + h / (2 * h_prev) * (-0.2 - 0.4);
  hand = s.sigma(0.3) / s.sigma(0.6) * hand + s.alpha(0.3) * (1 - std::exp(-h)) * d_bar;
  EXPECT_NEAR(x[0], static_cast<double>(hand), 1e-14);
}

TEST(SolversStep, IpndmWarmsUpToAdamsBashforthFour) {
  // docs/model.md §Solvers: ddim's step with x̂0 replaced by the Adams–Bashforth combination
  // of order 1, 2, 3, then 4 (weights written out here, not taken from the solver).
  const TangentSchedule s;
  const std::vector<double> times = {0.8, 0.7, 0.6, 0.5, 0.4, 0.3};
  std::vector<double> x = {0.7};
  int call = 0;
  const double p[5] = {0.4, -0.2, 0.9, 0.1, -0.6};
  auto denoise = [&](const double*, double, const double*, double* out) { out[0] = p[call++]; };
  NormalGenerator rng(0);
  Arena arena;
  SolverSettings settings;
  settings.kind = SamplerKind::ipndm;
  integrate<double>(denoise, settings, s, times, 1, x.data(), rng, arena);
  const double d_bar[5] = {p[0], (3 * p[1] - p[0]) / 2, (23 * p[2] - 16 * p[1] + 5 * p[0]) / 12,
                           (55 * p[3] - 59 * p[2] + 37 * p[1] - 9 * p[0]) / 24,
                           (55 * p[4] - 59 * p[3] + 37 * p[2] - 9 * p[1]) / 24};
  auto lam = [&](double t) { return std::log(s.alpha(t) / s.sigma(t)); };
  double hand = 0.7;
  for (int i = 0; i < 5; ++i) {
    const double t = times[i], t_next = times[i + 1], h = lam(t_next) - lam(t);
    hand = s.sigma(t_next) / s.sigma(t) * hand + s.alpha(t_next) * (1 - std::exp(-h)) * d_bar[i];
  }
  EXPECT_NEAR(x[0], hand, 1e-13);
}

TEST(SolversStep, DeisIntegratesItsPolynomialInTime) {
  // docs/model.md §Solvers: x' = (σ'/σ) x + σ' ∫ e^λ P(t(λ)) dλ, P the Lagrange polynomial
  // in t through this step's and the earlier x̂0's (1, 2, then 3 of them for tAB3). The
  // integral here is Simpson's rule in λ on 4000 intervals, with t(λ) written out.
  const TangentSchedule s;
  const std::vector<double> times = {0.8, 0.7, 0.55, 0.45, 0.3};
  const double p[4] = {0.4, -0.2, 0.9, 0.1};
  auto lam = [&](double t) { return std::log(s.alpha(t) / s.sigma(t)); };
  auto t_of = [](double l) { return 2 / std::numbers::pi * std::atan(std::exp(-l) / 3.0); };
  for (const auto& [kind, nodes_max] : {std::pair{SamplerKind::deis_2, 2}, std::pair{SamplerKind::deis_3, 3}}) {
    std::vector<double> x = {0.7};
    int call = 0;
    auto denoise = [&](const double*, double, const double*, double* out) { out[0] = p[call++]; };
    NormalGenerator rng(0);
    Arena arena;
    SolverSettings settings;
    settings.kind = kind;
    integrate<double>(denoise, settings, s, times, 1, x.data(), rng, arena);
    double hand = 0.7;
    for (int i = 0; i < 4; ++i) {
      const int nodes = std::min(i + 1, nodes_max);
      const auto poly = [&](double t) {
        double sum = 0;
        for (int k = 0; k < nodes; ++k) {
          double basis = 1;
          for (int m = 0; m < nodes; ++m)
            if (m != k) basis *= (t - times[i - m]) / (times[i - k] - times[i - m]);
          sum += basis * p[i - k];
        }
        return sum;
      };
      const double a = lam(times[i]), b = lam(times[i + 1]);
      const int intervals = 4000;
      double integral = 0;
      for (int j = 0; j <= intervals; ++j) {
        const double l = a + (b - a) * j / intervals, f = std::exp(l) * poly(t_of(l));
        integral += f * (j == 0 || j == intervals ? 1 : j % 2 ? 4 : 2);
      }
      integral *= (b - a) / intervals / 3;
      hand = s.sigma(times[i + 1]) / s.sigma(times[i]) * hand + s.sigma(times[i + 1]) * integral;
    }
    // Simpson's error at 4000 intervals is far below 1e-11; a weight off by one node, or
    // the polynomial taken in λ instead of t, moves x by more than 1e-4.
    EXPECT_NEAR(x[0], hand, 1e-11) << sampler_info(kind).name;
  }
}

TEST(SolversStep, UniPCCorrectsWithTheNextCallsPrediction) {
  // docs/model.md §Solvers, from a grid that starts below 1: step 0 predicts with ddim;
  // step 1's call, at that x_1, gives D_1, which corrects x_1 with ρ = b_1(h_0) before
  // step 1 predicts x_2 from the corrected x_1 with the 2M rule. The final x_2 is not
  // corrected. With B(h) = h (bh1) the corrector's weight, which solves its order
  // condition, is the same (B cancels); the 2M predictor's ρ = ½ multiplies α' h instead
  // of α'(1 − e^{−h}).
  const TangentSchedule s;
  const std::vector<double> times = {0.8, 0.6, 0.3};
  auto lam = [&](double t) { return std::log(s.alpha(t) / s.sigma(t)); };
  const double h0 = lam(0.6) - lam(0.8), h1 = lam(0.3) - lam(0.6);
  const double c0 = s.alpha(0.6) * (1 - std::exp(-h0)), c1 = s.alpha(0.3) * (1 - std::exp(-h1));
  const double base0 = s.sigma(0.6) / s.sigma(0.8) * 0.7 + c0 * 0.4;
  const double b1 = ((1 - std::exp(-h0)) / h0 - 1) / (std::exp(-h0) - 1);
  const double corrected = base0 + c0 * b1 * (-0.2 - 0.4);
  const double d1 = h1 / h0 * (-0.2 - 0.4);  // (D_0 − D_1) / r, r = −h0 / h1
  for (const UniPCVariant variant : {UniPCVariant::bh2, UniPCVariant::bh1}) {
    std::vector<double> x = {0.7};
    std::vector<double> seen;
    int call = 0;
    const double predictions[2] = {0.4, -0.2};
    auto denoise = [&](const double* at, double, const double*, double* out) {
      seen.push_back(at[0]);
      out[0] = predictions[call++];
    };
    NormalGenerator rng(0);
    Arena arena;
    SolverSettings settings;
    settings.kind = SamplerKind::unipc;
    settings.unipc_variant = variant;
    integrate<double>(denoise, settings, s, times, 1, x.data(), rng, arena);
    const bool bh1 = variant == UniPCVariant::bh1;
    EXPECT_NEAR(seen[1], base0, 1e-14) << "the second call sees the predicted x_1; bh1 " << bh1;
    const double predictor_scale = bh1 ? s.alpha(0.3) * h1 : c1;
    EXPECT_NEAR(x[0], s.sigma(0.3) / s.sigma(0.6) * corrected + c1 * -0.2 + predictor_scale * 0.5 * d1, 1e-14)
        << "bh1 " << bh1;
  }
}

TEST(SolversHooks, AStepHookAlsoSeesUniPCsCorrectedX) {
  // An x-space condition pins x after every step; UniPC's corrector moves x_i again after
  // the call at t_i, so the hook runs once more on it, at t_i and before the next step.
  for (SamplerKind kind : {SamplerKind::unipc, SamplerKind::unipc_3m}) {
    const TangentSchedule s;
    std::vector<double> seen;
    auto denoise = [&](const double* at, double, const double*, double* out) {
      seen.push_back(at[0]);
      out[0] = 0.25 * static_cast<double>(seen.size());
    };
    std::vector<double> x = {0.0};
    NormalGenerator rng(0);
    Arena arena;
    SolverSettings settings;
    settings.kind = kind;
    SolverHooks<double> hooks;
    std::vector<double> hook_times;
    hooks.on_step = [&](double t, bool, double* values) {
      hook_times.push_back(t);
      values[0] = 5.0;
    };
    const auto times = time_grid(5, 0.05);
    integrate<double>(denoise, settings, s, times, 1, x.data(), rng, arena, hooks);
    // Steps 1 … 4 each correct the x their call saw: 5 step hooks and 4 corrector hooks.
    EXPECT_EQ(hook_times, (std::vector<double>{times[1], times[1], times[2], times[2], times[3], times[3], times[4],
                                               times[4], times[5]}))
        << sampler_info(kind).name;
    for (std::size_t c = 1; c < seen.size(); ++c) EXPECT_EQ(seen[c], 5.0) << sampler_info(kind).name << ", call " << c;
  }
}

TEST(SolversSelfConditioning, EveryCallGetsTheMostRecentPrediction) {
  for (const SamplerInfo& info : kSamplers) {
    for (HeunSelfCondition heun : {HeunSelfCondition::latest, HeunSelfCondition::step_start}) {
      if (heun == HeunSelfCondition::step_start && info.kind != SamplerKind::heun) continue;
      const TangentSchedule s;
      std::vector<double> returned, conditioned;
      int call = 0;
      // Each call returns its own number; the self-conditioning input tells which call it saw.
      auto denoise = [&](const double*, double, const double* self_cond, double* out) {
        conditioned.push_back(self_cond[0]);
        out[0] = ++call;
        returned.push_back(out[0]);
      };
      std::vector<double> x = {0.1};
      NormalGenerator rng(0);
      Arena arena;
      SolverSettings settings;
      settings.kind = info.kind;
      settings.heun_self_condition = heun;
      settings.self_condition = SelfCondition::previous;
      settings.endpoint = Endpoint::denoised;
      const auto times = time_grid(5, 0.05);
      const SamplingStats stats = integrate<double>(denoise, settings, s, times, 1, x.data(), rng, arena);
      EXPECT_EQ(stats.denoiser_calls, 5 * info.calls_per_step) << info.name;
      EXPECT_EQ(stats.steps, 5);
      ASSERT_EQ(conditioned.size(), returned.size());
      EXPECT_EQ(conditioned[0], 0.0) << info.name << ": the first call gets zeros";
      for (std::size_t c = 1; c < conditioned.size(); ++c) {
        const bool heun_second = info.kind == SamplerKind::heun && c % 2 == 1;
        const double expected =
            heun_second && heun == HeunSelfCondition::step_start ? conditioned[c - 1] : returned[c - 1];
        EXPECT_EQ(conditioned[c], expected) << info.name << ", call " << c + 1;
      }
      EXPECT_EQ(x[0], returned.back()) << info.name << ": the default endpoint is the last x0";
    }
  }
}

// SolverSettings::model_times: the denoiser alone sees them. Model times equal to the grid's
// must give the outputs of no model times bit for bit, for every solver that takes them, with
// the self-condition extrapolated and a resampled step; offset ones must reach the denoiser,
// one per call, and nothing else.
TEST(SolversModelTime, TheDenoiserAloneSeesTheModelTimes) {
  const TangentSchedule schedule;
  const std::vector<double> times = time_grid(6, 0.05, schedule, TimeGridOptions{TimeGrid::lambda});
  std::vector<double> offset(times.begin(), times.end() - 1);
  for (std::size_t i = 1; i < offset.size(); ++i) offset[i] *= 0.9;
  for (const SamplerInfo& info : kSamplers) {
    if (info.kind == SamplerKind::heun) continue;
    const auto run = [&](const std::vector<double>& model_times, std::vector<double>* seen,
                         std::vector<double>* hooked) {
      Gaussian g;
      auto denoise = [&](const double* x, double t, const double* self_cond, double* x0) {
        if (seen) seen->push_back(t);
        g(x, t, self_cond, x0);
        for (Index k = 0; k < kValues; ++k) x0[k] += 0.1 * self_cond[k];  // so that the self-condition counts
      };
      SolverHooks<double> hooks;
      hooks.on_denoised = [&](double t, double*) {
        if (hooked) hooked->push_back(t);
      };
      std::vector<double> x(kValues);
      NormalGenerator start(5);
      start.fill(x.data(), kValues);
      NormalGenerator rng(1);
      Arena arena;
      SolverSettings settings;
      settings.kind = info.kind;
      settings.self_condition = SelfCondition::extrapolated;
      settings.resample = 1;
      settings.model_times = model_times;
      integrate<double>(denoise, settings, schedule, times, kValues, x.data(), rng, arena, hooks);
      return x;
    };
    const std::vector<double> plain = run({}, nullptr, nullptr);
    const std::vector<double> same = run({times.begin(), times.end() - 1}, nullptr, nullptr);
    Index worst = 0;
    for (Index k = 0; k < kValues; ++k)
      if (std::abs(same[k] - plain[k]) > std::abs(same[worst] - plain[worst])) worst = k;
    EXPECT_EQ(same[worst], plain[worst]) << info.name << ": model times at the grid's times, worst element " << worst;

    std::vector<double> seen, hooked;
    const std::vector<double> moved = run(offset, &seen, &hooked);
    // Every step but the first (from t = 1) is taken twice (resample = 1).
    std::vector<double> expected_seen = {offset[0]}, expected_hooked = {times[0]};
    for (std::size_t i = 1; i < offset.size(); ++i) {
      expected_seen.insert(expected_seen.end(), 2, offset[i]);
      expected_hooked.insert(expected_hooked.end(), 2, times[i]);
    }
    EXPECT_EQ(seen, expected_seen) << info.name << ": the times the denoiser saw";
    EXPECT_EQ(hooked, expected_hooked) << info.name << ": the hooks keep the grid's times";
    EXPECT_NE(moved, plain) << info.name << ": offset model times changed nothing";
  }
}

TEST(SolversModelTime, BadModelTimesAreClearErrors) {
  const TangentSchedule s;
  const auto times = time_grid(4, 0.05);
  auto denoise = [](const double*, double, const double*, double* out) { out[0] = 0.0; };
  const auto error_with = [&](SamplerKind kind, std::vector<double> model_times) {
    std::vector<double> x = {0.0};
    NormalGenerator rng(0);
    Arena arena;
    SolverSettings settings;
    settings.kind = kind;
    settings.model_times = std::move(model_times);
    try {
      integrate<double>(denoise, settings, s, times, 1, x.data(), rng, arena);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(error_with(SamplerKind::unipc_3m, {1.0, 0.7, 0.5}),
              HasSubstr("sample: model_times: expected one time per step, 4, got 3"));
  EXPECT_THAT(error_with(SamplerKind::unipc_3m, {1.0, 0.7, 0.0, 0.2}),
              HasSubstr("sample: model_times: expected times in (0, 1], got 0.000000 for step 2"));
  EXPECT_THAT(error_with(SamplerKind::ddim, {1.0, 0.7, 0.5, std::nan("")}),
              HasSubstr("expected times in (0, 1], got nan for step 3"));
  EXPECT_THAT(error_with(SamplerKind::heun, {1.0, 0.7, 0.5, 0.2}),
              HasSubstr("sample: model_times: heun makes two calls per step"));
}

TEST(SolversSelfConditioning, ExtrapolatedSelfConditionIsLinearInLambda) {
  // From t = 1 the first step's x̂0 sits at λ = −∞: calls 1-3 get zeros, D_0, D_1; call
  // i ≥ 4 gets D_{i−1} + (λ_i − λ_{i−1}) / (λ_{i−1} − λ_{i−2}) · (D_{i−1} − D_{i−2}).
  for (SamplerKind kind : {SamplerKind::dpmpp_3m, SamplerKind::ipndm, SamplerKind::ddim}) {
    const TangentSchedule s;
    const auto times = time_grid(6, 0.05);
    std::vector<double> conditioned, returned;
    auto denoise = [&](const double*, double t, const double* self_cond, double* out) {
      conditioned.push_back(self_cond[0]);
      out[0] = std::sin(7 * t) + 0.1 * static_cast<double>(returned.size());
      returned.push_back(out[0]);
    };
    std::vector<double> x = {0.3};
    NormalGenerator rng(0);
    Arena arena;
    SolverSettings settings;
    settings.kind = kind;
    settings.self_condition = SelfCondition::extrapolated;
    integrate<double>(denoise, settings, s, times, 1, x.data(), rng, arena);
    ASSERT_EQ(conditioned.size(), 6u);
    EXPECT_EQ(conditioned[0], 0.0);
    EXPECT_EQ(conditioned[1], returned[0]);
    EXPECT_EQ(conditioned[2], returned[1]);
    for (int i = 3; i < 6; ++i) {
      const double slope =
          (s.lambda(times[i]) - s.lambda(times[i - 1])) / (s.lambda(times[i - 1]) - s.lambda(times[i - 2]));
      EXPECT_NEAR(conditioned[i], returned[i - 1] + slope * (returned[i - 1] - returned[i - 2]), 1e-12)
          << sampler_info(kind).name << ", call " << i + 1;
    }
  }
}

TEST(SolversHooks, PredictionHookRunsBeforeTheSolverReadsIt) {
  // A hook that pins x̂0 to 3 makes ddim's result at t_min the ODE of a point mass at 3.
  const TangentSchedule s;
  auto denoise = [&](const double*, double, const double*, double* out) { out[0] = -100; };
  std::vector<double> x = {0.0};
  NormalGenerator rng(0);
  Arena arena;
  SolverSettings settings;
  settings.kind = SamplerKind::ddim;
  settings.endpoint = Endpoint::sample;
  SolverHooks<double> hooks;
  int steps_seen = 0;
  hooks.on_denoised = [](double, double* x0) { x0[0] = 3.0; };
  hooks.on_step = [&](double, bool, double*) { ++steps_seen; };
  const auto times = time_grid(7, 0.05);
  integrate<double>(denoise, settings, s, times, 1, x.data(), rng, arena, hooks);
  EXPECT_NEAR(x[0], s.alpha(0.05) * 3.0, 1e-12);  // x starts at 0, so only the data term remains
  EXPECT_EQ(steps_seen, 7);
}

// Hand computation of one Euler step, long double, from the formulas of docs/model.md §Time grid and steps.
std::vector<long double> hand_step(bool sde, long double t, long double t_next, const std::vector<float>& x,
                                   const std::vector<float>& x0, const std::vector<float>* noise) {
  const long double a = ref_alpha(t, 3), s = ref_sigma(t, 3), b = ref_beta(t, 3, 0.95L), dt = t_next - t;
  std::vector<long double> out;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const long double eps = (x[i] - a * x0[i]) / s;
    const long double score = -eps / s;
    const long double drift = sde ? -0.5L * b * x[i] - b * score : -0.5L * b * x[i] - 0.5L * b * score;
    long double next = x[i] + drift * dt;
    if (noise) next += std::sqrt(b) * std::sqrt(-dt) * (*noise)[i];
    out.push_back(next);
  }
  return out;
}

TEST(SolversEulerStep, OdeAndSdeMatchHandComputation) {
  const TangentSchedule s;
  const std::vector<float> x = {0.5f, -1.25f, 2.0f, 0.0f}, x0 = {0.125f, 0.375f, -0.5f, 1.0f},
                           xi = {0.75f, -0.25f, 1.5f, -2.0f};
  for (auto [t, t_next] : {std::pair{0.6, 0.45}, std::pair{1.0, 0.7625}, std::pair{0.2875, 0.05}}) {
    auto ode = x;
    euler_step<float>(SamplerKind::ode, s, t, t_next, x0.data(), nullptr, 4, ode.data());
    auto sde = x;
    euler_step<float>(SamplerKind::sde, s, t, t_next, x0.data(), xi.data(), 4, sde.data());
    auto mean = x;
    euler_step<float>(SamplerKind::sde, s, t, t_next, x0.data(), nullptr, 4, mean.data());
    const auto ode_ref = hand_step(false, t, t_next, x, x0, nullptr);
    const auto sde_ref = hand_step(true, t, t_next, x, x0, &xi);
    const auto mean_ref = hand_step(true, t, t_next, x, x0, nullptr);
    for (int i = 0; i < 4; ++i) {
      const double tol = 2e-7 * std::max(1.0L, std::fabs(sde_ref[i]));
      EXPECT_NEAR(ode[i], ode_ref[i], tol) << "ODE t=" << t << " i=" << i;
      EXPECT_NEAR(sde[i], sde_ref[i], tol) << "SDE t=" << t << " i=" << i;
      EXPECT_NEAR(mean[i], mean_ref[i], tol) << "SDE mean t=" << t << " i=" << i;
    }
    // The ODE ignores noise.
    auto ode_noise = x;
    euler_step<float>(SamplerKind::ode, s, t, t_next, x0.data(), xi.data(), 4, ode_noise.data());
    EXPECT_EQ(ode_noise, ode);
  }
}

TEST(SolversEulerStep, RejectsNonDecreasingTime) {
  const TangentSchedule s;
  float x = 0, x0 = 0;
  try {
    euler_step<float>(SamplerKind::ode, s, 0.5, 0.5, &x0, nullptr, 1, &x);
    FAIL() << "dt = 0 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("t_next must be < t"));
  }
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(SolversErrors, BadGridsAndPredictionsAreClearErrors) {
  const TangentSchedule s;
  EXPECT_THAT(error_of([&] {
                check_time_grid("sample", std::vector<double>{1.0, 0.5, 0.5, 0.1});
              }),
              HasSubstr("sample: a time grid must decrease strictly, got t_1 = 0.500000 and t_2 = 0.500000"));
  EXPECT_THAT(error_of([&] { check_time_grid("sample", std::vector<double>{1.0}); }),
              HasSubstr("a time grid needs at least 2 times, got 1"));
  EXPECT_THAT(error_of([&] {
                check_time_grid("sample", std::vector<double>{1.5, 0.1});
              }),
              HasSubstr("a time grid must lie in (0, 1]"));
  EXPECT_THAT(error_of([&] {
                check_time_grid("sample", std::vector<double>{1.0, 0.0});
              }),
              HasSubstr("a time grid must lie in (0, 1]"));
  EXPECT_THAT(error_of([&] {
                time_grid(4, 0.05, s, TimeGridOptions{TimeGrid::karras, 0.1, 7});
              }),
              HasSubstr("time_grid karras: sigma_max must be finite and above sigma/alpha at t_min"));
  EXPECT_THAT(error_of([&] {
                time_grid(4, 0.05, s, TimeGridOptions{TimeGrid::karras, 20, 0});
              }),
              HasSubstr("rho must be finite and > 0"));
  EXPECT_THAT(error_of([&] { time_grid(0, 0.05, s, TimeGridOptions{TimeGrid::lambda}); }),
              HasSubstr("steps must be >= 1, got 0"));
  EXPECT_FALSE(find_sampler("dpmpp_2m").has_value());
  EXPECT_EQ(find_sampler("dpmpp-2m"), SamplerKind::dpmpp_2m);
  EXPECT_EQ(
      sampler_names(),
      "sde, ode, ddim, heun, dpmpp-2m, dpmpp-2m-sde, dpmpp-3m, dpmpp-3m-sde, unipc, unipc-3m, ipndm, deis-2, deis-3");

  auto nan_at_third = [calls = 0](const double*, double, const double*, double* out) mutable {
    out[0] = ++calls == 3 ? std::numeric_limits<double>::quiet_NaN() : 0.0;
  };
  std::vector<double> x = {0.0};
  NormalGenerator rng(0);
  Arena arena;
  SolverSettings settings;
  settings.check_finite = true;
  const auto times = time_grid(4, 0.05);
  EXPECT_THAT(error_of([&] { integrate<double>(nan_at_third, settings, s, times, 1, x.data(), rng, arena); }),
              HasSubstr("sample: the denoiser returned a non-finite x0 (nan at element 0) in call 3, at t = 0.525"));
}

}  // namespace
}  // namespace unit_sampling_solvers
}  // namespace ldlm
