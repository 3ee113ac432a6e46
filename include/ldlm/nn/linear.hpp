// Linear layers owning named parameters: nn.Linear ([out, in]) and GPT-2's Conv1D
// ([in, out], the transpose). Their weights are MatmulWeights: once loaded they are
// packed for the chosen kernel and precision (ops/gemm.hpp), and the forward pass
// runs in the precision they were packed in.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "ldlm/core/parameter.hpp"
#include "ldlm/core/precision.hpp"
#include "ldlm/ops/linear.hpp"
#include "ldlm/ops/modulate.hpp"

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

  /// Packs the loaded values for products in `precision`. A double model keeps its
  /// values and computes in double; it has no bf16 mode.
  void pack(Precision precision) {
    if constexpr (std::is_same_v<S, float>) {
      packed_ =
          std::make_shared<const PackedMatrix>(PackedMatrix::pack(std::as_const(*this).matrix(), layout_, precision));
      this->release();
    } else if (precision == Precision::bf16) {
      throw InvalidArgument("MatmulWeight::pack: bf16 precision needs a float model, this one computes in double");
    }
  }

  WeightLayout layout() const { return layout_; }
  /// The precision of this weight's products: fp32 until packed in bf16.
  Precision precision() const { return packed_ ? packed_->precision() : Precision::fp32; }
  /// Null until packed.
  const PackedMatrix* packed() const { return packed_.get(); }
  /// Whether the products take bf16 operands (and bf16 rows): packed for bf16 kernels.
  bool bf16_operands() const { return packed_ && packed_->bf16_operands(); }

 private:
  WeightLayout layout_ = WeightLayout::out_in;
  std::shared_ptr<const PackedMatrix> packed_;  // shared: copies of a module share one packing
};

/// y = x Wᵀ (+ b) through the packed weight when there is one.
template <class S, class Epilogue>
void linear_forward(Context& ctx, ConstMatRef<S> x, const MatmulWeight<S>& w, const S* bias, MatRef<S> y,
                    Epilogue&& epilogue) {
  if constexpr (std::is_same_v<S, float>) {
    if (const PackedMatrix* packed = w.packed())
      return linear(ctx, x, *packed, bias, y, std::forward<Epilogue>(epilogue));
  }
  linear<S>(ctx, x, w.matrix(), bias, y, w.layout(), std::forward<Epilogue>(epilogue));
}

/// w's packing, which must be for bf16 kernels: bf16 rows exist only to feed them.
template <class S>
const PackedMatrix& packed_for_bf16_rows(const MatmulWeight<S>& w, const char* module) {
  if (!w.bf16_operands())
    throw InvalidArgument(std::string(module) + " " + shape_string(w.shape()) +
                          ": bf16 rows need a weight packed for bf16 kernels; this one is " +
                          std::string(precision_name(w.precision())) +
                          (w.packed() ? " on " + w.packed()->kernel() : std::string(" and not packed")));
  return *w.packed();
}

/// out.residual += gate ⊙ (x · W (+ b)) on float or bf16 rows x, with a weight packed
/// for bf16 kernels: in one pass where the residual is dense (linear_gated_add).
template <class Rows>
void gated_add_product(Context& ctx, const Rows& x, const PackedMatrix& w, const float* bias,
                       const GatedResidual<float>& out) {
  if (out.residual.outerStride() == out.residual.cols()) return linear_gated_add(ctx, x, w, bias, out);
  Arena::Scope scope(ctx.arena());
  const Index rows = [&] {
    if constexpr (std::is_same_v<Rows, BF16Rows>)
      return x.rows;
    else
      return x.rows();
  }();
  MatrixMap<float> y(ctx.arena().allocate<float>(rows * w.out_features()), rows, w.out_features());
  linear(ctx, x, w, bias, y);
  gated_residual_add<float>(ctx, out.residual, out.gate, y, out.T);
}
/// y = x · W (+ b) on bf16 rows x (the overload the MLPs and FusedSelfAttention pick
/// for a plain output; float rows with a plain output take map.forward instead).
inline void gated_add_product(Context& ctx, BF16Rows x, const PackedMatrix& w, const float* bias, MatRef<float> y) {
  linear(ctx, x, w, bias, y);
}

/// out.residual += gate ⊙ map(x) for a Linear or Conv1D map: in one pass on bf16
/// kernels; otherwise the product into the arena, then gated_residual_add, which
/// is the unfused block's arithmetic (fp32 results do not change).
template <class S, class Map>
void forward_gated_add(Context& ctx, const Map& map, ConstMatRef<S> x, const GatedResidual<S>& out) {
  if constexpr (std::is_same_v<S, float>) {
    if (map.weight.bf16_operands()) return gated_add_product(ctx, x, *map.weight.packed(), map.bias_data(), out);
  }
  Arena::Scope scope(ctx.arena());
  MatrixMap<S> y(ctx.arena().allocate<S>(x.rows() * map.out_features()), x.rows(), map.out_features());
  map.forward(ctx, x, y);
  gated_residual_add<S>(ctx, out.residual, out.gate, y, out.T);
}
/// map(x) into y (the overload modules pick for a plain output).
template <class S, class Map>
void forward_gated_add(Context& ctx, const Map& map, ConstMatRef<S> x, MatRef<S> y) {
  map.forward(ctx, x, y);
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

  /// y[M, out] = x[M, in] Wᵀ (+ b), then epilogue (see ldlm::linear). y must not alias x.
  template <class Epilogue = std::nullptr_t>
  void forward(Context& ctx, ConstMatRef<S> x, MatRef<S> y, Epilogue&& epilogue = nullptr) const {
    linear_forward<S>(ctx, x, weight, bias_data(), y, std::forward<Epilogue>(epilogue));
  }
  /// The same on bf16 rows x, for a weight packed for bf16 kernels (bf16_operands()).
  void forward(Context& ctx, BF16Rows x, MatRef<S> y) const {
    linear(ctx, x, packed_for_bf16_rows(weight, "Linear"), bias_data(), y);
  }
  bool bf16_operands() const { return weight.bf16_operands(); }
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
  void forward(Context& ctx, ConstMatRef<S> x, MatRef<S> y, Epilogue&& epilogue = nullptr) const {
    linear_forward<S>(ctx, x, weight, bias_data(), y, std::forward<Epilogue>(epilogue));
  }
  bool bf16_operands() const { return weight.bf16_operands(); }
};

}  // namespace ldlm::nn
