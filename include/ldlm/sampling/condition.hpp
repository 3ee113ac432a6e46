// Sampling with some latents known (docs/model.md §Conditioning): the infill and prompt
// continuation of an unconditional denoiser, without retraining. The known rows of the
// latent matrix enter the solver only through its hooks (solvers.hpp SolverHooks), so
// every sampler composes with every method here, and nothing here knows of text: the
// pipeline turns known token ids into known latent rows.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ldlm/core/error.hpp"
#include "ldlm/core/tensor.hpp"
#include "ldlm/sampling/schedule.hpp"
#include "ldlm/sampling/solvers.hpp"

namespace ldlm {

/// Where the known latents replace the sampler's own values.
enum class ConditionMethod {
  x0,    // the denoiser's x̂0 at the known rows becomes z, after every call
  x,     // x at the known rows becomes α(t') z + σ(t') ε, after every step to t'
  both,  // both of the above
};

/// What stands at the free positions while the known text is encoded.
enum class KnownFill {
  mask,      // the mask id
  pad,       // the pad id
  separate,  // nothing: each maximal run of known positions is encoded alone
};

inline constexpr std::array<NamedChoice<ConditionMethod>, 3> kConditionMethods{{
    {ConditionMethod::x0, "x0", "replace the denoiser's x0 at the known positions, after every call"},
    {ConditionMethod::x, "x", "replace x at the known positions by the noised known latents, after every step"},
    {ConditionMethod::both, "both", "both replacements"},
}};

inline constexpr std::array<NamedChoice<KnownFill>, 3> kKnownFills{{
    {KnownFill::mask, "mask", "encode the known text with the mask id at the free positions"},
    {KnownFill::pad, "pad", "encode the known text with the pad id at the free positions"},
    {KnownFill::separate, "separate", "encode each run of known positions alone"},
}};

inline std::optional<ConditionMethod> find_condition_method(std::string_view name) {
  if (const auto* info = detail::find_named(kConditionMethods, name)) return info->value;
  return std::nullopt;
}
inline std::string condition_method_names(std::string_view separator = ", ") {
  return detail::joined_names(kConditionMethods, separator);
}
inline std::optional<KnownFill> find_known_fill(std::string_view name) {
  if (const auto* info = detail::find_named(kKnownFills, name)) return info->value;
  return std::nullopt;
}
inline std::string known_fill_names(std::string_view separator = ", ") {
  return detail::joined_names(kKnownFills, separator);
}
inline const NamedChoice<ConditionMethod>& condition_method_info(ConditionMethod method) {
  return detail::info_of(kConditionMethods, &NamedChoice<ConditionMethod>::value, method, "condition: unknown ConditionMethod");
}
inline const NamedChoice<KnownFill>& known_fill_info(KnownFill fill) {
  return detail::info_of(kKnownFills, &NamedChoice<KnownFill>::value, fill, "condition: unknown KnownFill");
}

/// How a condition is applied, chosen by the measurement of docs/model.md §Conditioning.
struct ConditionOptions {
  ConditionMethod method = ConditionMethod::x0;
  KnownFill fill = KnownFill::mask;
  /// RePaint's resampling: every step (but the one from t = 1) taken 1 + resample times.
  int resample = 0;
  /// The replacements apply at times t <= from_t only (1: from the start).
  double from_t = 1.0;
};

/// Throws InvalidArgument unless the options are usable; `op` names the caller.
inline void check_condition_options(std::string_view op, const ConditionOptions& o) {
  const std::string where(op);
  if (o.resample < 0) throw InvalidArgument(where + ": resample must be >= 0, got " + std::to_string(o.resample));
  if (!(o.from_t > 0 && o.from_t <= 1))
    throw InvalidArgument(where + ": the condition's from_t must be in (0, 1], got " + std::to_string(o.from_t));
}

/// The known rows of a [rows, d] latent matrix and their clean latents z.
template <class S>
struct KnownRows {
  std::vector<Index> rows;  // ascending row indices
  Matrix<S> z;              // [rows.size(), d]: z of each known row, in that order
};

/// Throws unless `known` fits a [rows, d] latent matrix: its rows ascend and lie in
/// [0, rows), and z is [known rows, d].
template <class S>
void check_known_rows(std::string_view op, const KnownRows<S>& known, Index rows, Index d) {
  const std::string where(op);
  check_shape(op, "known z", {static_cast<Index>(known.rows.size()), d}, Shape{known.z.rows(), known.z.cols()});
  for (std::size_t r = 0; r < known.rows.size(); ++r)
    if (known.rows[r] < 0 || known.rows[r] >= rows || (r > 0 && known.rows[r] <= known.rows[r - 1]))
      throw InvalidArgument(where + ": known row " + std::to_string(r) + " is " + std::to_string(known.rows[r]) +
                            "; known rows must ascend within [0, " + std::to_string(rows) + ")");
}

/// The solver hooks that apply `known` with `options`. `start` is the sampler's x at
/// t = 1 ([rows, d], the seed's noise): its known rows are the ε of the x-space
/// replacement, so that x at a known row follows α(t) z + σ(t) ε, one path from the
/// start's noise, and applying the replacement twice at one t changes nothing (UniPC's
/// corrector runs the step hook again). The hooks hold pointers into `known` and their
/// own copy of the noise; `known` must outlive them.
template <class S>
SolverHooks<S> condition_hooks(const KnownRows<S>& known, const S* start, Index d, const TangentSchedule& schedule,
                               const ConditionOptions& options) {
  SolverHooks<S> hooks;
  if (known.rows.empty()) return hooks;  // nothing known: unconditional sampling, bit for bit
  const Index k = static_cast<Index>(known.rows.size());
  const double from_t = options.from_t;
  const bool in_x0 = options.method != ConditionMethod::x, in_x = options.method != ConditionMethod::x0;
  if (in_x0)
    hooks.on_denoised = [&known, d, from_t](double t, S* x0) {
      if (t > from_t) return;
      for (std::size_t r = 0; r < known.rows.size(); ++r)
        std::copy_n(known.z.row(static_cast<Index>(r)).data(), d, x0 + known.rows[r] * d);
    };
  if (in_x) {
    Matrix<S> noise(k, d);
    for (Index r = 0; r < k; ++r) std::copy_n(start + known.rows[r] * d, d, noise.row(r).data());
    hooks.on_step = [&known, d, from_t, schedule, noise = std::move(noise)](double t, bool, S* x) {
      if (t > from_t) return;
      const double a = schedule.alpha(t), s = schedule.sigma(t);
      for (std::size_t r = 0; r < known.rows.size(); ++r) {
        const S* z = known.z.row(static_cast<Index>(r)).data();
        const S* e = noise.row(static_cast<Index>(r)).data();
        S* out = x + known.rows[r] * d;
        for (Index j = 0; j < d; ++j) out[j] = static_cast<S>(a * double(z[j]) + s * double(e[j]));
      }
    };
  }
  return hooks;
}

}  // namespace ldlm
