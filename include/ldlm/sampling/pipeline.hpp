// The end-to-end pipeline of docs/model.md §Pipeline over an LDLM:
//   encode:      tokens -> GPT-2 features -> latent encoder -> latents
//   decode:      latents -> latent decoder -> hidden -> token decoder -> logits -> argmax
//   reconstruct: encode, then decode
//   generate:    x_1 ~ N(0, I) -> N denoiser steps (sampler.hpp) -> decode
// Each stage needs only the modules it runs to be loaded or initialised:
// generate uses the denoiser, latent_decoder and token_decoder; encode uses the
// feature_model and encoder.
#pragma once

#include <algorithm>

#include "ldlm/model/model.hpp"
#include "ldlm/ops/argmax.hpp"
#include "ldlm/sampling/sampler.hpp"

namespace ldlm {

template <class S>
struct Decoded {
  Tensor3<S> hidden;   // [B, T, d], latent decoder output (≈ GPT-2 features)
  Tensor3<S> logits;   // [B, T, V]
  TokenTensor tokens;  // [B, T], argmax of logits (lowest id on ties)
};

template <class S>
struct Reconstruction {
  Tensor3<S> features;  // [B, T, d]
  Tensor3<S> latents;   // [B, T, d]
  Tensor3<S> hidden;    // [B, T, d]
  Tensor3<S> logits;    // [B, T, V]
  TokenTensor tokens;   // [B, T]
};

/// Runs the LDLM stages. Holds a reference: the model must outlive the pipeline.
template <class S = float>
class Pipeline {
 public:
  explicit Pipeline(const LDLM<S>& model) : model_(&model) {}
  explicit Pipeline(const LDLM<S>&&) = delete;  // would dangle

  const LDLM<S>& model() const { return *model_; }

  /// tokens [B, T] -> latents z0 [B, T, d].
  Tensor3<S> encode(Context& ctx, const TokenTensor& tokens) const {
    return model_->encoder.forward(ctx, model_->feature_model.forward(ctx, tokens));
  }

  /// latents [B, T, d] -> hidden, logits and argmax tokens.
  Decoded<S> decode(Context& ctx, const Tensor3<S>& latents) const {
    Decoded<S> out;
    out.hidden = model_->latent_decoder.forward(ctx, latents);
    out.logits = model_->token_decoder.forward(ctx, out.hidden);
    out.tokens = TokenTensor(latents.dimension(0), latents.dimension(1));
    argmax_rows<S>(as_matrix(out.logits), out.tokens.data());
    return out;
  }

  /// latents [B, T, d] -> argmax tokens only. The logits are computed kLogitRows rows
  /// at a time and never held whole: at T = 1024 they would be [1024, 50259] floats,
  /// 206 MB, more than the rest of generation's working memory.
  TokenTensor decode_tokens(Context& ctx, const Tensor3<S>& latents) const {
    const Index B = latents.dimension(0), T = latents.dimension(1), rows = B * T;
    const auto& token_decoder = model_->token_decoder;
    const Index d = token_decoder.config.d_model, V = token_decoder.config.vocab_size;
    const Tensor3<S> hidden = model_->latent_decoder.forward(ctx, latents);
    Matrix<S> normed(rows, d);
    token_decoder.forward_to_head(ctx, as_matrix(hidden), B, T, normed);
    Matrix<S> logits(std::min(rows, kLogitRows), V);
    TokenTensor tokens(B, T);
    for (Index r = 0; r < rows; r += kLogitRows) {
      const Index n = std::min(kLogitRows, rows - r);
      auto block = logits.topRows(n);
      token_decoder.lm_head.forward(ctx, normed.middleRows(r, n), block);
      check_finite<S>(ctx, token_decoder.kName, "logits", block);
      argmax_rows<S>(block, tokens.data() + r);
    }
    return tokens;
  }

  /// tokens -> every intermediate of encode-then-decode.
  Reconstruction<S> reconstruct(Context& ctx, const TokenTensor& tokens) const {
    Reconstruction<S> r;
    r.features = model_->feature_model.forward(ctx, tokens);
    r.latents = model_->encoder.forward(ctx, r.features);
    Decoded<S> d = decode(ctx, r.latents);
    r.hidden = std::move(d.hidden);
    r.logits = std::move(d.logits);
    r.tokens = std::move(d.tokens);
    return r;
  }

  /// Samples latents [B, T, d] with the denoiser (see sample_latents in sampler.hpp);
  /// `stats`, if given, receives the steps and denoiser calls made.
  Tensor3<S> sample(Context& ctx, Index B, Index T, const SamplerOptions& options,
                    SamplingStats* stats = nullptr) const {
    return detail::sample_latent_tensor("generate", ctx, model_->denoiser, B, T, options, stats);
  }

  /// B sequences of T tokens: sample, then decode. Throws InvalidArgument for B < 1,
  /// T outside [1, max_positions] or steps < 1, SamplingCancelled if the progress
  /// callback returns false.
  TokenTensor generate(Context& ctx, Index B, Index T, const SamplerOptions& options,
                       SamplingStats* stats = nullptr) const {
    return decode_tokens(ctx, sample(ctx, B, T, options, stats));
  }

 private:
  static constexpr Index kLogitRows = 128;
  const LDLM<S>* model_;
};

}  // namespace ldlm
