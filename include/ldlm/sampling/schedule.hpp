// The variance-preserving "tangent" noise schedule of docs/model.md §Noise schedule and the
// sampling time grid. Everything here is computed in double: the values are
// scalars per step, so precision is free, and the model type S only enters when a
// time is handed to the denoiser.
//
//   x_t = α(t) x_0 + σ(t) ε,           ε ~ N(0, I), t ∈ [0, 1]
//   α(t) = (1 + D² tan²(πt/2))^(-1/2)  (α(0) = 1, α(1) = 0)
//   σ(t) = sqrt(1 − α(t)²)
//   β(t) = d/dt log(1/α²) = π D² tan(πt/2) (1 + tan²(πt/2)) / (1 + D² tan²(πt/2)),
//          evaluated at min(t, beta_t_clip) because β → ∞ as t → 1.
#pragma once

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "ldlm/core/error.hpp"
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

}  // namespace ldlm
