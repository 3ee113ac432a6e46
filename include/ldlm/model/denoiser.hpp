// The diffusion denoiser (docs/model.md §Denoiser): DDiT blocks (Diffusion
// Transformer blocks of the DiT family, conditioned through adaLN modulation), predicting
// x̂0 from (x_t, t, x̂0 of the previous step).
#pragma once

#include <string>
#include <string_view>

#include "ldlm/model/attention_config.hpp"
#include "ldlm/model/common.hpp"
#include "ldlm/model/config.hpp"
#include "ldlm/nn/attention.hpp"
#include "ldlm/nn/mlp.hpp"
#include "ldlm/ops/embedding.hpp"
#include "ldlm/ops/modulate.hpp"

namespace ldlm {

template <class S = float>
class Denoiser {
 public:
  /// The module's name in LDLM (for_each_module): its state-dict prefix without the dot,
  /// and the module its errors and Context::block_observer name.
  static constexpr std::string_view kName = "denoiser";

  /// One DDiT block (the MDLM/Duo name): adaLN chunks (shift, scale, gate) × (attention, MLP).
  struct Block {
    nn::LayerNormGain<S> norm1, norm2;
    nn::FusedSelfAttention<S> attn;
    nn::GeluMLP<S> mlp;
    nn::Linear<S> adaLN_modulation;

    Block() = default;
    explicit Block(const Config& c)
        : norm1(c.d_model, c.layer_norm_eps),
          norm2(c.d_model, c.layer_norm_eps),
          attn(denoiser_attention_config(c)),
          mlp(c.d_model, c.mlp_hidden()),
          adaLN_modulation(c.d_model, 6 * c.d_model, true) {
      // int8 quantizes these four maps, nearly all of the block's products; adaLN, the
      // conditioning, stays bf16 (docs/model.md §int8).
      attn.quantize_at_int8();
      mlp.quantize_at_int8();
    }

    template <class F>
    void visit(const std::string& prefix, F&& f) {
      norm1.visit(prefix + "norm1.", f);
      norm2.visit(prefix + "norm2.", f);
      attn.visit(prefix, f);
      mlp.visit(prefix + "mlp.", f);
      adaLN_modulation.visit(prefix + "adaLN_modulation.", f);
    }

    /// x: [B*T, d], updated in place; c: [B, d] conditioning (after SiLU).
    void forward(Context& ctx, MatRef<S> x, ConstMatRef<S> c, Index B, Index T, const RotaryTable<S>& rotary) const {
      Arena::Scope scope(ctx.arena());
      const Index rows = B * T, d = x.cols();
      MatrixMap<S> ada(ctx.arena().allocate<S>(B * 6 * d), B, 6 * d);  // [B, 6d]
      adaLN_modulation.forward(ctx, c, ada);
      // Chunks 0-5: shift, scale, gate of the attention, then of the MLP.
      auto chunk = [&](int i) { return ada.middleCols(i * d, d); };
      // The normed rows y, in the form the sublayers' first products read (bf16 rows
      // on bf16 kernels: the norm rounds them once, as those products would).
      const auto y = OperandBuffer<S>::allocate(ctx.arena(), rows, d, common_form(attn.input_form(), mlp.input_form()));
      auto norm_into_y = [&](const nn::LayerNormGain<S>& norm, int shift, int scale) {
        y.write([&](auto out) { norm.forward_modulated(ctx, x, chunk(shift), chunk(scale), T, out); });
      };
      norm_into_y(norm1, 0, 1);
      attn.forward(ctx, y, B, T, &rotary, GatedResidual<S>{x, chunk(2), T});  // x += gate ⊙ attn(y)
      norm_into_y(norm2, 3, 4);
      mlp.forward(ctx, y, GatedResidual<S>{x, chunk(5), T});
    }
  };

  /// adaLN (shift and scale only) on the final norm, then the projection.
  struct OutputLayer {
    nn::LayerNormGain<S> norm_final;  // the documented 768 parameters
    nn::Linear<S> adaLN_modulation, linear;

    explicit OutputLayer(const Config& c)
        : norm_final(c.d_model, c.layer_norm_eps),
          adaLN_modulation(c.d_model, 2 * c.d_model, true),
          linear(c.d_model, c.d_model, true) {}

    template <class F>
    void visit(const std::string& prefix, F&& f) {
      norm_final.visit(prefix + "norm_final.", f);
      adaLN_modulation.visit(prefix + "adaLN_modulation.", f);
      linear.visit(prefix + "linear.", f);
    }
  };

  Config config;
  nn::Linear<S> input_proj;  // [d, 2d], on concat(x_t, self_cond)
  // State dict time_emb.0 and time_emb.2: indices in a Sequential whose .1 is the SiLU.
  nn::Linear<S> time_fc1, time_fc2;
  std::vector<Block> blocks;
  OutputLayer output_layer;

