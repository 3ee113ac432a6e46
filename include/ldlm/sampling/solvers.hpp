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
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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
  dpmpp_3m,      // DPM-Solver++(3M): third order, one call per step
  dpmpp_3m_sde,  // DPM-Solver++(3M) SDE, η = 1
  unipc,         // UniPC: the 2M predictor and the UniC corrector on the next call's x̂0
  unipc_3m,      // UniPC with a third-order predictor
  ipndm,         // iPNDM: fourth-order Adams–Bashforth on x̂0, lower orders to start
  deis_2,        // DEIS tAB2: x̂0 linear in t through this step's and the last step's
  deis_3,        // DEIS tAB3: x̂0 quadratic in t through this step's and the last two steps'
};

struct SamplerInfo {
  SamplerKind kind;
  std::string_view name;  // as the CLI spells it
  int calls_per_step;     // denoiser calls
  int order;              // of the deterministic part, on a smooth problem
  bool stochastic;
  std::string_view summary;
};

inline constexpr std::array<SamplerInfo, 13> kSamplers{{
    {SamplerKind::sde, "sde", 1, 1, true, "Euler-Maruyama on the reverse SDE (clipped beta)"},
    {SamplerKind::ode, "ode", 1, 1, false, "Euler on the probability-flow ODE (clipped beta)"},
    {SamplerKind::ddim, "ddim", 1, 1, false, "exact first-order exponential integrator (DPM-Solver++ 1)"},
    {SamplerKind::heun, "heun", 2, 2, false, "exponential Heun, trapezoidal in lambda"},
    {SamplerKind::dpmpp_2m, "dpmpp-2m", 1, 2, false, "DPM-Solver++(2M), multistep"},
    {SamplerKind::dpmpp_2m_sde, "dpmpp-2m-sde", 1, 2, true, "DPM-Solver++(2M) SDE, eta = 1"},
    {SamplerKind::dpmpp_3m, "dpmpp-3m", 1, 3, false, "DPM-Solver++(3M), multistep"},
    {SamplerKind::dpmpp_3m_sde, "dpmpp-3m-sde", 1, 3, true, "DPM-Solver++(3M) SDE, eta = 1"},
    {SamplerKind::unipc, "unipc", 1, 3, false, "UniPC: 2M predictor, UniC corrector (no extra call)"},
    {SamplerKind::unipc_3m, "unipc-3m", 1, 4, false, "UniPC: 3M predictor, UniC corrector (no extra call)"},
    {SamplerKind::ipndm, "ipndm", 1, 4, false, "iPNDM: Adams-Bashforth 4 on x0, lower orders to start"},
    {SamplerKind::deis_2, "deis-2", 1, 2, false, "DEIS tAB2: x0 linear in t over the last two calls"},
    {SamplerKind::deis_3, "deis-3", 1, 3, false, "DEIS tAB3: x0 quadratic in t over the last three calls"},
}};

/// The sampler the library and `ldlm generate` use unless told otherwise, with the λ grid
/// (TimeGrid::automatic's fallback) and kDefaultSelfCondition: chosen together on held-out
/// seeds of the shipped demo model (docs/model.md §Choosing the default).
inline constexpr SamplerKind kDefaultSampler = SamplerKind::unipc_3m;

