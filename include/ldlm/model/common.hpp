// Checks at the public API boundary, shared by every model module.
#pragma once

#include <cmath>
#include <string>

#include "ldlm/core/context.hpp"
#include "ldlm/core/tensor.hpp"
#include "ldlm/model/config.hpp"

namespace ldlm {

/// Throws E unless B sequences of T positions fit the widest rows the modules hold
/// (Config::widest_row) in a 64-bit index. With T <= max_positions, only a huge
/// B can fail; this is checked before B·T·width is formed anywhere.
template <class E = ShapeError>
void check_batch_fits(std::string_view module, Index B, Index T, const Config& c) {
  if (!checked_product<Index>({B, T, c.widest_row()}))
    throw E(std::string(module) + ": a batch of B = " + std::to_string(B) + " sequences of T = " + std::to_string(T) +
            " is too large: its [B, T, " + std::to_string(c.widest_row()) +
            "] activations have more elements than a 64-bit index can count");
}

/// Validates an activation [B, T, d]: rank, feature width d_model, 1 <= T <= max_positions,
/// B >= 1, and a batch whose activations fit (check_batch_fits).
template <class S>
void check_activation_shape(std::string_view module, std::string_view tensor, const Tensor3<S>& x, const Config& c) {
  check_shape(module, tensor, {-1, -1, c.d_model}, shape_of(x));
  if (x.dimension(0) < 1 || x.dimension(1) < 1 || x.dimension(1) > c.max_positions)
    throw ShapeError(std::string(module) + ": tensor '" + std::string(tensor) + "' has shape " +
                     shape_string(shape_of(x)) +
                     "; need B >= 1 and 1 <= T <= max_positions = " + std::to_string(c.max_positions));
  check_batch_fits(module, x.dimension(0), x.dimension(1), c);
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

/// Hands `x` to Context::block_observer, if set, as `name`.
template <class S>
void observe_block(const Context& ctx, std::string_view module, std::string_view name, ConstMatRef<S> x) {
  if (ctx.block_observer) ctx.block_observer(module, name, x.template cast<double>());
}

/// The same for block `index` of `stream`: the name is "<stream>.<index>", built only when observed.
template <class S>
void observe_block(const Context& ctx, std::string_view module, std::string_view stream, std::size_t index,
                   ConstMatRef<S> x) {
  if (ctx.block_observer) observe_block<S>(ctx, module, std::string(stream) + "." + std::to_string(index), x);
}

}  // namespace ldlm
