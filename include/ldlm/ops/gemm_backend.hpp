// The choice of what multiplies: the backend, once per process; whether bf16
// operands meet bf16 instructions, once per process; and from those the path of each
// weight's products (ProductPath), once per weight, when it is packed.
//
// Backends (gemm_backend()):
//   onednn  oneDNN (Debian libdnnl-dev, ops/onednn.hpp). It dispatches on CPUID
//           features, never on the CPU model: AMX and AVX512_BF16 for bf16, AVX-512
//           or AVX2 for fp32. Weights are reordered once into the layout its kernels
//           want (ops/packed_matrix.hpp); bf16 weights without bf16 kernels stay in
//           bf16 and are widened block by block for the fp32 GEMM.
//           Attention's products multiply activations: in fp32 with its
//           runtime-shape GEMM, reading the heads in place; in bf16 with
//           fixed-shape primitives on dense per-head copies, which alone get its
//           blocked kernels (fixed_matmul), or, where those are AMX, with ldlm's
//           own AMX kernel (bf16_attention_amx, ops/attention_amx.hpp).
//   eigen    Eigen's own products: the fallback of a build without oneDNN.
// OpenBLAS is not a backend: it picks its kernels by a guess of the CPU model
// (bench/results/README.md has the comparison).
//
// Test and diagnostic switches (environment, read once): LDLM_GEMM_BACKEND=onednn|eigen
// forces a backend; oneDNN's own ONEDNN_MAX_CPU_ISA (e.g. AVX2, AVX512_CORE) caps the
// instruction set it dispatches to. gemm_paths() (ops/gemm_report.hpp) reports what runs.
#pragma once

#include <cstdlib>
#include <string>
#include <string_view>

#include "ldlm/core/amx.hpp"
#include "ldlm/core/error.hpp"
#include "ldlm/core/precision.hpp"
#include "ldlm/core/tensor.hpp"
#include "ldlm/ops/onednn.hpp"

