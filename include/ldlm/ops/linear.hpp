// Matrix products over all B*T rows at once. Every activation is a row-major
// [rows, features] matrix; a weight is either nn.Linear's [out, in] or GPT-2's
// Conv1D [in, out]. Work is split over the context's threads by rows (or, for
// few rows, by output features); Eigen itself stays single-threaded.
#pragma once

#include "ldlm/core/context.hpp"
#include "ldlm/core/tensor.hpp"

namespace ldlm {

enum class WeightLayout { out_in, in_out };

/// y[M, N] = x[M, K] · W (+ bias[N]), with W = w^T for out_in ([N, K]) and W = w for
/// in_out ([K, N]). bias may be null. y must not alias x or w.
template <class S>
void linear(Context& ctx, ConstMatRef<S> x, ConstMatRef<S> w, const S* bias, MatRef<S> y,
            WeightLayout layout = WeightLayout::out_in) {
  const Index M = x.rows();
  const Index N = layout == WeightLayout::out_in ? w.rows() : w.cols();
  const Index K = layout == WeightLayout::out_in ? w.cols() : w.rows();
  if (x.cols() != K || y.rows() != M || y.cols() != N)
    throw ShapeError("linear: x " + shape_string(Shape{M, x.cols()}) + ", weight " +
                     shape_string(Shape{w.rows(), w.cols()}) + ", y " + shape_string(Shape{y.rows(), y.cols()}) +
                     " do not fit");
  // Split rows when there are enough of them for every thread, else split columns.
  const int threads = ctx.threads();
  const bool by_rows = M >= 32 * threads;
  const Index extent = by_rows ? M : N;
  const Index parts = std::min<Index>(threads, std::max<Index>(1, extent / 16));
  const Index chunk = (extent + parts - 1) / parts;
  ctx.pool().parallel_for(parts, [&](Index part, int) {
    const Index begin = part * chunk, len = std::min(chunk, extent - begin);
    if (len <= 0) return;
    const Index r0 = by_rows ? begin : 0, rows = by_rows ? len : M;
    const Index c0 = by_rows ? 0 : begin, cols = by_rows ? N : len;
    auto out = y.block(r0, c0, rows, cols);
    if (layout == WeightLayout::out_in)
      out.noalias() = x.middleRows(r0, rows) * w.middleRows(c0, cols).transpose();
    else
      out.noalias() = x.middleRows(r0, rows) * w.middleCols(c0, cols);
    if (bias) out.rowwise() += ConstRowVectorMap<S>(bias + c0, cols);
  });
}

}  // namespace ldlm
