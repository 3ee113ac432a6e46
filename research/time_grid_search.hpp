// The end-to-end fit of a time grid (research/fit_time_grid.cpp, `--methods end-to-end`), after
// LD3 (Tong et al., ICLR 2025, "Learning to Discretize Denoising Diffusion ODEs"), done
// without derivatives: the N + 1 times are chosen to minimise the *final* error of the real
// solver run on them from each fitting seed's noise, against that seed's converged reference,
// averaged over the seeds. Kept apart from the model so that a test can run it on an analytic
// denoiser (research/test_time_grid_search.cpp).
#pragma once

#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ldlm/sampling/schedule.hpp"

namespace ldlm::research {

/// A grid of N steps from t = 1 to t_min written as N − 1 free numbers, the logs of the gaps
/// in λ between t_1, …, t_N: λ_N = λ(t_min), λ_i = λ_{i+1} − exp(g_i) for i = N − 1 … 1, and
/// t_0 = 1 (λ = −∞, so the first step has no finite gap to fit). The grid decreases strictly
/// with both ends exact for any g's double can resolve (`representable`: far out, t_1 rounds
/// to 1 or two times round to one), so the search needs no other constraint; and moving one g
/// moves t_1 … t_i together, which keeps the grid's shape elsewhere.
struct LambdaGaps {
  TangentSchedule schedule;
  double t_min = 0.05;

  std::vector<double> times(std::span<const double> log_gaps) const {
    const std::size_t steps = log_gaps.size() + 1;
    std::vector<double> t(steps + 1);
    t.front() = 1.0;
    t.back() = t_min;
    double lambda = schedule.lambda(t_min);
    for (std::size_t i = steps - 1; i >= 1; --i) {
      lambda -= std::exp(log_gaps[i - 1]);
      t[i] = schedule.time_of_lambda(lambda);
    }
    return t;
  }

  /// Whether `times` (from `times()`) decreases strictly: false only for extreme g's.
  static bool representable(std::span<const double> times) {
    for (std::size_t i = 0; i + 1 < times.size(); ++i)
      if (!(times[i + 1] < times[i])) return false;
    return true;
  }

  /// The g's of a grid from 1 to t_min (the inverse of `times`): where the search starts.
  std::vector<double> log_gaps(std::span<const double> times) const {
    check_time_grid("LambdaGaps", times);
    if (times.size() < 3) throw InvalidArgument("LambdaGaps: a grid of one step has no gap to fit");
    std::vector<double> g(times.size() - 2);
    for (std::size_t i = 1; i + 1 < times.size(); ++i)
      g[i - 1] = std::log(schedule.lambda(times[i + 1]) - schedule.lambda(times[i]));
    return g;
  }
};

/// A grid and its decoupled model times (SolverSettings::model_times, after LD3's decoupled
/// model time) as one vector of 2(N − 1) free numbers: the first N − 1 are the grid's
/// LambdaGaps, the next N − 1 the offsets δ_i, in λ, of the time the denoiser is given at
/// t_1 … t_{N−1}: λ(t'_i) = λ(t_i) + δ_i. The call at t = 1 keeps t = 1 (λ = −∞ has no offset
/// to make). A zero offset gives t_i itself, not its round trip through λ, so that zero
/// offsets are the grid's own times exactly.
struct DecoupledGrid {
  LambdaGaps gaps;

  static std::size_t steps(std::span<const double> parameters) {
    if (parameters.empty() || parameters.size() % 2 != 0)
      throw InvalidArgument("DecoupledGrid: expected 2(N - 1) > 0 parameters, got " +
                            std::to_string(parameters.size()));
    return parameters.size() / 2 + 1;
  }

  std::vector<double> times(std::span<const double> parameters) const {
    return gaps.times(parameters.first(steps(parameters) - 1));
  }

  /// The N model times for `times(parameters)`.
  std::vector<double> model_times(std::span<const double> parameters) const {
    const std::size_t n = steps(parameters);
    const std::vector<double> grid = times(parameters);
    std::vector<double> model(grid.begin(), grid.end() - 1);
    for (std::size_t i = 1; i < n; ++i) {
      const double offset = parameters[n - 1 + i - 1];
      if (offset != 0.0) model[i] = gaps.schedule.time_of_lambda(gaps.schedule.lambda(grid[i]) + offset);
    }
    return model;
  }

