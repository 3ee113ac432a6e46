// Packed weights: a weight reordered once, at load, for the kernel that multiplies
// it, and its products.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ldlm/core/error.hpp"
#include "ldlm/core/memory.hpp"
#include "ldlm/core/precision.hpp"
#include "ldlm/core/tensor.hpp"
#include "ldlm/ops/activation.hpp"
#include "ldlm/ops/gemm.hpp"
#include "ldlm/ops/gemm_backend.hpp"
#include "ldlm/ops/onednn.hpp"

namespace ldlm {

enum class WeightLayout { out_in, in_out };  // nn.Linear [out, in]; GPT-2 Conv1D [in, out]

/// Where a packed weight's product r = x · W[:, columns] (+ bias) goes: written as
/// float rows; written as activation(r) in bf16 rows, computed in fp32 and rounded
/// once, the next product's operand; or added to float rows as gate ⊙ r (a gated
/// residual, gate one [1, N] row). The last two happen inside bf16 kernels' products
/// (ProductPath::bf16_native) and want dense rows. A product may cover a block of the
/// output columns (PackedMatrix::column_block()), so that threads can share a
/// product of few rows; y's rows are then the whole rows, of which it writes the block.
struct ProductOutput {
  void* data = nullptr;
  Index stride = 0;  // elements between rows
  Activation activation = Activation::none;
  const float* gate = nullptr;
  Index first_column = 0, columns = -1;  // columns < 0: all of them

