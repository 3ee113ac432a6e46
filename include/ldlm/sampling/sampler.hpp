// The diffusion sampler of docs/model.md §Sampler over the model's denoiser: noise at
// t = 1, the solver of solvers.hpp on a time grid of schedule.hpp, self-conditioning on
// the most recent x̂0.
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
#include <vector>

#include "ldlm/core/context.hpp"
#include "ldlm/core/error.hpp"
#include "ldlm/core/random.hpp"
#include "ldlm/model/denoiser.hpp"
#include "ldlm/sampling/condition.hpp"
#include "ldlm/sampling/schedule.hpp"
#include "ldlm/sampling/solvers.hpp"

namespace ldlm {

/// The step count of the default sampler (kDefaultSampler), chosen with it.
inline constexpr int kDefaultSamplerSteps = 10;
// The default grid is TimeGridOptions{}'s: karras, and the result x at t_min.

struct SamplerOptions {
  SamplerKind kind = kDefaultSampler;
  int steps = kDefaultSamplerSteps;  // solver steps; the denoiser calls are steps × calls_per_step
  TimeGridOptions grid;
  Endpoint endpoint = Endpoint::sample;
  HeunSelfCondition heun_self_condition = HeunSelfCondition::latest;
  SelfCondition self_condition = kDefaultSelfCondition;
  UniPCVariant unipc_variant = UniPCVariant::bh2;  // SolverSettings::unipc_variant
  std::uint64_t seed = 0;
  /// Empty: every sequence draws from `seed`. Otherwise consecutive groups of sequences
  /// (their rows adding up to the batch), each drawing from its own seed what it would
  /// draw alone (GroupedNormalGenerator); `seed` is then unused.
  std::vector<NoiseGroup> noise_groups;
  /// Called after every step. Returning false cancels sampling: the sampler throws
  /// SamplingCancelled. May be empty.
  std::function<bool(const SamplingProgress&)> progress;
};

/// The number of denoiser calls a run with `options` makes.
inline int denoiser_calls(const SamplerOptions& options) { return denoiser_calls(options.kind, options.steps); }

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

/// The model's denoiser as the callable `integrate` takes: x̂0 for B sequences of T
/// positions, every sequence at the call's time t. Its [B] times and rotary table come
/// from the context's arena, so it lives inside the caller's Arena::Scope.
template <class S>
class DenoiserCall {
 public:
  DenoiserCall(Context& ctx, const Denoiser<S>& denoiser, Index B, Index T)
      : ctx_(ctx),
        denoiser_(denoiser),
        B_(B),
        T_(T),
        times_(ctx.arena().allocate<S>(static_cast<std::size_t>(B))),
        rotary_(make_rotary_table<S>(ctx.arena(), T, denoiser.config.head_dim, denoiser.config.rope_base)) {}

  void operator()(const S* x, double t, const S* self_cond, S* x0) const {
    const Index rows = B_ * T_, d = denoiser_.config.d_model;
    std::fill(times_, times_ + B_, static_cast<S>(t));
    denoiser_.forward(ctx_, ConstMatrixMap<S>(x, rows, d), times_, ConstMatrixMap<S>(self_cond, rows, d), B_, T_,
                      rotary_, MatrixMap<S>(x0, rows, d));
  }

