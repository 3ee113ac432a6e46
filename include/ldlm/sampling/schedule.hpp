// The variance-preserving "tangent" noise schedule of docs/model.md §Noise schedule and the
// sampling time grids (§Time grids). Everything here is computed in double: the values
// are scalars per step, so precision is free, and the model type S only enters when a
// time is handed to the denoiser.
//
//   x_t = α(t) x_0 + σ(t) ε,           ε ~ N(0, I), t ∈ [0, 1]
//   α(t) = (1 + D² tan²(πt/2))^(-1/2)  (α(0) = 1, α(1) = 0)
//   σ(t) = sqrt(1 − α(t)²)
//   β(t) = d/dt log(1/α²) = π D² tan(πt/2) (1 + tan²(πt/2)) / (1 + D² tan²(πt/2)),
//          evaluated at min(t, beta_t_clip) because β → ∞ as t → 1.
//   λ(t) = log(α/σ) = −log(D tan(πt/2))  (−∞ at t = 1), the exponential solvers' variable
//   σ/α  = D tan(πt/2), the noise-to-signal ratio of the Karras grid
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <numbers>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ldlm/core/error.hpp"
#include "ldlm/io/json.hpp"
#include "ldlm/io/safetensors.hpp"
#include "ldlm/model/config.hpp"

namespace ldlm {

struct TangentSchedule {
  double d = 3.0;             // D, Config::schedule_d
  double beta_t_clip = 0.95;  // Config::beta_t_clip

  static TangentSchedule from_config(const Config& c) { return {c.schedule_d, c.beta_t_clip}; }

  /// α(t) = (1 + D² tan²(πt/2))^(-1/2).
  double alpha(double t) const {
    const double dt = d * std::tan(std::numbers::pi * t / 2);
    return 1.0 / std::sqrt(1.0 + dt * dt);
  }

  /// σ(t) = sqrt(1 − α²), evaluated as D |tan| / sqrt(1 + D² tan²): the same value
  /// without the cancellation of 1 − α² at small t.
  double sigma(double t) const {
    const double dt = d * std::abs(std::tan(std::numbers::pi * t / 2));
    return dt / std::sqrt(1.0 + dt * dt);
  }

  /// λ(t) = log(α/σ) = −log(D tan(πt/2)); −∞ at t = 1, where α = 0.
  double lambda(double t) const {
    if (t >= 1.0) return -std::numeric_limits<double>::infinity();
    return -std::log(noise_ratio(t));
  }

  /// σ/α = D tan(πt/2), the noise-to-signal ratio; +∞ at t = 1.
  double noise_ratio(double t) const {
    if (t >= 1.0) return std::numeric_limits<double>::infinity();
    return d * std::tan(std::numbers::pi * t / 2);
  }

  /// The time whose σ/α is `ratio` (> 0): t = (2/π) atan(ratio / D).
  double time_of_noise_ratio(double ratio) const { return 2.0 / std::numbers::pi * std::atan(ratio / d); }

  /// The time whose λ is `lambda`: t = (2/π) atan(e^(−λ) / D).
  double time_of_lambda(double lambda) const { return time_of_noise_ratio(std::exp(-lambda)); }

