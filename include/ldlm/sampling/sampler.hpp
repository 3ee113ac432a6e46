// The diffusion sampler of docs/model.md §Sampler: N Euler steps (SDE or probability-flow
// ODE) of the tangent schedule from t = 1 down to t_min, with self-conditioning.
//
// Reproducibility: the Gaussian noise comes from our own generator (NormalGenerator,
// core/random.hpp: xoshiro256**, Box–Muller in double), not std::normal_distribution,
// whose output differs between standard libraries. The noise depends only on the
// seed and the shapes, never on the thread count (the matrix products may still
// round differently with another thread count, which splits them differently).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numbers>
#include <string>
#include <type_traits>
#include <utility>

#include "ldlm/core/context.hpp"
#include "ldlm/core/error.hpp"
#include "ldlm/core/random.hpp"
#include "ldlm/model/denoiser.hpp"
#include "ldlm/sampling/schedule.hpp"

namespace ldlm {

enum class SamplerKind {
  sde,  // Euler–Maruyama on the reverse SDE: drift −½βx − β·score, plus sqrt(β)·sqrt(−dt)·ξ
  ode,  // Euler on the probability-flow ODE: drift −½βx − ½β·score, no noise
};

struct SamplerOptions {
  int steps = 50;  // N; docs/model.md fixes no count
  SamplerKind kind = SamplerKind::sde;
  std::uint64_t seed = 0;
  /// Called after every step with (step, total), step = 1..total. Returning false
  /// cancels sampling: the sampler throws SamplingCancelled. May be empty.
  std::function<bool(int step, int total)> progress;
};

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

/// Throws InvalidArgument unless B >= 1, 1 <= T <= max_positions, the batch fits
/// (check_batch_fits), steps >= 1 and D > 0.
inline void check_sampling_arguments(std::string_view op, const Config& c, Index B, Index T, int steps) {
  const std::string where(op);
  if (B < 1) throw InvalidArgument(where + ": batch size B must be >= 1, got " + std::to_string(B));
  if (T < 1 || T > c.max_positions)
    throw InvalidArgument(where + ": length T must be in [1, max_positions = " + std::to_string(c.max_positions) +
                          "], got " + std::to_string(T));
  check_batch_fits<InvalidArgument>(op, B, T, c);
  if (steps < 1) throw InvalidArgument(where + ": steps must be >= 1, got " + std::to_string(steps));
  // σ = 0 for every t when D = 0, and the score divides by σ².
  if (!(c.schedule_d > 0))
    throw InvalidArgument(where + ": config 'schedule_d' must be > 0, got " + std::to_string(c.schedule_d));
}

namespace detail {
/// sample_latents after check_sampling_arguments: the caller has checked B, T and steps.
template <class S>
void sample_latents_checked(Context& ctx, const Denoiser<S>& denoiser, Index B, Index T, const SamplerOptions& options,
                            std::type_identity_t<MatRef<S>> z) {
  const Config& c = denoiser.config;
  const Index rows = B * T, d = c.d_model, n = rows * d;
  check_shape("sample", "z", {rows, d}, Shape{z.rows(), z.cols()});
  const TangentSchedule schedule = TangentSchedule::from_config(c);
  const int steps = options.steps;

  Arena::Scope scope(ctx.arena());
  Arena& arena = ctx.arena();
  double* times = arena.allocate<double>(static_cast<std::size_t>(steps) + 1);
  {
    const auto grid = time_grid(steps, c.t_min);
    std::copy(grid.begin(), grid.end(), times);
  }
  S* x = arena.allocate<S>(n);
  S* x0 = arena.allocate<S>(n);
  S* self_cond = arena.allocate<S>(n);
  S* noise = options.kind == SamplerKind::sde ? arena.allocate<S>(n) : nullptr;
  S* t_batch = arena.allocate<S>(B);
  const RotaryTable<S> rotary = make_rotary_table<S>(arena, T, c.head_dim, c.rope_base);

  NormalGenerator rng(options.seed);
  rng.fill(x, n);
  std::fill(self_cond, self_cond + n, S(0));

  for (int i = 0; i < steps; ++i) {
    std::fill(t_batch, t_batch + B, static_cast<S>(times[i]));
    denoiser.forward(ctx, ConstMatrixMap<S>(x, rows, d), t_batch, ConstMatrixMap<S>(self_cond, rows, d), B, T, rotary,
                     MatrixMap<S>(x0, rows, d));
    const bool last = i + 1 == steps;
    const S* xi = nullptr;
    if (noise && !last) {
      rng.fill(noise, n);
      xi = noise;
    }
    euler_step<S>(options.kind, schedule, times[i], times[i + 1], x0, xi, n, x);
    std::swap(x0, self_cond);  // this step's x̂0 conditions the next step
    if (options.progress && !options.progress(i + 1, steps))
      throw SamplingCancelled("sample: cancelled by the progress callback after step " + std::to_string(i + 1) +
                              " of " + std::to_string(steps));
  }
  z = ConstMatrixMap<S>(x, rows, d);
}

/// Checks the arguments (errors name `op`), then samples latents [B, T, d].
template <class S>
Tensor3<S> sample_latent_tensor(std::string_view op, Context& ctx, const Denoiser<S>& denoiser, Index B, Index T,
                                const SamplerOptions& options) {
  check_sampling_arguments(op, denoiser.config, B, T, options.steps);
  Tensor3<S> z(B, T, denoiser.config.d_model);
  sample_latents_checked(ctx, denoiser, B, T, options, as_matrix(z));
  return z;
}
}  // namespace detail

/// Checks the arguments (errors name "sample"), then samples latents z [B*T, d] with
/// the denoiser (docs/model.md §Sampler):
///   x ~ N(0, I) at t_0 = 1 (the first B*T*d normals of the seed, row-major);
///   for i = 0..N-1: x̂0 = denoiser(x, t_i, self_cond) with self_cond = the previous
///     step's x̂0 (zeros at i = 0); then an Euler step from t_i to t_{i+1}; the SDE
///     draws ξ for steps 0..N-2 (the next B*T*d normals each).
///   The result, "the last deterministic mean", is the final step's x without its
///   noise term: x_{N-1} + drift·dt at t_N = t_min (for the ODE, simply the final x).
///   It is not the last x̂0; the final step's ξ would be discarded, so none is drawn.
/// No heap allocation inside the loop: x, x̂0, self_cond, ξ, the times and the
/// rotary table live in the context's arena, set up once before the first step.
template <class S>
void sample_latents(Context& ctx, const Denoiser<S>& denoiser, Index B, Index T, const SamplerOptions& options,
                    std::type_identity_t<MatRef<S>> z) {
  check_sampling_arguments("sample", denoiser.config, B, T, options.steps);
  detail::sample_latents_checked(ctx, denoiser, B, T, options, z);
}

/// Tensor form: latents [B, T, d].
template <class S>
Tensor3<S> sample_latents(Context& ctx, const Denoiser<S>& denoiser, Index B, Index T, const SamplerOptions& options) {
  return detail::sample_latent_tensor("sample", ctx, denoiser, B, T, options);
}

}  // namespace ldlm
