// Element-wise activations, in place over a contiguous range (vectorised by Eigen).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ldlm/core/eigen.hpp"
#include "ldlm/core/error.hpp"
#include "ldlm/core/tensor.hpp"

namespace ldlm {

namespace detail {
/// x[i] = f(x)[i] for i in [0, n), every element through the same vector code.
/// Evaluated on x directly, Eigen computes the elements before the first aligned
/// address, and a tail shorter than a vector, with its scalar functions, which for
/// exp round differently from the vector ones: a value would depend on where its
/// row starts. So the aligned body is evaluated in place and the rest a block at a
/// time through an aligned buffer. f maps an array expression to an array expression.
/// x is aligned to its element type, as any S* is. (For double, Eigen 3.4 has no
/// vector tanh or erf: those GELUs are scalar throughout, the same at every address.)
template <class S, class F>
void apply_elementwise(S* x, Index n, F f) {
  constexpr Index kBlock = 64 / sizeof(S);  // one cache line: a whole number of vectors at any width
  using Block = Eigen::Array<S, kBlock, 1>;
  const auto address = reinterpret_cast<std::uintptr_t>(x);
  const Index head = std::min(n, static_cast<Index>((64 - address % 64) % 64 / sizeof(S)));
  const Index body = (n - head) / kBlock * kBlock;
  auto through_buffer = [&f](S* from, Index count) {
    alignas(64) Block buffer = Block::Zero();
    std::copy_n(from, count, buffer.data());
    buffer = f(buffer);
    std::copy_n(buffer.data(), count, from);
  };
  if (head > 0) through_buffer(x, head);
  if (body > 0) {
    Eigen::Map<Eigen::Array<S, Eigen::Dynamic, 1>, Eigen::Aligned64> a(x + head, body);
    a = f(a);
  }
  for (Index i = head + body; i < n; i += kBlock) through_buffer(x + i, std::min(kBlock, n - i));
}
}  // namespace detail

/// Exact GELU: x · Φ(x) = 0.5 x (1 + erf(x / √2)). Used by the Perceiver FFNs.
template <class S>
void gelu_erf_inplace(S* x, Index n) {
  detail::apply_elementwise(x, n, [](const auto& a) { return S(0.5) * a * (S(1) + (a * S(M_SQRT1_2)).erf()); });
}

/// Tanh-approximate GELU, as in GPT-2 and the denoiser MLP.
template <class S>
void gelu_tanh_inplace(S* x, Index n) {
  const S k = S(0.7978845608028654);  // sqrt(2 / pi)
  detail::apply_elementwise(
      x, n, [k](const auto& a) { return S(0.5) * a * (S(1) + (k * (a + S(0.044715) * a.cube())).tanh()); });
}

/// SiLU: x · sigmoid(x).
template <class S>
void silu_inplace(S* x, Index n) {
  detail::apply_elementwise(x, n, [](const auto& a) { return a / (S(1) + (-a).exp()); });
}

/// The activations a product can apply as it writes its output
/// (ProductOutput::activated): those of the MLPs between two linear maps.
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
