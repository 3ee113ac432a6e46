// Checks at the public API boundary, shared by every model module.
#pragma once

#include <cmath>
#include <string>

#include "ldlm/core/context.hpp"
#include "ldlm/core/tensor.hpp"

namespace ldlm {

/// Validates an activation [B, T, d]: rank, feature width, 1 <= T <= max_positions, B >= 1.
template <class S>
void check_activation(std::string_view module, std::string_view tensor, const Tensor3<S>& x, Index d,
                      Index max_positions) {
  check_shape(module, tensor, {-1, -1, d}, shape_of(x));
  if (x.dimension(0) < 1 || x.dimension(1) < 1 || x.dimension(1) > max_positions)
    throw ShapeError(std::string(module) + ": tensor '" + std::string(tensor) + "' has shape " +
                     shape_string(shape_of(x)) + "; need B >= 1 and 1 <= T <= max_positions = " +
                     std::to_string(max_positions));
}

/// With Context::check_finite set, throws NumericError at the first NaN/Inf.
template <class S>
void check_finite(const Context& ctx, std::string_view module, std::string_view tensor, ConstMatRef<S> m) {
  if (!ctx.check_finite || m.allFinite()) return;
  for (Index r = 0; r < m.rows(); ++r)
    for (Index c = 0; c < m.cols(); ++c)
      if (!std::isfinite(m(r, c)))
        throw NumericError(std::string(module) + ": non-finite value " + std::to_string(m(r, c)) + " in '" +
                           std::string(tensor) + "' at row " + std::to_string(r) + ", column " + std::to_string(c));
}

}  // namespace ldlm
