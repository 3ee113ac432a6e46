// Matrix products: the one place that decides which kernel multiplies.
//
// Backends, chosen once per process (gemm_backend()):
//   onednn  oneDNN (Debian libdnnl-dev). It dispatches on CPUID features, never on
//           the CPU model: AMX and AVX512_BF16 for bf16, AVX-512 or AVX2 for fp32.
//           Weights are reordered once into the layout its kernels want
//           (PackedMatrix); bf16 weights without bf16 kernels stay in bf16 and
//           are widened block by block for the fp32 GEMM (PackedMatrix::widened).
//           Attention's products multiply activations: in fp32 with its
//           runtime-shape GEMM, reading the heads in place; in bf16 with
//           fixed-shape primitives on dense per-head copies, which alone get its
//           blocked kernels (fixed_matmul), or, where those are AMX, with ldlm's
//           own AMX kernel (bf16_attention_amx, ops/attention_amx.hpp).
//   eigen    Eigen's own products: the fallback of a build without oneDNN.
// OpenBLAS is not a backend: it picks its kernels by a guess of the CPU model, and on
// the ldlm-base shapes it was slower than oneDNN even when told the right model
// (figures in bench/results/README.md).
//
// Threading: every product runs on the calling thread only; ldlm's pool splits the
// work (ops/linear.hpp, ops/attention.hpp), so a result never depends on which
// worker computed it. Debian's oneDNN is built on OpenMP, so each call runs with the
// calling thread's OpenMP thread count set to 1, and restores it afterwards.
//
// Test and diagnostic switches (environment, read once): LDLM_GEMM_BACKEND=onednn|eigen
// forces a backend; oneDNN's own ONEDNN_MAX_CPU_ISA (e.g. AVX2, AVX512_CORE) caps the
// instruction set it dispatches to. ldlm_gemm_paths() reports what runs.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ldlm/core/amx.hpp"
#include "ldlm/core/error.hpp"
#include "ldlm/core/precision.hpp"
#include "ldlm/core/tensor.hpp"
#include "ldlm/ops/activation.hpp"

#if defined(LDLM_HAVE_ONEDNN)
#include <dlfcn.h>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace ldlm {

enum class WeightLayout { out_in, in_out };  // nn.Linear [out, in]; GPT-2 Conv1D [in, out]

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

/// A row-major bf16 matrix view with its own row stride.
struct BF16Rows {
  const bf16* data = nullptr;
  Index rows = 0, cols = 0, stride = 0;
};

#if defined(LDLM_HAVE_ONEDNN)
namespace detail::onednn {
using dnnl::memory;
using Dims = memory::dims;

/// The first primitive oneDNN creates also builds its process-wide state (the
/// primitive cache and the lock guarding it) and publishes it with atomics inside
/// libdnnl. Creating that first primitive here, inside this function's guarded static,
/// orders it before any thread's use of the engine in a way every tool can see,
/// ThreadSanitizer included, which cannot look into an uninstrumented libdnnl.
inline dnnl::engine& engine() {
  static dnnl::engine e = [] {
    dnnl::engine cpu(dnnl::engine::kind::cpu, 0);
    const memory::desc one({1, 1}, memory::data_type::f32, memory::format_tag::ab);
    dnnl::matmul warm_up(dnnl::matmul::primitive_desc(dnnl::matmul::desc(one, one, one), cpu));
    return cpu;
  }();
  return e;
}

inline dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

/// Runs oneDNN on the calling thread alone for the scope's lifetime: its OpenMP
/// runtime sizes every parallel region by the caller's omp_get_max_threads().
/// The symbols are looked up at run time, so a oneDNN on another runtime (or none)
/// needs nothing here.
class SerialScope {
 public:
  SerialScope() {
    if (const Omp& omp = runtime(); omp.get && omp.set) {
      previous_ = omp.get();
      if (previous_ != 1) omp.set(1);
    }
  }
  ~SerialScope() {
    if (previous_ != 1) runtime().set(previous_);
  }
  SerialScope(const SerialScope&) = delete;
  SerialScope& operator=(const SerialScope&) = delete;

 private:
  struct Omp {
    int (*get)() = nullptr;
    void (*set)(int) = nullptr;
  };
  static const Omp& runtime() {
    static const Omp omp{reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "omp_get_max_threads")),
                         reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"))};
    return omp;
  }
  int previous_ = 1;
};

template <class T>
constexpr memory::data_type data_type() {
  return std::is_same_v<T, bf16> ? memory::data_type::bf16 : memory::data_type::f32;
}

