// adaLN modulation and gated residuals. Rows are (b, t) pairs, b = row / T; the
// per-sequence vectors (shift, scale, gate) are rows of [B, d] matrices, usually
// column blocks of the adaLN output.
#pragma once

#include "ldlm/ops/norm.hpp"

namespace ldlm {

/// y = x ⊙ (1 + scale[b]) + shift[b]. y may alias x.
template <class S>
void modulate(Context& ctx, ConstMatRef<S> x, ConstMatRef<S> shift, ConstMatRef<S> scale, Index T, MatRef<S> y) {
  detail::for_each_row(ctx, x.rows(), [&](Index r) {
    const Index b = r / T;
    y.row(r) = x.row(r).cwiseProduct((scale.row(b).array() + S(1)).matrix()) + shift.row(b);
  });
}

/// residual += gate[b] ⊙ x (dropout is the identity at inference).
template <class S>
void gated_residual_add(Context& ctx, MatRef<S> residual, ConstMatRef<S> gate, ConstMatRef<S> x, Index T) {
  detail::for_each_row(ctx, x.rows(), [&](Index r) { residual.row(r) += gate.row(r / T).cwiseProduct(x.row(r)); });
}

/// ScaleMask with every position masked (m = 1): y = x · (1 + w + b). y may alias x.
template <class S>
void scale_mask(Context& ctx, ConstMatRef<S> x, S w, S b, MatRef<S> y) {
  const S factor = S(1) + w * S(1) + b;
  detail::for_each_row(ctx, x.rows(), [&](Index r) { y.row(r) = x.row(r) * factor; });
}

}  // namespace ldlm
