// The oneDNN adapter: engine and streams, primitives cached per thread, arguments
// bound without allocating, and the post-ops of ldlm's fused products. Everything
// here is oneDNN's vocabulary; which product runs where is decided in
// ops/gemm_backend.hpp.
//
// Threading: every product runs on the calling thread only; ldlm's pool splits the
// work (ops/linear.hpp, ops/attention.hpp), so a result never depends on which
// worker computed it. Debian's oneDNN is built on OpenMP, so each call runs with the
// calling thread's OpenMP thread count set to 1, and restores it afterwards
// (SerialScope).
#pragma once

#if defined(LDLM_HAVE_ONEDNN)
#include <dlfcn.h>

#include <cstddef>
#include <deque>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ldlm/core/error.hpp"
#include "ldlm/core/precision.hpp"
#include "ldlm/core/tensor.hpp"
#include "ldlm/ops/activation.hpp"

namespace ldlm {
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
/// its runtime-shape GEMM has none, and on bf16 operands it ran attention's QKᵀ far
/// below a fixed-shape primitive (figures in bench/results/README.md). Dense
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
}  // namespace ldlm
#endif  // LDLM_HAVE_ONEDNN