/// A matrix product primitive, with this thread's scratchpad for it: primitives use
/// the user scratchpad mode, so one primitive may run on several threads at once.
struct Matmul {
  Matmul(const dnnl::matmul::primitive_desc& pd)
      : primitive(pd), kernel(pd.impl_info_str()), scratch_bytes(pd.scratchpad_desc().get_size()) {
    scratch = memory(pd.scratchpad_desc(), engine(), scratch_bytes.data());
  }
  dnnl::matmul primitive;
  std::string kernel;  // oneDNN's implementation name, e.g. "brg:avx512_core_bf16"
  std::vector<std::byte> scratch_bytes;
  memory scratch;
};

/// The arguments of one product. Memory objects are made once per description and
/// thread and rebound to new data with set_data_handle, and the primitive runs
/// through the C API with the arguments on the stack: a product allocates nothing
/// in ldlm's own code (oneDNN still keeps a little bookkeeping per call).
class ProductArgs {
 public:
  ProductArgs() {
    if (cache().size() >= 256) cache().clear();  // bound growth; no handle of this call exists yet
  }

  /// A row-major (or, with strides {1, ld}, column-major) matrix at `data`.
  void add(int arg, memory::data_type type, Index rows, Index cols, Index row_stride, Index col_stride,
           const void* data) {
    bind({arg, static_cast<int>(type), rows, cols, row_stride, col_stride, false}, data, [&] {
      return memory::desc({rows, cols}, type, Dims{row_stride, col_stride});
    });
  }
  /// A packed weight [K, N]: its layout follows from (type, K, N) (packed_weight_desc).
  /// A block of a packed weight's columns (PackedMatrix::column_block) has the
  /// block's own (type, K, columns) and is told apart from whole weights of that shape.
  void add_packed(int arg, const memory::desc& desc, const void* data, bool column_block = false) {
    const Dims dims = desc.dims();
    bind({arg, static_cast<int>(desc.data_type()), dims[0], dims[1], 0, column_block, /*packed=*/true}, data,
         [&] { return desc; });
  }
  void add_scalar(int arg, const float* value) {
    bind({arg, static_cast<int>(memory::data_type::f32), 1, 0, 0, 0, false}, value,
         [] { return memory::desc({1}, memory::data_type::f32, memory::format_tag::x); });
  }

  void execute(Matmul& mm) {
    args_[count_++] = {DNNL_ARG_SCRATCHPAD, mm.scratch.get()};
    SerialScope serial;
    const dnnl_status_t status = dnnl_primitive_execute(mm.primitive.get(), stream().get(), count_, args_);
    if (status != dnnl_success)
      throw Error("gemm: oneDNN " + mm.kernel + " failed with status " + std::to_string(static_cast<int>(status)));
  }

 private:
  struct Key {  // arg is part of it: two arguments of one call may share a description
    int arg;
    int type;
    Index rows, cols, row_stride, col_stride;
    bool packed;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const {
      std::size_t h = k.packed;
      for (Index v : {Index(k.arg), Index(k.type), k.rows, k.cols, k.row_stride, k.col_stride})
        h = h * 0x9E3779B97F4A7C15ull + std::hash<Index>()(v);
      return h;
    }
  };
  static std::unordered_map<Key, memory, KeyHash>& cache() {
    thread_local std::unordered_map<Key, memory, KeyHash> memories;
    return memories;
  }
  template <class Describe>
  void bind(const Key& key, const void* data, Describe&& describe) {
    auto it = cache().find(key);
    if (it == cache().end()) it = cache().emplace(key, memory(describe(), engine(), DNNL_MEMORY_NONE)).first;
    it->second.set_data_handle(const_cast<void*>(data));
    args_[count_++] = {key.arg, it->second.get()};
  }

  dnnl_exec_arg_t args_[8];
  int count_ = 0;
};

/// Primitives of one kind on this thread, found by key; made, under SerialScope, on
/// first use. Every primitive keeps a scratchpad of its own, so the cache is bounded:
/// many distinct row counts, causal tiles or sequence lengths would otherwise grow
/// it without end.
template <class Key>
using MatmulCache = std::deque<std::pair<Key, Matmul>>;

template <class Key, class Describe>
Matmul& cached_matmul(MatmulCache<Key>& cache, const Key& key, Describe&& describe) {
  for (auto& [k, matmul] : cache)
    if (k == key) return matmul;
  if (cache.size() >= 256) cache.pop_front();
  SerialScope serial;
  cache.emplace_back(key, Matmul(describe()));
  return cache.back().second;
}

