// Element-wise activations, in place over a contiguous range (vectorised by Eigen).
#pragma once

#include <unsupported/Eigen/SpecialFunctions>

#include <cmath>

#include "ldlm/core/error.hpp"
#include "ldlm/core/tensor.hpp"

namespace ldlm {

/// Exact GELU: x · Φ(x) = 0.5 x (1 + erf(x / √2)). Used by the Perceiver FFNs.
template <class S>
void gelu_erf_inplace(S* x, Index n) {
  ArrayMap<S> a(x, n);
  a = S(0.5) * a * (S(1) + (a * S(M_SQRT1_2)).erf());
}

/// Tanh-approximate GELU, as in GPT-2 and the denoiser MLP.
template <class S>
void gelu_tanh_inplace(S* x, Index n) {
  ArrayMap<S> a(x, n);
  const S k = S(0.7978845608028654);  // sqrt(2 / pi)
  a = S(0.5) * a * (S(1) + (k * (a + S(0.044715) * a.cube())).tanh());
}

/// SiLU: x · sigmoid(x).
template <class S>
void silu_inplace(S* x, Index n) {
  ArrayMap<S> a(x, n);
  a = a / (S(1) + (-a).exp());
}

/// The activations a product can apply as it writes its output (PackedMatrix::
/// multiply_activated): those of the MLPs between two linear maps.
enum class Activation { none, gelu_tanh, gelu_erf };

/// The in-place function of an activation other than none.
template <class S>
auto activation_inplace(Activation a) -> void (*)(S*, Index) {
  if (a == Activation::none) throw InvalidArgument("activation_inplace: Activation::none has no function");
  return a == Activation::gelu_erf ? gelu_erf_inplace<S> : gelu_tanh_inplace<S>;
}

/// An epilogue for ldlm::linear that applies one of the activations above to
/// each row of a finished block, while the task that wrote it still holds it.
template <class S>
auto per_row_epilogue(void (*activation)(S*, Index)) {
  return [activation](MatRef<S> block) {
    for (Index r = 0; r < block.rows(); ++r) activation(block.row(r).data(), block.cols());
  };
}

}  // namespace ldlm