inline const SamplerInfo& sampler_info(SamplerKind kind) {
  return detail::info_of(kSamplers, &SamplerInfo::kind, kind, "sampler: unknown SamplerKind");
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

/// The self-conditioning input of each call but a resampled step's later attempts
/// (docs/model.md §Self-conditioning in a solver).
enum class SelfCondition {
  previous,      // the most recent x̂0, the last step's: a lag of one step
  extrapolated,  // the last two steps' x̂0's, extrapolated linearly in λ to the call's time
};

inline constexpr std::array<NamedChoice<SelfCondition>, 2> kSelfConditions{{
    {SelfCondition::previous, "previous", "the last step's x0 (one step late)"},
    {SelfCondition::extrapolated, "extrapolated", "the last two steps' x0, extrapolated in lambda to the call's time"},
}};

/// The default's self-conditioning input, chosen with kDefaultSampler: the one-step lag of
/// `previous` cost 0.01-0.03 of agreement at 6-20 calls (docs/model.md §Choosing the default).
inline constexpr SelfCondition kDefaultSelfCondition = SelfCondition::extrapolated;

/// B(h) of UniPC's order conditions (Zhao et al. 2023). In the data-prediction form the
/// weights that solve the conditions scale as 1/B(h) and enter the step multiplied by B(h),
/// so B cancels from them: it acts only through the fixed ρ = ½ of the predictor with one
/// earlier x̂0 (docs/model.md §Solvers).
enum class UniPCVariant {
  bh2,  // B(h) = e^{h} − 1: ρ = ½ on α'(1 − e^{−h}), DPM-Solver++(2M)'s step
  bh1,  // B(h) = h: ρ = ½ on α' h, which UniPC's authors advise for unconditional sampling
};

inline constexpr std::array<NamedChoice<UniPCVariant>, 2> kUniPCVariants{{
    {UniPCVariant::bh2, "bh2", "B(h) = e^h - 1"},
    {UniPCVariant::bh1, "bh1", "B(h) = h"},
}};

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

/// `first`'s hooks, then `then`'s, where each is set.
template <class S>
SolverHooks<S> chain_hooks(SolverHooks<S> first, const SolverHooks<S>& then) {
  const auto chain = [](auto a, const auto& b) -> std::decay_t<decltype(b)> {
    if (!a) return b;
    if (!b) return a;
    return [a = std::move(a), b](auto... args) {
      a(args...);
      b(args...);
    };
  };
  first.on_denoised = chain(std::move(first.on_denoised), then.on_denoised);
  first.on_step = chain(std::move(first.on_step), then.on_step);
  return first;
}

struct SolverSettings {
  SamplerKind kind = kDefaultSampler;
  Endpoint endpoint = Endpoint::sample;
  HeunSelfCondition heun_self_condition = HeunSelfCondition::latest;
  SelfCondition self_condition = kDefaultSelfCondition;
  /// Throw NumericError when the denoiser returns a NaN or an infinity.
  bool check_finite = false;
  /// After every step; returning false cancels sampling (SamplingCancelled). May be empty.
  std::function<bool(const SamplingProgress&)> progress;
  /// RePaint's resampling (Lugmayr et al. 2022): each step is taken 1 + resample times,
  /// going back from t_{i+1} to t_i with fresh noise in between, so that a condition
  /// applied by the hooks spreads to the free values. A step from t = 1 is taken once:
  /// going back there would erase everything. Costs resample × calls per step more.
  int resample = 0;
  /// The time given to the denoiser at each step's call (every attempt of a resampled
  /// step), one per step, where it is decoupled from the step's grid time t_i (LD3's
  /// decoupled model time: docs/model.md §Time grids). Empty: the denoiser is called at
  /// t_i. The solver's coefficients, the self-condition's extrapolation and the hooks keep
  /// t_i. Heun's second call has no step of its own, so Heun takes none.
  std::vector<double> model_times;
  /// UniPC's B(h) (unipc, unipc-3m; the others ignore it).
  UniPCVariant unipc_variant = UniPCVariant::bh2;
};

/// The number of denoiser calls of `steps` steps of `kind`.
inline int denoiser_calls(SamplerKind kind, int steps) { return sampler_info(kind).calls_per_step * steps; }

/// How many more times than once the step from t is taken (SolverSettings::resample).
/// Every step but the one from t = 1. The test is on t, not on α(t) > 0: the closed form
/// gives α(1) = 1/sqrt(1 + D² tan²(π/2)) ≈ 2e-17, as tan(π/2) is finite in double.
inline int resampled_attempts(const SolverSettings& settings, const TangentSchedule&, double t) {
  return t < 1.0 ? settings.resample : 0;
}

/// The number of denoiser calls of integrate over `times` with `settings`.
inline int denoiser_calls(const SolverSettings& settings, const TangentSchedule& schedule,
                          std::span<const double> times) {
  int steps = 0;
  for (std::size_t i = 0; i + 1 < times.size(); ++i) steps += 1 + resampled_attempts(settings, schedule, times[i]);
  return denoiser_calls(settings.kind, steps);
}

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

/// The weights of one UniPC step (Zhao et al. 2023, B(h) = e^{h} − 1 unless `variant` says h, in the
/// data prediction; docs/model.md §Solvers) from t_i to t_{i+1} of length h, using up to
/// `max_history` earlier x̂0's whose steps are usable (finite h). With
/// D1_k = (D_{i−k} − D_i) / r_k and r_k = (λ_{i−k} − λ_i) / h < 0:
///   predictor: x' = base + α'(1 − e^{−h}) Σ_k predictor_k D1_k
///   corrector: x' = base + α'(1 − e^{−h}) (Σ_k corrector_k D1_k + corrector_K (D_{i+1} − D_i))
/// where base is ddim's step and D_{i+1} the next call's x̂0 at the predicted x'.
struct UniPCWeights {
  int history = 0;                    // usable earlier x̂0's: 0, 1 or 2
  std::array<double, 2> r{};          // r_k
  std::array<double, 2> predictor{};  // on D1_k
  std::array<double, 3> corrector{};  // on D1_k, then (index history) on D_{i+1} − D_i

  /// h of this step; h_previous and h_before_previous of the two steps before it (∞ when
  /// there is none, or it started at t = 1).
  static UniPCWeights between(double h, double h_previous, double h_before_previous, int max_history,
                              UniPCVariant variant = UniPCVariant::bh2) {
    UniPCWeights w;
    if (max_history >= 1 && std::isfinite(h_previous)) {
      w.history = 1;
      w.r[0] = -h_previous / h;
      if (max_history >= 2 && std::isfinite(h_before_previous)) {
        w.history = 2;
        w.r[1] = -(h_previous + h_before_previous) / h;
      }
    }
    // The order conditions' right-hand side b_k = k!·φ_{k+1}(−h)/B(h), φ the exponential
    // integrator functions; all three tend to 1 as h → ∞ (the step from t = 1).
    std::array<double, 3> b{1.0, 1.0, 1.0};
    if (std::isfinite(h)) {
      const double hh = -h, bh = std::expm1(hh);
      double phi = bh / hh - 1.0, factorial = 1.0;
      for (int k = 0; k < 3; ++k) {
        b[k] = phi * factorial / bh;
        factorial *= k + 2;
        phi = phi / hh - 1.0 / factorial;
      }
    }
    // The predictor with one earlier x̂0 is DPM-Solver++(2M)'s midpoint rule (ρ = ½); with
    // two it solves the 2×2 order conditions.
    // With B(h) = h the step is α' h ρ D1 where the code multiplies by α'(1 − e^{−h}).
    if (w.history == 1)
      w.predictor[0] = variant == UniPCVariant::bh1 && std::isfinite(h) ? 0.5 * h / -std::expm1(-h) : 0.5;
    if (w.history == 2) {
      const auto rho = solve({{{1.0, 1.0, 0.0}, {w.r[0], w.r[1], 0.0}, {0.0, 0.0, 1.0}}}, {b[0], b[1], 0.0}, 2);
      w.predictor = {rho[0], rho[1]};
    }
    // The corrector: rows k = 0 … K−1 of R are (r_1^k, …, r_history^k, 1^k).
    const int K = w.history + 1;
    std::array<std::array<double, 3>, 3> R{};
    for (int row = 0; row < K; ++row)
      for (int col = 0; col < K; ++col) R[row][col] = std::pow(col < w.history ? w.r[col] : 1.0, row);
    w.corrector = solve(R, b, K);
    return w;
  }

 private:
  /// Solves the leading n×n block of a x = b (n ≤ 3) by Gaussian elimination with partial
  /// pivoting; the r_k are distinct and nonzero, so the Vandermonde block is regular.
  static std::array<double, 3> solve(std::array<std::array<double, 3>, 3> a, std::array<double, 3> b, int n) {
    for (int c = 0; c < n; ++c) {
      int pivot = c;
      for (int r = c + 1; r < n; ++r)
        if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
      std::swap(a[c], a[pivot]);
      std::swap(b[c], b[pivot]);
      for (int r = c + 1; r < n; ++r) {
        const double f = a[r][c] / a[c][c];
        for (int k = c; k < n; ++k) a[r][k] -= f * a[c][k];
        b[r] -= f * b[c];
      }
    }
    std::array<double, 3> x{};
    for (int r = n - 1; r >= 0; --r) {
      double v = b[r];
      for (int k = r + 1; k < n; ++k) v -= a[r][k] * x[k];
      x[r] = v / a[r][r];
    }
    return x;
  }
};

namespace detail {

template <class S>
void check_denoised_finite(const S* x0, Index n, int call, double t) {
  for (Index i = 0; i < n; ++i)
    if (!std::isfinite(x0[i]))
      throw NumericError("sample: the denoiser returned a non-finite x0 (" + std::to_string(x0[i]) + " at element " +
                         std::to_string(i) + ") in call " + std::to_string(call) + ", at t = " + std::to_string(t));
}

/// SolverSettings::model_times: none, or one time in (0, 1] per step, and not with Heun.
inline void check_model_times(const SolverSettings& settings, int steps) {
  const std::vector<double>& m = settings.model_times;
  if (m.empty()) return;
  if (settings.kind == SamplerKind::heun)
    throw InvalidArgument("sample: model_times: heun makes two calls per step, model times are one per step");
  if (m.size() != static_cast<std::size_t>(steps))
    throw InvalidArgument("sample: model_times: expected one time per step, " + std::to_string(steps) + ", got " +
                          std::to_string(m.size()));
  for (std::size_t i = 0; i < m.size(); ++i)
    if (!(m[i] > 0.0 && m[i] <= 1.0))
      throw InvalidArgument("sample: model_times: expected times in (0, 1], got " + std::to_string(m[i]) +
                            " for step " + std::to_string(i));
}

/// The earlier x̂0's a solver reads beyond self-conditioning (which reads only the most
/// recent one, kept for every solver).
inline int history_depth(SamplerKind kind) {
  switch (kind) {
    case SamplerKind::dpmpp_3m:
    case SamplerKind::dpmpp_3m_sde:
    case SamplerKind::unipc_3m:
    case SamplerKind::deis_3:
      return 2;
    case SamplerKind::ipndm:
      return 3;
    default:
      return 1;
  }
}

/// What a step function reads and writes. integrate's loop sets the step's fields before
/// each step, and shifts the history after it; the scratch is allocated once.
template <class S>
struct SolverState {
  SamplerKind kind;
  Index n = 0;
  S* x = nullptr;
  // The step: from t to t_next, its exponential scalars, its first x̂0 d0 (with the
  // self-conditioning input it was given) and its noise ξ (null when it has none).
  double t = 0, t_next = 0;
  bool last = false;
  ExponentialStep e{};
  const S* d0 = nullptr;
  const S* self_cond = nullptr;
  const S* xi = nullptr;
  /// The step's most recent x̂0: d0, or what a step function's own call gave.
  const S* denoised = nullptr;
  /// A buffer no one holds, for a step function's own call.
  S* spare = nullptr;
  // The x̂0's of the steps before (history[0] the last) and those steps' h, ∞ when there
  // was none or it started at t = 1.
  std::array<const S*, 3> history{};
  std::array<double, 3> h_history{std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity(),
                                  std::numeric_limits<double>::infinity()};
  // Heun's predicted x at t_next.
  S* predictor = nullptr;
  HeunSelfCondition heun_self_condition = HeunSelfCondition::latest;
  UniPCVariant unipc_variant = UniPCVariant::bh2;
  // UniPC's corrector of x_{i+1}, but for the term in D_{i+1}: set by step i, applied by
  // step i + 1 once its call has given D_{i+1}. Kept in double: it is a partial sum.
  double* corrector_base = nullptr;
  double corrector_weight = 0.0;
  bool corrector_pending = false;

  bool has_history(int k) const { return history[k] && std::isfinite(h_history[k]); }
};

template <class S>
void ddim_step(SolverState<S>& s) {
  const double cx = s.e.sigma_ratio, cd = s.e.alpha_next * -std::expm1(-s.e.h);
  for (Index k = 0; k < s.n; ++k) s.x[k] = static_cast<S>(cx * double(s.x[k]) + cd * double(s.d0[k]));
}

template <class S>
void dpmpp_2m_step(SolverState<S>& s) {
  // x̂0 extrapolated linearly in λ to the step's midpoint: D + (D − D_prev)/(2r), r = h_prev/h.
  const double cx = s.e.sigma_ratio, cd = s.e.alpha_next * -std::expm1(-s.e.h);
  const S* previous = s.history[0];
  const double w = s.has_history(0) ? 0.5 * s.e.h / s.h_history[0] : 0.0;
  for (Index k = 0; k < s.n; ++k) {
    const double d = double(s.d0[k]);
    const double slope = w != 0.0 ? w * (d - double(previous[k])) : 0.0;
    s.x[k] = static_cast<S>(cx * double(s.x[k]) + cd * (d + slope));
  }
}

template <class S, class Call>
void heun_step(SolverState<S>& s, const Call& call) {
  const double cx = s.e.sigma_ratio, cd = s.e.alpha_next * -std::expm1(-s.e.h);
  for (Index k = 0; k < s.n; ++k) s.predictor[k] = static_cast<S>(cx * double(s.x[k]) + cd * double(s.d0[k]));
  S* d1 = s.spare;
  call(s.predictor, s.t_next, s.heun_self_condition == HeunSelfCondition::latest ? s.d0 : s.self_cond, d1);
  // Trapezoid in λ: x̂0 linear between D (at λ) and D' (at λ'); its weight on D' − D is
  // α'·(1 − (1 − e^(−h))/h).
  const double cslope = s.e.alpha_next * (1.0 - s.e.phi1_over_h());
  for (Index k = 0; k < s.n; ++k) {
    const double d = double(s.d0[k]);
    s.x[k] = static_cast<S>(cx * double(s.x[k]) + cd * d + cslope * (double(d1[k]) - d));
  }
  s.denoised = d1;  // the corrector's x̂0 is the most recent
}

/// DPM-Solver++(3M), and the 2M and 3M SDEs.
template <class S>
void dpmpp_multistep(SolverState<S>& s) {
  // With η = 1 for the SDEs and 0 for 3M, h_η = (1 + η) h:
  // x' = (σ'/σ) e^(−ηh) x + α'(1 − e^(−h_η)) D + α'·(history terms) + σ' sqrt(1 − e^(−2ηh)) ξ.
  const ExponentialStep& e = s.e;
  const bool sde = sampler_info(s.kind).stochastic;
  const double h_eta = sde ? 2.0 * e.h : e.h;
  const double phi = -std::expm1(-h_eta), cd = e.alpha_next * phi;
  const double cx = sde ? e.sigma_ratio * e.decay : e.sigma_ratio;
  const double cnoise = sde ? e.sigma_next * std::sqrt(phi) : 0.0;
  const bool one = s.has_history(0), two = one && history_depth(s.kind) >= 2 && s.has_history(1);
  // 2M SDE (midpoint): α'·½(1 − e^(−2h))/r·(D − D_prev).
  // 3M and 3M SDE: α'·(φ2·d1 − φ3·d2), φ2 = 1 − (1 − e^(−h_η))/h_η, φ3 = φ2/h_η − ½.
  const double phi2 = std::isfinite(h_eta) ? 1.0 - phi / h_eta : 1.0;
  const double phi3 = std::isfinite(h_eta) ? phi2 / h_eta - 0.5 : -0.5;
  const double r0 = one ? s.h_history[0] / e.h : 0.0, r1 = two ? s.h_history[1] / e.h : 0.0;
  const S *previous = s.history[0], *before_previous = s.history[1];
  for (Index k = 0; k < s.n; ++k) {
    const double d = double(s.d0[k]);
    double next = cx * double(s.x[k]) + cd * d;
    if (s.kind == SamplerKind::dpmpp_2m_sde) {
      if (one) next += e.alpha_next * 0.5 * phi / r0 * (d - double(previous[k]));
    } else if (two) {
      const double p = double(previous[k]), q = double(before_previous[k]);
      const double d1_0 = (d - p) / r0, d1_1 = (p - q) / r1;
      const double first = d1_0 + (d1_0 - d1_1) * r0 / (r0 + r1), second = (d1_0 - d1_1) / (r0 + r1);
      next += e.alpha_next * (phi2 * first - phi3 * second);
    } else if (one) {
      next += e.alpha_next * phi2 * (d - double(previous[k])) / r0;
    }
    if (s.xi) next += cnoise * double(s.xi[k]);
    s.x[k] = static_cast<S>(next);
  }
}

/// The Adams–Bashforth weights of iPNDM (Zhang & Chen 2023) on D_i, D_{i−1}, …, by how many
/// earlier x̂0's there are: orders 1 to 4, the lower ones warming the method up.
inline constexpr std::array<std::array<double, 4>, 4> kIpndmWeights{{
    {1.0, 0.0, 0.0, 0.0},
    {3.0 / 2, -1.0 / 2, 0.0, 0.0},
    {23.0 / 12, -16.0 / 12, 5.0 / 12, 0.0},
    {55.0 / 24, -59.0 / 24, 37.0 / 24, -9.0 / 24},
}};

/// iPNDM on the data prediction: ddim's exact step (Euler in ν = α/σ on x/σ, whose slope
/// is x̂0: docs/model.md §Solvers) with x̂0 replaced by the Adams–Bashforth combination of
/// this step's and up to three earlier x̂0's. The fixed weights assume equal steps in ν.
template <class S>
void ipndm_step(SolverState<S>& s) {
  int earlier = 0;
  while (earlier < 3 && s.history[earlier]) ++earlier;
  const std::array<double, 4>& w = kIpndmWeights[earlier];
  const double cx = s.e.sigma_ratio, cd = s.e.alpha_next * -std::expm1(-s.e.h);
  for (Index k = 0; k < s.n; ++k) {
    double d = w[0] * double(s.d0[k]);
    for (int j = 0; j < earlier; ++j) d += w[j + 1] * double(s.history[j][k]);
    s.x[k] = static_cast<S>(cx * double(s.x[k]) + cd * d);
  }
}

/// Gauss–Legendre's 8 nodes on [−1, 1] (±, the positive half) and their weights: exact for
/// polynomials of degree 15.
inline constexpr std::array<double, 4> kGaussNodes{0.1834346424956498, 0.5255324099163290, 0.7966664774136267,
                                                   0.9602898564975363};
inline constexpr std::array<double, 4> kGaussWeights{0.3626837833783620, 0.3137066458778873, 0.2223810344533745,
                                                     0.1012285362903763};

/// DEIS's tAB (Zhang & Chen 2023) on the data prediction: the exponential integrator's
/// exact x' = (σ'/σ) x + σ' ∫ e^λ D dλ over the step, with D the Lagrange polynomial in t
/// through this step's x̂0 and the `history_depth` earlier ones (fewer while the history
/// fills). In u = e^{λ − λ'} the integral is α' ∫_{e^{−h}}^{1} D(t(u)) du, and t(u) =
/// (2/π) atan((σ'/α') / (u D)) is analytic in u, so Gauss–Legendre gives each node's weight
/// w_k = ∫ ℓ_k(t(u)) du to rounding: x' = (σ'/σ) x + α' Σ_k w_k D_{i−k}. The x̂0 at t = 1 is
/// a node like any other (t is finite there, unlike λ); the step from t = 1 is ddim's.
template <class S>
void deis_step(SolverState<S>& s, const TangentSchedule& schedule) {
  std::array<double, 3> nodes{s.t};
  std::array<const S*, 3> values{s.d0};
  int count = 1;
  double lambda = schedule.lambda(s.t);
  for (int k = 0; k < history_depth(s.kind) && s.history[k]; ++k, ++count) {
    lambda -= s.h_history[k];
    nodes[count] = schedule.time_of_lambda(lambda);
    values[count] = s.history[k];
  }
  std::array<double, 3> w{};
  const double low = std::isfinite(s.e.h) ? std::exp(-s.e.h) : 0.0, half = 0.5 * (1.0 - low);
  const double ratio_next = schedule.noise_ratio(s.t_next);
  for (int q = 0; q < 8; ++q) {
    const double xi = q < 4 ? -kGaussNodes[q] : kGaussNodes[q - 4], weight = kGaussWeights[q % 4] * half;
    const double t = schedule.time_of_noise_ratio(ratio_next / (low + half * (1.0 + xi)));
    for (int k = 0; k < count; ++k) {
      double basis = 1.0;
      for (int m = 0; m < count; ++m)
        if (m != k) basis *= (t - nodes[m]) / (nodes[k] - nodes[m]);
      w[k] += weight * basis;
    }
  }
  const double cx = s.e.sigma_ratio;
  for (Index k = 0; k < s.n; ++k) {
    double d = 0.0;
    for (int j = 0; j < count; ++j) d += w[j] * double(values[j][k]);
    s.x[k] = static_cast<S>(cx * double(s.x[k]) + s.e.alpha_next * d);
  }
}

/// UniPC's predictor; it leaves the corrector of x_{i+1} pending until the next call.
template <class S>
void unipc_step(SolverState<S>& s) {
  const UniPCWeights w =
      UniPCWeights::between(s.e.h, s.h_history[0], s.h_history[1], history_depth(s.kind), s.unipc_variant);
  const double cx = s.e.sigma_ratio, c = s.e.alpha_next * -std::expm1(-s.e.h);
  const double new_weight = w.corrector[w.history];
  for (Index k = 0; k < s.n; ++k) {
    const double d = double(s.d0[k]);
    const double base = cx * double(s.x[k]) + c * d;
    double predicted = 0.0, corrected = 0.0;
    for (int j = 0; j < w.history; ++j) {
      const double d1 = (double(s.history[j][k]) - d) / w.r[j];
      predicted += w.predictor[j] * d1;
      corrected += w.corrector[j] * d1;
    }
    s.x[k] = static_cast<S>(base + c * predicted);
    if (!s.last) s.corrector_base[k] = base + c * (corrected - new_weight * d);
  }
  s.corrector_weight = c * new_weight;
  s.corrector_pending = !s.last;  // the final x has no call after it to correct it with
}

/// x̂0 at the call's time λ_i, extrapolated linearly in λ from the last two steps'
/// (at λ_{i−1} and λ_{i−2}) into `out`; false, and nothing written, until two finite steps
/// have been taken (the x̂0 at t = 1 sits at λ = −∞).
template <class S>
bool extrapolate_self_condition(const SolverState<S>& s, S* out) {
  if (!s.has_history(0) || !s.has_history(1)) return false;
  const double w = s.h_history[0] / s.h_history[1];
  for (Index k = 0; k < s.n; ++k) {
    const double latest = double(s.history[0][k]);
    out[k] = static_cast<S>(latest + w * (latest - double(s.history[1][k])));
  }
  return true;
}

/// UniC: x_i again, from the x̂0 just computed at the predicted x_i. The call itself is not
/// repeated: D_i stays the x̂0 of the predicted point.
template <class S>
void unipc_correct(SolverState<S>& s, const SolverHooks<S>& hooks) {
  for (Index k = 0; k < s.n; ++k) s.x[k] = static_cast<S>(s.corrector_base[k] + s.corrector_weight * double(s.d0[k]));
  if (hooks.on_step) hooks.on_step(s.t, false, s.x);
  s.corrector_pending = false;
}

/// One step of s.kind from s.t to s.t_next, in place on s.x.
template <class S, class Call>
void solver_step(SolverState<S>& s, const TangentSchedule& schedule, const Call& call) {
  switch (s.kind) {
    case SamplerKind::sde:
    case SamplerKind::ode:
      return euler_step<S>(s.kind, schedule, s.t, s.t_next, s.d0, s.xi, s.n, s.x);
    case SamplerKind::ddim:
      return ddim_step(s);
    case SamplerKind::heun:
      return heun_step(s, call);
    case SamplerKind::dpmpp_2m:
      return dpmpp_2m_step(s);
    case SamplerKind::dpmpp_2m_sde:
    case SamplerKind::dpmpp_3m:
    case SamplerKind::dpmpp_3m_sde:
      return dpmpp_multistep(s);
    case SamplerKind::unipc:
    case SamplerKind::unipc_3m:
      return unipc_step(s);
    case SamplerKind::ipndm:
      return ipndm_step(s);
    case SamplerKind::deis_2:
    case SamplerKind::deis_3:
      return deis_step(s, schedule);
  }
}

/// RePaint: back from t_next to t with fresh noise, x_t = (α/α') x' + sqrt(σ² − (α σ'/α')²) ξ.
template <class S, class Noise>
void renoise(const TangentSchedule& schedule, double t, double t_next, Index n, S* x, S* noise, Noise& rng) {
  const double alpha = schedule.alpha(t), sigma = schedule.sigma(t);
  const double scale = alpha / schedule.alpha(t_next), spread = scale * schedule.sigma(t_next);
  const double noise_scale = std::sqrt(std::max(0.0, sigma * sigma - spread * spread));
  rng.fill(noise, n);
  for (Index k = 0; k < n; ++k) x[k] = static_cast<S>(scale * double(x[k]) + noise_scale * double(noise[k]));
}

}  // namespace detail

/// Integrates n values of x from times.front() down to times.back() with the solver of
/// `settings`, in place: x holds the start (N(0, I) at t = 1) and receives the result
/// (`settings.endpoint`). `denoise(x, t, self_cond, x0)` writes x̂0(x, t) for n values, t
/// the step's time or its `settings.model_times` entry;
/// self_cond is the most recent x̂0, or with SelfCondition::extrapolated the last two
/// extrapolated to the call's time (zeros before the first call). Stochastic solvers
/// draw their ξ from `rng`, n normals for each step but the last. Scratch comes from
/// `arena`, inside a Scope of this call; nothing is allocated per step. `rng` is a
/// NormalGenerator, or a GroupedNormalGenerator for a batch of independent requests.
/// The loop is the same for every solver: calls, hooks, resampling, progress; each
/// solver is one step function of detail::solver_step.
template <class S, class Denoise, class Noise>
SamplingStats integrate(Denoise&& denoise, const SolverSettings& settings, const TangentSchedule& schedule,
                        std::span<const double> times, Index n, S* x, Noise& rng, Arena& arena,
                        const SolverHooks<S>& hooks = {}) {
  check_time_grid("sample", times);
  const SamplerInfo& info = sampler_info(settings.kind);
  const int steps = static_cast<int>(times.size()) - 1;
  if (settings.resample < 0)
    throw InvalidArgument("sample: resample must be >= 0, got " + std::to_string(settings.resample));
  const int total_calls = denoiser_calls(settings, schedule, times);
  detail::check_model_times(settings, steps);

  Arena::Scope scope(arena);
  const auto allocate = [&](bool needed) {
    return needed ? arena.allocate<S>(static_cast<std::size_t>(n)) : static_cast<S*>(nullptr);
  };
  // x̂0 buffers: this step's, a step function's own call's, the history (whose most recent
  // one is also the self-conditioning), and the two of a resampled step's previous attempt,
  // which the next attempt conditions on.
  std::array<S*, 7> buffers{};
  for (S*& b : buffers) b = allocate(true);
  S* noise = allocate(info.stochastic || settings.resample > 0);
  const bool extrapolate = settings.self_condition == SelfCondition::extrapolated;
  S* extrapolated = allocate(extrapolate);
  // The first call's self-condition. The extrapolation needs two finite steps before
  // it, so it is written at the third call at the earliest, and its buffer can hold
  // these zeros until then: one buffer fewer resident (3.1 MB at T 1024).
  S* zeros = extrapolate ? extrapolated : allocate(true);
  std::fill(zeros, zeros + n, S(0));
  detail::SolverState<S> s;
  s.kind = settings.kind;
  s.n = n;
  s.x = x;
  s.heun_self_condition = settings.heun_self_condition;
  s.unipc_variant = settings.unipc_variant;
  s.predictor = allocate(settings.kind == SamplerKind::heun);
  if (settings.kind == SamplerKind::unipc || settings.kind == SamplerKind::unipc_3m)
    s.corrector_base = arena.allocate<double>(static_cast<std::size_t>(n));
  const int depth = std::max(detail::history_depth(settings.kind), extrapolate ? 2 : 1);
  const auto unused_buffer = [&](std::initializer_list<const S*> also_taken) {
    for (S* b : buffers)
      if (std::find(s.history.begin(), s.history.end(), b) == s.history.end() &&
          std::find(also_taken.begin(), also_taken.end(), b) == also_taken.end())
        return b;
    return buffers[0];  // unreachable: seven buffers, at most six taken
  };

  int calls = 0;
  // The denoiser sees model_t; everything else the step's time t.
  const auto call_at = [&](const S* at, double t, double model_t, const S* cond, S* out) {
    denoise(at, model_t, cond, out);
    ++calls;
    if (settings.check_finite) detail::check_denoised_finite(out, n, calls, model_t);
    if (hooks.on_denoised) hooks.on_denoised(t, out);
  };
  const auto call = [&](const S* at, double t, const S* cond, S* out) { call_at(at, t, t, cond, out); };

  const S* denoised = zeros;  // the final x̂0 of the last step
  for (int i = 0; i < steps; ++i) {
    s.t = times[i];
    s.t_next = times[i + 1];
    s.last = i + 1 == steps;
    s.e = ExponentialStep::between(schedule, s.t, s.t_next);
    const int attempts = 1 + resampled_attempts(settings, schedule, s.t);
    const S* earlier_attempt = nullptr;  // the x̂0 of this step's previous attempt, if any
    for (int attempt = 0; attempt < attempts; ++attempt) {
      s.self_cond = earlier_attempt                                                      ? earlier_attempt
                    : extrapolate && detail::extrapolate_self_condition(s, extrapolated) ? extrapolated
                    : s.history[0]                                                       ? s.history[0]
                                                                                         : zeros;
      S* d0 = unused_buffer({earlier_attempt});
      call_at(x, s.t, settings.model_times.empty() ? s.t : settings.model_times[i], s.self_cond, d0);
      s.d0 = s.denoised = d0;
      s.spare = unused_buffer({d0, earlier_attempt});
      if (s.corrector_pending) detail::unipc_correct(s, hooks);
      s.xi = nullptr;
      if (info.stochastic && !s.last) {
        rng.fill(noise, n);
        s.xi = noise;
      }
      detail::solver_step(s, schedule, call);
      denoised = s.denoised;
      if (hooks.on_step) hooks.on_step(s.t_next, s.last, x);
      if (attempt + 1 < attempts) {
        // The step again from x_t; the multistep history stays that of the steps before.
        detail::renoise(schedule, s.t, s.t_next, n, x, noise, rng);
        earlier_attempt = denoised;
        s.corrector_pending = false;  // the corrector was for the x' just discarded
      }
    }
    for (int k = depth - 1; k > 0; --k) {
      s.history[k] = s.history[k - 1];
      s.h_history[k] = s.h_history[k - 1];
    }
    s.history[0] = denoised;
    s.h_history[0] = s.e.h;
    if (settings.progress && !settings.progress({i + 1, steps, calls, total_calls}))
      throw SamplingCancelled("sample: cancelled by the progress callback after step " + std::to_string(i + 1) +
                              " of " + std::to_string(steps));
  }
  if (settings.endpoint == Endpoint::denoised) std::copy(denoised, denoised + n, x);
  return {steps, calls};
}

}  // namespace ldlm
