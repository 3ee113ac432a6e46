// Feed-forward blocks. Each writes y, or (the denoiser's GeluMLP) adds to a gated
// residual; hidden activations live in the context's arena.
#pragma once

#include <string>
#include <type_traits>

#include "ldlm/nn/linear.hpp"
#include "ldlm/nn/norm.hpp"
#include "ldlm/ops/activation.hpp"

namespace ldlm::nn {

namespace detail {
/// y = down(activation(up(x))) for Linear or Conv1D maps, the hidden activations in
/// the context's arena, in the form down reads them when up can write it: on bf16
/// kernels up's product applies the activation and writes down's bf16 operand
/// itself, one pass over the hidden rows where the unfused order makes three (write,
/// activate, round for the next product). Either way the activation is computed in
/// fp32 and rounded to bf16 once. y is written, or a gated residual added to.
template <class S, class Up, class Down>
void up_activate_down(Context& ctx, const OperandRows<S>& x, const Up& up, Activation activation, const Down& down,
                      const Destination<S>& y) {
  Arena::Scope scope(ctx.arena());
  const auto h = OperandBuffer<S>::allocate(ctx.arena(), x.rows(), up.out_features(),
                                            common_form(up.input_form(), down.input_form()));  // [rows, h]
  up.forward(ctx, x, ActivatedRows<S>{h, activation});
  down.forward(ctx, h, y);
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

  /// Marks its maps as ones Precision::int8 quantizes (docs/model.md §int8).
  void quantize_at_int8() {
    for (Linear<S>* map : {&up, &down}) map->weight.quantize_at_int8();
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

  /// Marks its maps as ones Precision::int8 quantizes (docs/model.md §int8).
  void quantize_at_int8() {
    for (Linear<S>* map : {&gate_proj, &up_proj, &down_proj}) map->weight.quantize_at_int8();
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

  /// Marks its maps as ones Precision::int8 quantizes (docs/model.md §int8).
  void quantize_at_int8() {
    for (Linear<S>* map : {&fc1, &fc2}) map->weight.quantize_at_int8();
  }

  /// y = mlp(x), or y.residual += gate ⊙ mlp(x), fused into fc2's product on bf16
  /// kernels. y must not alias x.
  void forward(Context& ctx, const OperandRows<S>& x, const Destination<S>& y) const {
    detail::up_activate_down<S>(ctx, x, fc1, Activation::gelu_tanh, fc2, y);
  }
  RowForm input_form() const { return fc1.input_form(); }
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
  void forward(Context& ctx, const OperandRows<S>& x, const Destination<S>& y) const {
    detail::up_activate_down<S>(ctx, x, c_fc, Activation::gelu_tanh, c_proj, y);
  }
};

}  // namespace ldlm::nn
