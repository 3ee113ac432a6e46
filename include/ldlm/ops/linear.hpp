// Linear maps over all B*T rows at once. Every activation is a row-major
// [rows, features] matrix; a weight is either nn.Linear's [out, in] or GPT-2's
// Conv1D [in, out], plain or packed (ops/gemm.hpp). Work is split over the
// context's threads by rows (plain weights with few rows: by output features);
// each product runs on one thread. Products of few rows are split by output columns
// instead: plain weights always, packed ones where their layout allows it (bf16).
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "ldlm/core/context.hpp"
#include "ldlm/core/tensor.hpp"
#include "ldlm/ops/packed_matrix.hpp"

namespace ldlm {

/// y[M, N] = x[M, K] · W (+ bias[N]), with W = w^T for out_in ([N, K]) and W = w for
/// in_out ([K, N]). bias may be null. y must not alias x or w. `epilogue`, if
/// given, runs on each finished block of y (a [rows, cols] MatRef) inside the
/// task that computed it, so an activation costs no extra pass over threads;
/// it may run concurrently on disjoint blocks.
template <class S, class Epilogue = std::nullptr_t>
void linear(Context& ctx, ConstMatRef<S> x, ConstMatRef<S> w, const S* bias, MatRef<S> y,
            WeightLayout layout = WeightLayout::out_in, Epilogue&& epilogue = nullptr) {
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
    MatRef<S> out = y.block(r0, c0, rows, cols);
    // The bias goes in first and the product accumulates onto it (beta = 1): one
    // pass over y instead of a zero fill plus a bias pass.
    if (bias) out.rowwise() = ConstRowVectorMap<S>(bias + c0, cols);
    const S beta = bias ? S(1) : S(0);
    if (layout == WeightLayout::out_in)
      gemm<S>(x.middleRows(r0, rows), w.middleRows(c0, cols), true, S(1), beta, out);
    else
      gemm<S>(x.middleRows(r0, rows), w.middleCols(c0, cols), false, S(1), beta, out);
    if constexpr (!std::is_same_v<std::decay_t<Epilogue>, std::nullptr_t>) epilogue(out);
  });
}

namespace detail {
/// Runs product(r0, rows, scratch) over blocks of x's M rows, one per thread, in
/// blocks of at least 16 (packed kernels keep their speed down to that many rows;
/// below, bf16 loses it at 8 rows and fp32 at 4: bench/results/README.md). scratch
/// holds w.scratch_bytes of the largest block.
template <class Product>
void split_packed_rows(Context& ctx, Index M, const PackedMatrix& w, Product&& product) {
  if (M == 0) return;
  const Index parts = std::clamp<Index>(M / 16, 1, ctx.threads());
  const Index chunk = (M + parts - 1) / parts;
  ctx.pool().parallel_for(parts, [&](Index part, int worker) {
    const Index r0 = part * chunk, rows = std::min(chunk, M - r0);
    if (rows <= 0) return;
    Arena& arena = ctx.worker_arena(worker);
    Arena::Scope scope(arena);
    product(r0, rows, arena.allocate<std::byte>(w.scratch_bytes(chunk)));  // the largest part's: sized once
  });
}

inline void check_packed_shapes(Index x_rows, Index x_cols, const PackedMatrix& w, Index y_rows, Index y_cols) {
  if (x_cols != w.in_features() || y_rows != x_rows || y_cols != w.out_features())
    throw ShapeError("linear: x " + shape_string(Shape{x_rows, x_cols}) + ", weight " + shape_string(w.weight_shape()) +
                     ", y " + shape_string(Shape{y_rows, y_cols}) + " do not fit");
}
}  // namespace detail

/// y[M, N] = x[M, K] · W (+ bias[N]) with a packed weight, then `epilogue` on each
/// finished block of y, as above: of rows, or of columns when the rows are too few
/// for the threads. y must not alias x.
template <class Epilogue = std::nullptr_t>
void linear(Context& ctx, ConstMatRef<float> x, const PackedMatrix& w, const float* bias, MatRef<float> y,
            Epilogue&& epilogue = nullptr) {
  detail::check_packed_shapes(x.rows(), x.cols(), w, y.rows(), y.cols());
  // Too few rows for every thread (adaLN's one row per sequence): blocks of columns.
  const Index M = x.rows(), N = w.out_features(), block = w.column_block();
  if (M > 0 && M / 16 < ctx.threads() && ctx.threads() > 1 && block > 0 && N >= 2 * block) {
    const Index blocks = (N + block - 1) / block, parts = std::min<Index>(ctx.threads(), blocks);
    ctx.pool().parallel_for(parts, [&](Index part, int worker) {
      const Index n0 = part * blocks / parts * block, n1 = std::min(N, (part + 1) * blocks / parts * block);
      Arena& arena = ctx.worker_arena(worker);
      Arena::Scope scope(arena);
      w.multiply_columns(x.data(), x.outerStride(), M, bias, n0, n1 - n0, y.data(), y.outerStride(),
                         arena.allocate<std::byte>(w.scratch_bytes(M)));
      if constexpr (!std::is_same_v<std::decay_t<Epilogue>, std::nullptr_t>) epilogue(y.middleCols(n0, n1 - n0));
    });
    return;
  }
  detail::split_packed_rows(ctx, x.rows(), w, [&](Index r0, Index rows, std::byte* scratch) {
    w.multiply(x.row(r0).data(), x.outerStride(), rows, bias, y.row(r0).data(), y.outerStride(), scratch);
    if constexpr (!std::is_same_v<std::decay_t<Epilogue>, std::nullptr_t>) epilogue(y.middleRows(r0, rows));
  });
}

