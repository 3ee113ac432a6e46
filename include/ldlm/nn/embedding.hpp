// Small parameterised pieces: the scaled position table and ScaleMask.
#pragma once

#include <string>

#include "ldlm/core/parameter.hpp"
#include "ldlm/ops/embedding.hpp"
#include "ldlm/ops/modulate.hpp"

namespace ldlm::nn {

/// The learned position table; rows are scaled by d^-1/2 on use.
template <class S = float>
struct PositionalEmbedding {
  Parameter<S> table;  // [max_positions, d], state dict emb.weight (an nn.Embedding named emb)

  PositionalEmbedding() = default;
  PositionalEmbedding(Index max_positions, Index d) : table({max_positions, d}) {}

  Index max_positions() const { return table.shape()[0]; }

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    f(prefix + "emb.weight", table);
  }
  /// x[b*T + t] += E[t] · d^-1/2.
  void add_to(Context& ctx, Index T, MatRef<S> x) const { add_positions<S>(ctx, table.matrix(), T, x); }
};

/// ScaleMask: a Linear(1, 1) on the mask indicator; x · (1 + w·m + b) with m = 1.
template <class S = float>
struct ScaleMask {
  Parameter<S> weight{{1, 1}}, bias{{1}};  // state dict scale_mlp.weight, scale_mlp.bias

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    f(prefix + "scale_mlp.weight", weight);
    f(prefix + "scale_mlp.bias", bias);
  }
  /// y may alias x.
  void forward(Context& ctx, ConstMatRef<S> x, MatRef<S> y) const {
    scale_mask<S>(ctx, x, weight.data()[0], bias.data()[0], y);
  }
};

}  // namespace ldlm::nn
