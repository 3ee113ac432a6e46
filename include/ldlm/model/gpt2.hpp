// The frozen GPT-2 feature model (docs/model.md §Feature model): Hugging Face layout, causal, cut
// after block gpt2_feature_layers - 1. Every block and ln_f are still owned (and
// loaded and counted), but only the blocks the features need are run.
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
class GPT2Features {
 public:
  /// The module's name in LDLM (for_each_module): its state-dict prefix without the dot,
  /// and the module its errors and Context::block_observer name.
  static constexpr std::string_view kName = "feature_model";

  struct Block {
    nn::LayerNorm<S> ln_1;
    nn::GPT2Attention<S> attn;
    nn::LayerNorm<S> ln_2;
    nn::GPT2MLP<S> mlp;

    template <class F>
    void visit(const std::string& prefix, F&& f) {
      ln_1.visit(prefix + "ln_1.", f);
      attn.visit(prefix + "attn.", f);
      ln_2.visit(prefix + "ln_2.", f);
      mlp.visit(prefix + "mlp.", f);
    }
  };

  Config config;
  Parameter<S> wte, wpe;  // [V, d], [max_positions, d]; state dict wte.weight, wpe.weight
  std::vector<Block> h;   // state dict h.{i}, Hugging Face's name for GPT-2's blocks
  nn::LayerNorm<S> ln_f;

  explicit GPT2Features(const Config& c = Config{})
      : config(c),
        wte({c.vocab_size, c.d_model}, Role::frozen),
        wpe({c.max_positions, c.d_model}, Role::frozen),
        h(c.gpt2_layers, Block{nn::LayerNorm<S>(c.d_model, c.layer_norm_eps, Role::frozen),
                               nn::GPT2Attention<S>(gpt2_attention_config(c), Role::frozen),
                               nn::LayerNorm<S>(c.d_model, c.layer_norm_eps, Role::frozen),
                               nn::GPT2MLP<S>(c.d_model, c.mlp_hidden(), Role::frozen)}),
        ln_f(c.d_model, c.layer_norm_eps, Role::frozen) {}

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    f(prefix + "wte.weight", wte);
    f(prefix + "wpe.weight", wpe);
    for (std::size_t i = 0; i < h.size(); ++i) h[i].visit(prefix + "h." + std::to_string(i) + ".", f);
    ln_f.visit(prefix + "ln_f.", f);
  }

  /// Row form: tokens [B*T] (already validated), features [B*T, d].
  void forward(Context& ctx, const std::int64_t* tokens, Index B, Index T, MatRef<S> features) const {
    Arena::Scope scope(ctx.arena());
    const Index rows = B * T, d = config.d_model;
    MatrixMap<S> x(ctx.arena().allocate<S>(rows * d), rows, d);    // [B*T, d]
    MatrixMap<S> y(ctx.arena().allocate<S>(rows * d), rows, d);    // [B*T, d]
    MatrixMap<S> out(ctx.arena().allocate<S>(rows * d), rows, d);  // [B*T, d]
    const auto wte_m = wte.matrix();
    const auto wpe_m = wpe.matrix();
    for (Index r = 0; r < rows; ++r) x.row(r) = wte_m.row(tokens[r]) + wpe_m.row(r % T);
    observe_block<S>(ctx, kName, "input", x);
    for (Index i = 0; i < config.gpt2_feature_layers; ++i) {
      const Block& block = h[static_cast<std::size_t>(i)];
      block.ln_1.forward(ctx, x, y);
      block.attn.forward(ctx, y, B, T, out);
      x += out;
      block.ln_2.forward(ctx, x, y);
      block.mlp.forward(ctx, y, out);
      x += out;
      observe_block<S>(ctx, kName, "h", static_cast<std::size_t>(i), x);
    }
    features = x;
    check_finite<S>(ctx, kName, "features", features);
  }

  /// tokens [B, T] with ids in [0, V) -> features [B, T, d] (hidden state gpt2_feature_layers).
  Tensor3<S> forward(Context& ctx, const TokenTensor& tokens) const {
    check_tokens(tokens);
    const Index B = tokens.dimension(0), T = tokens.dimension(1);
    Tensor3<S> features(B, T, config.d_model);
    forward(ctx, tokens.data(), B, T, as_matrix(features));
    return features;
  }

  void check_tokens(const TokenTensor& tokens) const {
    const Index B = tokens.dimension(0), T = tokens.dimension(1);
    if (B < 1 || T < 1 || T > config.max_positions)
      throw ShapeError(std::string(kName) + ": tensor 'tokens' has shape " + shape_string(shape_of(tokens)) +
                       "; need B >= 1 and 1 <= T <= max_positions = " + std::to_string(config.max_positions));
    check_batch_fits(kName, B, T, config);
    for (Index i = 0; i < tokens.size(); ++i)
      if (tokens.data()[i] < 0 || tokens.data()[i] >= config.vocab_size)
        throw InvalidArgument(std::string(kName) + ": tensor 'tokens' has id " + std::to_string(tokens.data()[i]) +
                              " at [" + std::to_string(i / T) + ", " + std::to_string(i % T) +
                              "], outside the vocabulary [0, " + std::to_string(config.vocab_size) + ")");
  }
};

}  // namespace ldlm
