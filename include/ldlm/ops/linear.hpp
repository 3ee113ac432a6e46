// Linear maps over all B*T rows at once. Every activation is a row-major
// [rows, features] matrix; a weight is either nn.Linear's [out, in] or GPT-2's
// Conv1D [in, out], plain or packed (ops/packed_matrix.hpp). Work is split over the
// context's threads by rows (plain weights with few rows: by output features);
// each product runs on one thread. Products of few rows are split by output columns
// instead: plain weights always, packed ones where their layout allows it (bf16).
//
// One entry point, linear(): rows in any form the weight's path reads (OperandRows),
// a weight packed or plain (LinearWeight; a packed weight's ProductPath, fp32, bf16 or
// int8 kernels, was chosen once when it was packed), and where the result goes
// (Destination), fusing what the path can fuse and doing the rest in separate passes
// of the same arithmetic.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "ldlm/core/context.hpp"
#include "ldlm/core/error.hpp"
#include "ldlm/core/precision.hpp"
#include "ldlm/core/tensor.hpp"
#include "ldlm/ops/activation.hpp"
#include "ldlm/ops/gemm.hpp"
#include "ldlm/ops/modulate.hpp"
#include "ldlm/ops/packed_matrix.hpp"

namespace ldlm {

/// Where a product's result goes in a gated residual block: residual[r] +=
/// gate[r / T] ⊙ result[r], for rows r = (b, t) of B sequences of T. residual is
/// [B*T, N] and gate [B, N].
template <class S>
struct GatedResidual {
  MatRef<S> residual;
  ConstMatRef<S> gate;
  Index T;
};

/// Rows that feed products, in the form they read (RowForm): S rows with any row
/// stride, or bf16 rows, which only bf16_native products read. A matrix converts to
/// it implicitly, and so do BF16Rows.
template <class S>
class OperandRows {
 public:
  template <class M>
  requires std::convertible_to<const M&, ConstMatRef<S>> OperandRows(
      const M& m) {  // NOLINT(google-explicit-constructor): a matrix is rows in the S form
    const ConstMatRef<S> r(m);
    data_ = r.data(), rows_ = r.rows(), cols_ = r.cols(), stride_ = r.outerStride();
  }
  OperandRows(BF16Rows x)  // NOLINT(google-explicit-constructor)
      requires std::same_as<S, float>
      : data_(x.data), rows_(x.rows), cols_(x.cols), stride_(x.stride), form_(RowForm::bf16) {}
  OperandRows(const void* data, Index rows, Index cols, Index stride, RowForm form)
      : data_(data), rows_(rows), cols_(cols), stride_(stride), form_(form) {}

  RowForm form() const { return form_; }
  Index rows() const { return rows_; }
  Index cols() const { return cols_; }
  /// The S rows, for RowForm::fp32.
  ConstStridedMap<S> values() const {
    return ConstStridedMap<S>(static_cast<const S*>(data_), rows_, cols_, Eigen::OuterStride<>(stride_));
  }
  /// The bf16 rows, for RowForm::bf16.
  BF16Rows bf16_rows() const { return {static_cast<const bf16*>(data_), rows_, cols_, stride_}; }

