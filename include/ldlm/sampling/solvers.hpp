// The diffusion solvers of docs/model.md §Solvers: how x moves from t_i to t_{i+1} given
// the denoiser's x̂0. They know nothing of the model: `integrate` takes the denoiser as
// a callable, so that a test can hand it an analytic one, and a condition (the known
// tokens of an infill) enters only through SolverHooks.
//
// Every solver but the two Euler ones integrates the exact probability-flow ODE (or the
// reverse SDE) of the schedule, written in λ = log(α/σ) with the data prediction
// (DPM-Solver++, Lu et al. 2022). Their first step starts at t = 1, where λ = −∞ and α = 0;
// the coefficients below are written as ratios of α and σ, so that step is exact and
// nothing divides by zero. Each element is computed in double and rounded to S once per
// step.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "ldlm/core/context.hpp"
#include "ldlm/core/error.hpp"
#include "ldlm/core/random.hpp"
#include "ldlm/sampling/schedule.hpp"

namespace ldlm {

enum class SamplerKind {
  sde,           // Euler–Maruyama on the reverse SDE with the clipped β (the original sampler)
  ode,           // Euler on the probability-flow ODE with the clipped β
  ddim,          // exact first-order exponential integrator (DPM-Solver++ 1)
  heun,          // exponential Heun: trapezoidal in λ, two calls per step
  dpmpp_2m,      // DPM-Solver++(2M): second order, one call per step
  dpmpp_2m_sde,  // DPM-Solver++(2M) SDE, η = 1
  dpmpp_3m_sde,  // DPM-Solver++(3M) SDE, η = 1
};

struct SamplerInfo {
  SamplerKind kind;
  std::string_view name;  // as the CLI spells it
  int calls_per_step;     // denoiser calls
  int order;              // of the deterministic part, on a smooth problem
  bool stochastic;
  std::string_view summary;
};

inline constexpr std::array<SamplerInfo, 7> kSamplers{{
    {SamplerKind::sde, "sde", 1, 1, true, "Euler-Maruyama on the reverse SDE (clipped beta)"},
    {SamplerKind::ode, "ode", 1, 1, false, "Euler on the probability-flow ODE (clipped beta)"},
    {SamplerKind::ddim, "ddim", 1, 1, false, "exact first-order exponential integrator (DPM-Solver++ 1)"},
    {SamplerKind::heun, "heun", 2, 2, false, "exponential Heun, trapezoidal in lambda"},
    {SamplerKind::dpmpp_2m, "dpmpp-2m", 1, 2, false, "DPM-Solver++(2M), multistep"},
    {SamplerKind::dpmpp_2m_sde, "dpmpp-2m-sde", 1, 2, true, "DPM-Solver++(2M) SDE, eta = 1"},
    {SamplerKind::dpmpp_3m_sde, "dpmpp-3m-sde", 1, 3, true, "DPM-Solver++(3M) SDE, eta = 1"},
}};

inline const SamplerInfo& sampler_info(SamplerKind kind) {
  for (const auto& info : kSamplers)
    if (info.kind == kind) return info;
  throw InvalidArgument("sampler: unknown SamplerKind value " + std::to_string(static_cast<int>(kind)));
}

inline std::optional<SamplerKind> find_sampler(std::string_view name) {
  if (const auto* info = detail::find_named(kSamplers, name)) return info->kind;
  return std::nullopt;
}

inline std::string sampler_names(std::string_view separator = ", ") {
  return detail::joined_names(kSamplers, separator);
}

/// What the sampler returns (docs/model.md §The result).
enum class Endpoint {
  sample,    // x at t_min: the final step's deterministic mean
  denoised,  // the last x̂0 the denoiser gave
};

/// The self-conditioning input of Heun's second call, at t_{i+1}.
enum class HeunSelfCondition {
  latest,      // x̂0 of the step's first call, the most recent one
  step_start,  // the first call's own self-conditioning input
};

/// Where a sampling run has got to, after each step.
struct SamplingProgress {
  int step = 0, steps = 0;                  // steps done, of steps
  int denoiser_calls = 0, total_calls = 0;  // the same in denoiser calls (NFE)
};

struct SamplingStats {
  int steps = 0;
  int denoiser_calls = 0;
};

/// Changes a condition makes to the sampler's state. Both may be empty.
template <class S>
struct SolverHooks {
  /// After every denoiser call, before the solver reads x̂0 (n values, changed in
  /// place): the x̂0-space replacement of an infill. t is the call's time.
  std::function<void(double t, S* x0)> on_denoised;
  /// After each step, on x at t_next (n values, changed in place); `last` for the
  /// final step: the x-space replacement of an infill.
  std::function<void(double t_next, bool last, S* x)> on_step;
};

struct SolverSettings {
  SamplerKind kind = SamplerKind::dpmpp_2m;
  Endpoint endpoint = Endpoint::sample;
  HeunSelfCondition heun_self_condition = HeunSelfCondition::latest;
  /// Throw NumericError when the denoiser returns a NaN or an infinity.
  bool check_finite = false;
  /// After every step; returning false cancels sampling (SamplingCancelled). May be empty.
  std::function<bool(const SamplingProgress&)> progress;
};

/// The number of denoiser calls of `steps` steps of `kind`.
inline int denoiser_calls(SamplerKind kind, int steps) { return sampler_info(kind).calls_per_step * steps; }

/// One Euler step of n values from time t to t_next < t (dt = t_next − t), in place
/// on x, with x0 = x̂0(x, t) from the denoiser and α, σ, β taken at t:
///   score = −ε̂/σ, ε̂ = (x − α x̂0)/σ
///   sde: drift = −½βx − β·score,  x' = x + drift·dt + sqrt(β)·sqrt(−dt)·ξ
///   ode: drift = −½βx − ½β·score, x' = x + drift·dt
/// `noise` (ξ, n values) is used by the SDE only; null means "no noise term", i.e.
/// x' is the step's deterministic mean. Computed in double per element.
template <class S>
void euler_step(SamplerKind kind, const TangentSchedule& schedule, double t, double t_next, const S* x0, const S* noise,
                Index n, S* x) {
  if (!(t_next < t))
    throw InvalidArgument("euler_step: t_next must be < t, got t = " + std::to_string(t) +
                          ", t_next = " + std::to_string(t_next));
  if (kind != SamplerKind::sde && kind != SamplerKind::ode)
    throw InvalidArgument("euler_step: '" + std::string(sampler_info(kind).name) + "' is not an Euler sampler");
  const double alpha = schedule.alpha(t), sigma = schedule.sigma(t), beta = schedule.beta(t);
  const double dt = t_next - t;
  const double score_weight = kind == SamplerKind::sde ? beta : 0.5 * beta;
  const double noise_scale = kind == SamplerKind::sde && noise ? std::sqrt(beta) * std::sqrt(-dt) : 0.0;
  for (Index i = 0; i < n; ++i) {
    const double xi = static_cast<double>(x[i]);
    const double score = score_from_x0(xi, static_cast<double>(x0[i]), alpha, sigma);
    const double drift = -0.5 * beta * xi - score_weight * score;
    double next = xi + drift * dt;
    if (noise_scale != 0.0) next += noise_scale * static_cast<double>(noise[i]);
    x[i] = static_cast<S>(next);
  }
}

/// The scalars of one exponential step from t to t_next < t (docs/model.md §Solvers).
struct ExponentialStep {
  double sigma_ratio;  // σ'/σ
  double alpha_next;   // α'
  double sigma_next;   // σ'
  double decay;        // e^(−h) = (α σ')/(σ α'), 0 at t = 1
  double h;            // λ' − λ, +∞ at t = 1

