// adaLN modulation and gated residuals. Rows are (b, t) pairs, b = row / T; the
// per-sequence vectors (shift, scale, gate) are rows of [B, d] matrices, usually
// column blocks of the adaLN output.
#pragma once

#include "ldlm/ops/norm.hpp"

namespace ldlm {

namespace detail {
/// One row of modulate: y = x ⊙ (1 + scale) + shift over [0, n). y may alias x.
template <class S>
void modulate_row(const S* x, const S* shift, const S* scale, Index n, S* y) {
  const ConstRowVectorMap<S> x_row(x, n), shift_row(shift, n), scale_row(scale, n);
  RowVectorMap<S>(y, n) = x_row.cwiseProduct((scale_row.array() + S(1)).matrix()) + shift_row;
}

inline void check_modulate_shapes(const char* op, Index rows, Index d, Index T, Index shift_rows, Index shift_cols,
                                  Index scale_rows, Index scale_cols, Index y_rows, Index y_cols) {
  const auto shape = [](Index r, Index c) { return shape_string(Shape{r, c}); };
  const Index B = sequence_count(op, "x", rows, d, T);
  if (shift_rows != B || scale_rows != B || shift_cols != d || scale_cols != d)
    throw ShapeError(std::string(op) + ": x " + shape(rows, d) + " with T = " + std::to_string(T) +
                     " needs shift and scale " + shape(B, d) + ", got " + shape(shift_rows, shift_cols) + " and " +
                     shape(scale_rows, scale_cols));
  if (y_rows != rows || y_cols != d)
    throw ShapeError(std::string(op) + ": y " + shape(y_rows, y_cols) + " must match x " + shape(rows, d));
}
}  // namespace detail

/// y = x ⊙ (1 + scale[b]) + shift[b]. y may alias x.
template <class S>
void modulate(Context& ctx, ConstMatRef<S> x, ConstMatRef<S> shift, ConstMatRef<S> scale, Index T, MatRef<S> y) {
  const Index d = x.cols();
  detail::check_modulate_shapes("modulate", x.rows(), d, T, shift.rows(), shift.cols(), scale.rows(), scale.cols(),
                                y.rows(), y.cols());
  for_each_row(ctx, x.rows(), [&](Index r) {
    const Index b = r / T;
    detail::modulate_row(x.row(r).data(), shift.row(b).data(), scale.row(b).data(), d, y.row(r).data());
  });
}

/// modulate(layer_norm_gain(x)) in one pass, each row still in L1 between the two:
/// y = (γ ⊙ (x − μ) / sqrt(σ² + ε)) ⊙ (1 + scale[b]) + shift[b]. y may alias x.
template <class S>
void layer_norm_modulate(Context& ctx, ConstMatRef<S> x, const S* gamma, float eps, ConstMatRef<S> shift,
                         ConstMatRef<S> scale, Index T, MatRef<S> y) {
  const Index d = x.cols();
  detail::check_norm_shapes("layer_norm_modulate", detail::extents(x), d, detail::extents(y));
  detail::check_modulate_shapes("layer_norm_modulate", x.rows(), d, T, shift.rows(), shift.cols(), scale.rows(),
                                scale.cols(), y.rows(), y.cols());
  for_each_row(ctx, x.rows(), [&](Index r) {
    const Index b = r / T;
    detail::layer_norm_gain_row(x.row(r).data(), gamma, eps, d, y.row(r).data());
    detail::modulate_row(y.row(r).data(), shift.row(b).data(), scale.row(b).data(), d, y.row(r).data());
  });
}

/// The same rows rounded to bf16 once, into y: dense [rows, d] bf16, the operand a
/// bf16 product would otherwise round from a float32 y (same values, one pass over
/// memory less). y must not overlap x.
inline void layer_norm_modulate(Context& ctx, ConstMatRef<float> x, const float* gamma, float eps,
                                ConstMatRef<float> shift, ConstMatRef<float> scale, Index T, bf16* y) {
  const Index d = x.cols();
  detail::check_modulate_shapes("layer_norm_modulate", x.rows(), d, T, shift.rows(), shift.cols(), scale.rows(),
                                scale.cols(), x.rows(), d);
  constexpr Index kRowsPerTask = 32;
  ctx.pool().parallel_for((x.rows() + kRowsPerTask - 1) / kRowsPerTask, [&](Index task, int worker) {
    Arena& arena = ctx.worker_arena(worker);
    Arena::Scope scope(arena);
    float* const row = arena.allocate<float>(static_cast<std::size_t>(d));  // one float32 row, in L1
    for (Index r = task * kRowsPerTask; r < std::min(x.rows(), (task + 1) * kRowsPerTask); ++r) {
      const Index b = r / T;
      detail::layer_norm_gain_row(x.row(r).data(), gamma, eps, d, row);
      detail::modulate_row(row, shift.row(b).data(), scale.row(b).data(), d, row);
      to_bf16(row, d, y + r * d);
    }
  });
}

/// residual += gate[b] ⊙ x (dropout is the identity at inference). residual must
/// not alias x or gate.
template <class S>
void gated_residual_add(Context& ctx, MatRef<S> residual, ConstMatRef<S> gate, ConstMatRef<S> x, Index T) {
  const Index B = sequence_count("gated_residual_add", "x", x.rows(), x.cols(), T);
  check_shape("gated_residual_add", "gate", {B, x.cols()}, detail::extents(gate));
  check_shape("gated_residual_add", "residual", {x.rows(), x.cols()}, detail::extents(residual));
  for_each_row(ctx, x.rows(), [&](Index r) { residual.row(r) += gate.row(r / T).cwiseProduct(x.row(r)); });
}

/// ScaleMask with every position masked (m = 1): y = x · (1 + w + b). y may alias x.
template <class S>
void scale_mask(Context& ctx, ConstMatRef<S> x, S w, S b, MatRef<S> y) {
  check_shape("scale_mask", "y", {x.rows(), x.cols()}, detail::extents(y));
  const S factor = S(1) + w * S(1) + b;
  for_each_row(ctx, x.rows(), [&](Index r) { y.row(r) = x.row(r) * factor; });
}

}  // namespace ldlm
