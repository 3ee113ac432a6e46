// Matrix products over all B*T rows at once. Every activation is a row-major
// [rows, features] matrix; a weight is either nn.Linear's [out, in] or GPT-2's
// Conv1D [in, out]. Work is split over the context's threads by rows (or, for
// few rows, by output features); the GEMM itself stays single-threaded.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <type_traits>

#include "ldlm/core/context.hpp"
#include "ldlm/core/tensor.hpp"

#if defined(LDLM_USE_BLAS) && !defined(EIGEN_USE_BLAS)
#error "LDLM_USE_BLAS needs EIGEN_USE_BLAS, whose <Eigen/Core> declares sgemm_/dgemm_ (the ldlm::ldlm target defines both)"
#endif

namespace ldlm {

enum class WeightLayout { out_in, in_out };

/// c[M, N] = alpha · a[M, K] · op(b) + beta · c, with op(b) = bᵀ for b [N, K]
/// (transpose_b) and b for b [K, N]. With beta = 0, c is only written, never read.
/// c must not alias a or b. Runs on the calling thread only.
template <class S>
void gemm(ConstMatRef<S> a, ConstMatRef<S> b, bool transpose_b, S alpha, S beta, MatRef<S> c) {
  const Index M = c.rows(), N = c.cols(), K = a.cols();
  const Index b_rows = transpose_b ? N : K, b_cols = transpose_b ? K : N;
  if (a.rows() != M || b.rows() != b_rows || b.cols() != b_cols)
    throw ShapeError("gemm: a " + shape_string(Shape{a.rows(), a.cols()}) + ", b " +
                     shape_string(Shape{b.rows(), b.cols()}) + (transpose_b ? " (transposed)" : "") + ", c " +
                     shape_string(Shape{M, N}) + " do not fit; b must be " + shape_string(Shape{b_rows, b_cols}));
  if (M == 0 || N == 0) return;
#if defined(LDLM_USE_BLAS)
  constexpr bool blas_scalar = std::is_same_v<S, float> || std::is_same_v<S, double>;
  const bool fits_int = std::max({M, N, K, a.outerStride(), b.outerStride(), c.outerStride()}) <= INT_MAX;
  if constexpr (blas_scalar) {
    if (fits_int && K > 0) {
      detail::keep_blas_single_threaded();
      // Row-major C = A·op(B) is column-major Cᵀ = op(B)ᵀ·Aᵀ, and each row-major
      // matrix already is its own transpose in column-major order. Calling the BLAS
      // directly spares Eigen's product wrapper its own zero fill of c (OpenBLAS
      // still clears c itself when beta = 0).
      const char trans_b = transpose_b ? 'T' : 'N', no_trans = 'N';
      const int m = int(N), n = int(M), k = int(K);
      const int lda = int(a.outerStride()), ldb = int(b.outerStride()), ldc = int(c.outerStride());
      if constexpr (std::is_same_v<S, float>)
        sgemm_(&trans_b, &no_trans, &m, &n, &k, &alpha, b.data(), &ldb, a.data(), &lda, &beta, c.data(), &ldc);
      else
        dgemm_(&trans_b, &no_trans, &m, &n, &k, &alpha, b.data(), &ldb, a.data(), &lda, &beta, c.data(), &ldc);
      return;
    }
  }
#endif
  if (beta == S(0))
    c.setZero();
  else if (beta != S(1))
    c *= beta;
  if (transpose_b)
    c.noalias() += (alpha * a) * b.transpose();
  else
    c.noalias() += (alpha * a) * b;
}

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

}  // namespace ldlm