  explicit Denoiser(const Config& c = Config{})
      : config(c),
        input_proj(2 * c.d_model, c.d_model, false),
        time_fc1(c.d_model, 2 * c.d_model, true),
        time_fc2(2 * c.d_model, c.d_model, true),
        blocks(c.denoiser_blocks, Block(c)),
        output_layer(c) {}

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    input_proj.visit(prefix + "input_proj.", f);
    time_fc1.visit(prefix + "time_emb.0.", f);
    time_fc2.visit(prefix + "time_emb.2.", f);
    for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i].visit(prefix + "blocks." + std::to_string(i) + ".", f);
    output_layer.visit(prefix + "output_layer.", f);
  }

  /// c = silu(time_emb(timestep_embedding(t))): [B, d].
  void condition(Context& ctx, const S* t, Index B, MatRef<S> c) const {
    Arena::Scope scope(ctx.arena());
    const Index d = config.d_model;
    MatrixMap<S> emb(ctx.arena().allocate<S>(B * d), B, d);        // [B, d]
    MatrixMap<S> h(ctx.arena().allocate<S>(B * 2 * d), B, 2 * d);  // [B, 2d]
    timestep_embedding<S>(t, B, config.time_max_period, config.time_embedding_flip, emb);
    time_fc1.forward(ctx, emb, h);
    silu_inplace(h.data(), h.size());
    time_fc2.forward(ctx, h, c);
    silu_inplace(c.data(), c.size());
  }

  /// Row form: x_t, self_cond, x0: [B*T, d]; t: [B]. `rotary` must cover T.
  void forward(Context& ctx, ConstMatRef<S> x_t, const S* t, ConstMatRef<S> self_cond, Index B, Index T,
               const RotaryTable<S>& rotary, MatRef<S> x0) const {
    Arena::Scope scope(ctx.arena());
    const Index rows = B * T, d = config.d_model;
    MatrixMap<S> x(ctx.arena().allocate<S>(rows * d), rows, d);      // [B*T, d]
    MatrixMap<S> c(ctx.arena().allocate<S>(B * d), B, d);            // [B, d]
    MatrixMap<S> ada(ctx.arena().allocate<S>(B * 2 * d), B, 2 * d);  // [B, 2d] = shift | scale
    {
      // Given back before the blocks run: at T 1024 it is 6.3 MB of the sampler's peak.
      Arena::Scope input_scope(ctx.arena());
      MatrixMap<S> in(ctx.arena().allocate<S>(rows * 2 * d), rows, 2 * d);  // [B*T, 2d] = x_t | self_cond
      in.leftCols(d) = x_t;
      in.rightCols(d) = self_cond;
      input_proj.forward(ctx, in, x);
    }
    condition(ctx, t, B, c);
    observe_block<S>(ctx, kName, "input", x);
    observe_block<S>(ctx, kName, "condition", c);
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      blocks[i].forward(ctx, x, c, B, T, rotary);
      observe_block<S>(ctx, kName, "blocks", i, x);
    }
    output_layer.adaLN_modulation.forward(ctx, c, ada);
    output_layer.norm_final.forward_modulated(ctx, x, ada.leftCols(d), ada.rightCols(d), T, x);
    observe_block<S>(ctx, kName, "output_layer.linear.input", x);
    output_layer.linear.forward(ctx, x, x0);
    check_finite<S>(ctx, kName, "x0", x0);
  }

  /// Tensor form: x_t, self_cond [B, T, d]; t [B] finite. Returns x̂0 [B, T, d].
  Tensor3<S> forward(Context& ctx, const Tensor3<S>& x_t, const Tensor1<S>& t, const Tensor3<S>& self_cond) const {
    check_activation_shape(kName, "x_t", x_t, config);
    const Index B = x_t.dimension(0), T = x_t.dimension(1);
    check_shape(kName, "self_cond", {B, T, config.d_model}, shape_of(self_cond));
    check_shape(kName, "t", {B}, shape_of(t));
    for (Index b = 0; b < B; ++b)
      if (!std::isfinite(t(b)))
        throw InvalidArgument(std::string(kName) + ": tensor 't' has a non-finite value at index " + std::to_string(b));
    Tensor3<S> x0(B, T, config.d_model);
    Arena::Scope scope(ctx.arena());
    const auto rotary = make_rotary_table<S>(ctx.arena(), T, config.head_dim, config.rope_base);
    forward(ctx, as_matrix(x_t), t.data(), as_matrix(self_cond), B, T, rotary, as_matrix(x0));
    return x0;
  }
};

}  // namespace ldlm
