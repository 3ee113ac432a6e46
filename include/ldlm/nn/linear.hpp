// Linear layers owning named parameters: nn.Linear ([out, in]) and GPT-2's Conv1D
// ([in, out], the transpose). Their weights are MatmulWeights: once loaded they are
// packed for a product path and precision (ops/packed_matrix.hpp), and the forward
// pass runs on that path, in the precision they were packed in. A module takes its
// input as OperandRows and its output as a Destination, and calls ldlm::linear
// (ops/linear.hpp), which decides what the path reads, writes and fuses.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ldlm/core/parameter.hpp"
#include "ldlm/core/precision.hpp"
#include "ldlm/ops/activation.hpp"
#include "ldlm/ops/linear.hpp"

namespace ldlm::nn {

/// A parameter that feeds matrix products. pack() reorders its values once into the
/// layout and precision of the kernel and releases the plain copy, so a packed model
/// holds each weight once (in bf16: half the bytes).
template <class S>
class MatmulWeight : public Parameter<S> {
 public:
  MatmulWeight() = default;
  MatmulWeight(Shape shape, Role role, WeightLayout layout) : Parameter<S>(std::move(shape), role), layout_(layout) {}

  /// Storage for new values; a previous packing no longer applies.
  void allocate() {
    packed_.reset();
    Parameter<S>::allocate();
  }

  /// Marks this weight as one that Precision::int8 quantizes (the trained modules' maps
  /// but the denoiser's conditioning and ends); at int8 every other weight packs in bf16
  /// (docs/model.md §int8).
  void quantize_at_int8() { quantize_at_int8_ = true; }
  bool quantized_at_int8() const { return quantize_at_int8_; }

  /// Packs the loaded values for products in `precision`. A double model keeps its
  /// values and computes in double; it has no bf16 or int8 mode.
  void pack(Precision precision) {
    if constexpr (std::is_same_v<S, float>) {
      const Precision packed = precision == Precision::int8 && !quantize_at_int8_ ? Precision::bf16 : precision;
      packed_ =
          std::make_shared<const PackedMatrix>(PackedMatrix::pack(std::as_const(*this).matrix(), layout_, packed));
      this->release();
    } else if (precision != Precision::fp32) {
      throw InvalidArgument("MatmulWeight::pack: " + std::string(precision_name(precision)) +
                            " precision needs a float model, this one computes in double");
    }
  }

  /// Output channels: the scales a quantized weight has.
  Index out_features() const { return layout_ == WeightLayout::out_in ? this->shape()[0] : this->shape()[1]; }

  /// Takes values quantized per output channel (a quantized checkpoint's I8 tensor, in
  /// this weight's shape, and its scales): at int8 they are packed as they are, the
  /// same packing as quantizing the original at load; at any other precision (or
  /// unpacked) the weight is their dequantization, value · scale in float.
  void load_quantized(const std::int8_t* values, std::vector<float> scales, std::optional<Precision> precision) {
    if (static_cast<Index>(scales.size()) != out_features())
      throw ShapeError("MatmulWeight::load_quantized: weight " + shape_string(this->shape()) + " has " +
                       std::to_string(out_features()) + " output channels, got " + std::to_string(scales.size()) +
                       " scales");
    if constexpr (std::is_same_v<S, float>) {
      if (precision == Precision::int8 && quantize_at_int8_) {
        packed_ = std::make_shared<const PackedMatrix>(
            PackedMatrix::pack_quantized(values, std::move(scales), this->shape(), layout_));
        this->release();
        return;
      }
    }
    allocate();
    MatrixMap<S> w = this->matrix();
    for (Index r = 0; r < w.rows(); ++r)
      for (Index c = 0; c < w.cols(); ++c) {
        const float scale = scales[static_cast<std::size_t>(layout_ == WeightLayout::out_in ? r : c)];
        w(r, c) = static_cast<S>(static_cast<float>(values[r * w.cols() + c]) * scale);
      }
    if (precision) pack(*precision);
  }