 private:
  const void* data_ = nullptr;
  Index rows_ = 0, cols_ = 0, stride_ = 0;
  RowForm form_ = RowForm::fp32;
};

/// f(x.values()) or, for bf16 rows, f(x.bf16_rows()): the one place that looks at a form.
template <class S, class F>
decltype(auto) with_rows(const OperandRows<S>& x, F&& f) {
  if constexpr (std::is_same_v<S, float>)
    if (x.form() == RowForm::bf16) return f(x.bf16_rows());
  return f(x.values());
}

/// Dense rows to write products' operands into, in the form those products read,
/// from an arena (uninitialised). A double model's rows are always S.
template <class S>
class OperandBuffer {
 public:
  static OperandBuffer allocate(Arena& arena, Index rows, Index cols, RowForm form) {
    if (!std::is_same_v<S, float> && form == RowForm::bf16)
      throw InvalidArgument("OperandBuffer: bf16 rows need a float model, this one computes in double");
    OperandBuffer b;
    const auto n = static_cast<std::size_t>(rows * cols);
    b.data_ = form == RowForm::bf16 ? static_cast<void*>(arena.allocate<bf16>(n)) : arena.allocate<S>(n);
    b.rows_ = rows, b.cols_ = cols, b.form_ = form;
    return b;
  }
  RowForm form() const { return form_; }
  Index rows() const { return rows_; }
  Index cols() const { return cols_; }
  /// f(MatrixMap<S>) or, for bf16 rows, f(bf16* dense rows): where to write them.
  template <class F>
  decltype(auto) write(F&& f) const {
    if constexpr (std::is_same_v<S, float>)
      if (form_ == RowForm::bf16) return f(static_cast<bf16*>(data_));
    return f(MatrixMap<S>(static_cast<S*>(data_), rows_, cols_));
  }
  operator OperandRows<S>() const {  // NOLINT(google-explicit-constructor): what was written is read
    return OperandRows<S>(data_, rows_, cols_, cols_, form_);
  }

 private:
  void* data_ = nullptr;
  Index rows_ = 0, cols_ = 0;
  RowForm form_ = RowForm::fp32;
};

/// Where a product writes the next product's operand: activation(x · W (+ bias)),
/// computed in fp32 and rounded to bf16 (if at all) once, into rows of `rows`' form.
template <class S>
struct ActivatedRows {
  OperandBuffer<S> rows;
  Activation activation = Activation::none;
};

/// The first element of the dense rows OperandBuffer::write hands out.
inline bf16* dense_data(bf16* rows) { return rows; }
template <class S>
S* dense_data(MatrixMap<S> rows) {
  return rows.data();
}

/// Where a product's result rows go: written to y, added to a gated residual, or
/// written activated as the next product's rows. Any matrix converts to it implicitly,
/// and so do a GatedResidual and ActivatedRows.
template <class S>
class Destination {
 public:
  template <class M>
  requires std::convertible_to<M&&, MatRef<S>> Destination(
      M&& y) {  // NOLINT(google-explicit-constructor): a matrix is written
    MatRef<S> r(std::forward<M>(y));
    data_ = r.data(), rows_ = r.rows(), cols_ = r.cols(), stride_ = r.outerStride();
  }
  Destination(const GatedResidual<S>& out)  // NOLINT(google-explicit-constructor)
      : Destination(out.residual) {
    gate_ = out.gate.data(), gate_rows_ = out.gate.rows(), gate_cols_ = out.gate.cols();
    gate_stride_ = out.gate.outerStride(), T_ = out.T;
  }
  Destination(const ActivatedRows<S>& out)  // NOLINT(google-explicit-constructor)
      : rows_(out.rows.rows()), cols_(out.rows.cols()), activated_(out) {}

  Index rows() const { return rows_; }
  Index cols() const { return cols_; }
  /// f(MatRef<S> y), or f(GatedResidual<S>), or f(ActivatedRows<S>).
  template <class F>
  decltype(auto) visit(F&& f) const {
    if (activated_) return f(*activated_);
    if (gate_) {
      const ConstStridedMap<S> gate(gate_, gate_rows_, gate_cols_, Eigen::OuterStride<>(gate_stride_));
      return f(GatedResidual<S>{rows_map(), gate, T_});
    }
    return f(MatRef<S>(rows_map()));
  }

 private:
  S* data_ = nullptr;
  Index rows_ = 0, cols_ = 0, stride_ = 0;
  const S* gate_ = nullptr;
  Index gate_rows_ = 0, gate_cols_ = 0, gate_stride_ = 0, T_ = 0;
  std::optional<ActivatedRows<S>> activated_;

