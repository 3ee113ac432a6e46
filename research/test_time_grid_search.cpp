// The end-to-end time-grid fit of research/time_grid_search.hpp (ldlm_fit_time_grid
// --methods end-to-end) on an analytic denoiser, in well under a second: Gaussian data
// z ~ N(0, s²I) has x̂0(x, t) = α s² x / (α² s² + σ²), and its probability-flow ODE from
// x(1) = ε the closed form x(t) = ε sqrt(α(t)² s² + σ(t)²), the converged reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ldlm/core/context.hpp"
#include "ldlm/core/random.hpp"
#include "ldlm/sampling/solvers.hpp"
#include "time_grid_search.hpp"

namespace research_time_grid_search {
namespace {

using namespace ldlm;
using research::compass_search;
using research::end_to_end_error;
using research::LambdaGaps;
using research::per_position_error;

constexpr double kTMin = 0.05;
constexpr double kSpread = 0.5;  // s, ≠ 1 so that x̂0 is not trivial
constexpr std::size_t kD = 4, kPositions = 4, kN = kD * kPositions;

double spread(const TangentSchedule& schedule, double t) {
  const double a = schedule.alpha(t), sg = schedule.sigma(t);
  return std::sqrt(a * a * kSpread * kSpread + sg * sg);
}

/// Seed i's start noise, its x(t_min) from `kind` (extrapolated self-condition, which the
/// analytic denoiser ignores) on `times`, and its exact x(t_min).
struct GaussianSeeds {
  TangentSchedule schedule;
  SamplerKind kind = SamplerKind::unipc_3m;
  std::vector<std::vector<float>> noise, exact;

  explicit GaussianSeeds(std::size_t seeds) {
    for (std::size_t i = 0; i < seeds; ++i) {
      std::vector<float> e(kN);
      NormalGenerator(100 + i).fill(e.data(), kN);
      std::vector<float> x(kN);
      for (std::size_t k = 0; k < kN; ++k) x[k] = static_cast<float>(e[k] * spread(schedule, kTMin));
      noise.push_back(e);
      exact.push_back(x);
    }
  }

