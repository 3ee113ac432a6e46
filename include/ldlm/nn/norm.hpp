// Normalisation layers owning their gains (and bias).
#pragma once

#include <string>

#include "ldlm/core/parameter.hpp"
#include "ldlm/ops/modulate.hpp"

namespace ldlm::nn {

/// Gain-only LayerNorm computed in float32 (denoiser and token decoder norms).
template <class S = float>
struct LayerNormGain {
  Parameter<S> weight;  // [n]
  float eps = 1e-5f;

  LayerNormGain() = default;
  LayerNormGain(Index n, double eps_, Role role = Role::trained) : weight({n}, role), eps(static_cast<float>(eps_)) {}

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    f(prefix + "weight", weight);
  }
  /// y may alias x.
  void forward(Context& ctx, ConstMatRef<S> x, MatRef<S> y) const { layer_norm_gain<S>(ctx, x, weight.data(), eps, y); }
  /// forward, then adaLN's modulate with per-sequence shift, scale [B, n], in one pass. y may alias x.
  void forward_modulated(Context& ctx, ConstMatRef<S> x, ConstMatRef<S> shift, ConstMatRef<S> scale, Index T,
                         MatRef<S> y) const {
    layer_norm_modulate<S>(ctx, x, weight.data(), eps, shift, scale, T, y);
  }
  /// The same rounded to bf16 into y, dense [rows, n]: a bf16 product's operand.
  void forward_modulated(Context& ctx, ConstMatRef<float> x, ConstMatRef<float> shift, ConstMatRef<float> scale,
                         Index T, bf16* y) const {
    layer_norm_modulate(ctx, x, weight.data(), eps, shift, scale, T, y);
  }
};

/// torch.nn.LayerNorm (weight and bias).
template <class S = float>
struct LayerNorm {
  Parameter<S> weight, bias;  // [n], [n]
  S eps = S(1e-5);

  LayerNorm() = default;
  LayerNorm(Index n, double eps_, Role role = Role::trained)
      : weight({n}, role), bias({n}, role), eps(static_cast<S>(eps_)) {}

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    f(prefix + "weight", weight);
    f(prefix + "bias", bias);
  }
  /// y may alias x.
  void forward(Context& ctx, ConstMatRef<S> x, MatRef<S> y) const {
    layer_norm<S>(ctx, x, weight.data(), bias.data(), eps, y);
  }
};

/// Cosmos RMSNorm (clamped RMS), parameter named `gamma`.
template <class S = float>
struct RMSNorm {
  Parameter<S> gamma;  // [n]
  S eps = S(1e-5);

  RMSNorm() = default;
  RMSNorm(Index n, double eps_, Role role = Role::trained) : gamma({n}, role), eps(static_cast<S>(eps_)) {}

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    f(prefix + "gamma", gamma);
  }
  /// y may alias x.
  void forward(Context& ctx, ConstMatRef<S> x, MatRef<S> y) const { rms_norm<S>(ctx, x, gamma.data(), eps, y); }
};

}  // namespace ldlm::nn