 private:
  Context& ctx_;
  const Denoiser<S>& denoiser_;
  Index B_, T_;
  S* times_;
  RotaryTable<S> rotary_;
};

namespace detail {
/// sample_latents after check_sampling_arguments: the caller has checked B, T and steps.
/// With `known`, its rows are conditioned on as `condition` says (condition.hpp); without
/// known rows, sampling is unconditional and `condition` is unused. `observers` run after
/// the condition's hooks, and see what the solver sees (tests trace every step with them).
template <class S>
SamplingStats sample_latents_checked(Context& ctx, const Denoiser<S>& denoiser, Index B, Index T,
                                     const SamplerOptions& options, std::type_identity_t<MatRef<S>> z,
                                     const SolverHooks<S>& observers = {}, const KnownRows<S>* known = nullptr,
                                     const ConditionOptions& condition = {}) {
  const Config& c = denoiser.config;
  const Index rows = B * T, d = c.d_model, n = rows * d;
  check_shape("sample", "z", {rows, d}, Shape{z.rows(), z.cols()});
  const TangentSchedule schedule = TangentSchedule::from_config(c);
  const std::vector<double> times = time_grid(options.steps, c.t_min, schedule, options.grid);

  Arena::Scope scope(ctx.arena());
  Arena& arena = ctx.arena();
  S* x = arena.allocate<S>(n);
  const DenoiserCall<S> denoise(ctx, denoiser, B, T);

  Index grouped_rows = 0;
  for (const NoiseGroup& g : options.noise_groups) grouped_rows += g.rows;
  if (!options.noise_groups.empty() && grouped_rows != B)
    throw InvalidArgument("sample: the noise groups cover " + std::to_string(grouped_rows) +
                          " sequences, the batch has B = " + std::to_string(B));
  GroupedNormalGenerator rng = options.noise_groups.empty() ? GroupedNormalGenerator(options.seed)
                                                            : GroupedNormalGenerator(options.noise_groups);
  rng.fill(x, n);
  SolverSettings settings;
  settings.kind = options.kind;
  settings.endpoint = options.endpoint;
  settings.heun_self_condition = options.heun_self_condition;
  settings.self_condition = options.self_condition;
  settings.unipc_variant = options.unipc_variant;
  settings.check_finite = ctx.check_finite;
  settings.progress = options.progress;
  // Heun's second call has no step of its own to take a model time from: on the grid's times.
  if (sampler_info(options.kind).calls_per_step == 1) settings.model_times = model_times(options.steps, options.grid);
  SolverHooks<S> hooks;
  if (known && !known->rows.empty()) {
    check_condition_options("sample", condition);
    check_known_rows("sample", *known, rows, d);
    hooks = condition_hooks(*known, x, d, schedule, condition);
    settings.resample = condition.resample;
  }
  hooks = chain_hooks(std::move(hooks), observers);
  const SamplingStats stats = integrate<S>(denoise, settings, schedule, times, n, x, rng, arena, hooks);
  z = ConstMatrixMap<S>(x, rows, d);
  return stats;
}

/// Checks the arguments (errors name `op`), then samples latents [B, T, d].
template <class S>
Tensor3<S> sample_latent_tensor(std::string_view op, Context& ctx, const Denoiser<S>& denoiser, Index B, Index T,
                                const SamplerOptions& options, SamplingStats* stats = nullptr,
                                const SolverHooks<S>& observers = {}, const KnownRows<S>* known = nullptr,
                                const ConditionOptions& condition = {}) {
  check_sampling_arguments(op, denoiser.config, B, T, options.steps);
  Tensor3<S> z(B, T, denoiser.config.d_model);
  const SamplingStats done =
      sample_latents_checked(ctx, denoiser, B, T, options, as_matrix(z), observers, known, condition);
  if (stats) *stats = done;
  return z;
}
}  // namespace detail

/// Checks the arguments (errors name "sample"), then samples latents z [B*T, d] with
/// the denoiser (docs/model.md §Sampler):
///   x ~ N(0, I) at t_0 = 1 (the first B*T*d normals of the seed, row-major);
///   for i = 0..N-1: x̂0 = denoiser(x, t_i, self_cond), self_cond = the most recent x̂0
///     (zeros at the first call); then a step of options.kind from t_i to t_{i+1} on the
///     grid of options.grid; a stochastic solver draws ξ for steps 0..N-2 (the next
///     B*T*d normals each).
///   The result is options.endpoint: the last x̂0, or x at t_min, the final step's
///   deterministic mean (no ξ is drawn for it).
/// No heap allocation inside the loop: x, the x̂0 history, ξ and the rotary table live
/// in the context's arena, set up once before the first step. Returns the number of
/// steps and denoiser calls made.
template <class S>
SamplingStats sample_latents(Context& ctx, const Denoiser<S>& denoiser, Index B, Index T, const SamplerOptions& options,
                             std::type_identity_t<MatRef<S>> z) {
  check_sampling_arguments("sample", denoiser.config, B, T, options.steps);
  return detail::sample_latents_checked(ctx, denoiser, B, T, options, z);
}

/// Tensor form: latents [B, T, d].
template <class S>
Tensor3<S> sample_latents(Context& ctx, const Denoiser<S>& denoiser, Index B, Index T, const SamplerOptions& options) {
  return detail::sample_latent_tensor("sample", ctx, denoiser, B, T, options);
}

}  // namespace ldlm