/// The attributes every product shares: the user scratchpad (see Matmul) and its
/// post-ops: for beta != 0, C accumulated as beta · C; then the activation, if any.
/// With gate_columns > 0, C += gate ⊙ (A · B (+ bias)) instead: the product times a
/// [1, gate_columns] row (the post-op's first operand), then the old C added.
inline dnnl::primitive_attr product_attr(float beta, Activation activation = Activation::none, Index gate_columns = 0) {
  if (gate_columns > 0 && (beta != 0.0f || activation != Activation::none))
    throw InvalidArgument("gemm: a gated product neither accumulates with beta nor activates (post-ops order)");
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::post_ops ops;
  if (gate_columns > 0) {
    ops.append_binary(dnnl::algorithm::binary_mul,
                      memory::desc({1, gate_columns}, memory::data_type::f32, Dims{gate_columns, 1}));
    ops.append_sum(1.0f);
  }
  if (beta != 0.0f) ops.append_sum(beta);
  if (activation != Activation::none)
    ops.append_eltwise(
        1.0f,
        activation == Activation::gelu_tanh ? dnnl::algorithm::eltwise_gelu_tanh : dnnl::algorithm::eltwise_gelu_erf,
        0.0f, 0.0f);
  if (ops.len() > 0) attr.set_post_ops(ops);
  return attr;
}

/// C = alpha · A · op(B) + beta · C with every extent and stride given at run time
/// (oneDNN's gemm-based matmul): one primitive per (type, op(B), beta) and thread.
inline Matmul& runtime_matmul(memory::data_type type, bool transpose_b, float beta) {
  thread_local MatmulCache<std::tuple<memory::data_type, bool, float>> cache;
  return cached_matmul(cache, std::tuple(type, transpose_b, beta), [&] {
    const auto R = DNNL_RUNTIME_DIM_VAL;
    const memory::desc a({R, R}, type, Dims{R, 1});
    const memory::desc b({R, R}, type, transpose_b ? Dims{1, R} : Dims{R, 1});
    const memory::desc c({R, R}, memory::data_type::f32, Dims{R, 1});
    dnnl::primitive_attr attr = product_attr(beta);
    attr.set_output_scales(0, {DNNL_RUNTIME_F32_VAL});
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, engine());
  });
}

/// The same product with every extent, stride and scalar fixed: one primitive per
/// problem and thread. Only then does oneDNN run its blocked kernels (brgemm, AMX):
/// its runtime-shape GEMM has none, and on bf16 operands it ran attention's QKᵀ at a
/// tenth of a fixed-shape primitive's speed on AMX (bench/results/README.md). Dense
/// operands (row stride = columns, or a transposed B with column stride = rows) get
/// the blocked kernels; others fall back to oneDNN's GEMM inside the primitive.
inline Matmul& fixed_matmul(memory::data_type type, Index M, Index N, Index K, Index lda, Index ldb, bool transpose_b,
                            Index ldc, float alpha, float beta) {
  struct Problem {
    memory::data_type type;
    Index M, N, K, lda, ldb, ldc;
    bool transpose_b;
    float alpha, beta;
    bool operator==(const Problem&) const = default;
  };
  thread_local MatmulCache<Problem> cache;
  return cached_matmul(cache, Problem{type, M, N, K, lda, ldb, ldc, transpose_b, alpha, beta}, [&] {
    const memory::desc a({M, K}, type, Dims{lda, 1});
    const memory::desc b({K, N}, type, transpose_b ? Dims{1, ldb} : Dims{ldb, 1});
    const memory::desc c({M, N}, memory::data_type::f32, Dims{ldc, 1});
    dnnl::primitive_attr attr = product_attr(beta);
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, engine());
  });
}

/// Row-major C[M, N] = alpha · A[M, K] · op(B) + beta · C, strides in elements; on
/// bf16 operands through a fixed-shape primitive, on fp32 through the runtime-shape
/// one, which measured as fast as fixed shapes there (bench/results/README.md).
template <class T>
void gemm(const T* a, Index lda, const T* b, Index ldb, bool transpose_b, Index M, Index N, Index K, float alpha,
          float beta, float* c, Index ldc) {
  const memory::data_type type = data_type<T>();
  const bool fixed = std::is_same_v<T, bf16>;
  Matmul& mm = fixed ? fixed_matmul(type, M, N, K, lda, ldb, transpose_b, ldc, alpha, beta)
                     : runtime_matmul(type, transpose_b, beta);
  ProductArgs args;
  args.add(DNNL_ARG_SRC, type, M, K, lda, 1, a);
  if (transpose_b)
    args.add(DNNL_ARG_WEIGHTS, type, K, N, 1, ldb, b);
  else
    args.add(DNNL_ARG_WEIGHTS, type, K, N, ldb, 1, b);
  args.add(DNNL_ARG_DST, memory::data_type::f32, M, N, ldc, 1, c);
  if (!fixed) args.add_scalar(DNNL_ARG_ATTR_OUTPUT_SCALES, &alpha);
  args.execute(mm);
}