  /// The parameters of `grid` with zero offsets: where the search starts.
  std::vector<double> parameters(std::span<const double> grid) const {
    std::vector<double> p = gaps.log_gaps(grid);
    p.resize(2 * p.size(), 0.0);
    return p;
  }
};

/// The error of one final latent against its reference: the RMS over each position's d values
/// of the difference, averaged over positions, scaled by `weight`. A token changes when its
/// position's latent crosses a margin, so a mean of per-position errors follows the share of
/// changed ids more closely than one RMS over everything, which a few large errors dominate
/// (research/fit_time_grid.cpp's step costs measure the same way).
inline double per_position_error(std::span<const float> x, std::span<const float> reference, std::size_t d,
                                 double weight) {
  if (x.size() != reference.size() || d == 0 || x.size() % d != 0)
    throw InvalidArgument("per_position_error: " + std::to_string(x.size()) + " values against a reference of " +
                          std::to_string(reference.size()) + ", positions of " + std::to_string(d));
  const std::size_t positions = x.size() / d;
  double sum = 0;
  for (std::size_t p = 0; p < positions; ++p) {
    double squares = 0;
    for (std::size_t q = p * d; q < (p + 1) * d; ++q) {
      const double e = double(x[q]) - double(reference[q]);
      squares += e * e;
    }
    sum += std::sqrt(squares / double(d));
  }
  return weight * sum / double(positions);
}

/// The end-to-end objective of a grid: the mean over the fitting seeds of per_position_error
/// between `run(i, times)`, seed i's x(t_min) from the solver on `times`, and `references[i]`,
/// seed i's converged x(t_min). Every seed counts once.
template <class Run>
double end_to_end_error(const Run& run, std::span<const std::vector<float>> references, std::size_t d, double weight,
                        std::span<const double> times) {
  if (references.empty()) throw InvalidArgument("end_to_end_error: no fitting seeds");
  double sum = 0;
  for (std::size_t i = 0; i < references.size(); ++i) {
    const std::vector<float> x = run(i, times);
    sum += per_position_error(x, references[i], d, weight);
  }
  return sum / double(references.size());
}

/// What the search minimises over the log-gaps: end_to_end_error on their grid, or +∞ where
/// they give no grid double can hold.
template <class Run>
double end_to_end_objective(const LambdaGaps& gaps, const Run& run, std::span<const std::vector<float>> references,
                            std::size_t d, double weight, std::span<const double> log_gaps) {
  const std::vector<double> times = gaps.times(log_gaps);
  if (!LambdaGaps::representable(times)) return std::numeric_limits<double>::infinity();
  return end_to_end_error(run, references, d, weight, times);
}

struct SearchResult {
  std::vector<double> x;
  double value = std::numeric_limits<double>::infinity();
  int evaluations = 0;
};

/// Compass search (a derivative-free pattern search): from x, try ±step along each coordinate
/// in turn, keeping any move that lowers f; after a sweep with no move, halve the step; stop
/// below `min_step` or after `budget` evaluations of f. A coordinate's last successful sign is
/// tried first. Its result is never worse than the start, and on a smooth f it ends at a point
/// no ±min_step move improves (Kolda, Lewis and Torczon 2003). `report` sees each improvement.
inline SearchResult compass_search(const std::function<double(const std::vector<double>&)>& f, std::vector<double> x,
                                   double step, double min_step, int budget,
                                   const std::function<void(const SearchResult&)>& report = {}) {
  if (!(step > 0) || !(min_step > 0) || budget < 1)
    throw InvalidArgument("compass_search: step " + std::to_string(step) + ", min_step " + std::to_string(min_step) +
                          " and budget " + std::to_string(budget) + " must be > 0");
  SearchResult best{x, f(x), 1};
  std::vector<double> sign(x.size(), 1.0);
  while (step >= min_step && best.evaluations < budget) {
    bool moved = false;
    for (std::size_t i = 0; i < x.size() && best.evaluations < budget; ++i)
      for (const double direction : {sign[i], -sign[i]}) {
        if (best.evaluations >= budget) break;
        std::vector<double> trial = best.x;
        trial[i] += direction * step;
        const double value = f(trial);
        ++best.evaluations;
        if (value < best.value) {
          best.x = std::move(trial);
          best.value = value;
          sign[i] = direction;
          moved = true;
          if (report) report(best);
          break;
        }
      }
    if (!moved) step /= 2;
  }
  return best;
}

}  // namespace ldlm::research
