// Elementwise comparison against a reference with a stated tolerance,
// |got - ref| <= atol + rtol·|ref|. The tests and `ldlm compare` both judge parity
// with it, so a margin means the same thing in both places.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "ldlm/core/error.hpp"

namespace ldlm {

struct Tolerance {
  double atol = 1e-5;
  double rtol = 1e-5;

  /// The largest |got - ref| accepted for the reference value `ref`.
  double allowed(double ref) const { return atol + rtol * std::abs(ref); }
};

/// |got - ref|, where equal values (equal infinities too) and two NaNs agree and a
/// NaN against a number is infinitely far, so that it always fails and is the worst.
inline double element_error(double got, double ref) {
  if (got == ref || (std::isnan(got) && std::isnan(ref))) return 0.0;
  const double error = std::abs(got - ref);
  return std::isnan(error) ? std::numeric_limits<double>::infinity() : error;
}

/// The outcome of compare_values.
struct Comparison {
  std::int64_t count = 0;     // elements compared
  std::int64_t failures = 0;  // elements outside the tolerance
  double max_error = 0;       // the largest element_error
  /// The element furthest outside its bound, or least inside it when all pass
  /// (flat row-major index; -1 when there is none), with its two values.
  std::int64_t worst = -1;
  double worst_got = 0;
  double worst_ref = 0;

  bool ok() const { return failures == 0; }
};

/// Compares n values with their references. An infinite error fails even where the
/// bound is infinite too (a finite value against an infinite reference).
template <class G, class R>
Comparison compare_values(const G* got, const R* ref, std::int64_t n, Tolerance tol) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  Comparison c;
  c.count = n;
  double worst_excess = -kInf;
  for (std::int64_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(got[i]), r = static_cast<double>(ref[i]);
    const double error = element_error(g, r);
    const double excess = error == kInf ? kInf : error - tol.allowed(r);
    c.max_error = std::max(c.max_error, error);
    if (excess > 0) ++c.failures;
    if (excess > worst_excess) worst_excess = excess, c.worst = i, c.worst_got = g, c.worst_ref = r;
  }
  return c;
}

/// The multi-index of the flat row-major index `flat` in `shape`, as "[b, t, j]".
inline std::string index_string(std::int64_t flat, const Shape& shape) {
  Shape index(shape.size());
  for (std::int64_t k = static_cast<std::int64_t>(shape.size()) - 1; k >= 0; --k) {
    index[k] = shape[k] ? flat % shape[k] : 0;
    flat = shape[k] ? flat / shape[k] : 0;
  }
  return shape_string(index);
}

}  // namespace ldlm
