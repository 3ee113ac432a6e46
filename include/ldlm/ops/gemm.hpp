// Plain matrix products on activations: gemm (fp32 or double) and gemm_bf16 (bf16
// operands, fp32 sums), on the backend of ops/gemm_backend.hpp. Weights multiply
// through PackedMatrix (ops/packed_matrix.hpp) instead.
#pragma once

#include <string>
#include <type_traits>

#include "ldlm/core/error.hpp"
#include "ldlm/core/precision.hpp"
#include "ldlm/core/tensor.hpp"
#include "ldlm/ops/gemm_backend.hpp"

namespace ldlm {

/// A row-major bf16 matrix view with its own row stride.
struct BF16Rows {
  const bf16* data = nullptr;
  Index rows = 0, cols = 0, stride = 0;
};

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
#if defined(LDLM_HAVE_ONEDNN)
  if constexpr (std::is_same_v<S, float>) {
    if (gemm_backend() == GemmBackend::onednn && K > 0) {
      detail::onednn::gemm<float>(a.data(), a.outerStride(), b.data(), b.outerStride(), transpose_b, M, N, K, alpha,
                                  beta, c.data(), c.outerStride());
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

/// c[M, N] = alpha · a · op(b) + beta · c on bf16 operands, fp32 sums and output:
/// the bf16 products of attention. Needs bf16_operands_native(); c must not overlap.
inline void gemm_bf16(BF16Rows a, BF16Rows b, bool transpose_b, [[maybe_unused]] float alpha,
                      [[maybe_unused]] float beta, MatRef<float> c) {
  const Index M = c.rows(), N = c.cols(), K = a.cols;
  if (a.rows != M || (transpose_b ? b.rows != N || b.cols != K : b.rows != K || b.cols != N))
    throw ShapeError("gemm_bf16: a " + shape_string(Shape{a.rows, a.cols}) + ", b " +
                     shape_string(Shape{b.rows, b.cols}) + (transpose_b ? " (transposed)" : "") + ", c " +
                     shape_string(Shape{M, N}) + " do not fit");
  if (M == 0 || N == 0) return;
#if defined(LDLM_HAVE_ONEDNN)
  if (bf16_operands_native() && K > 0) {
    detail::onednn::gemm<bf16>(a.data, a.stride, b.data, b.stride, transpose_b, M, N, K, alpha, beta, c.data(),
                               c.outerStride());
    return;
  }
#endif
  throw Error("gemm_bf16: no bf16 kernel in this process (backend " + std::string(backend_name(gemm_backend())) +
              "); round to bf16 and use gemm<float> instead");
}

}  // namespace ldlm
