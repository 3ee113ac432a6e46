// Linear layers owning named parameters: nn.Linear ([out, in]) and GPT-2's Conv1D
// ([in, out], the transpose).
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include "ldlm/core/parameter.hpp"
#include "ldlm/ops/linear.hpp"

namespace ldlm::nn {

template <class S = float>
struct Linear {
  Parameter<S> weight;  // [out, in]
  Parameter<S> bias;    // [out], when has_bias
  bool has_bias = false;

  Linear() = default;
  Linear(Index in, Index out, bool with_bias, Role role = Role::trained)
      : weight({out, in}, role), bias(with_bias ? Shape{out} : Shape{}, role), has_bias(with_bias) {}

  Index in_features() const { return weight.shape()[1]; }
  Index out_features() const { return weight.shape()[0]; }

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    f(prefix + "weight", weight);
    if (has_bias) f(prefix + "bias", bias);
  }

  /// y[M, out] = x[M, in] Wᵀ (+ b), then epilogue (see ldlm::linear). y must not alias x.
  template <class Epilogue = std::nullptr_t>
  void forward(Context& ctx, ConstMatRef<S> x, MatRef<S> y, Epilogue&& epilogue = nullptr) const {
    linear<S>(ctx, x, weight.matrix(), has_bias ? bias.data() : nullptr, y, WeightLayout::out_in,
              std::forward<Epilogue>(epilogue));
  }
};

/// Hugging Face GPT-2 Conv1D: weight stored [in, out], y = x W + b.
template <class S = float>
struct Conv1D {
  Parameter<S> weight;  // [in, out]
  Parameter<S> bias;    // [out]

  Conv1D() = default;
  Conv1D(Index in, Index out, Role role) : weight({in, out}, role), bias({out}, role) {}

  Index in_features() const { return weight.shape()[0]; }
  Index out_features() const { return weight.shape()[1]; }

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    f(prefix + "weight", weight);
    f(prefix + "bias", bias);
  }

  template <class Epilogue = std::nullptr_t>
  void forward(Context& ctx, ConstMatRef<S> x, MatRef<S> y, Epilogue&& epilogue = nullptr) const {
    linear<S>(ctx, x, weight.matrix(), bias.data(), y, WeightLayout::in_out, std::forward<Epilogue>(epilogue));
  }
};

}  // namespace ldlm::nn
