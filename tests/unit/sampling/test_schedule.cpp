// The tangent schedule (sampling/schedule.hpp, docs/model.md §Noise schedule) against the
// formulas written out in long double (support/schedule_reference.hpp), and the time
// grids: uniform, λ and Karras.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ldlm/ldlm.hpp"
#include "support/errors.hpp"
#include "support/reference.hpp"
#include "support/schedule_reference.hpp"

namespace ldlm {
namespace unit_sampling_schedule {
namespace {

using ::testing::HasSubstr;

using test::error_of;
using test::kPi;
using test::ref_alpha;
using test::ref_beta;
using test::ref_sigma;

void expect_close(double got, long double ref, const char* what, double t) {
  const long double tol = 1e-12L * std::fabs(ref) + 1e-15L;
  EXPECT_LE(std::fabs(static_cast<long double>(got) - ref), tol)
      << what << "(" << t << "): got " << got << ", reference " << static_cast<double>(ref);
}

TEST(Schedule, MatchesSpecFormulasAtSeveralTimes) {
  const TangentSchedule s = TangentSchedule::from_config(Config{});
  EXPECT_EQ(s.d, 3.0);
  EXPECT_EQ(s.beta_t_clip, 0.95);
  for (double t : {0.05, 0.3, 0.5, 0.9, 0.97, 1.0}) {
    expect_close(s.alpha(t), ref_alpha(t, 3), "alpha", t);
    expect_close(s.sigma(t), ref_sigma(t, 3), "sigma", t);
    expect_close(s.beta(t), ref_beta(t, 3, 0.95L), "beta", t);
    EXPECT_NEAR(s.alpha(t) * s.alpha(t) + s.sigma(t) * s.sigma(t), 1.0, 1e-15) << "variance preserving at t=" << t;
  }
  // Hand values: at t = 0.5, tan = 1: α = 1/sqrt(10), β = π·9·2/10.
  EXPECT_NEAR(s.alpha(0.5), 1.0 / std::sqrt(10.0), 1e-15);
  EXPECT_NEAR(s.beta(0.5), kPi * 1.8L, 1e-13);
  EXPECT_EQ(s.beta(0.97), s.beta(0.95)) << "beta clips t at beta_t_clip";
  EXPECT_EQ(s.beta(1.0), s.beta(0.95));
  EXPECT_NEAR(s.alpha(1.0), 0.0, 1e-15);
  EXPECT_EQ(s.sigma(1.0), 1.0);
}

TEST(Schedule, FollowsConfigSwitches) {
  Config c;
  c.schedule_d = 2.0;
  c.beta_t_clip = 0.9;
  const TangentSchedule s = TangentSchedule::from_config(c);
  expect_close(s.alpha(0.3), ref_alpha(0.3L, 2), "alpha D=2", 0.3);
  expect_close(s.beta(0.93), ref_beta(0.93L, 2, 0.9L), "beta clip 0.9", 0.93);
}

TEST(Schedule, ScoreFromX0) {
  // ε̂ = (x − α x̂0)/σ, score = −ε̂/σ.
  EXPECT_DOUBLE_EQ(epsilon_from_x0(1.0, 2.0, 0.6, 0.8), (1.0 - 1.2) / 0.8);
  EXPECT_DOUBLE_EQ(score_from_x0(1.0, 2.0, 0.6, 0.8), -((1.0 - 1.2) / 0.8) / 0.8);
}

TEST(ScheduleTimeGrid, EvenlySpacedFromOneToTMin) {
  const auto t = time_grid(4, 0.05);
  ASSERT_EQ(t.size(), 5u);
  EXPECT_EQ(t.front(), 1.0);
  EXPECT_EQ(t.back(), 0.05);
  for (std::size_t i = 0; i + 1 < t.size(); ++i) EXPECT_NEAR(t[i] - t[i + 1], 0.95 / 4, 1e-15) << "gap " << i;
  const auto one = time_grid(1, 0.05);
  EXPECT_EQ(one, (std::vector<double>{1.0, 0.05}));
}

TEST(ScheduleTimeGrid, RejectsBadArguments) {
  try {
    time_grid(0, 0.05);
    FAIL() << "steps = 0 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("steps must be >= 1, got 0"));
  }
  try {
    time_grid(4, 1.5);
    FAIL() << "t_min = 1.5 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("t_min must be in (0, 1)"));
  }
}

TEST(ScheduleTimeGrid, LambdaAndKarrasGridsAreSpacedAsDocumented) {
  const TangentSchedule s;
  const double r_min = s.noise_ratio(0.05);
  for (int steps : {2, 3, 10}) {
    TimeGridOptions lambda{TimeGrid::lambda, 20.0, 7.0};
    const auto t = time_grid(steps, 0.05, s, lambda);
    ASSERT_EQ(t.size(), std::size_t(steps) + 1);
    EXPECT_EQ(t.front(), 1.0);
    EXPECT_EQ(t.back(), 0.05);
    EXPECT_NEAR(s.noise_ratio(t[1]), 20.0, 1e-9);
    for (int i = 1; i + 1 < steps; ++i)
      EXPECT_NEAR(s.lambda(t[i + 1]) - s.lambda(t[i]), (std::log(20.0) - std::log(r_min)) / (steps - 1), 1e-12)
          << "lambda grid, step " << i;
    check_time_grid("test", t);

    TimeGridOptions karras{TimeGrid::karras, 20.0, 7.0};
    const auto k = time_grid(steps, 0.05, s, karras);
    EXPECT_EQ(k.front(), 1.0);
    EXPECT_EQ(k.back(), 0.05);
    const double a = std::pow(20.0, 1 / 7.0), b = std::pow(r_min, 1 / 7.0);
    for (int i = 1; i < steps; ++i)
      EXPECT_NEAR(std::pow(s.noise_ratio(k[i]), 1 / 7.0), a + (i - 1.0) / (steps - 1) * (b - a), 1e-12)
          << "karras grid, time " << i;
    check_time_grid("test", k);
  }
  EXPECT_EQ(time_grid(1, 0.05, s, TimeGridOptions{TimeGrid::karras}), (std::vector<double>{1.0, 0.05}));
  EXPECT_EQ(time_grid(6, 0.05, s, TimeGridOptions{TimeGrid::uniform}), time_grid(6, 0.05));
  // sigma_max = 0 (the default) starts the spaced steps at the uniform grid's t_1.
  for (TimeGrid grid : {TimeGrid::lambda, TimeGrid::karras})
    for (int steps : {2, 10, 1000}) {
      const auto t = time_grid(steps, 0.05, s, TimeGridOptions{grid});
      EXPECT_NEAR(t[1], time_grid(steps, 0.05)[1], 1e-12) << time_grid_info(grid).name << ", " << steps << " steps";
      check_time_grid("test", t);
    }
  // λ and t: inverse functions, λ = −∞ at t = 1.
  for (double t : {0.05, 0.3, 0.7, 0.99}) EXPECT_NEAR(s.time_of_lambda(s.lambda(t)), t, 1e-14);
  EXPECT_EQ(s.lambda(1.0), -std::numeric_limits<double>::infinity());
}

/// A model file with nothing but these `__metadata__` entries.
SafetensorsFile file_with_metadata(const std::map<std::string, std::string>& metadata) {
  SafetensorsWriter writer;
  for (const auto& [key, value] : metadata) writer.set_metadata(key, value);
  const float one = 1.0f;
  writer.add("denoiser.x", Shape{1}, &one);
  return SafetensorsFile::from_buffer(writer.to_bytes());
}

TEST(ScheduleFittedGrid, StoredGridsAreReadAndUsedForTheirStepCount) {
  const TangentSchedule s;
  const SafetensorsFile file = file_with_metadata(
      {{"ldlm.time_grid.2", "[1, 0.5, 0.05]"}, {"ldlm.time_grid.3", "[1.0, 0.9, 0.25, 0.05]"}, {"ldlm.config", "{}"}});
  const FittedTimeGrids grids = read_time_grids(file, 0.05);
  ASSERT_EQ(grids.size(), 2u);
  const TimeGridOptions fitted{TimeGrid::fitted, 0.0, 7.0, grids};
  EXPECT_EQ(time_grid(3, 0.05, s, fitted), (std::vector<double>{1.0, 0.9, 0.25, 0.05}));
  EXPECT_EQ(time_grid(2, 0.05, s, fitted), (std::vector<double>{1.0, 0.5, 0.05}));
  // auto: the stored grid where there is one, the λ grid (with its options) elsewhere.
  const TimeGridOptions automatic{TimeGrid::automatic, 0.0, 5.0, grids};
  EXPECT_EQ(time_grid(3, 0.05, s, automatic), time_grid(3, 0.05, s, fitted));
  EXPECT_EQ(time_grid(4, 0.05, s, automatic), time_grid(4, 0.05, s, TimeGridOptions{TimeGrid::lambda, 0.0, 5.0}));
  EXPECT_EQ(time_grid(10, 0.05, s, TimeGridOptions{}), time_grid(10, 0.05, s, TimeGridOptions{TimeGrid::lambda}));
  EXPECT_THAT(error_of<InvalidArgument>([&] { time_grid(4, 0.05, s, fitted); }),
              HasSubstr("time_grid fitted: the model has no fitted grid of 4 steps; it has grids of 2, 3 steps"));
  EXPECT_THAT(error_of<InvalidArgument>([&] { time_grid(4, 0.05, s, TimeGridOptions{TimeGrid::fitted}); }),
              HasSubstr("it has none"));
  EXPECT_THAT(error_of<InvalidArgument>([&] { time_grid(3, 0.1, s, fitted); }),
              HasSubstr("the grid of 3 steps ends at t = 0.050000, the model's t_min is 0.100000"));
  EXPECT_TRUE(read_time_grids(file_with_metadata({}), 0.05).empty());
}

// Model times go with the fitted grid of their step count, and only when that grid is used.
TEST(ScheduleFittedGrid, StoredModelTimesGoWithTheirGrid) {
  const SafetensorsFile file = file_with_metadata({{"ldlm.time_grid.2", "[1, 0.5, 0.05]"},
                                                   {"ldlm.time_grid.3", "[1, 0.9, 0.25, 0.05]"},
                                                   {"ldlm.model_time.2", "[1, 0.45]"}});
  const FittedTimeGrids grids = read_time_grids(file, 0.05);
  const FittedTimeGrids model = read_model_times(file, grids);
  ASSERT_EQ(model.size(), 1u);
  TimeGridOptions options{TimeGrid::automatic, 0.0, 7.0, grids, model};
  EXPECT_EQ(model_times(2, options), (std::vector<double>{1.0, 0.45}));
  EXPECT_TRUE(model_times(3, options).empty()) << "a grid without model times";
  EXPECT_TRUE(model_times(4, options).empty()) << "auto's λ fallback";
  options.grid = TimeGrid::fitted;
  EXPECT_EQ(model_times(2, options), (std::vector<double>{1.0, 0.45}));
  options.grid = TimeGrid::lambda;
  EXPECT_TRUE(model_times(2, options).empty()) << "another grid than the fitted one";
  EXPECT_TRUE(read_model_times(file_with_metadata({}), {}).empty());

  const auto error = [&](const std::string& key, const std::string& value) {
    return error_of<CheckpointError>([&] { read_model_times(file_with_metadata({{key, value}}), grids); });
  };
  EXPECT_THAT(error("ldlm.model_time.4", "[1, 0.9, 0.5, 0.2]"),
              HasSubstr("'ldlm.model_time.4': there is no 'ldlm.time_grid.4' grid for these model times"));
  EXPECT_THAT(error("ldlm.model_time.x", "[1]"), HasSubstr("the key must end in a step count"));
  EXPECT_THAT(error("ldlm.model_time.2", "[1, 0.5, 0.05]"),
              HasSubstr("expected a JSON list of 2 times, got 3 entries"));
  EXPECT_THAT(error("ldlm.model_time.2", "[1, 0]"), HasSubstr("expected times in (0, 1], got 0"));
  EXPECT_THAT(error("ldlm.model_time.2", "[1.5, 0.5]"), HasSubstr("expected times in (0, 1], got 1.5"));
  EXPECT_THAT(error("ldlm.model_time.2", "[1, \"x\"]"), HasSubstr("expected times in (0, 1], got \"x\""));
}

TEST(ScheduleFittedGrid, BadStoredGridsAreClearErrors) {
  const auto error = [](const std::string& key, const std::string& value) {
    return error_of<CheckpointError>([&] { read_time_grids(file_with_metadata({{key, value}}), 0.05); });
  };
  EXPECT_THAT(error("ldlm.time_grid.x", "[1, 0.05]"),
              HasSubstr("'ldlm.time_grid.x': the key must end in a step count"));
  EXPECT_THAT(error("ldlm.time_grid.0", "[1]"), HasSubstr("a step count in [1, 1024]"));
  EXPECT_THAT(error("ldlm.time_grid.2", "[1, 0.05]"), HasSubstr("expected a JSON list of 3 times, got 2 entries"));
  EXPECT_THAT(error("ldlm.time_grid.1", "{\"a\": 1}"), HasSubstr("expected a JSON list of 2 times, got object"));
  EXPECT_THAT(error("ldlm.time_grid.1", "[1, \"x\"]"), HasSubstr("expected numbers, got a string"));
  EXPECT_THAT(error("ldlm.time_grid.1", "[1, 0.05"), HasSubstr("'ldlm.time_grid.1': not valid JSON"));
  EXPECT_THAT(error("ldlm.time_grid.2", "[1, 0.05, 0.5]"), HasSubstr("must decrease strictly"));
  EXPECT_THAT(error("ldlm.time_grid.1", "[0.9, 0.05]"), HasSubstr("from t = 1 to the model's t_min = 0.050000"));
  EXPECT_THAT(error("ldlm.time_grid.1", "[1, 0.1]"), HasSubstr("got 1.000000 to 0.100000"));
}

}  // namespace
}  // namespace unit_sampling_schedule
}  // namespace ldlm
