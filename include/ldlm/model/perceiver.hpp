// The Perceiver latent encoder (docs/model.md §Latent encoder) and latent
// decoder (docs/model.md §Latent decoder).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ldlm/model/attention_config.hpp"
#include "ldlm/model/common.hpp"
#include "ldlm/model/config.hpp"
#include "ldlm/nn/attention.hpp"
#include "ldlm/nn/embedding.hpp"
#include "ldlm/nn/mlp.hpp"

namespace ldlm {

template <class S = float>
class LatentEncoder {
 public:
  /// The module's name in LDLM (for_each_module): its state-dict prefix without the dot,
  /// and the module its errors and Context::block_observer name.
  static constexpr std::string_view kName = "encoder";

  struct Block {
    nn::LatentAttention<S> latent_attn;
    nn::PerceiverFFN<S> ffn_latent;

    Block() = default;
    explicit Block(const Config& c)
        : latent_attn(latent_attention_config(c)), ffn_latent(c.d_model, c.mlp_hidden(), c.layer_norm_eps) {
      latent_attn.quantize_at_int8();
      ffn_latent.quantize_at_int8();
    }

    template <class F>
    void visit(const std::string& prefix, F&& f) {
      latent_attn.visit(prefix + "latent_attn.", f);
      ffn_latent.visit(prefix + "ffn_latent.", f);
    }
  };

  Config config;
  Parameter<S> latents;  // [max_positions, d], learned
  nn::PositionalEmbedding<S> positional_emb;
  nn::RMSNorm<S> latent_norm, output_norm;
  std::vector<Block> latent_layers;  // state dict latent_layers.{i}

  explicit LatentEncoder(const Config& c = Config{})
      : config(c),
        latents({c.max_positions, c.d_model}),
        positional_emb(c.max_positions, c.d_model),
        latent_norm(c.d_model, c.rms_norm_eps),
        output_norm(c.d_model, c.rms_norm_eps),
        latent_layers(c.encoder_layers, Block(c)) {}

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    f(prefix + "latents", latents);
    positional_emb.visit(prefix + "positional_emb.", f);
    latent_norm.visit(prefix + "latent_norm.", f);
    output_norm.visit(prefix + "output_norm.", f);
    for (std::size_t i = 0; i < latent_layers.size(); ++i)
      latent_layers[i].visit(prefix + "latent_layers." + std::to_string(i) + ".", f);
  }

  /// Row form: h, z0: [B*T, d].
  void forward(Context& ctx, ConstMatRef<S> h, Index B, Index T, MatRef<S> z0) const {
    Arena::Scope scope(ctx.arena());
    const Index rows = B * T, d = config.d_model;
    MatrixMap<S> e(ctx.arena().allocate<S>(rows * d), rows, d);    // [B*T, d] context
    MatrixMap<S> z(ctx.arena().allocate<S>(rows * d), rows, d);    // [B*T, d] latents
    MatrixMap<S> out(ctx.arena().allocate<S>(rows * d), rows, d);  // [B*T, d]
    e = h;
    positional_emb.add_to(ctx, T, e);
    latent_norm.forward(ctx, latents.matrix().topRows(T), z.topRows(T));  // RMSNorm(latents[:T])
    for (Index b = 1; b < B; ++b) z.middleRows(b * T, T) = z.topRows(T);
    observe_block<S>(ctx, kName, "context", e);
    observe_block<S>(ctx, kName, "input", z);
    for (std::size_t i = 0; i < latent_layers.size(); ++i) {
      const Block& block = latent_layers[i];
      block.latent_attn.forward(ctx, e, T, z, B, T, out);
      z += out;
      block.ffn_latent.forward(ctx, z, out);
      z += out;
      observe_block<S>(ctx, kName, "latent_layers", i, z);
    }
    output_norm.forward(ctx, z, z0);
    check_finite<S>(ctx, kName, "latents", z0);
  }

  /// features [B, T, d] -> latents [B, T, d].
  Tensor3<S> forward(Context& ctx, const Tensor3<S>& features) const {
    check_activation_shape(kName, "features", features, config);
    Tensor3<S> z0(features.dimension(0), features.dimension(1), config.d_model);
    forward(ctx, as_matrix(features), features.dimension(0), features.dimension(1), as_matrix(z0));
    return z0;
  }
};