namespace ldlm {

enum class GemmBackend { onednn, eigen };

inline constexpr std::string_view backend_name(GemmBackend b) { return b == GemmBackend::onednn ? "onednn" : "eigen"; }

namespace detail {
inline GemmBackend choose_gemm_backend() {
  const char* env = std::getenv("LDLM_GEMM_BACKEND");
  const std::string forced = env ? env : "";
  if (forced == "eigen") return GemmBackend::eigen;
#if defined(LDLM_HAVE_ONEDNN)
  if (forced.empty() || forced == "onednn") return GemmBackend::onednn;
#else
  if (forced.empty()) return GemmBackend::eigen;
  if (forced == "onednn")
    throw InvalidArgument("LDLM_GEMM_BACKEND=onednn, but this build of ldlm has no oneDNN (Debian: libdnnl-dev)");
#endif
  throw InvalidArgument("LDLM_GEMM_BACKEND: expected 'onednn' or 'eigen', got '" + forced + "'");
}
}  // namespace detail

/// The backend of every product in this process.
inline GemmBackend gemm_backend() {
  static const GemmBackend backend = detail::choose_gemm_backend();
  return backend;
}

#if defined(LDLM_HAVE_ONEDNN)
namespace detail::onednn {
/// The kernel oneDNN runs for a packed bf16 weight in this process, asked once: ""
/// without the oneDNN backend or without any bf16 primitive on this instruction set.
inline const std::string& packed_bf16_kernel() {
  static const std::string kernel = []() -> std::string {
    if (gemm_backend() != GemmBackend::onednn) return "";
    try {
      return packed_matmul(packed_weight_desc(64, 64, memory::data_type::bf16), 64, true).kernel;
    } catch (const dnnl::error&) {
      return "";
    }
  }();
  return kernel;
}

/// The kernel oneDNN runs for a packed int8 weight (s8 rows times s8 weights, s32
/// sums) in this process, asked once: "" without the oneDNN backend or without any
/// int8 primitive.
inline const std::string& packed_int8_kernel() {
  static const std::string kernel = []() -> std::string {
    if (gemm_backend() != GemmBackend::onednn) return "";
    try {
      return packed_matmul(packed_weight_desc(64, 64, memory::data_type::s8), 64, false).kernel;
    } catch (const dnnl::error&) {
      return "";
    }
  }();
  return kernel;
}
}  // namespace detail::onednn
#endif

/// Why int8 products cannot run in this process, or "" when they can. They run only
/// on oneDNN kernels with int8 dot-product instructions (AVX512_VNNI, AVX-VNNI,
/// AMX-INT8): without them oneDNN's int8 kernels sum pairs of u8·s8 products in
/// saturating 16-bit lanes, which clips large sums, and an emulated int8 path would
/// be slower than bf16, the precision such a CPU should use instead.
inline std::string int8_unavailable_reason() {
#if defined(LDLM_HAVE_ONEDNN)
  if (gemm_backend() != GemmBackend::onednn)
    return "int8 products need the oneDNN backend; this process multiplies with " +
           std::string(backend_name(gemm_backend()));
  const std::string& kernel = detail::onednn::packed_int8_kernel();
  if (kernel.find("vnni") != std::string::npos || kernel.find("amx") != std::string::npos) return "";
  return "int8 products need int8 dot-product instructions (AVX512_VNNI, AVX-VNNI or AMX-INT8); oneDNN's int8 kernel "
         "here is " +
         (kernel.empty() ? std::string("none") : "'" + kernel + "'") + ": use --precision bf16";
#else
  return "int8 products need oneDNN (Debian: libdnnl-dev); this build of ldlm has none";
#endif
}

/// Whether bf16 operands are multiplied by bf16 kernels (true) or rounded to bf16 and
/// multiplied by fp32 kernels (false); both give bf16 products with fp32 sums.
inline bool bf16_operands_native() {
#if defined(LDLM_HAVE_ONEDNN)
  return detail::onednn::bf16_instructions(detail::onednn::packed_bf16_kernel());
#else
  return false;
#endif
}

/// Whether bf16 attention runs on ldlm's own AMX kernel (ops/attention_amx.hpp). It
/// does where oneDNN's bf16 kernels are AMX ones, so that a cap on oneDNN's
/// instruction set (ONEDNN_MAX_CPU_ISA) moves attention off AMX too.
inline bool bf16_attention_amx() {
#if defined(LDLM_HAVE_ONEDNN) && defined(LDLM_HAVE_AMX)
  static const bool amx = [] {
    // (Its softmax row needs AVX512_BF16, DQ and BW, which every AMX CPU has.)
    const CpuFeatures& cpu = cpu_features();
    return amx_bf16_usable() && cpu.avx512_bf16 && cpu.avx512dq && cpu.avx512bw &&
           detail::onednn::packed_bf16_kernel().find("amx") != std::string::npos;
  }();
  return amx;
#else
  return false;
#endif
}

/// How a weight's products run, decided once when the weight is packed
/// (PackedMatrix::pack, product_path) and kept as a value of the packed weight, so
/// that no layer above tests a kernel.
enum class ProductPath {
  eigen,         // fp32 values multiplied by Eigen (the eigen backend, or a weight with no extent)
  fp32_packed,   // fp32, reordered for oneDNN's fp32 kernels
  bf16_native,   // bf16, reordered for bf16 kernels: reads bf16 rows, writes bf16 activations, adds gated residuals
  bf16_widened,  // bf16 held in bf16, widened block by block for fp32 kernels on bf16-rounded operands
  int8_native,   // s8 weights (a scale per output channel) reordered for oneDNN's int8 kernels; reads float
                 // rows, quantized to s8 per row; s32 sums, scaled back with the bias in ldlm's epilogue
};

inline constexpr std::string_view product_path_name(ProductPath p) {
  switch (p) {
    case ProductPath::eigen:
      return "eigen";
    case ProductPath::fp32_packed:
      return "fp32_packed";
    case ProductPath::bf16_native:
      return "bf16_native";
    case ProductPath::bf16_widened:
      return "bf16_widened";
    case ProductPath::int8_native:
      return "int8_native";
  }
  return "?";
}

/// The path of the products of an [n out, k in] weight in `precision`, in this process.
/// int8 without int8 instructions is refused (int8_unavailable_reason), never run in
/// another precision.
inline ProductPath product_path(Precision precision, Index n, Index k) {
  if (precision == Precision::int8) {
    if (const std::string why = int8_unavailable_reason(); !why.empty())
      throw InvalidArgument("precision int8: " + why);
    return n == 0 || k == 0 ? ProductPath::eigen : ProductPath::int8_native;
  }
  if (precision == Precision::bf16 && !bf16_operands_native()) return ProductPath::bf16_widened;
  // (No extent: oneDNN packs nothing, and Eigen's product of no terms writes zeros or the bias.)
  if (gemm_backend() != GemmBackend::onednn || n == 0 || k == 0) return ProductPath::eigen;
  return precision == Precision::bf16 ? ProductPath::bf16_native : ProductPath::fp32_packed;
}

/// The form of the rows a product reads: float32 rows (S rows for a double model), or
/// bf16 rows, which only a bf16_native product reads; the layer that writes a product's
/// operand writes it in this form, rounded once.
enum class RowForm { fp32, bf16 };

inline constexpr RowForm row_form(ProductPath p) {
  return p == ProductPath::bf16_native ? RowForm::bf16 : RowForm::fp32;
}

/// The form rows read by several products take: bf16 only when every one reads bf16.
inline constexpr RowForm common_form(RowForm a, RowForm b) {
  return a == RowForm::bf16 && b == RowForm::bf16 ? RowForm::bf16 : RowForm::fp32;
}

}  // namespace ldlm
