// The token decoder (docs/model.md §Token decoder): pre-norm blocks with rotary self-attention and
// SwiGLU, then a gain-only norm and a bias-free vocabulary head.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ldlm/model/attention_config.hpp"
#include "ldlm/model/common.hpp"
#include "ldlm/model/config.hpp"
#include "ldlm/nn/attention.hpp"
#include "ldlm/nn/mlp.hpp"

namespace ldlm {

template <class S = float>
class TokenDecoder {
 public:
  /// The module's name in LDLM (for_each_module): its state-dict prefix without the dot,
  /// and the module its errors and Context::block_observer name.
  static constexpr std::string_view kName = "token_decoder";

  struct Block {
    nn::LayerNormGain<S> norm1, norm2;
    nn::SelfAttention<S> attn;
    nn::SwiGLU<S> mlp;

    Block() = default;
    explicit Block(const Config& c)
        : norm1(c.d_model, c.layer_norm_eps),
          norm2(c.d_model, c.layer_norm_eps),
          attn(token_decoder_attention_config(c)),
          mlp(c.d_model, c.token_decoder_mlp_hidden) {
      attn.quantize_at_int8();
      mlp.quantize_at_int8();
    }

    template <class F>
    void visit(const std::string& prefix, F&& f) {
      norm1.visit(prefix + "norm1.", f);
      attn.visit(prefix + "attn.", f);
      norm2.visit(prefix + "norm2.", f);
      mlp.visit(prefix + "mlp.", f);
    }
  };

  Config config;
  std::vector<Block> blocks;
  nn::LayerNormGain<S> norm_final;
  nn::Linear<S> lm_head;  // [V, d], no bias

  explicit TokenDecoder(const Config& c = Config{})
      : config(c),
        blocks(c.token_decoder_layers, Block(c)),
        norm_final(c.d_model, c.layer_norm_eps),
        lm_head(c.d_model, c.vocab_size, false) {
    lm_head.weight.quantize_at_int8();
  }

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i].visit(prefix + "blocks." + std::to_string(i) + ".", f);
    norm_final.visit(prefix + "norm_final.", f);
    lm_head.visit(prefix + "lm_head.", f);
  }

  /// Row form: hidden [B*T, d] -> norm_final(blocks(hidden)) [B*T, d], the input of
  /// lm_head; `normed` must not alias `hidden`.
  void forward_to_head(Context& ctx, ConstMatRef<S> hidden, Index B, Index T, MatRef<S> normed) const {
    Arena::Scope scope(ctx.arena());
    const Index rows = B * T, d = config.d_model;
    MatrixMap<S> x(ctx.arena().allocate<S>(rows * d), rows, d);    // [B*T, d]
    MatrixMap<S> out(ctx.arena().allocate<S>(rows * d), rows, d);  // [B*T, d]
    RotaryTable<S> rotary;
    if (config.token_decoder_rotary) rotary = make_rotary_table<S>(ctx.arena(), T, config.head_dim, config.rope_base);
    x = hidden;
    observe_block<S>(ctx, kName, "input", x);
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const Block& block = blocks[i];
      block.norm1.forward(ctx, x, normed);
      block.attn.forward(ctx, normed, B, T, config.token_decoder_rotary ? &rotary : nullptr, out);
      x += out;
      block.norm2.forward(ctx, x, normed);
      block.mlp.forward(ctx, normed, out);
      x += out;
      observe_block<S>(ctx, kName, "blocks", i, x);
    }
    norm_final.forward(ctx, x, normed);
    observe_block<S>(ctx, kName, "lm_head.input", normed);
  }

  /// Row form: hidden [B*T, d] -> logits [B*T, V].
  void forward(Context& ctx, ConstMatRef<S> hidden, Index B, Index T, MatRef<S> logits) const {
    Arena::Scope scope(ctx.arena());
    MatrixMap<S> normed(ctx.arena().allocate<S>(B * T * config.d_model), B * T, config.d_model);  // [B*T, d]
    forward_to_head(ctx, hidden, B, T, normed);
    lm_head.forward(ctx, normed, logits);
    check_finite<S>(ctx, kName, "logits", logits);
  }

  /// hidden [B, T, d] -> logits [B, T, V].
  Tensor3<S> forward(Context& ctx, const Tensor3<S>& hidden) const {
    check_activation_shape(kName, "hidden", hidden, config);
    const Index B = hidden.dimension(0), T = hidden.dimension(1);
    Tensor3<S> logits(B, T, config.vocab_size);
    forward(ctx, as_matrix(hidden), B, T, as_matrix(logits));
    return logits;
  }
};

}  // namespace ldlm
