// What multiplies in this process, in words: the report of `ldlm info` and of the
// benchmarks' context.
#pragma once

#include <string>

#include "ldlm/core/eigen.hpp"
#include "ldlm/core/precision.hpp"
#include "ldlm/ops/gemm.hpp"
#include "ldlm/ops/gemm_backend.hpp"
#include "ldlm/ops/packed_matrix.hpp"

namespace ldlm {

/// The library behind the backend, e.g. "onednn (oneDNN 2.6.3, OpenMP runtime run serially per call)".
inline std::string gemm_library() {
#if defined(LDLM_HAVE_ONEDNN)
  if (gemm_backend() == GemmBackend::onednn) {
    const dnnl_version_t* v = dnnl_version();
    const char* runtime = v->cpu_runtime == DNNL_RUNTIME_OMP   ? "OpenMP"
                          : v->cpu_runtime == DNNL_RUNTIME_SEQ ? "sequential"
                                                               : "other";
    return "onednn (oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
           std::to_string(v->patch) + ", " + runtime + " runtime, one thread per call under ldlm's pool)";
  }
#endif
  return "eigen (Eigen " + std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) + "." +
         std::to_string(EIGEN_MINOR_VERSION) + ")";
}

/// What multiplies in this process, for `ldlm info` and the benchmarks.
struct GemmPaths {
  std::string backend;      // "onednn" or "eigen"
  std::string fp32_linear;  // kernel of packed fp32 weights
  std::string fp32_attention;
  std::string bf16_linear;  // kernel of packed bf16 weights ("... widened ..." without bf16 kernels)
  std::string bf16_attention;
  /// kernel of int8 weights (docs/model.md §int8 names them; the rest of an int8 model
  /// runs as bf16), or "unavailable: " and why int8 is refused here.
  std::string int8_linear;
};

inline GemmPaths gemm_paths() {
  GemmPaths p;
  p.backend = std::string(backend_name(gemm_backend()));
  const Matrix<float> w = Matrix<float>::Zero(64, 64);
  p.fp32_linear = PackedMatrix::pack(w, WeightLayout::out_in, Precision::fp32).kernel();
  p.bf16_linear = PackedMatrix::pack(w, WeightLayout::out_in, Precision::bf16).kernel();
  const std::string int8_refusal = int8_unavailable_reason();
  p.int8_linear = int8_refusal.empty() ? PackedMatrix::pack(w, WeightLayout::out_in, Precision::int8).kernel() +
                                             " (s8 rows scaled per row, s8 weights per output channel, s32 sums)"
                                       : "unavailable: " + int8_refusal;
  p.fp32_attention = p.bf16_attention = "eigen";
#if defined(LDLM_HAVE_ONEDNN)
  if (gemm_backend() == GemmBackend::onednn) {
    namespace dd = detail::onednn;
    p.fp32_attention = dd::runtime_matmul(dd::memory::data_type::f32, true, 0.0f).kernel;
    // Without AMX, bf16 attention's products are fixed-shape: report the QKᵀ of one
    // tile of ldlm-base's denoiser (256 queries, 1024 keys, head_dim 64, dense rows).
    p.bf16_attention =
        bf16_attention_amx()
            ? "ldlm amx_bf16 (QKᵀ, softmax and P·V per 32 queries; head_dim a multiple of 32 up to 256)"
        : bf16_operands_native()
            ? dd::fixed_matmul(dd::memory::data_type::bf16, 256, 1024, 64, 64, 64, true, 1024, 0.125f, 0.0f).kernel
            : p.fp32_attention;
  }
#endif
  if (!bf16_operands_native()) {
    p.bf16_linear += " (bf16-rounded operands)";
    p.bf16_attention += " (bf16-rounded operands)";
  }
  return p;
}

}  // namespace ldlm