  std::vector<float> operator()(std::size_t i, std::span<const double> times) const {
    std::vector<float> x = noise.at(i);
    const auto denoise = [&](const float* at, double t, const float*, float* x0) {
      const double a = schedule.alpha(t), sg = schedule.sigma(t);
      for (std::size_t k = 0; k < kN; ++k)
        x0[k] = static_cast<float>(a * kSpread * kSpread * at[k] / (a * a * kSpread * kSpread + sg * sg));
    };
    SolverSettings settings;
    settings.kind = kind;
    settings.self_condition = SelfCondition::extrapolated;
    NormalGenerator rng(0);
    Arena arena;
    integrate<float>(denoise, settings, schedule, times, Index(kN), x.data(), rng, arena);
    return x;
  }
};

std::vector<double> lambda_grid(const TangentSchedule& schedule, int steps) {
  return time_grid(steps, kTMin, schedule, TimeGridOptions{TimeGrid::lambda});
}

// Gaps double resolves give a grid from exactly 1 to exactly t_min that decreases strictly;
// extreme ones are flagged, and the objective is +∞ there; the gaps of a grid give it back (to
// 1e-12 in t).
TEST(ResearchTimeGridSearch, LambdaGapsGiveAValidGridAndInvertIt) {
  const LambdaGaps gaps{TangentSchedule{}, kTMin};
  for (const std::vector<double>& g :
       {std::vector<double>{-3.0, 1.0, 0.0, 1.5}, std::vector<double>{2.0, -6.0}, std::vector<double>{0.0}}) {
    const std::vector<double> t = gaps.times(g);
    ASSERT_EQ(t.size(), g.size() + 2);
    EXPECT_EQ(t.front(), 1.0);
    EXPECT_EQ(t.back(), kTMin);
    for (std::size_t i = 0; i + 1 < t.size(); ++i)
      EXPECT_LT(t[i + 1], t[i]) << "t_" << i + 1 << " = " << t[i + 1] << " is not below t_" << i << " = " << t[i];
    EXPECT_TRUE(LambdaGaps::representable(t));
  }
  // e^5 in λ puts t_1 at 1 in double; e^−40 puts two times at one.
  for (const std::vector<double>& g : {std::vector<double>{5.0, 0.0}, std::vector<double>{0.0, -40.0, 0.0}}) {
    EXPECT_FALSE(LambdaGaps::representable(gaps.times(g))) << "gaps " << g[0] << ", " << g[1];
    const GaussianSeeds seeds(1);
    EXPECT_EQ(research::end_to_end_objective(gaps, seeds, seeds.exact, kD, 1.0, g),
              std::numeric_limits<double>::infinity());
  }
  const std::vector<double> grid = lambda_grid(TangentSchedule{}, 10);
  const std::vector<double> back = gaps.times(gaps.log_gaps(grid));
  ASSERT_EQ(back.size(), grid.size());
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < grid.size(); ++i)
    if (std::abs(back[i] - grid[i]) > worst) worst = std::abs(back[i] - grid[i]), at = i;
  EXPECT_LE(worst, 1e-12) << "worst at t_" << at << ": " << back[at] << " against " << grid[at];
}

// Zero offsets are the grid's own times exactly (so a decoupled search starts where the grid
// search does, bit for bit); an offset δ_i moves the call at t_i, and only it, to λ + δ_i (to
// 1e-9 in λ), and the call at t = 1 has none.
TEST(ResearchTimeGridSearch, DecoupledGridOffsetsEachCallInLambda) {
  const TangentSchedule schedule;
  const research::DecoupledGrid decoupling{LambdaGaps{schedule, kTMin}};
  const std::vector<double> grid = lambda_grid(schedule, 5);
  std::vector<double> p = decoupling.parameters(grid);
  ASSERT_EQ(p.size(), 8u);
  const std::vector<double> times = decoupling.times(p);
  EXPECT_EQ(decoupling.model_times(p), std::vector<double>(times.begin(), times.end() - 1));
  p[4 + 1] = 0.3;  // the call at t_2
  const std::vector<double> model = decoupling.model_times(p);
  ASSERT_EQ(model.size(), 5u);
  EXPECT_EQ(decoupling.times(p), times) << "an offset moved the grid";
  for (std::size_t i = 0; i < model.size(); ++i) {
    if (i == 2)
      EXPECT_NEAR(schedule.lambda(model[i]), schedule.lambda(times[i]) + 0.3, 1e-9);
    else
      EXPECT_EQ(model[i], times[i]) << "the call at t_" << i << " moved";
  }
  EXPECT_THROW(research::DecoupledGrid::steps(std::vector<double>(3)), InvalidArgument);
}

// The mean over positions of each position's RMS, not one RMS over every value.
TEST(ResearchTimeGridSearch, PerPositionErrorAveragesEachPositionsRms) {
  const std::vector<float> x{3, 4, 0, 0}, reference{0, 0, 0, 0};
  // Position 0: sqrt((9 + 16) / 2); position 1: 0; one RMS over all four would be 2.5.
  EXPECT_NEAR(per_position_error(x, reference, 2, 2.0), 2.0 * std::sqrt(12.5) / 2, 1e-12);
  EXPECT_THROW(per_position_error(x, std::vector<float>(3), 2, 1.0), InvalidArgument);
}

// The objective is the mean of every seed's own error (each computed alone here): a seed left
// out or counted twice moves it by at least 1e-3, far above the 1e-9 tolerance.
TEST(ResearchTimeGridSearch, ObjectiveCountsEverySeedOnce) {
  const GaussianSeeds seeds(3);
  const std::vector<double> times = lambda_grid(seeds.schedule, 4);
  std::vector<double> each;
  for (std::size_t i = 0; i < 3; ++i) each.push_back(per_position_error(seeds(i, times), seeds.exact[i], kD, 1.0));
  ASSERT_GT(std::max({std::abs(each[0] - each[1]), std::abs(each[1] - each[2]), std::abs(each[0] - each[2])}), 3e-3)
      << "the seeds must differ for this test to see one left out";
  EXPECT_NEAR(end_to_end_error(seeds, seeds.exact, kD, 1.0, times), (each[0] + each[1] + each[2]) / 3, 1e-9);
}

// On a quadratic bowl the search ends within its last step of the minimum, and never above
// its start.
TEST(ResearchTimeGridSearch, CompassSearchFindsAQuadraticsMinimum) {
  const std::vector<double> centre{0.3, -1.1, 2.0};
  const auto bowl = [&](const std::vector<double>& x) {
    double sum = 0;
    for (std::size_t i = 0; i < x.size(); ++i) sum += (i + 1.0) * (x[i] - centre[i]) * (x[i] - centre[i]);
    return sum;
  };
  const research::SearchResult r = compass_search(bowl, {0, 0, 0}, 0.5, 1.0 / 64, 1000);
  for (std::size_t i = 0; i < centre.size(); ++i) EXPECT_NEAR(r.x[i], centre[i], 1.0 / 64) << "coordinate " << i;
  EXPECT_LE(r.evaluations, 1000);
  EXPECT_THROW(compass_search(bowl, {0, 0, 0}, 0.0, 1.0 / 64, 10), InvalidArgument);
}

// The whole fit: from the λ grid, the search lowers unipc-3m's final error at 4 steps by at
// least a third, and what it returns is a valid grid whose error is the one it reports.
TEST(ResearchTimeGridSearch, EndToEndFitBeatsTheLambdaGridOnTheGaussian) {
  const GaussianSeeds seeds(3);
  const LambdaGaps gaps{seeds.schedule, kTMin};
  const auto objective = [&](const std::vector<double>& g) {
    return end_to_end_error(seeds, seeds.exact, kD, 1.0, gaps.times(g));
  };
  const std::vector<double> start = gaps.log_gaps(lambda_grid(seeds.schedule, 4));
  const double before = objective(start);
  const research::SearchResult r = compass_search(objective, start, 0.5, 1.0 / 32, 200);
  const std::vector<double> fitted = gaps.times(r.x);
  EXPECT_EQ(fitted.front(), 1.0);
  EXPECT_EQ(fitted.back(), kTMin);
  for (std::size_t i = 0; i + 1 < fitted.size(); ++i) EXPECT_LT(fitted[i + 1], fitted[i]) << "at t_" << i + 1;
  EXPECT_NEAR(end_to_end_error(seeds, seeds.exact, kD, 1.0, fitted), r.value, 1e-12);
  EXPECT_LT(r.value, before * 2.0 / 3.0) << "λ grid " << before << ", fitted " << r.value;
}

}  // namespace
}  // namespace research_time_grid_search
