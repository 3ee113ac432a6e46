// Feed-forward blocks. Each writes y (the residual add is the caller's); hidden
// activations live in the context's arena.
#pragma once

#include <string>
#include <type_traits>

#include "ldlm/nn/linear.hpp"
#include "ldlm/nn/norm.hpp"
#include "ldlm/ops/activation.hpp"

namespace ldlm::nn {

namespace detail {
/// up_activate_down on bf16 kernels, on `rows` float32 or bf16 rows x.
template <class Input, class Up, class Down, class Out>
void up_activate_down_bf16(Context& ctx, const Input& x, Index rows, const Up& up, Activation activation,
                           const Down& down, const Out& y) {
  Arena::Scope scope(ctx.arena());
  const PackedMatrix& up_packed = packed_for_bf16_rows(up.weight, "MLP");
  const PackedMatrix& down_packed = packed_for_bf16_rows(down.weight, "MLP");
  const Index hidden = up_packed.out_features();
  bf16* h = ctx.arena().allocate<bf16>(static_cast<std::size_t>(rows * hidden));  // [rows, h]
  linear_activated(ctx, x, up_packed, up.bias_data(), activation, h);
  gated_add_product(ctx, BF16Rows{h, rows, hidden, hidden}, down_packed, down.bias_data(), y);
}

/// y = down(activation(up(x))) for Linear or Conv1D maps, the hidden activations in
/// the context's arena. On bf16 kernels up's product applies the activation and
/// writes down's bf16 operand itself: one pass over the hidden rows where the
/// unfused order makes three (write, activate, round for the next product). Either
/// way the activation is computed in fp32 and rounded to bf16 once.
/// `y` is a MatRef<S> the result is written to, or a GatedResidual<S> it is added to.
template <class S, class Up, class Down, class Out>
void up_activate_down(Context& ctx, ConstMatRef<S> x, const Up& up, Activation activation, const Down& down,
                      const Out& y) {
  if constexpr (std::is_same_v<S, float>)
    if (up.bf16_operands() && down.bf16_operands())
      return up_activate_down_bf16(ctx, x, x.rows(), up, activation, down, y);
  Arena::Scope scope(ctx.arena());
  const Index rows = x.rows(), hidden = up.out_features();
  MatrixMap<S> h(ctx.arena().allocate<S>(rows * hidden), rows, hidden);  // [rows, h]
  up.forward(ctx, x, h, per_row_epilogue<S>(activation_inplace<S>(activation)));
  forward_gated_add<S>(ctx, down, h, y);
}
}  // namespace detail

/// Perceiver FFN: LayerNorm → Linear(d, h) → GELU(erf) → Dropout → Linear(h, d).
template <class S = float>
struct PerceiverFFN {
  // State dict ffd.0, ffd.1 and ffd.4: indices in a Sequential whose .2 is the GELU
  // and .3 the Dropout.
  LayerNorm<S> norm;
  Linear<S> up, down;

  PerceiverFFN() = default;
  PerceiverFFN(Index d, Index hidden, double eps) : norm(d, eps), up(d, hidden, true), down(hidden, d, true) {}

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    norm.visit(prefix + "ffd.0.", f);
    up.visit(prefix + "ffd.1.", f);
    down.visit(prefix + "ffd.4.", f);
  }

  /// y must not alias x.
  void forward(Context& ctx, ConstMatRef<S> x, MatRef<S> y) const {
    Arena::Scope scope(ctx.arena());
    MatrixMap<S> n(ctx.arena().allocate<S>(x.rows() * x.cols()), x.rows(), x.cols());  // [rows, d]
    norm.forward(ctx, x, n);
    detail::up_activate_down<S>(ctx, n, up, Activation::gelu_erf, down, y);
  }
};

/// SwiGLU: down(silu(gate(x)) ⊙ up(x)), no biases.
template <class S = float>
struct SwiGLU {
  Linear<S> gate_proj, up_proj, down_proj;

  SwiGLU() = default;
  SwiGLU(Index d, Index hidden) : gate_proj(d, hidden, false), up_proj(d, hidden, false), down_proj(hidden, d, false) {}

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    gate_proj.visit(prefix + "gate_proj.", f);
    up_proj.visit(prefix + "up_proj.", f);
    down_proj.visit(prefix + "down_proj.", f);
  }

  /// y must not alias x.
  void forward(Context& ctx, ConstMatRef<S> x, MatRef<S> y) const {
    Arena::Scope scope(ctx.arena());
    const Index rows = x.rows(), hidden = gate_proj.out_features();
    MatrixMap<S> g(ctx.arena().allocate<S>(rows * hidden), rows, hidden);  // [rows, h]
    MatrixMap<S> u(ctx.arena().allocate<S>(rows * hidden), rows, hidden);  // [rows, h]
    gate_proj.forward(ctx, x, g, per_row_epilogue<S>(silu_inplace<S>));
    up_proj.forward(ctx, x, u);
    g.array() *= u.array();
    down_proj.forward(ctx, g, y);
  }
};

/// Linear → GELU(tanh) → Linear with biases: the denoiser MLP.
template <class S = float>
struct GeluMLP {
  Linear<S> fc1, fc2;  // state dict 0 and 2: indices in a Sequential whose .1 is the GELU

  GeluMLP() = default;
  GeluMLP(Index d, Index hidden) : fc1(d, hidden, true), fc2(hidden, d, true) {}

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    fc1.visit(prefix + "0.", f);
    fc2.visit(prefix + "2.", f);
  }

  /// y must not alias x.
  void forward(Context& ctx, ConstMatRef<S> x, MatRef<S> y) const {
    detail::up_activate_down<S>(ctx, x, fc1, Activation::gelu_tanh, fc2, y);
  }
  /// out.residual += gate ⊙ mlp(x), fused into fc2's product on bf16 kernels. x must
  /// not alias the residual.
  void forward(Context& ctx, ConstMatRef<S> x, const GatedResidual<S>& out) const {
    detail::up_activate_down<S>(ctx, x, fc1, Activation::gelu_tanh, fc2, out);
  }
  /// The same on bf16 rows x, when takes_bf16_rows().
  void forward(Context& ctx, BF16Rows x, const GatedResidual<S>& out) const {
    detail::up_activate_down_bf16(ctx, x, x.rows, fc1, Activation::gelu_tanh, fc2, out);
  }
  bool takes_bf16_rows() const { return fc1.bf16_operands() && fc2.bf16_operands(); }
};

/// GPT-2 MLP: Conv1D c_fc → GELU(tanh) → Conv1D c_proj.
template <class S = float>
struct GPT2MLP {
  Conv1D<S> c_fc, c_proj;

  GPT2MLP() = default;
  GPT2MLP(Index d, Index hidden, Role role) : c_fc(d, hidden, role), c_proj(hidden, d, role) {}

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    c_fc.visit(prefix + "c_fc.", f);
    c_proj.visit(prefix + "c_proj.", f);
  }

  /// y must not alias x.
  void forward(Context& ctx, ConstMatRef<S> x, MatRef<S> y) const {
    detail::up_activate_down<S>(ctx, x, c_fc, Activation::gelu_tanh, c_proj, y);
  }
};

}  // namespace ldlm::nn