  static ProductOutput rows(float* y, Index ldy) { return {y, ldy}; }
  static ProductOutput activated(bf16* y, Index ldy, Activation activation) {
    if (activation == Activation::none)
      throw InvalidArgument("ProductOutput::activated: bf16 rows are written with an activation, got none");
    return {y, ldy, activation};
  }
  static ProductOutput gated_add(float* residual, Index ld, const float* gate) { return {residual, ld, {}, gate}; }
  /// This output restricted to columns [n0, n0 + cols).
  ProductOutput block(Index n0, Index cols) const {
    ProductOutput o = *this;
    o.first_column = n0, o.columns = cols;
    return o;
  }
};

/// A weight quantized to s8 with one scale per output channel: values in the weight's
/// own layout ([N, K] for out_in, [K, N] for in_out), weight ≈ value · scales[channel].
/// What Precision::int8 packs, and what a quantized checkpoint stores
/// (docs/checkpoints.md §Quantized checkpoints).
struct S8Weight {
  std::vector<std::int8_t> values;
  std::vector<float> scales;  // [N]
};

/// Quantizes each output channel of w (its K values) with quantize_s8: the one
/// quantization of weights, so that a checkpoint quantized once holds exactly what
/// quantizing at load packs. Writes w's s8 values in w's own layout to `values` and
/// one scale per channel to `scales`.
inline void quantize_channels_into(ConstMatRef<float> w, WeightLayout layout, std::int8_t* values, float* scales) {
  const Index n = layout == WeightLayout::out_in ? w.rows() : w.cols();
  const Index k = layout == WeightLayout::out_in ? w.cols() : w.rows();
  std::vector<float> channel(static_cast<std::size_t>(k));
  std::vector<std::int8_t> quantized(static_cast<std::size_t>(k));
  for (Index c = 0; c < n; ++c) {
    for (Index i = 0; i < k; ++i) channel[i] = layout == WeightLayout::out_in ? w(c, i) : w(i, c);
    scales[c] = quantize_s8(channel.data(), k, quantized.data());
    for (Index i = 0; i < k; ++i) values[layout == WeightLayout::out_in ? c * k + i : i * n + c] = quantized[i];
  }
}

/// The same, into values and scales of their own.
inline S8Weight quantize_channels(ConstMatRef<float> w, WeightLayout layout) {
  S8Weight q;
  q.values.resize(static_cast<std::size_t>(w.rows() * w.cols()));
  q.scales.resize(static_cast<std::size_t>(layout == WeightLayout::out_in ? w.rows() : w.cols()));
  quantize_channels_into(w, layout, q.values.data(), q.scales.data());
  return q;
}

/// A weight reordered once, at load, into the layout its path's kernel wants, in the
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
    p.path_ = product_path(precision, p.n_, p.k_);
    switch (p.path_) {
      case ProductPath::bf16_widened:
        p.pack_widened(w, layout);
        break;
      case ProductPath::fp32_packed:
      case ProductPath::bf16_native:
        p.pack_onednn(w, layout);
        break;
      case ProductPath::int8_native: {
        S8Weight quantized = quantize_channels(w, layout);
        p.weight_scales_ = std::move(quantized.scales);
        p.pack_s8(quantized.values.data(), layout);
        break;
      }
      case ProductPath::eigen: {
        Matrix<float> values = w;
        if (layout == WeightLayout::out_in) values.transposeInPlace();  // Eigen multiplies by [K, N]
        p.plain_ = std::make_shared<const Matrix<float>>(std::move(values));
        p.kernel_ = "eigen";
        break;
      }
    }
    return p;
  }

  /// An int8 weight from values already quantized (quantize_channels' form; a quantized
  /// checkpoint's tensors): weight_shape in PyTorch order, values in that shape, one
  /// scale per output channel. Packs what pack(w, layout, Precision::int8) packs for
  /// the w they were quantized from.
  static PackedMatrix pack_quantized(const std::int8_t* values, std::vector<float> scales, const Shape& weight_shape,
                                     WeightLayout layout) {
    if (weight_shape.size() != 2)
      throw ShapeError("PackedMatrix::pack_quantized: a weight is a matrix, got shape " + shape_string(weight_shape));
    PackedMatrix p;
    p.precision_ = Precision::int8;
    p.weight_shape_ = weight_shape;
    p.n_ = layout == WeightLayout::out_in ? weight_shape[0] : weight_shape[1];
    p.k_ = layout == WeightLayout::out_in ? weight_shape[1] : weight_shape[0];
    if (static_cast<Index>(scales.size()) != p.n_)
      throw ShapeError("PackedMatrix::pack_quantized: weight " + shape_string(weight_shape) + " has " +
                       std::to_string(p.n_) + " output channels, got " + std::to_string(scales.size()) + " scales");
    p.path_ = product_path(Precision::int8, p.n_, p.k_);
    if (p.path_ == ProductPath::eigen) {  // an empty weight: nothing to quantize
      p.plain_ = std::make_shared<const Matrix<float>>(Matrix<float>::Zero(p.k_, p.n_));
      p.kernel_ = "eigen";
      return p;
    }
    p.weight_scales_ = std::move(scales);
    p.pack_s8(values, layout);
    return p;
  }

  Index out_features() const { return n_; }
  Index in_features() const { return k_; }
  /// The packed weight's own shape, in PyTorch order ([out, in] or Conv1D's [in, out]).
  const Shape& weight_shape() const { return weight_shape_; }
  Precision precision() const { return precision_; }
  /// How this weight's products run, chosen when it was packed.
  ProductPath path() const { return path_; }
  /// The form of the rows its products read (bf16 rows on bf16_native only).
  RowForm input_form() const { return row_form(path_); }
  /// The implementation that multiplies, e.g. "brg:avx512_core_amx" or "eigen".
  const std::string& kernel() const { return kernel_; }
  /// Bytes of the packed weight (with an int8 weight's scales).
  std::size_t bytes() const {
    return plain_ ? static_cast<std::size_t>(plain_->size()) * sizeof(float)
                  : storage_.size() + weight_scales_.size() * sizeof(float);
  }
  /// An int8_native weight's scales, one per output channel (weight ≈ s8 value ·
  /// scale); empty on every other path.
  const std::vector<float>& weight_scales() const { return weight_scales_; }

  /// Scratch bytes multiply() needs for M rows.
  std::size_t scratch_bytes(Index M) const {
    if (path_ == ProductPath::int8_native)  // s8 rows, their scales, and a strided y's sums kInt8StridedRows at a time
      return int8_sums_offset(M) + static_cast<std::size_t>(std::min(M, kInt8StridedRows) * n_) * sizeof(float);
    if (path_ == ProductPath::bf16_widened) {  // a chunk of rounded rows, and one widened block
      const auto rounded = static_cast<std::size_t>(std::min(M, kWidenedRows) * k_);
      const auto block = static_cast<std::size_t>(k_ * std::min(kWidenedBlock, n_));
      return (rounded + block) * sizeof(float) + 128;
    }
    return static_cast<std::size_t>(M) * static_cast<std::size_t>(k_ + n_) * sizeof(float) + 128;
  }

  /// Columns per block of a bf16_widened weight: each block is widened to fp32 in
  /// scratch right before its product. That is how a CPU without bf16 instructions
  /// (or the Eigen backend) keeps bf16 weights resident, half the memory: widening
  /// costs K·N element copies per product and thread against M·K·N FMAs, and each
  /// block is a call of the runtime-shape GEMM (its speed against fp32:
  /// bench/results/README.md).
  static constexpr Index kWidenedBlock = 256;
  /// Rows of x a widened product rounds to bf16 at a time. Rounding all of them
  /// would keep a copy of the activations in each worker's scratch (fc2's
  /// [1024 × 3072] at T = 1024: 12.6 MB), resident for the rest of the run.
  static constexpr Index kWidenedRows = 128;

  /// Where a product may be cut into blocks of output columns (ProductOutput::block),
  /// or 0: each block of this many columns of the packed weight is one contiguous
  /// [K, block] weight of the same layout (oneDNN's BA16a64b2a for bf16 kernels, or
  /// a widened weight's blocks).
  Index column_block() const { return column_block_; }

  /// The product of x[M, K] (float rows, or bf16 rows on bf16_native; row stride ldx)
  /// and the weight (+ bias[N]) into `out`, which must not overlap x. A block of
  /// columns starts at a multiple of column_block() and is whole blocks unless it ends
  /// at N. `scratch` holds scratch_bytes(M), 64-byte aligned. Runs on the calling
  /// thread only.
  template <class X>
  void multiply(const X* x, Index ldx, Index M, const float* bias, const ProductOutput& out, std::byte* scratch) const {
    static_assert(std::is_same_v<X, float> || std::is_same_v<X, bf16>, "PackedMatrix::multiply: float or bf16 rows");
    const bool whole = out.columns < 0;
    const Index n0 = whole ? 0 : out.first_column, cols = whole ? n_ : out.columns;
    if (!whole) require_column_block(n0, cols);
    if (M == 0 || cols == 0) return;
    const bool fused = out.activation != Activation::none || out.gate != nullptr;
    if constexpr (std::is_same_v<X, bf16>) require_native("a bf16 input");
    if (fused) {
      require_native(out.gate ? "a gated residual" : "a bf16 output");
      if (!whole || out.stride != n_)
        throw InvalidArgument("PackedMatrix " + shape_string(weight_shape_) +
                              ": a fused output needs all columns in dense rows (row stride " + std::to_string(n_) +
                              "), got columns [" + std::to_string(n0) + ", " + std::to_string(n0 + cols) +
                              ") at row stride " + std::to_string(out.stride));
      return product_dense(operand(x, ldx, M, scratch), M, bias, out.data, out.activation, out.gate);
    }
    float* const y = static_cast<float*>(out.data);
    if constexpr (std::is_same_v<X, float>)
      if (path_ == ProductPath::bf16_widened)
        return product_widened(x, ldx, M, bias, n0, n0 + cols, y, out.stride, scratch);
    if constexpr (std::is_same_v<X, float>)
      if (path_ == ProductPath::int8_native) return product_int8(x, ldx, M, bias, y, out.stride, scratch);
    if (whole) return product_into(operand(x, ldx, M, scratch), M, bias, y, out.stride, scratch);
    product_columns(operand(x, ldx, M, scratch), M, bias, n0, cols, y, out.stride, scratch);
  }

 private:
  /// The packed bytes, shared so that copies of a module share one packed weight. A
  /// packed weight lives as long as its model, so from 1 MB up it has pages of its own
  /// (AlignedBytes), apart from the heap's short-lived buffers of loading.
  class Storage {
   public:
    Storage() = default;
    explicit Storage(std::size_t n) : bytes_(std::make_shared<const AlignedBytes>(n)) {}
    std::byte* data() const { return bytes_ ? bytes_->data() : nullptr; }
    std::size_t size() const { return bytes_ ? bytes_->size() : 0; }

   private:
    std::shared_ptr<const AlignedBytes> bytes_;
  };

  /// Reorders w into oneDNN's layout for its fp32 or bf16 kernels.
  void pack_onednn([[maybe_unused]] ConstMatRef<float> w, [[maybe_unused]] WeightLayout layout) {
#if defined(LDLM_HAVE_ONEDNN)
    namespace dd = detail::onednn;
    const bool bf16_kernels = path_ == ProductPath::bf16_native;
    const auto type = bf16_kernels ? dd::memory::data_type::bf16 : dd::memory::data_type::f32;
    desc_ = dd::packed_weight_desc(n_, k_, type);
    storage_ = Storage(desc_.get_size());
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
    dd::memory plain({{k_, n_}, dd::memory::data_type::f32, plain_tag}, dd::engine(), const_cast<float*>(source));
    dd::memory packed(desc_, dd::engine(), storage_.data());
    dd::SerialScope serial;
    dnnl::reorder(plain, packed).execute(dd::stream(), plain, packed);
    dd::stream().wait();
    kernel_ = dd::packed_matmul(desc_, 1024, true).kernel;
    if (bf16_kernels &&
        desc_ == dd::memory::desc({k_, n_}, dd::memory::data_type::bf16, dd::memory::format_tag::BA16a64b2a))
      column_block_ = 64;
#else
    throw Error("PackedMatrix: path " + std::string(product_path_name(path_)) + " without oneDNN in this build");
#endif
  }

  /// Reorders s8 values (the weight's own layout, weight_shape_) for oneDNN's int8
  /// kernels, with their scales.
  void pack_s8([[maybe_unused]] const std::int8_t* values, [[maybe_unused]] WeightLayout layout) {
#if defined(LDLM_HAVE_ONEDNN)
    namespace dd = detail::onednn;
    desc_ = dd::packed_weight_desc(n_, k_, dd::memory::data_type::s8);
    storage_ = Storage(desc_.get_size());
    // As a [K, N] matrix, [N, K] row-major is column-major ("ba"). The reorder also
    // writes the compensation oneDNN's s8 · s8 kernels keep after the values.
    const auto plain_tag = layout == WeightLayout::out_in ? dd::memory::format_tag::ba : dd::memory::format_tag::ab;
    // const_cast: a reorder only reads its source.
    dd::memory plain({{k_, n_}, dd::memory::data_type::s8, plain_tag}, dd::engine(), const_cast<std::int8_t*>(values));
    dd::memory packed(desc_, dd::engine(), storage_.data());
    dd::SerialScope serial;
    dnnl::reorder(plain, packed).execute(dd::stream(), plain, packed);
    dd::stream().wait();
    kernel_ = dd::packed_matmul(desc_, 1024, false).kernel;
#else
    throw Error("PackedMatrix: path " + std::string(product_path_name(path_)) + " without oneDNN in this build");
#endif
  }

  /// Rows whose sums product_int8 holds in scratch at a time for a strided y (rare: a
  /// dense y takes them itself). Few, because a worker's arena keeps the largest
  /// scratch it was ever asked for: sums for all of a product's rows were 12.9 MB per
  /// worker for lm_head's 64 rows at T 1024 (on 2 threads), reserved though never used.
  static constexpr Index kInt8StridedRows = 16;
  /// product_int8's scratch: M · K s8 values, then M row scales, then (for a strided
  /// y) the float sums, each part on a cache line.
  static std::size_t cache_lines(std::size_t bytes) { return (bytes + 63) / 64 * 64; }
  std::size_t int8_scales_offset(Index M) const { return cache_lines(static_cast<std::size_t>(M * k_)); }
  std::size_t int8_sums_offset(Index M) const {
    return int8_scales_offset(M) + cache_lines(static_cast<std::size_t>(M) * sizeof(float));
  }

  /// y[M, N] (row stride ldy) = x · W (+ bias) on an int8_native weight: each row of x
  /// quantized to s8 with its own scale, the s8 · s8 product summed in s32 by oneDNN
  /// (written as floats, into y when it is dense), then each sum scaled by its row's
  /// and its channel's scales and the bias added, in one pass over the row.
  void product_int8(const float* x, Index ldx, Index M, const float* bias, float* y, Index ldy,
                    std::byte* scratch) const {
    std::int8_t* const quantized = reinterpret_cast<std::int8_t*>(scratch);
    float* const row_scales = reinterpret_cast<float*>(scratch + int8_scales_offset(M));
    for (Index r = 0; r < M; ++r) row_scales[r] = quantize_s8(x + r * ldx, k_, quantized + r * k_);
    const bool dense = ldy == n_;
    const Index block = dense ? M : kInt8StridedRows;
    const float* const channel_scales = weight_scales_.data();
    for (Index r0 = 0; r0 < M; r0 += block) {
      const Index rows = std::min(block, M - r0);
      float* const sums = dense ? y + r0 * n_ : reinterpret_cast<float*>(scratch + int8_sums_offset(M));
      product_dense(quantized + r0 * k_, rows, nullptr, sums, Activation::none);
      for (Index r = r0; r < r0 + rows; ++r) {
        const float row_scale = row_scales[r];
        const float* const in = sums + (r - r0) * n_;
        float* const out = y + r * ldy;
        if (bias)
          for (Index n = 0; n < n_; ++n) out[n] = in[n] * (row_scale * channel_scales[n]) + bias[n];
        else
          for (Index n = 0; n < n_; ++n) out[n] = in[n] * (row_scale * channel_scales[n]);
      }
    }
  }

  /// Holds w in bf16, as consecutive dense [K, cols] blocks of kWidenedBlock columns
  /// (the last one narrower), ready to be widened one block at a time.
  void pack_widened(ConstMatRef<float> w, WeightLayout layout) {
    column_block_ = kWidenedBlock;
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
  void product_widened(const float* x, Index ldx, Index M, const float* bias, Index n0, Index n1, float* y, Index ldy,
                       std::byte* scratch) const {
    const Index chunk = std::min(M, kWidenedRows);
    float* const block = reinterpret_cast<float*>(scratch) + (chunk * k_ + 15) / 16 * 16;  // on a cache line
    const bf16* const weights = reinterpret_cast<const bf16*>(storage_.data());
    const float* rounded = nullptr;
    for (Index c0 = n0; c0 < n1; c0 += kWidenedBlock) {
      const Index cols = std::min(kWidenedBlock, n_ - c0);
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

  void require_native(const char* what) const {
    if (path_ != ProductPath::bf16_native)
      throw InvalidArgument("PackedMatrix " + shape_string(weight_shape_) + ": " + what +
                            " needs a weight packed for bf16 kernels (path bf16_native); this one is " +
                            std::string(precision_name(precision_)) + " on " + kernel_ + " (path " +
                            std::string(product_path_name(path_)) + ")");
  }

  void require_column_block(Index n0, Index cols) const {
    if (column_block_ == 0)
      throw InvalidArgument("PackedMatrix " + shape_string(weight_shape_) + ": this weight has no column blocks (" +
                            kernel_ + ")");
    if (n0 < 0 || n0 % column_block_ != 0 || cols < 0 || n0 + cols > n_ ||
        (cols % column_block_ != 0 && n0 + cols != n_))
      throw InvalidArgument("PackedMatrix " + shape_string(weight_shape_) + ": columns [" + std::to_string(n0) + ", " +
                            std::to_string(n0 + cols) + ") of " + std::to_string(n_) + " are not whole blocks of " +
                            std::to_string(column_block_));
  }

  /// x as the kernel takes it: bf16 converted or bf16-rounded rows, or dense rows
  /// (in scratch), or x itself.
  const void* operand(const float* x, Index ldx, Index M, std::byte* scratch) const {
    float* const x_copy = reinterpret_cast<float*>(scratch);
    if (path_ == ProductPath::bf16_native) {
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
  const bf16* operand(const bf16* x, Index ldx, Index M, std::byte* scratch) const {
    if (ldx == k_) return x;
    bf16* const x_copy = reinterpret_cast<bf16*>(scratch);
    for (Index r = 0; r < M; ++r) std::copy_n(x + r * ldx, k_, x_copy + r * k_);
    return x_copy;
  }

  /// y[M, N] (row stride ldy) from the dense operand a: through scratch's second part
  /// (after M · K floats, where `operand` puts a copy of x) when y is not dense.
  void product_into(const void* a, Index M, const float* bias, float* y, Index ldy, std::byte* scratch) const {
    float* const out = ldy == n_ ? y : reinterpret_cast<float*>(scratch) + M * k_;
    product_dense(a, M, bias, out, Activation::none);
    if (out != y)
      for (Index r = 0; r < M; ++r) std::copy_n(out + r * n_, n_, y + r * ldy);
  }

  /// y[M, n0 : n0 + cols] (row stride ldy) from the dense bf16 operand a, on one
  /// column block of a bf16_native weight (the only one with blocks besides widened).
  void product_columns([[maybe_unused]] const void* a, [[maybe_unused]] Index M, [[maybe_unused]] const float* bias,
                       [[maybe_unused]] Index n0, [[maybe_unused]] Index cols, [[maybe_unused]] float* y,
                       [[maybe_unused]] Index ldy, [[maybe_unused]] std::byte* scratch) const {
#if defined(LDLM_HAVE_ONEDNN)
    namespace dd = detail::onednn;
    const dd::memory::desc block({k_, cols}, dd::memory::data_type::bf16, dd::memory::format_tag::BA16a64b2a);
    const Index padded_k = desc_.data.padded_dims[0];
    dd::Matmul& mm = dd::packed_matmul(block, M, bias != nullptr);
    // oneDNN's blocked kernels want dense rows (strided ones got its reference
    // implementation, far slower): a single row is, others go through scratch.
    float* const out = M == 1 ? y + n0 : reinterpret_cast<float*>(scratch) + M * k_;
    dd::ProductArgs args;
    args.add(DNNL_ARG_SRC, dd::memory::data_type::bf16, M, k_, k_, 1, a);
    args.add_packed(DNNL_ARG_WEIGHTS, block, storage_.data() + n0 * padded_k * sizeof(bf16), /*column_block=*/true);
    args.add(DNNL_ARG_DST, dd::memory::data_type::f32, M, cols, cols, 1, out);
    if (bias) args.add(DNNL_ARG_BIAS, dd::memory::data_type::f32, 1, cols, cols, 1, bias + n0);
    args.execute(mm);
    if (out != y + n0)
      for (Index r = 0; r < M; ++r) std::copy_n(out + r * cols, cols, y + r * ldy + n0);
#endif
  }

  /// y: float, or bf16 when there is an activation (only on bf16 kernels). With a
  /// gate (only on bf16 kernels), y += gate ⊙ product.
  void product_dense(const void* a, Index M, const float* bias, void* y, [[maybe_unused]] Activation activation,
                     [[maybe_unused]] const float* gate = nullptr) const {
#if defined(LDLM_HAVE_ONEDNN)
    if (path_ != ProductPath::eigen) {
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
  ProductPath path_ = ProductPath::eigen;
  Index column_block_ = 0;
  std::string kernel_;
  std::shared_ptr<const Matrix<float>> plain_;  // [K, N]: the eigen backend
  Storage storage_;                             // oneDNN's layout, or bf16_widened's blocks
  std::vector<float> weight_scales_;            // int8_native: one per output channel
#if defined(LDLM_HAVE_ONEDNN)
  detail::onednn::memory::desc desc_;
#endif
};

}  // namespace ldlm