  /// β(t) with t clipped to beta_t_clip.
  double beta(double t) const {
    const double tc = std::min(t, beta_t_clip);
    const double tan = std::tan(std::numbers::pi * tc / 2);
    return std::numbers::pi * d * d * tan * (1.0 + tan * tan) / (1.0 + d * d * tan * tan);
  }
};

/// The denoiser predicts x̂0; the noise and the score of x_t follow from it.
/// ε̂ = (x_t − α x̂0) / σ.
inline double epsilon_from_x0(double x_t, double x0, double alpha, double sigma) { return (x_t - alpha * x0) / sigma; }

/// score = ∇ log p(x_t) ≈ −ε̂ / σ.
inline double score_from_x0(double x_t, double x0, double alpha, double sigma) {
  return -epsilon_from_x0(x_t, x0, alpha, sigma) / sigma;
}

namespace detail {
/// The entry of a table of named choices (kTimeGrids, kSamplers) called `name`, or null.
template <class Table>
const typename Table::value_type* find_named(const Table& table, std::string_view name) {
  for (const auto& entry : table)
    if (entry.name == name) return &entry;
  return nullptr;
}

/// The entry of a table of named choices whose `member` is `value`; an InvalidArgument
/// naming `what` (e.g. "sampler: unknown SamplerKind") when there is none.
template <class Table, class Member, class Value>
const typename Table::value_type& info_of(const Table& table, Member member, Value value, std::string_view what) {
  for (const auto& entry : table)
    if (entry.*member == value) return entry;
  throw InvalidArgument(std::string(what) + " value " + std::to_string(static_cast<int>(value)));
}

/// The names of a table's entries, joined by `separator`.
template <class Table>
std::string joined_names(const Table& table, std::string_view separator) {
  std::string s;
  for (const auto& entry : table) s += (s.empty() ? "" : std::string(separator)) + std::string(entry.name);
  return s;
}
}  // namespace detail

/// One entry of a table of named choices (kTimeGrids, kConditionMethods, kKnownFills):
/// the value, its name as the CLI spells it, and a line for the help.
template <class E>
struct NamedChoice {
  E value;
  std::string_view name;
  std::string_view summary;
};

/// The spacing of a sampling time grid (docs/model.md §Time grids).
enum class TimeGrid {
  uniform,    // even in t
  lambda,     // even in λ = log(α/σ) after the first step
  karras,     // even in (σ/α)^(1/ρ) after the first step (Karras et al. 2022)
  fitted,     // the model file's own grid for the step count (TimeGridOptions::fitted)
  automatic,  // fitted when the model has a grid for the step count, else lambda
};

inline constexpr std::array<NamedChoice<TimeGrid>, 5> kTimeGrids{{
    {TimeGrid::uniform, "uniform", "even in t"},
    {TimeGrid::lambda, "lambda", "even in log(alpha/sigma) after the first step"},
    {TimeGrid::karras, "karras", "Karras' rho-grid in sigma/alpha after the first step"},
    {TimeGrid::fitted, "fitted", "the model file's grid for the step count, fitted to the model"},
    {TimeGrid::automatic, "auto", "fitted when the model file has a grid for the step count, else lambda"},
}};

/// Grids fitted to a model offline (research/fit_time_grid.cpp), by step count: each
/// holds steps + 1 times from 1 down to the model's t_min.
using FittedTimeGrids = std::map<int, std::vector<double>>;

/// The `__metadata__` key of a model file's fitted grid of N steps is this prefix and N
/// ("ldlm.time_grid.10"); its value is a JSON list of the N + 1 times.
inline constexpr std::string_view kTimeGridMetadataPrefix = "ldlm.time_grid.";

/// The `__metadata__` key of the decoupled model times that go with a model file's fitted grid
/// of N steps is this prefix and N ("ldlm.model_time.10"); its value is a JSON list of N times
/// in (0, 1], the time the denoiser is given at each step's call (SolverSettings::model_times).
inline constexpr std::string_view kModelTimeMetadataPrefix = "ldlm.model_time.";

inline const NamedChoice<TimeGrid>& time_grid_info(TimeGrid grid) {
  return detail::info_of(kTimeGrids, &NamedChoice<TimeGrid>::value, grid, "time grid: unknown TimeGrid");
}

/// The grid named `name`, if there is one.
inline std::optional<TimeGrid> find_time_grid(std::string_view name) {
  if (const auto* info = detail::find_named(kTimeGrids, name)) return info->value;
  return std::nullopt;
}

/// The names of every grid, joined by `separator`.
inline std::string time_grid_names(std::string_view separator = ", ") {
  return detail::joined_names(kTimeGrids, separator);
}

/// How a grid is spaced. sigma_max and rho apply to the λ and Karras grids only (and to
/// `automatic` when it falls back to the λ grid).
struct TimeGridOptions {
  TimeGrid grid = TimeGrid::automatic;
  /// σ/α at t_1, where the λ and Karras grids start after the first step from t = 1;
  /// 0 takes the uniform grid's t_1 = 1 − (1 − t_min)/steps, so that the first step
  /// shrinks as steps grow and the grid converges (σ/α ≈ 19.9 at 10 steps).
  double sigma_max = 0.0;
  double rho = 7.0;  // the Karras grid's exponent
  /// The model's fitted grids (read_time_grids), for `fitted` and `automatic`.
  FittedTimeGrids fitted = {};
  /// The model times of some of those grids (read_model_times), by step count.
  FittedTimeGrids model_times = {};
};

/// Throws InvalidArgument unless `times` has at least two entries, starts at most
/// at 1, ends above 0 and strictly decreases; `op` names the caller.
inline void check_time_grid(std::string_view op, std::span<const double> times) {
  const std::string where(op);
  if (times.size() < 2)
    throw InvalidArgument(where + ": a time grid needs at least 2 times, got " + std::to_string(times.size()));
  if (!(times.front() <= 1.0) || !(times.back() > 0.0))
    throw InvalidArgument(where + ": a time grid must lie in (0, 1], got t_0 = " + std::to_string(times.front()) +
                          " and t_" + std::to_string(times.size() - 1) + " = " + std::to_string(times.back()));
  for (std::size_t i = 0; i + 1 < times.size(); ++i)
    if (!(times[i + 1] < times[i]))
      throw InvalidArgument(where + ": a time grid must decrease strictly, got t_" + std::to_string(i) + " = " +
                            std::to_string(times[i]) + " and t_" + std::to_string(i + 1) + " = " +
                            std::to_string(times[i + 1]));
}

/// steps + 1 evenly spaced times from 1 down to t_min: t_i = 1 − i (1 − t_min) / steps,
/// with both endpoints exact. Step i goes from t_i to t_{i+1}.
inline std::vector<double> time_grid(int steps, double t_min) {
  if (steps < 1) throw InvalidArgument("time_grid: steps must be >= 1, got " + std::to_string(steps));
  if (!(t_min > 0 && t_min < 1))
    throw InvalidArgument("time_grid: t_min must be in (0, 1), got " + std::to_string(t_min));
  std::vector<double> t(static_cast<std::size_t>(steps) + 1);
  for (int i = 0; i <= steps; ++i) t[i] = 1.0 - (1.0 - t_min) * i / steps;
  t.back() = t_min;
  return t;
}

/// steps + 1 times from t_0 = 1 down to t_steps = t_min (both exact), spaced as
/// `options` says (docs/model.md §Time grids). Every grid starts at t = 1, where the
/// prior N(0, I) is exact. The λ and Karras grids cannot space their first step,
/// which is infinitely long in λ and in σ/α, so it goes from 1 to t_1 with σ/α = sigma_max
/// (0: the uniform grid's t_1);
/// the other steps are spaced between t_1 and t_min:
///   lambda: λ_i = λ_1 + (i − 1)/(steps − 1) · (λ(t_min) − λ_1)
///   karras: (σ/α)_i = (r_1^(1/ρ) + (i − 1)/(steps − 1) · (r_min^(1/ρ) − r_1^(1/ρ)))^ρ
/// With one step, every grid is {1, t_min}.
inline std::vector<double> time_grid(int steps, double t_min, const TangentSchedule& schedule,
                                     const TimeGridOptions& options) {
  if (options.grid == TimeGrid::fitted || options.grid == TimeGrid::automatic) {
    const auto found = options.fitted.find(steps);
    if (found != options.fitted.end()) {
      if (found->second.back() != t_min)
        throw InvalidArgument("time_grid fitted: the grid of " + std::to_string(steps) + " steps ends at t = " +
                              std::to_string(found->second.back()) + ", the model's t_min is " + std::to_string(t_min));
      return found->second;
    }
    if (options.grid == TimeGrid::fitted) {
      std::string have;
      for (const auto& [n, times] : options.fitted) have += (have.empty() ? "" : ", ") + std::to_string(n);
      throw InvalidArgument("time_grid fitted: the model has no fitted grid of " + std::to_string(steps) + " steps; " +
                            (have.empty() ? std::string("it has none") : "it has grids of " + have + " steps"));
    }
    TimeGridOptions lambda = options;
    lambda.grid = TimeGrid::lambda;
    return time_grid(steps, t_min, schedule, lambda);
  }
  if (options.grid == TimeGrid::uniform || steps == 1) return time_grid(steps, t_min);
  std::vector<double> t = time_grid(steps, t_min);  // checks steps and t_min
  const double r_min = schedule.noise_ratio(t_min);
  const std::string name(time_grid_info(options.grid).name);
  const double sigma_max = options.sigma_max == 0.0 ? schedule.noise_ratio(t[1]) : options.sigma_max;
  if (!(sigma_max > r_min) || !std::isfinite(sigma_max))
    throw InvalidArgument("time_grid " + name + ": sigma_max must be finite and above sigma/alpha at t_min = " +
                          std::to_string(r_min) + ", got " + std::to_string(options.sigma_max));
  if (options.grid == TimeGrid::karras && !(options.rho > 0 && std::isfinite(options.rho)))
    throw InvalidArgument("time_grid karras: rho must be finite and > 0, got " + std::to_string(options.rho));
  const int last = steps - 1;  // intervals between t_1 and t_steps
  for (int i = 1; i < steps; ++i) {
    const double f = static_cast<double>(i - 1) / last;
    if (options.grid == TimeGrid::lambda) {
      const double l1 = -std::log(sigma_max), l_min = -std::log(r_min);
      t[i] = schedule.time_of_lambda(l1 + f * (l_min - l1));
    } else {
      const double a = std::pow(sigma_max, 1.0 / options.rho), b = std::pow(r_min, 1.0 / options.rho);
      t[i] = schedule.time_of_noise_ratio(std::pow(a + f * (b - a), options.rho));
    }
  }
  t.front() = 1.0;
  t.back() = t_min;
  return t;
}

namespace detail {
/// The step count N at the end of a metadata key; a CheckpointError naming `where` unless N
/// is in [1, 1024].
inline int metadata_step_count(const std::string& where, std::string_view suffix) {
  int steps = 0;
  const auto [end, ec] = std::from_chars(suffix.data(), suffix.data() + suffix.size(), steps);
  if (suffix.empty() || ec != std::errc() || end != suffix.data() + suffix.size() || steps < 1 || steps > 1024)
    throw CheckpointError(where + ": the key must end in a step count in [1, 1024]");
  return steps;
}
}  // namespace detail

/// The model times that go with time_grid(steps, ..., options), for SolverSettings::model_times:
/// the model's own when the grid is its fitted one (`fitted`, or `automatic` with a grid for
/// `steps`) and it has model times for it; else none, and the denoiser is called at the
/// grid's times.
inline std::vector<double> model_times(int steps, const TimeGridOptions& options) {
  if (options.grid != TimeGrid::fitted && options.grid != TimeGrid::automatic) return {};
  if (!options.fitted.contains(steps)) return {};
  const auto found = options.model_times.find(steps);
  return found == options.model_times.end() ? std::vector<double>{} : found->second;
}

/// The fitted grids in a model file's `__metadata__` (kTimeGridMetadataPrefix), for a model
/// whose t_min is `t_min`; empty when it has none. A key whose suffix is not a step count
/// in [1, 1024], or a value that is not a JSON list of steps + 1 numbers from 1 strictly
/// down to t_min, is a CheckpointError naming the file and the key.
inline FittedTimeGrids read_time_grids(const SafetensorsFile& file, double t_min) {
  FittedTimeGrids grids;
  for (const auto& [key, value] : file.metadata()) {
    if (!key.starts_with(kTimeGridMetadataPrefix)) continue;
    const std::string where = "checkpoint '" + file.path() + "': __metadata__ '" + key + "'";
    const int steps = detail::metadata_step_count(where, std::string_view(key).substr(kTimeGridMetadataPrefix.size()));
    const nlohmann::json list =
        read_json(value, [&](const JsonProblem& p) { throw CheckpointError(where + ": " + p.message); });
    if (!list.is_array() || list.size() != static_cast<std::size_t>(steps) + 1)
      throw CheckpointError(
          where + ": expected a JSON list of " + std::to_string(steps + 1) + " times, got " +
          (list.is_array() ? std::to_string(list.size()) + " entries" : std::string(list.type_name())));
    std::vector<double> times;
    for (const auto& t : list) {
      if (!t.is_number()) throw CheckpointError(where + ": expected numbers, got a " + std::string(t.type_name()));
      times.push_back(t.get<double>());
    }
    try {
      check_time_grid(where, times);
    } catch (const InvalidArgument& e) {
      throw CheckpointError(e.what());
    }
    if (times.front() != 1.0 || times.back() != t_min)
      throw CheckpointError(where + ": a grid must run from t = 1 to the model's t_min = " + std::to_string(t_min) +
                            ", got " + std::to_string(times.front()) + " to " + std::to_string(times.back()));
    grids.emplace(steps, std::move(times));
  }
  return grids;
}

/// The model times in a model file's `__metadata__` (kModelTimeMetadataPrefix), by step
/// count; empty when it has none. Each must go with one of `grids` (read_time_grids) of the
/// same step count, and be a JSON list of that many times in (0, 1]; anything else is a
/// CheckpointError naming the file and the key.
inline FittedTimeGrids read_model_times(const SafetensorsFile& file, const FittedTimeGrids& grids) {
  FittedTimeGrids model_times;
  for (const auto& [key, value] : file.metadata()) {
    if (!key.starts_with(kModelTimeMetadataPrefix)) continue;
    const std::string where = "checkpoint '" + file.path() + "': __metadata__ '" + key + "'";
    const int steps = detail::metadata_step_count(where, std::string_view(key).substr(kModelTimeMetadataPrefix.size()));
    if (!grids.contains(steps))
      throw CheckpointError(where + ": there is no '" + std::string(kTimeGridMetadataPrefix) + std::to_string(steps) +
                            "' grid for these model times");
    const nlohmann::json list =
        read_json(value, [&](const JsonProblem& p) { throw CheckpointError(where + ": " + p.message); });
    if (!list.is_array() || list.size() != static_cast<std::size_t>(steps))
      throw CheckpointError(
          where + ": expected a JSON list of " + std::to_string(steps) + " times, got " +
          (list.is_array() ? std::to_string(list.size()) + " entries" : std::string(list.type_name())));
    std::vector<double> times;
    for (const auto& t : list) {
      if (!t.is_number() || !(t.get<double>() > 0.0 && t.get<double>() <= 1.0))
        throw CheckpointError(where + ": expected times in (0, 1], got " + t.dump());
      times.push_back(t.get<double>());
    }
    model_times.emplace(steps, std::move(times));
  }
  return model_times;
}

}  // namespace ldlm