  /// Whether pack_int8_from_blocks takes this weight: an [out, in] weight int8 quantizes.
  bool packs_int8_from_blocks() const { return quantize_at_int8_ && layout_ == WeightLayout::out_in; }
  /// Packs for int8 a weight int8 quantizes, [out, in], whose float values come a block
  /// of whole rows at a time: read(first, count, dst) writes the flat elements
  /// [first, first + count) to dst (pack_int8_from_blocks in core/parameter.hpp).
  /// Each block is quantized as it comes (quantize_channels_into: a row is a channel),
  /// so the float values are never whole in memory, and the packing is load_quantized's
  /// of the whole weight quantized at once. Loading a float checkpoint at int8 thus
  /// peaks where loading a quantized one does (lm_head alone is 154 MB in fp32).
  template <class Read>
    requires std::same_as<S, float>
  void pack_int8_from_blocks(Read&& read) {
    if (!packs_int8_from_blocks())
      throw InvalidArgument("MatmulWeight::pack_int8_from_blocks: weight " + shape_string(this->shape()) +
                            " is not an [out, in] weight that int8 quantizes");
    const Index N = this->shape()[0], K = this->shape()[1];
    std::vector<std::int8_t> values(static_cast<std::size_t>(N * K));
    std::vector<float> scales(static_cast<std::size_t>(N));
    std::vector<float> block(static_cast<std::size_t>(std::min(N, kQuantizedRows) * K));
    for (Index r0 = 0; r0 < N; r0 += kQuantizedRows) {
      const Index rows = std::min(kQuantizedRows, N - r0);
      read(r0 * K, rows * K, block.data());
      quantize_channels_into(ConstMatrixMap<float>(block.data(), rows, K), layout_, values.data() + r0 * K,
                             scales.data() + r0);
    }
    load_quantized(values.data(), std::move(scales), Precision::int8);
  }

  WeightLayout layout() const { return layout_; }
  /// The precision of this weight's products: fp32 until packed.
  Precision precision() const { return packed_ ? packed_->precision() : Precision::fp32; }
  /// Null until packed.
  const PackedMatrix* packed() const { return packed_.get(); }
  /// The form of the rows its products read: bf16 rows on ProductPath::bf16_native,
  /// else S rows (and S rows until packed).
  RowForm input_form() const { return packed_ ? packed_->input_form() : RowForm::fp32; }
  /// This weight for ldlm::linear: the packed weight once there is one, else the values.
  LinearWeight<S> product_weight() const {
    if constexpr (std::is_same_v<S, float>)
      if (packed_) return *packed_;
    return LinearWeight<S>(this->matrix(), layout_);
  }

 private:
  static constexpr Index kQuantizedRows = 256;  // pack_int8_from_blocks' block: lm_head's is 768 KB of floats
  WeightLayout layout_ = WeightLayout::out_in;
  bool quantize_at_int8_ = false;
  std::shared_ptr<const PackedMatrix> packed_;  // shared: copies of a module share one packing
};

template <class S = float>
struct Linear {
  MatmulWeight<S> weight;  // [out, in]
  Parameter<S> bias;       // [out], when has_bias
  bool has_bias = false;

  Linear() = default;
  Linear(Index in, Index out, bool with_bias, Role role = Role::trained)
      : weight({out, in}, role, WeightLayout::out_in),
        bias(with_bias ? Shape{out} : Shape{}, role),
        has_bias(with_bias) {}

  Index in_features() const { return weight.shape()[1]; }
  Index out_features() const { return weight.shape()[0]; }
  Precision precision() const { return weight.precision(); }
  const S* bias_data() const { return has_bias ? bias.data() : nullptr; }

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    f(prefix + "weight", weight);
    if (has_bias) f(prefix + "bias", bias);
  }

  /// y[M, out] = x[M, in] Wᵀ (+ b): written (then epilogue), added to a gated
  /// residual, or activated into the next product's rows (ldlm::linear). y must not alias x.
  template <class Epilogue = std::nullptr_t>
  void forward(Context& ctx, const OperandRows<S>& x, const Destination<S>& y, Epilogue&& epilogue = nullptr) const {
    ldlm::linear<S>(ctx, x, weight.product_weight(), bias_data(), y, std::forward<Epilogue>(epilogue));
  }
  RowForm input_form() const { return weight.input_form(); }
};

/// Hugging Face GPT-2 Conv1D: weight stored [in, out], y = x W + b.
template <class S = float>
struct Conv1D {
  MatmulWeight<S> weight;  // [in, out]
  Parameter<S> bias;       // [out]

  Conv1D() = default;
  Conv1D(Index in, Index out, Role role) : weight({in, out}, role, WeightLayout::in_out), bias({out}, role) {}

  Index in_features() const { return weight.shape()[0]; }
  Index out_features() const { return weight.shape()[1]; }
  Precision precision() const { return weight.precision(); }
  const S* bias_data() const { return bias.data(); }

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    f(prefix + "weight", weight);
    f(prefix + "bias", bias);
  }

  template <class Epilogue = std::nullptr_t>
  void forward(Context& ctx, const OperandRows<S>& x, const Destination<S>& y, Epilogue&& epilogue = nullptr) const {
    ldlm::linear<S>(ctx, x, weight.product_weight(), bias_data(), y, std::forward<Epilogue>(epilogue));
  }
  RowForm input_form() const { return weight.input_form(); }
};

}  // namespace ldlm::nn