/// The layout oneDNN's kernels want for a [K, N] weight of `type`: asked once per
/// (N, K, type) for a tall product, then used for products of every row count.
inline memory::desc packed_weight_desc(Index N, Index K, memory::data_type type) {
  const memory::desc a({1024, K}, type, memory::format_tag::ab);
  const memory::desc w({K, N}, type, memory::format_tag::any);
  const memory::desc c({1024, N}, memory::data_type::f32, memory::format_tag::ab);
  SerialScope serial;
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, w, c), engine()).weights_desc();
}

/// y[M, N] = x[M, K] · W (+ bias) on a packed weight; x and y dense.
/// With an activation, the product writes activation(x · W + b) in bf16: the operand
/// of the next bf16 product, computed in fp32 and rounded once (oneDNN's eltwise
/// post-op), as ldlm computes it unfused. Gated, it adds gate ⊙ (x · W + b) to y
/// (product_attr).
inline Matmul& packed_matmul(const memory::desc& weights, Index M, bool bias, Activation activation = Activation::none,
                             bool gated = false) {
  // Rows and bias first: they tell most entries apart before the descriptors are compared.
  thread_local MatmulCache<std::tuple<Index, bool, Activation, bool, memory::desc>> cache;
  return cached_matmul(cache, std::tuple(M, bias, activation, gated, weights), [&] {
    const Dims dims = weights.dims();  // [K, N]
    const memory::desc a({M, dims[0]}, weights.data_type(), memory::format_tag::ab);
    const auto out_type = activation == Activation::none ? memory::data_type::f32 : memory::data_type::bf16;
    const memory::desc c({M, dims[1]}, out_type, memory::format_tag::ab);
    const memory::desc b({1, dims[1]}, memory::data_type::f32, memory::format_tag::ab);
    return dnnl::matmul::primitive_desc(bias ? dnnl::matmul::desc(a, weights, b, c) : dnnl::matmul::desc(a, weights, c),
                                        product_attr(0.0f, activation, gated ? dims[1] : 0), engine());
  });
}

/// True for a kernel that multiplies bf16 with bf16 instructions (AVX512_BF16, AMX).
/// oneDNN also runs bf16 on plain AVX-512 by emulating it, slower than its fp32
/// kernels there (bench/results/README.md), and not at all below AVX-512: on such
/// CPUs ldlm rounds the operands to bf16 and multiplies with fp32 kernels, which
/// gives the same values.
inline bool bf16_instructions(const std::string& kernel) {
  return kernel.find("bf16") != std::string::npos || kernel.find("amx") != std::string::npos;
}
}  // namespace detail::onednn
#endif  // LDLM_HAVE_ONEDNN

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
}  // namespace detail::onednn
#endif

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