  StridedMap<S> rows_map() const { return StridedMap<S>(data_, rows_, cols_, Eigen::OuterStride<>(stride_)); }
};

namespace detail {
/// y[M, N] = x[M, K] · W (+ bias[N]), with W = w^T for out_in ([N, K]) and W = w for
/// in_out ([K, N]). bias may be null. y must not alias x or w. `epilogue`, if
/// given, runs on each finished block of y (a [rows, cols] MatRef) inside the
/// task that computed it, so an activation costs no extra pass over threads;
/// it may run concurrently on disjoint blocks.
template <class S, class Epilogue>
void linear_plain(Context& ctx, ConstMatRef<S> x, ConstMatRef<S> w, const S* bias, MatRef<S> y, WeightLayout layout,
                  Epilogue&& epilogue) {
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
}  // namespace detail

namespace detail {
/// Runs product(r0, rows, scratch) over blocks of x's M rows, one per thread, in
/// blocks of at least 16 (packed kernels keep their speed down to that many rows;
/// below it they lose it: bench/results/README.md). scratch holds w.scratch_bytes
/// of the largest block.
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

/// Row r0 of float rows or of bf16 rows, their row stride and their count.
inline const float* row_data(ConstMatRef<float> x, Index r0) { return x.row(r0).data(); }
inline const bf16* row_data(BF16Rows x, Index r0) { return x.data + r0 * x.stride; }
inline Index row_stride(ConstMatRef<float> x) { return x.outerStride(); }
inline Index row_stride(BF16Rows x) { return x.stride; }
inline Index row_count(ConstMatRef<float> x) { return x.rows(); }
inline Index row_count(BF16Rows x) { return x.rows; }
inline Index col_count(ConstMatRef<float> x) { return x.cols(); }
inline Index col_count(BF16Rows x) { return x.cols; }
}  // namespace detail

namespace detail {
template <class Rows, class Epilogue>
void linear_rows(Context& ctx, const Rows& x, const PackedMatrix& w, const float* bias, MatRef<float> y,
                 Epilogue&& epilogue) {
  const Index M = detail::row_count(x), N = w.out_features(), block = w.column_block();
  detail::check_packed_shapes(M, detail::col_count(x), w, y.rows(), y.cols());
  const ProductOutput out = ProductOutput::rows(y.data(), y.outerStride());
  // Too few rows for every thread (adaLN's one row per sequence): blocks of columns.
  if (M > 0 && M / 16 < ctx.threads() && ctx.threads() > 1 && block > 0 && N >= 2 * block) {
    const Index blocks = (N + block - 1) / block, parts = std::min<Index>(ctx.threads(), blocks);
    ctx.pool().parallel_for(parts, [&](Index part, int worker) {
      const Index n0 = part * blocks / parts * block, n1 = std::min(N, (part + 1) * blocks / parts * block);
      Arena& arena = ctx.worker_arena(worker);
      Arena::Scope scope(arena);
      w.multiply(detail::row_data(x, 0), detail::row_stride(x), M, bias, out.block(n0, n1 - n0),
                 arena.allocate<std::byte>(w.scratch_bytes(M)));
      if constexpr (!std::is_same_v<std::decay_t<Epilogue>, std::nullptr_t>) epilogue(y.middleCols(n0, n1 - n0));
    });
    return;
  }
  detail::split_packed_rows(ctx, M, w, [&](Index r0, Index rows, std::byte* scratch) {
    w.multiply(detail::row_data(x, r0), detail::row_stride(x), rows, bias,
               ProductOutput::rows(y.row(r0).data(), y.outerStride()), scratch);
    if constexpr (!std::is_same_v<std::decay_t<Epilogue>, std::nullptr_t>) epilogue(y.middleRows(r0, rows));
  });
}

}  // namespace detail

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

/// out.residual += gate ⊙ (x · W (+ bias)), which `product(y)` writes: the unfused
/// order, the product into the arena and then gated_residual_add.
template <class S, class Product>
void gated_add_unfused(Context& ctx, Index rows, Index cols, const GatedResidual<S>& out, Product&& product) {
  Arena::Scope scope(ctx.arena());
  MatrixMap<S> y(ctx.arena().allocate<S>(rows * cols), rows, cols);
  product(MatRef<S>(y));
  gated_residual_add<S>(ctx, out.residual, out.gate, y, out.T);
}

/// out.residual += gate ⊙ (x · W (+ bias)). A bf16_native weight adds in its product,
/// in one pass over a dense residual (ProductOutput::gated_add); every other case
/// takes the unfused order. x must not alias the residual.
template <class Rows>
void gated_add_rows(Context& ctx, const Rows& x, const PackedMatrix& w, const float* bias,
                    const GatedResidual<float>& out) {
  check_gated_residual(row_count(x), col_count(x), w, out);
  if (w.path() != ProductPath::bf16_native || out.residual.outerStride() != out.residual.cols())
    return gated_add_unfused<float>(ctx, row_count(x), w.out_features(), out,
                                    [&](MatRef<float> y) { linear_rows(ctx, x, w, bias, y, nullptr); });
  MatRef<float> residual = out.residual;
  split_gated_rows(ctx, out, w, [&](Index r0, Index rows, const float* gate, std::byte* scratch) {
    w.multiply(row_data(x, r0), row_stride(x), rows, bias,
               ProductOutput::gated_add(residual.row(r0).data(), residual.outerStride(), gate), scratch);
  });
}

/// y[M, N] = activation(x[M, K] · W (+ bias[N])) as dense bf16 rows: the operand of
/// the next product, written by this one on a bf16_native weight.
template <class Rows>
void activated_rows(Context& ctx, const Rows& x, const PackedMatrix& w, const float* bias, Activation activation,
                    bf16* y) {
  const Index M = row_count(x), N = w.out_features();
  check_packed_shapes(M, col_count(x), w, M, N);
  split_packed_rows(ctx, M, w, [&](Index r0, Index rows, std::byte* scratch) {
    w.multiply(row_data(x, r0), row_stride(x), rows, bias, ProductOutput::activated(y + r0 * N, N, activation),
               scratch);
  });
}

/// The product of rows x in any form with a packed weight into out: written (then
/// `epilogue` on each block), added to a gated residual, or activated into rows of
/// h's form, bf16 rows written by a bf16_native product itself or float rows activated
/// block by block after their product (the activation in fp32 either way, rounded to
/// bf16, if at all, once).
template <class Out, class Epilogue>
void packed_product(Context& ctx, const OperandRows<float>& x, const PackedMatrix& w, const float* bias, const Out& out,
                    Epilogue&& epilogue) {
  with_rows(x, [&](const auto& rows) {
    using Rows =
        std::conditional_t<std::is_same_v<std::decay_t<decltype(rows)>, BF16Rows>, BF16Rows, ConstMatRef<float>>;
    if constexpr (std::is_same_v<Out, GatedResidual<float>>) {
      gated_add_rows(ctx, Rows(rows), w, bias, out);
    } else if constexpr (std::is_same_v<Out, ActivatedRows<float>>) {
      out.rows.write([&](auto h) {
        if constexpr (std::is_same_v<decltype(h), bf16*>)
          activated_rows(ctx, Rows(rows), w, bias, out.activation, h);
        else
          linear_rows(ctx, Rows(rows), w, bias, h, per_row_epilogue<float>(activation_inplace<float>(out.activation)));
      });
    } else {
      linear_rows(ctx, Rows(rows), w, bias, out, std::forward<Epilogue>(epilogue));
    }
  });
}

/// The same with a plain weight w ([out, in] or [in, out] by layout), which reads S
/// rows: a gated residual adds in the unfused order, activated rows are S rows
/// activated block by block.
template <class S, class Out, class Epilogue>
void plain_product(Context& ctx, const OperandRows<S>& x, ConstMatRef<S> w, WeightLayout layout, const S* bias,
                   const Out& out, Epilogue&& epilogue) {
  if (x.form() != RowForm::fp32)
    throw InvalidArgument("linear: weight " + shape_string(Shape{w.rows(), w.cols()}) +
                          ": bf16 rows need a weight packed for bf16 kernels; this one is not packed");
  const ConstStridedMap<S> rows = x.values();
  if constexpr (std::is_same_v<Out, GatedResidual<S>>) {
    gated_add_unfused<S>(ctx, rows.rows(), out.residual.cols(), out,
                         [&](MatRef<S> product) { linear_plain<S>(ctx, rows, w, bias, product, layout, nullptr); });
  } else if constexpr (std::is_same_v<Out, ActivatedRows<S>>) {
    if (out.rows.form() != RowForm::fp32)
      throw InvalidArgument("linear: weight " + shape_string(Shape{w.rows(), w.cols()}) +
                            ": bf16 rows are written by a weight packed for bf16 kernels; this one is not packed");
    out.rows.write([&](auto h) {
      if constexpr (!std::is_same_v<decltype(h), bf16*>)
        linear_plain<S>(ctx, rows, w, bias, h, layout, per_row_epilogue<S>(activation_inplace<S>(out.activation)));
    });
  } else {
    linear_plain<S>(ctx, rows, w, bias, out, layout, std::forward<Epilogue>(epilogue));
  }
}
}  // namespace detail

/// A weight as products take it: packed, with the ProductPath (fp32, bf16 or int8
/// kernels) chosen once when it was packed (PackedMatrix, float models), or plain S
/// values, nn.Linear's [out, in] or GPT-2 Conv1D's [in, out] by layout (a double
/// model's, or a weight not packed). Either converts to it implicitly.
template <class S>
class LinearWeight {
 public:
  LinearWeight(const PackedMatrix& w)  // NOLINT(google-explicit-constructor): a packed weight multiplies
      requires std::same_as<S, float> : packed_(&w) {}
  LinearWeight(ConstMatRef<S> w, WeightLayout layout)
      : data_(w.data()), rows_(w.rows()), cols_(w.cols()), stride_(w.outerStride()), layout_(layout) {}