/// y[M, N] = x[M, K] · W (+ bias[N]) on bf16 rows x (from linear_activated), with a
/// weight packed for bf16 kernels.
inline void linear(Context& ctx, BF16Rows x, const PackedMatrix& w, const float* bias, MatRef<float> y) {
  detail::check_packed_shapes(x.rows, x.cols, w, y.rows(), y.cols());
  detail::split_packed_rows(ctx, x.rows, w, [&](Index r0, Index rows, std::byte* scratch) {
    w.multiply(x.data + r0 * x.stride, x.stride, rows, bias, y.row(r0).data(), y.outerStride(), scratch);
  });
}

/// Where a product's result goes in a gated residual block: residual[r] +=
/// gate[r / T] ⊙ result[r], for rows r = (b, t) of B sequences of T. residual is
/// [B*T, N] and gate [B, N].
template <class S>
struct GatedResidual {
  MatRef<S> residual;
  ConstMatRef<S> gate;
  Index T;
};

namespace detail {
inline void check_gated_residual(Index x_rows, Index x_cols, const PackedMatrix& w, const GatedResidual<float>& out) {
  check_packed_shapes(x_rows, x_cols, w, out.residual.rows(), out.residual.cols());
  if (out.T <= 0 || x_rows % out.T != 0)
    throw ShapeError("linear: a gated residual's " + std::to_string(x_rows) +
                     " rows are not whole sequences of T = " + std::to_string(out.T));
  if (out.gate.rows() != x_rows / out.T || out.gate.cols() != w.out_features())
    throw ShapeError("linear: a gated residual of " + shape_string(Shape{x_rows, w.out_features()}) + " with T = " +
                     std::to_string(out.T) + " needs a gate " + shape_string(Shape{x_rows / out.T, w.out_features()}) +
                     ", got " + shape_string(Shape{out.gate.rows(), out.gate.cols()}));
  if (out.residual.outerStride() != out.residual.cols())
    throw ShapeError("linear: a gated residual needs dense residual rows (row stride " +
                     std::to_string(out.residual.cols()) + "), got row stride " +
                     std::to_string(out.residual.outerStride()));
}

/// product(r0, rows, gate_row, scratch) over the rows of split_packed_rows, cut
/// where a sequence ends so that each call has one gate row.
template <class Product>
void split_gated_rows(Context& ctx, const GatedResidual<float>& out, const PackedMatrix& w, Product&& product) {
  split_packed_rows(ctx, out.residual.rows(), w, [&](Index r0, Index rows, std::byte* scratch) {
    for (Index r = r0; r < r0 + rows;) {
      const Index b = r / out.T, end = std::min(r0 + rows, (b + 1) * out.T);
      product(r, end - r, out.gate.row(b).data(), scratch);
      r = end;
    }
  });
}
}  // namespace detail

/// out.residual += gate ⊙ (x · W (+ bias)) with a weight packed for bf16 kernels,
/// in one pass over the residual (PackedMatrix::multiply_gated_add). x must not
/// alias the residual.
inline void linear_gated_add(Context& ctx, ConstMatRef<float> x, const PackedMatrix& w, const float* bias,
                             GatedResidual<float> out) {
  detail::check_gated_residual(x.rows(), x.cols(), w, out);
  detail::split_gated_rows(ctx, out, w, [&](Index r0, Index rows, const float* gate, std::byte* scratch) {
    w.multiply_gated_add(x.row(r0).data(), x.outerStride(), rows, bias, gate, out.residual.row(r0).data(), scratch);
  });
}

/// The same on bf16 rows x (from linear_activated).
inline void linear_gated_add(Context& ctx, BF16Rows x, const PackedMatrix& w, const float* bias,
                             GatedResidual<float> out) {
  detail::check_gated_residual(x.rows, x.cols, w, out);
  detail::split_gated_rows(ctx, out, w, [&](Index r0, Index rows, const float* gate, std::byte* scratch) {
    w.multiply_gated_add(x.data + r0 * x.stride, x.stride, rows, bias, gate, out.residual.row(r0).data(), scratch);
  });
}

/// y[M, N] = activation(x[M, K] · W (+ bias[N])) as dense bf16 rows: the operand of
/// the next product, written by this one (PackedMatrix::multiply_activated).
inline void linear_activated(Context& ctx, ConstMatRef<float> x, const PackedMatrix& w, const float* bias,
                             Activation activation, bf16* y) {
  detail::check_packed_shapes(x.rows(), x.cols(), w, x.rows(), w.out_features());
  detail::split_packed_rows(ctx, x.rows(), w, [&](Index r0, Index rows, std::byte* scratch) {
    w.multiply_activated(x.row(r0).data(), x.outerStride(), rows, bias, activation, y + r0 * w.out_features(), scratch);
  });
}
/// The same on bf16 rows x.
inline void linear_activated(Context& ctx, BF16Rows x, const PackedMatrix& w, const float* bias, Activation activation,
                             bf16* y) {
  detail::check_packed_shapes(x.rows, x.cols, w, x.rows, w.out_features());
  detail::split_packed_rows(ctx, x.rows, w, [&](Index r0, Index rows, std::byte* scratch) {
    w.multiply_activated(x.data + r0 * x.stride, x.stride, rows, bias, activation, y + r0 * w.out_features(), scratch);
  });
}

}  // namespace ldlm