/// c[M, N] = alpha · a · op(b) + beta · c on bf16 operands, fp32 sums and output:
/// the bf16 products of attention. Needs bf16_operands_native(); c must not overlap.
inline void gemm_bf16(BF16Rows a, BF16Rows b, bool transpose_b, float alpha, float beta, MatRef<float> c) {
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

/// A weight reordered once, at load, into the layout the chosen kernel wants, in the
/// precision its products run in. Immutable after packing, so one packed weight
/// serves any number of threads.
class PackedMatrix {
 public:
  /// w is [N, K] for out_in (nn.Linear) and [K, N] for in_out (GPT-2 Conv1D).
  static PackedMatrix pack(ConstMatRef<float> w, WeightLayout layout, Precision precision) {
    PackedMatrix p;
    p.precision_ = precision;
    p.weight_shape_ = Shape{w.rows(), w.cols()};
    p.n_ = layout == WeightLayout::out_in ? w.rows() : w.cols();
    p.k_ = layout == WeightLayout::out_in ? w.cols() : w.rows();
    p.bf16_operands_ = precision == Precision::bf16 && bf16_operands_native();
    if (precision == Precision::bf16 && !p.bf16_operands_) {
      p.pack_widened(w, layout);
      return p;
    }
#if defined(LDLM_HAVE_ONEDNN)
    if (gemm_backend() == GemmBackend::onednn && p.n_ > 0 && p.k_ > 0) {
      namespace dd = detail::onednn;
      const auto type = p.bf16_operands_ ? dd::memory::data_type::bf16 : dd::memory::data_type::f32;
      p.desc_ = dd::packed_weight_desc(p.n_, p.k_, type);
      p.storage_ = Storage(p.desc_.get_size());
      // The reorder reads w in place when it can: a copy of lm_head alone is 154 MB
      // at ldlm-base width, and loading would briefly hold three of it.
      Matrix<float> copy;
      const float* source = w.data();
      if (w.outerStride() != w.cols()) {
        copy = w;
        source = copy.data();
      }
      // As a [K, N] matrix, nn.Linear's row-major [N, K] is column-major ("ba").
      const auto plain_tag = layout == WeightLayout::out_in ? dd::memory::format_tag::ba : dd::memory::format_tag::ab;
      // const_cast: a reorder only reads its source.
      dd::memory plain({{p.k_, p.n_}, dd::memory::data_type::f32, plain_tag}, dd::engine(), const_cast<float*>(source));
      dd::memory packed(p.desc_, dd::engine(), p.storage_.data());
      dd::SerialScope serial;
      dnnl::reorder(plain, packed).execute(dd::stream(), plain, packed);
      dd::stream().wait();
      p.kernel_ = dd::packed_matmul(p.desc_, 1024, true).kernel;
      if (p.bf16_operands_ &&
          p.desc_ == dd::memory::desc({p.k_, p.n_}, dd::memory::data_type::bf16, dd::memory::format_tag::BA16a64b2a))
        p.column_block_ = 64;
      return p;
    }
#endif
    Matrix<float> values = w;
    if (layout == WeightLayout::out_in) values.transposeInPlace();  // Eigen multiplies by [K, N]
    p.bf16_operands_ = false;  // (K = 0 on oneDNN: the plain path neither writes bf16 nor gates)
    p.plain_ = std::make_shared<const Matrix<float>>(std::move(values));
    p.kernel_ = "eigen";
    return p;
  }

  Index out_features() const { return n_; }
  Index in_features() const { return k_; }
  /// The packed weight's own shape, in PyTorch order ([out, in] or Conv1D's [in, out]).
  const Shape& weight_shape() const { return weight_shape_; }
  Precision precision() const { return precision_; }
  /// The implementation that multiplies, e.g. "brg:avx512_core_amx" or "eigen".
  const std::string& kernel() const { return kernel_; }
  /// Bytes of the packed weight.
  std::size_t bytes() const {
    return plain_ ? static_cast<std::size_t>(plain_->size()) * sizeof(float) : storage_.size();
  }

  /// Scratch bytes multiply() needs for M rows.
  std::size_t scratch_bytes(Index M) const {
    if (widened()) {  // a chunk of rounded rows, and one widened block
      const auto rounded = static_cast<std::size_t>(std::min(M, kWidenedRows) * k_);
      const auto block = static_cast<std::size_t>(k_ * std::min(widened_block_, n_));
      return (rounded + block) * sizeof(float) + 128;
    }
    return static_cast<std::size_t>(M) * static_cast<std::size_t>(k_ + n_) * sizeof(float) + 128;
  }

  /// Columns per block of a bf16 weight widened block by block (widened()).
  static constexpr Index kWidenedBlock = 256;
  /// Rows of x a widened product rounds to bf16 at a time. Rounding all of them
  /// would keep a copy of the activations in each worker's scratch (fc2's
  /// [1024 × 3072] at T = 1024: 12.6 MB), resident for the rest of the run.
  static constexpr Index kWidenedRows = 128;
  /// Whether this bf16 weight is held in bf16 and multiplied by fp32 kernels: each
  /// block of kWidenedBlock columns is widened to fp32 in scratch right before its
  /// product. That is how a CPU without bf16 instructions (or the Eigen backend)
  /// keeps bf16 weights resident, half the memory: widening costs K·N element
  /// copies per product and thread against M·K·N FMAs, and each block is a call of
  /// the runtime-shape GEMM (0.95-1.03x fp32's speed on an AVX2 CPU:
  /// bench/results/README.md).
  bool widened() const { return widened_block_ > 0; }

  /// y[M, N] = x[M, K] · W (+ bias[N]); x and y row-major with row strides ldx, ldy;
  /// y must not overlap x. `scratch` holds scratch_bytes(M), 64-byte aligned.
  /// Runs on the calling thread only.
  void multiply(const float* x, Index ldx, Index M, const float* bias, float* y, Index ldy, std::byte* scratch) const {
    if (M == 0 || n_ == 0) return;
    if (widened()) return multiply_widened(x, ldx, M, bias, 0, n_, y, ldy, scratch);
    multiply_into(operand(x, ldx, M, scratch), M, bias, y, ldy, scratch);
  }

  /// Where a product may be cut into blocks of output columns (multiply_columns), or
  /// 0: each block of this many columns of the packed weight is one contiguous
  /// [K, block] weight of the same layout (oneDNN's BA16a64b2a for bf16 kernels, or
  /// a widened weight's blocks).
  Index column_block() const { return column_block_; }

  /// y[M, n0 : n0 + cols] = x[M, K] · W[:, n0 : n0 + cols] (+ bias[n0 : n0 + cols]),
  /// y's rows ldy apart: one block of columns of the product, so that threads can
  /// share a product of few rows. n0 is a multiple of column_block(), and so is cols
  /// unless the block ends at N. Same requirements on x, y and scratch as multiply.
  void multiply_columns([[maybe_unused]] const float* x, [[maybe_unused]] Index ldx, Index M,
                        [[maybe_unused]] const float* bias, Index n0, Index cols, [[maybe_unused]] float* y,
                        [[maybe_unused]] Index ldy, [[maybe_unused]] std::byte* scratch) const {
    if (column_block_ == 0)
      throw InvalidArgument("PackedMatrix::multiply_columns: this weight has no column blocks (" + kernel_ + ")");
    if (n0 < 0 || n0 % column_block_ != 0 || cols < 0 || n0 + cols > n_ ||
        (cols % column_block_ != 0 && n0 + cols != n_))
      throw InvalidArgument("PackedMatrix::multiply_columns: columns [" + std::to_string(n0) + ", " +
                            std::to_string(n0 + cols) + ") of " + std::to_string(n_) + " are not whole blocks of " +
                            std::to_string(column_block_));
    if (M == 0 || cols == 0) return;
    if (widened()) return multiply_widened(x, ldx, M, bias, n0, n0 + cols, y, ldy, scratch);
#if defined(LDLM_HAVE_ONEDNN)
    namespace dd = detail::onednn;
    const dd::memory::desc block({k_, cols}, dd::memory::data_type::bf16, dd::memory::format_tag::BA16a64b2a);
    const Index padded_k = desc_.data.padded_dims[0];
    dd::Matmul& mm = dd::packed_matmul(block, M, bias != nullptr);
    // oneDNN's blocked kernels want dense rows (strided ones got its reference
    // implementation, 100x slower): a single row is, others go through scratch.
    float* const out = M == 1 ? y + n0 : reinterpret_cast<float*>(scratch) + M * k_;
    dd::ProductArgs args;
    args.add(DNNL_ARG_SRC, dd::memory::data_type::bf16, M, k_, k_, 1, operand(x, ldx, M, scratch));
    args.add_packed(DNNL_ARG_WEIGHTS, block, storage_.data() + n0 * padded_k * sizeof(bf16), /*column_block=*/true);
    args.add(DNNL_ARG_DST, dd::memory::data_type::f32, M, cols, cols, 1, out);
    if (bias) args.add(DNNL_ARG_BIAS, dd::memory::data_type::f32, 1, cols, cols, 1, bias + n0);
    args.execute(mm);
    if (out != y + n0)
      for (Index r = 0; r < M; ++r) std::copy_n(out + r * cols, cols, y + r * ldy + n0);
#endif
  }

  /// Whether the product takes bf16 operands and can write them (the overloads below).
  bool bf16_operands() const { return bf16_operands_; }

  /// y[M, N] = x[M, K] · W (+ bias[N]) on x already in bf16 (row stride ldx), as
  /// `multiply` would round it; needs bf16_operands().
  void multiply(const bf16* x, Index ldx, Index M, const float* bias, float* y, Index ldy, std::byte* scratch) const {
    if (M == 0 || n_ == 0) return;
    require_bf16_operands("a bf16 input");
    multiply_into(dense_bf16(x, ldx, M, scratch), M, bias, y, ldy, scratch);
  }

  /// y[M, N] = activation(x[M, K] · W (+ bias[N])) in bf16, dense: computed in fp32
  /// and rounded once, the next product's operand. Needs bf16_operands(). x is
  /// float32 rows, or bf16 rows (the overload below).
  void multiply_activated(const float* x, Index ldx, Index M, const float* bias, Activation activation, bf16* y,
                          std::byte* scratch) const {
    if (M > 0 && n_ > 0 && require_activation(activation))
      multiply_dense(operand(x, ldx, M, scratch), M, bias, y, activation);
  }
  void multiply_activated(const bf16* x, Index ldx, Index M, const float* bias, Activation activation, bf16* y,
                          std::byte* scratch) const {
    if (M > 0 && n_ > 0 && require_activation(activation))
      multiply_dense(dense_bf16(x, ldx, M, scratch), M, bias, y, activation);
  }

  /// residual[M, N] += gate[N] ⊙ (x[M, K] · W (+ bias[N])) in one pass: the product
  /// scales its fp32 result by the gate and adds it where it writes (a gated residual
  /// without the product's own output). residual is dense and must not overlap x.
  /// Needs bf16_operands().
  void multiply_gated_add(const float* x, Index ldx, Index M, const float* bias, const float* gate, float* residual,
                          std::byte* scratch) const {
    if (M == 0 || n_ == 0) return;
    require_bf16_operands("a gated residual");
    multiply_dense(operand(x, ldx, M, scratch), M, bias, residual, Activation::none, gate);
  }
  /// The same on x already in bf16 (row stride ldx).
  void multiply_gated_add(const bf16* x, Index ldx, Index M, const float* bias, const float* gate, float* residual,
                          std::byte* scratch) const {
    if (M == 0 || n_ == 0) return;
    require_bf16_operands("a gated residual");
    multiply_dense(dense_bf16(x, ldx, M, scratch), M, bias, residual, Activation::none, gate);
  }

 private:
  struct AlignedFree {
    void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t(64)); }
  };
  /// 64-byte aligned bytes, shared so that copies of a module share one packed weight.
  class Storage {
   public:
    Storage() = default;
    explicit Storage(std::size_t n)
        : data_(static_cast<std::byte*>(::operator new[](n, std::align_val_t(64))), AlignedFree{}), size_(n) {}
    std::byte* data() const { return data_.get(); }
    std::size_t size() const { return size_; }

   private:
    std::shared_ptr<std::byte> data_;
    std::size_t size_ = 0;
  };

  /// Holds w in bf16, as consecutive dense [K, cols] blocks of kWidenedBlock columns
  /// (the last one narrower), ready to be widened one block at a time.
  void pack_widened(ConstMatRef<float> w, WeightLayout layout) {
    widened_block_ = column_block_ = kWidenedBlock;
    storage_ = Storage(static_cast<std::size_t>(n_ * k_) * sizeof(bf16));
    bf16* const out = reinterpret_cast<bf16*>(storage_.data());
    for (Index n0 = 0; n0 < n_; n0 += kWidenedBlock) {
      const Index cols = std::min(kWidenedBlock, n_ - n0);
      bf16* const block = out + n0 * k_;
      if (layout == WeightLayout::in_out) {
        for (Index k = 0; k < k_; ++k) to_bf16(w.data() + k * w.outerStride() + n0, cols, block + k * cols);
      } else {
        for (Index c = 0; c < cols; ++c)
          for (Index k = 0; k < k_; ++k) block[k * cols + c] = float_to_bf16(w(n0 + c, k));
      }
    }
    kernel_ = "eigen";
#if defined(LDLM_HAVE_ONEDNN)
    if (gemm_backend() == GemmBackend::onednn)
      kernel_ = detail::onednn::runtime_matmul(detail::onednn::memory::data_type::f32, false, 0.0f).kernel;
#endif
    kernel_ += " on bf16 weights widened per " + std::to_string(kWidenedBlock) + " columns";
  }

  /// y[M, n0 : n1] (row stride ldy) = x[M, K] · W[:, n0 : n1] (+ bias), n0 and n1 on
  /// block boundaries (or n1 = N): each block widened into scratch, then multiplied by
  /// the fp32 kernels with x's rows rounded to bf16 (operand) kWidenedRows at a time,
  /// into scratch before it. (Rows are rounded again for every block: M·K·N/256
  /// conversions against M·K·N FMAs.)
  void multiply_widened(const float* x, Index ldx, Index M, const float* bias, Index n0, Index n1, float* y, Index ldy,
                        std::byte* scratch) const {
    const Index chunk = std::min(M, kWidenedRows);
    float* const block = reinterpret_cast<float*>(scratch) + (chunk * k_ + 15) / 16 * 16;  // on a cache line
    const bf16* const weights = reinterpret_cast<const bf16*>(storage_.data());
    const float* rounded = nullptr;
    for (Index c0 = n0; c0 < n1; c0 += widened_block_) {
      const Index cols = std::min(widened_block_, n_ - c0);
      bf16_to_float(weights + c0 * k_, k_ * cols, block);
      for (Index r0 = 0; r0 < M; r0 += chunk) {
        const Index rows = std::min(chunk, M - r0);
        if (M > chunk || c0 == n0)  // (all rows in one chunk: rounded once, for the first block)
          rounded = static_cast<const float*>(operand(x + r0 * ldx, ldx, rows, scratch));
        StridedMap<float> out(y + r0 * ldy + c0, rows, cols, Eigen::OuterStride<>(ldy));
        if (bias) out.rowwise() = ConstRowVectorMap<float>(bias + c0, cols);
        gemm<float>(ConstMatrixMap<float>(rounded, rows, k_), ConstMatrixMap<float>(block, k_, cols), false, 1.0f,
                    bias ? 1.0f : 0.0f, out);
      }
    }
  }

  /// The preconditions of multiply_activated; true, or throws.
  bool require_activation(Activation activation) const {
    require_bf16_operands("a bf16 output");
    if (activation == Activation::none)
      throw InvalidArgument("PackedMatrix::multiply_activated: needs an activation, got none");
    return true;
  }

  void require_bf16_operands(const char* what) const {
    if (!bf16_operands_)
      throw InvalidArgument(std::string("PackedMatrix: ") + what +
                            " needs a weight packed for bf16 kernels; this one is " +
                            std::string(precision_name(precision_)) + " on " + kernel_);
  }

  /// x as the kernel takes it: bf16 converted or bf16-rounded rows, or dense rows
  /// (in scratch), or x itself.
  const void* operand(const float* x, Index ldx, Index M, std::byte* scratch) const {
    float* const x_copy = reinterpret_cast<float*>(scratch);
    if (bf16_operands_) {
      for (Index r = 0; r < M; ++r) to_bf16(x + r * ldx, k_, reinterpret_cast<bf16*>(x_copy) + r * k_);
      return x_copy;
    }
    const bool round_operands = precision_ == Precision::bf16;
    if (!round_operands && ldx == k_) return x;
    for (Index r = 0; r < M; ++r) {
      if (round_operands)
        round_to_bf16(x + r * ldx, k_, x_copy + r * k_);
      else
        std::copy_n(x + r * ldx, k_, x_copy + r * k_);
    }
    return x_copy;
  }

  /// x's rows (stride ldx) as one dense block: x itself, or a copy in scratch.
  const bf16* dense_bf16(const bf16* x, Index ldx, Index M, std::byte* scratch) const {
    if (ldx == k_) return x;
    bf16* const x_copy = reinterpret_cast<bf16*>(scratch);
    for (Index r = 0; r < M; ++r) std::copy_n(x + r * ldx, k_, x_copy + r * k_);
    return x_copy;
  }

  /// y[M, N] (row stride ldy) from the dense operand a: through scratch's second part
  /// (after M · K floats, where `operand` puts a copy of x) when y is not dense.
  void multiply_into(const void* a, Index M, const float* bias, float* y, Index ldy, std::byte* scratch) const {
    float* const out = ldy == n_ ? y : reinterpret_cast<float*>(scratch) + M * k_;
    multiply_dense(a, M, bias, out, Activation::none);
    if (out != y)
      for (Index r = 0; r < M; ++r) std::copy_n(out + r * n_, n_, y + r * ldy);
  }

  /// y: float, or bf16 when there is an activation (only on bf16 kernels). With a
  /// gate (only on bf16 kernels), y += gate ⊙ product.
  void multiply_dense(const void* a, Index M, const float* bias, void* y, [[maybe_unused]] Activation activation,
                      [[maybe_unused]] const float* gate = nullptr) const {
#if defined(LDLM_HAVE_ONEDNN)
    if (!plain_) {
      namespace dd = detail::onednn;
      dd::Matmul& mm = dd::packed_matmul(desc_, M, bias != nullptr, activation, gate != nullptr);
      dd::ProductArgs args;
      args.add(DNNL_ARG_SRC, desc_.data_type(), M, k_, k_, 1, a);
      args.add_packed(DNNL_ARG_WEIGHTS, desc_, storage_.data());
      args.add(DNNL_ARG_DST, activation == Activation::none ? dd::memory::data_type::f32 : dd::memory::data_type::bf16,
               M, n_, n_, 1, y);
      if (bias) args.add(DNNL_ARG_BIAS, dd::memory::data_type::f32, 1, n_, n_, 1, bias);
      if (gate)
        args.add(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, dd::memory::data_type::f32, 1, n_, n_, 1, gate);
      args.execute(mm);
      return;
    }
#endif
    MatrixMap<float> out(static_cast<float*>(y), M, n_);  // (activations need bf16 kernels: not here)
    if (bias)
      out.rowwise() = ConstRowVectorMap<float>(bias, n_);
    else
      out.setZero();
    out.noalias() += ConstMatrixMap<float>(static_cast<const float*>(a), M, k_) * *plain_;
  }

  Precision precision_ = Precision::fp32;
  Shape weight_shape_;
  Index n_ = 0, k_ = 0;
  bool bf16_operands_ = false;
  Index column_block_ = 0;
  Index widened_block_ = 0;
  std::string kernel_;
  std::shared_ptr<const Matrix<float>> plain_;  // [K, N]: the eigen backend
  Storage storage_;                             // oneDNN's layout, or widened()'s blocks
#if defined(LDLM_HAVE_ONEDNN)
  detail::onednn::memory::desc desc_;
#endif
};

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
};

inline GemmPaths gemm_paths() {
  GemmPaths p;
  p.backend = std::string(backend_name(gemm_backend()));
  const Matrix<float> w = Matrix<float>::Zero(64, 64);
  p.fp32_linear = PackedMatrix::pack(w, WeightLayout::out_in, Precision::fp32).kernel();
  p.bf16_linear = PackedMatrix::pack(w, WeightLayout::out_in, Precision::bf16).kernel();
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