  static ExponentialStep between(const TangentSchedule& schedule, double t, double t_next) {
    const double alpha = schedule.alpha(t), sigma = schedule.sigma(t);
    const double alpha_next = schedule.alpha(t_next), sigma_next = schedule.sigma(t_next);
    const double decay = alpha * sigma_next / (sigma * alpha_next);
    return {sigma_next / sigma, alpha_next, sigma_next, decay, schedule.lambda(t_next) - schedule.lambda(t)};
  }

  /// (1 − e^(−h)) / h, which tends to 0 as h → ∞.
  double phi1_over_h() const { return std::isfinite(h) ? -std::expm1(-h) / h : 0.0; }
};

namespace detail {

template <class S>
void check_denoised_finite(const S* x0, Index n, int call, double t) {
  for (Index i = 0; i < n; ++i)
    if (!std::isfinite(x0[i]))
      throw NumericError("sample: the denoiser returned a non-finite x0 (" + std::to_string(x0[i]) + " at element " +
                         std::to_string(i) + ") in call " + std::to_string(call) + ", at t = " + std::to_string(t));
}

}  // namespace detail

/// Integrates n values of x from times.front() down to times.back() with the solver of
/// `settings`, in place: x holds the start (N(0, I) at t = 1) and receives the result
/// (`settings.endpoint`). `denoise(x, t, self_cond, x0)` writes x̂0(x, t) for n values;
/// self_cond is the most recent x̂0 (zeros before the first call). Stochastic solvers
/// draw their ξ from `rng`, n normals for each step but the last. Scratch comes from
/// `arena`, inside a Scope of this call; nothing is allocated per step.
template <class S, class Denoise>
SamplingStats integrate(Denoise&& denoise, const SolverSettings& settings, const TangentSchedule& schedule,
                        std::span<const double> times, Index n, S* x, NormalGenerator& rng, Arena& arena,
                        const SolverHooks<S>& hooks = {}) {
  check_time_grid("sample", times);
  const SamplerInfo& info = sampler_info(settings.kind);
  const int steps = static_cast<int>(times.size()) - 1;
  const int total_calls = denoiser_calls(settings.kind, steps);

  Arena::Scope scope(arena);
  // Four x̂0 buffers: this step's, Heun's second call's, and the last two steps' (the
  // history of the multistep solvers; the most recent one is also the self-conditioning).
  std::array<S*, 4> buffers{};
  for (S*& b : buffers) b = arena.allocate<S>(static_cast<std::size_t>(n));
  S* zeros = arena.allocate<S>(static_cast<std::size_t>(n));
  std::fill(zeros, zeros + n, S(0));
  S* predictor = settings.kind == SamplerKind::heun ? arena.allocate<S>(static_cast<std::size_t>(n)) : nullptr;
  S* noise = info.stochastic ? arena.allocate<S>(static_cast<std::size_t>(n)) : nullptr;
  S* previous = nullptr;         // x̂0 of the last step
  S* before_previous = nullptr;  // and of the one before (3M)
  double h_previous = std::numeric_limits<double>::infinity(), h_before_previous = h_previous;
  const auto unused_buffer = [&](const S* also_taken) {
    for (S* b : buffers)
      if (b != previous && b != before_previous && b != also_taken) return b;
    return buffers[0];  // unreachable: four buffers, at most three taken
  };

  int calls = 0;
  const auto call = [&](const S* at, double t, const S* cond, S* out) {
    denoise(at, t, cond, out);
    ++calls;
    if (settings.check_finite) detail::check_denoised_finite(out, n, calls, t);
    if (hooks.on_denoised) hooks.on_denoised(t, out);
  };

  S* denoised = zeros;  // the final x̂0 of the last step
  for (int i = 0; i < steps; ++i) {
    const double t = times[i], t_next = times[i + 1];
    const bool last = i + 1 == steps;
    const S* self_cond = previous ? previous : zeros;
    S* d0 = unused_buffer(nullptr);
    call(x, t, self_cond, d0);
    denoised = d0;
    const S* xi = nullptr;
    if (noise && !last) {
      rng.fill(noise, n);
      xi = noise;
    }
    const ExponentialStep e = ExponentialStep::between(schedule, t, t_next);
    switch (settings.kind) {
      case SamplerKind::sde:
      case SamplerKind::ode:
        euler_step<S>(settings.kind, schedule, t, t_next, d0, xi, n, x);
        break;
      case SamplerKind::ddim: {
        const double cx = e.sigma_ratio, cd = e.alpha_next * -std::expm1(-e.h);
        for (Index k = 0; k < n; ++k) x[k] = static_cast<S>(cx * double(x[k]) + cd * double(d0[k]));
        break;
      }
      case SamplerKind::dpmpp_2m: {
        // x̂0 extrapolated linearly in λ to the step's midpoint: D + (D − D_prev)/(2r), r = h_prev/h.
        const double cx = e.sigma_ratio, cd = e.alpha_next * -std::expm1(-e.h);
        const double w = previous && std::isfinite(h_previous) ? 0.5 * e.h / h_previous : 0.0;
        for (Index k = 0; k < n; ++k) {
          const double d = double(d0[k]);
          const double slope = w != 0.0 ? w * (d - double(previous[k])) : 0.0;
          x[k] = static_cast<S>(cx * double(x[k]) + cd * (d + slope));
        }
        break;
      }
      case SamplerKind::heun: {
        const double cx = e.sigma_ratio, cd = e.alpha_next * -std::expm1(-e.h);
        for (Index k = 0; k < n; ++k) predictor[k] = static_cast<S>(cx * double(x[k]) + cd * double(d0[k]));
        S* d1 = unused_buffer(d0);
        call(predictor, t_next, settings.heun_self_condition == HeunSelfCondition::latest ? d0 : self_cond, d1);
        // Trapezoid in λ: x̂0 linear between D (at λ) and D' (at λ'); its weight on D' − D is
        // α'·(1 − (1 − e^(−h))/h).
        const double cslope = e.alpha_next * (1.0 - e.phi1_over_h());
        for (Index k = 0; k < n; ++k) {
          const double d = double(d0[k]);
          x[k] = static_cast<S>(cx * double(x[k]) + cd * d + cslope * (double(d1[k]) - d));
        }
        denoised = d1;  // the corrector's x̂0 is the most recent
        break;
      }
      case SamplerKind::dpmpp_2m_sde:
      case SamplerKind::dpmpp_3m_sde: {
        // η = 1: x' = (σ'/σ) e^(−h) x + α'(1 − e^(−2h)) D + α'·(history terms) + σ' sqrt(1 − e^(−2h)) ξ.
        const double cx = e.sigma_ratio * e.decay, phi = -std::expm1(-2.0 * e.h), cd = e.alpha_next * phi;
        const double cnoise = e.sigma_next * std::sqrt(phi);
        const bool one = previous && std::isfinite(h_previous);
        const bool two =
            settings.kind == SamplerKind::dpmpp_3m_sde && one && before_previous && std::isfinite(h_before_previous);
        // 2M SDE (midpoint): α'·½(1 − e^(−2h))/r·(D − D_prev).
        // 3M SDE: α'·(φ2·d1 − φ3·d2), φ2 = 1 − (1 − e^(−2h))/(2h), φ3 = φ2/(2h) − ½.
        const double h2 = 2.0 * e.h;
        const double phi2 = std::isfinite(h2) ? 1.0 - phi / h2 : 1.0;
        const double phi3 = std::isfinite(h2) ? phi2 / h2 - 0.5 : -0.5;
        const double r0 = one ? h_previous / e.h : 0.0, r1 = two ? h_before_previous / e.h : 0.0;
        for (Index k = 0; k < n; ++k) {
          const double d = double(d0[k]);
          double next = cx * double(x[k]) + cd * d;
          if (settings.kind == SamplerKind::dpmpp_2m_sde) {
            if (one) next += e.alpha_next * 0.5 * phi / r0 * (d - double(previous[k]));
          } else if (two) {
            const double p = double(previous[k]), q = double(before_previous[k]);
            const double d1_0 = (d - p) / r0, d1_1 = (p - q) / r1;
            const double first = d1_0 + (d1_0 - d1_1) * r0 / (r0 + r1), second = (d1_0 - d1_1) / (r0 + r1);
            next += e.alpha_next * (phi2 * first - phi3 * second);
          } else if (one) {
            next += e.alpha_next * phi2 * (d - double(previous[k])) / r0;
          }
          if (xi) next += cnoise * double(xi[k]);
          x[k] = static_cast<S>(next);
        }
        break;
      }
    }
    if (hooks.on_step) hooks.on_step(t_next, last, x);
    before_previous = info.order >= 3 ? previous : nullptr;
    previous = denoised;
    h_before_previous = h_previous;
    h_previous = e.h;
    if (settings.progress && !settings.progress({i + 1, steps, calls, total_calls}))
      throw SamplingCancelled("sample: cancelled by the progress callback after step " + std::to_string(i + 1) +
                              " of " + std::to_string(steps));
  }
  if (settings.endpoint == Endpoint::denoised) std::copy(denoised, denoised + n, x);
  return {steps, calls};
}

}  // namespace ldlm
