// Linear layers owning named parameters: nn.Linear ([out, in]) and GPT-2's Conv1D
// ([in, out], the transpose). Their weights are MatmulWeights: once loaded they are
// packed for a product path and precision (ops/packed_matrix.hpp), and the forward
// pass runs on that path, in the precision they were packed in. A module takes its
// input as OperandRows and its output as a Destination (ops/linear.hpp); what the
// path reads, writes and fuses is decided in ops/.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

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

  /// Marks this weight as one that Precision::int8 quantizes (the denoiser blocks'
  /// Linear maps); at int8 every other weight packs in bf16 (docs/model.md §Precision).
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

  WeightLayout layout() const { return layout_; }
  /// The precision of this weight's products: fp32 until packed.
  Precision precision() const { return packed_ ? packed_->precision() : Precision::fp32; }
  /// Null until packed.
  const PackedMatrix* packed() const { return packed_.get(); }
  /// The form of the rows its products read: bf16 rows on ProductPath::bf16_native,
  /// else S rows (and S rows until packed).
  RowForm input_form() const { return packed_ ? packed_->input_form() : RowForm::fp32; }

 private:
  WeightLayout layout_ = WeightLayout::out_in;
  bool quantize_at_int8_ = false;
  std::shared_ptr<const PackedMatrix> packed_;  // shared: copies of a module share one packing
};

/// x Wᵀ (+ b) into y: written (then `epilogue` on each block, see ldlm::linear), or
/// added to a gated residual; through the packed weight once there is one
/// (ldlm::linear_to decides what its path reads, writes and fuses).
template <class S, class Epilogue = std::nullptr_t>
void linear_forward(Context& ctx, const OperandRows<S>& x, const MatmulWeight<S>& w, const S* bias,
                    const Destination<S>& y, Epilogue&& epilogue = nullptr) {
  if constexpr (std::is_same_v<S, float>) {
    if (const PackedMatrix* packed = w.packed())
      return linear_to(ctx, x, *packed, bias, y, std::forward<Epilogue>(epilogue));
  }
  linear_to<S>(ctx, x, w.matrix(), w.layout(), bias, y, std::forward<Epilogue>(epilogue));
}

/// h = activation(x Wᵀ (+ b)) into rows of h's form (ldlm::linear_activated_to).
template <class S>
void linear_forward_activated(Context& ctx, const OperandRows<S>& x, const MatmulWeight<S>& w, const S* bias,
                              Activation activation, const OperandBuffer<S>& h) {
  if constexpr (std::is_same_v<S, float>) {
    if (const PackedMatrix* packed = w.packed()) return linear_activated_to(ctx, x, *packed, bias, activation, h);
  }
  linear_activated_to<S>(ctx, x, w.matrix(), w.layout(), bias, activation, h);
}

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

  /// y[M, out] = x[M, in] Wᵀ (+ b), written (then epilogue, see ldlm::linear) or added
  /// to a gated residual. y must not alias x.
  template <class Epilogue = std::nullptr_t>
  void forward(Context& ctx, const OperandRows<S>& x, const Destination<S>& y, Epilogue&& epilogue = nullptr) const {
    linear_forward<S>(ctx, x, weight, bias_data(), y, std::forward<Epilogue>(epilogue));
  }
  /// h = activation(x Wᵀ (+ b)), in h's form.
  void forward_activated(Context& ctx, const OperandRows<S>& x, Activation activation,
                         const OperandBuffer<S>& h) const {
    linear_forward_activated<S>(ctx, x, weight, bias_data(), activation, h);
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
    linear_forward<S>(ctx, x, weight, bias_data(), y, std::forward<Epilogue>(epilogue));
  }
  void forward_activated(Context& ctx, const OperandRows<S>& x, Activation activation,
                         const OperandBuffer<S>& h) const {
    linear_forward_activated<S>(ctx, x, weight, bias_data(), activation, h);
  }
  RowForm input_form() const { return weight.input_form(); }
};

}  // namespace ldlm::nn