  /// Null for a plain weight.
  const PackedMatrix* packed() const { return packed_; }
  /// A plain weight's values and layout.
  ConstStridedMap<S> values() const { return ConstStridedMap<S>(data_, rows_, cols_, Eigen::OuterStride<>(stride_)); }
  WeightLayout layout() const { return layout_; }

 private:
  const PackedMatrix* packed_ = nullptr;
  const S* data_ = nullptr;
  Index rows_ = 0, cols_ = 0, stride_ = 0;
  WeightLayout layout_ = WeightLayout::out_in;
};

/// y = x · W (+ bias[N]): the one product of rows with a weight. x is [M, K] rows in
/// any form the weight's path reads (OperandRows: float rows, or bf16 rows for a
/// bf16_native weight); W is w^T for [N, K] weights and w for [K, N] ones; y is where
/// the result goes (Destination): written, then `epilogue` on each finished block of
/// y (a [rows, cols] MatRef) inside the task that computed it, possibly concurrently on
/// disjoint blocks; added to a gated residual; or written activated as the next
/// product's rows (ActivatedRows). What the weight's path fuses is fused (bf16 kernels
/// gate and activate inside their products), the rest runs in separate passes of the
/// same arithmetic. bias may be null. y must not alias x or w.
///
/// Work is split over the context's threads by rows; products of few rows are split by
/// output columns instead: plain weights always, packed ones where their layout allows
/// it (bf16). S is float unless named (linear<double>).
template <class S = float, class Epilogue = std::nullptr_t>
void linear(Context& ctx, const std::type_identity_t<OperandRows<S>>& x, const std::type_identity_t<LinearWeight<S>>& w,
            const std::type_identity_t<S>* bias, const std::type_identity_t<Destination<S>>& y,
            Epilogue&& epilogue = nullptr) {
  y.visit([&](const auto& out) {
    using Out = std::decay_t<decltype(out)>;
    if constexpr (!std::is_same_v<Out, MatRef<S>> && !std::is_same_v<std::decay_t<Epilogue>, std::nullptr_t>)
      throw InvalidArgument("linear: an epilogue runs on written rows, not on a gated residual or activated rows");
    if constexpr (std::is_same_v<S, float>)
      if (const PackedMatrix* packed = w.packed())
        return detail::packed_product(ctx, x, *packed, bias, out, std::forward<Epilogue>(epilogue));
    detail::plain_product<S>(ctx, x, w.values(), w.layout(), bias, out, std::forward<Epilogue>(epilogue));
  });
}

}  // namespace ldlm