template <class S = float>
class LatentDecoder {
 public:
  /// The module's name in LDLM (for_each_module): its state-dict prefix without the dot,
  /// and the module its errors and Context::block_observer name.
  static constexpr std::string_view kName = "latent_decoder";

  struct Block {
    nn::LatentAttention<S> latent_attn;
    nn::ScaleMask<S> attn_scale;
    nn::PerceiverFFN<S> ffn_latent;
    nn::ScaleMask<S> ffn_scale;

    Block() = default;
    explicit Block(const Config& c)
        : latent_attn(latent_attention_config(c)), ffn_latent(c.d_model, c.mlp_hidden(), c.layer_norm_eps) {
      latent_attn.quantize_at_int8();
      ffn_latent.quantize_at_int8();
    }

    template <class F>
    void visit(const std::string& prefix, F&& f) {
      latent_attn.visit(prefix + "latent_attn.", f);
      attn_scale.visit(prefix + "attn_scale.", f);
      ffn_latent.visit(prefix + "ffn_latent.", f);
      ffn_scale.visit(prefix + "ffn_scale.", f);
    }
  };

  Config config;
  Parameter<S> mask_vector;  // [d], frozen copy of GPT-2's mask-token row
  nn::PositionalEmbedding<S> positional_emb;
  nn::PerceiverFFN<S> embedding_ffn;
  nn::ScaleMask<S> scale_embedding;
  std::vector<Block> layers;  // state dict layers.{i}

  explicit LatentDecoder(const Config& c = Config{})
      : config(c),
        mask_vector({c.d_model}, Role::frozen),
        positional_emb(c.max_positions, c.d_model),
        embedding_ffn(c.d_model, c.mlp_hidden(), c.layer_norm_eps),
        layers(c.latent_decoder_layers, Block(c)) {
    embedding_ffn.quantize_at_int8();
  }

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    f(prefix + "mask_vector", mask_vector);
    positional_emb.visit(prefix + "positional_emb.", f);
    embedding_ffn.visit(prefix + "embedding_ffn.", f);
    scale_embedding.visit(prefix + "scale_embedding.", f);
    for (std::size_t i = 0; i < layers.size(); ++i) layers[i].visit(prefix + "layers." + std::to_string(i) + ".", f);
  }

  /// Row form: z, hidden: [B*T, d].
  void forward(Context& ctx, ConstMatRef<S> z, Index B, Index T, MatRef<S> hidden) const {
    Arena::Scope scope(ctx.arena());
    const Index rows = B * T, d = config.d_model;
    MatrixMap<S> c(ctx.arena().allocate<S>(rows * d), rows, d);    // [B*T, d] context
    MatrixMap<S> out(ctx.arena().allocate<S>(rows * d), rows, d);  // [B*T, d]
    MatrixMap<S> query(ctx.arena().allocate<S>(d), 1, d);          // [1, d]
    MatrixMap<S> x(ctx.arena().allocate<S>(rows * d), rows, d);    // [B*T, d] queries
    // Every query is the mask vector, through the FFN and the ScaleMask, plus positions.
    embedding_ffn.forward(ctx, mask_vector.matrix(), query);
    scale_embedding.forward(ctx, query, query);
    x.rowwise() = query.row(0);
    positional_emb.add_to(ctx, T, x);
    c = z;
    positional_emb.add_to(ctx, T, c);
    observe_block<S>(ctx, kName, "context", c);
    observe_block<S>(ctx, kName, "input", x);
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const Block& block = layers[i];
      block.latent_attn.forward(ctx, c, T, x, B, T, out);
      block.attn_scale.forward(ctx, out, out);
      x += out;
      block.ffn_latent.forward(ctx, x, out);
      block.ffn_scale.forward(ctx, out, out);
      x += out;
      observe_block<S>(ctx, kName, "layers", i, x);
    }
    hidden = x;
    check_finite<S>(ctx, kName, "hidden", hidden);
  }

  /// latents [B, T, d] -> hidden [B, T, d].
  Tensor3<S> forward(Context& ctx, const Tensor3<S>& latents) const {
    check_activation_shape(kName, "latents", latents, config);
    Tensor3<S> hidden(latents.dimension(0), latents.dimension(1), config.d_model);
    forward(ctx, as_matrix(latents), latents.dimension(0), latents.dimension(1), as_matrix(hidden));
    return hidden;
  }
};

}  // namespace ldlm
