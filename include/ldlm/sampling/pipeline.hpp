// The end-to-end pipeline of docs/model.md §Pipeline over an LDLM:
//   encode:      tokens -> GPT-2 features -> latent encoder -> latents
//   decode:      latents -> latent decoder -> hidden -> token decoder -> logits -> argmax
//   reconstruct: encode, then decode
//   generate:    x_1 ~ N(0, I) -> N denoiser steps (sampler.hpp) -> decode
//   generate with known tokens (docs/model.md §Conditioning): encode the known ids,
//                sample with their latents as a condition (condition.hpp), decode, and
//                put the known ids back
// Each stage needs only the modules it runs to be loaded or initialised:
// generate uses the denoiser, latent_decoder and token_decoder; encode uses the
// feature_model and encoder, and so does generation with known tokens.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "ldlm/core/stopwatch.hpp"
#include "ldlm/model/model.hpp"
#include "ldlm/ops/argmax.hpp"
#include "ldlm/sampling/sampler.hpp"

namespace ldlm {

/// The ids a vocabulary of V tokens reserves after the tokenizer's own: pad = V − 2,
/// mask = V − 1 (docs/model.md §The vocabulary and the two added tokens). In a condition,
/// the mask id marks a position to generate.
inline std::int64_t pad_id(const Config& c) { return c.vocab_size - 2; }
inline std::int64_t mask_id(const Config& c) { return c.vocab_size - 1; }

/// Throws InvalidArgument unless every id of `ids` [B, T] is in [0, V) and T fits the
/// model; the error names the sequence and the position.
inline void check_condition_ids(std::string_view op, const Config& c, const TokenTensor& ids) {
  const std::string where(op);
  const Index B = ids.dimension(0), T = ids.dimension(1);
  if (B < 1 || T < 1)
    throw InvalidArgument(where + ": the known tokens must be [B, T] with B, T >= 1, got " + shape_string(Shape{B, T}));
  if (T > c.max_positions)
    throw InvalidArgument(where + ": the known tokens have T = " + std::to_string(T) +
                          " positions, more than the model's max_positions = " + std::to_string(c.max_positions));
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < T; ++t)
      if (ids(b, t) < 0 || ids(b, t) >= c.vocab_size)
        throw InvalidArgument(where + ": token id " + std::to_string(ids(b, t)) + " at sequence " + std::to_string(b) +
                              ", position " + std::to_string(t) + " is outside the vocabulary [0, " +
                              std::to_string(c.vocab_size) + ")");
}

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

/// What a preview sees after each solver step: the tokens the step's latest x̂0 decodes
/// to, with every known id as given. It runs on the calling thread, between steps.
struct StepTokens {
  SamplingProgress progress;  // steps and denoiser calls done, of all
  double t = 1;               // the time of the step's latest denoiser call
  const TokenTensor& tokens;  // [B, T]
};
/// Called after every step; returning false cancels sampling (SamplingCancelled). Each
/// call costs a decode of the whole batch (the latent and token decoders), which the
/// sampling loop does not otherwise run: docs/performance.md gives the measured cost.
using TokenPreview = std::function<bool(const StepTokens&)>;

/// Where a generation's time went, stage by stage, besides the sampler's counts.
struct GenerationStats : SamplingStats {
  double encode_seconds = 0;   // the known tokens to latents (0 without known tokens)
  double sample_seconds = 0;   // the solver's steps and denoiser calls, previews excluded
  double preview_seconds = 0;  // decoding the previews
  double decode_seconds = 0;   // the final latents to tokens
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
    // In the arena, whose pages the denoiser's calls have already made resident: fresh
    // heap blocks here would add their size to the peak RSS of a generation.
    Arena::Scope scope(ctx.arena());
    MatrixMap<S> normed(ctx.arena().allocate<S>(rows * d), rows, d);  // [B*T, d]
    token_decoder.forward_to_head(ctx, as_matrix(hidden), B, T, normed);
    MatrixMap<S> logits(ctx.arena().allocate<S>(std::min(rows, kLogitRows) * V), std::min(rows, kLogitRows), V);
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

  /// The latents of the known positions of `ids` [B, T] (every id but the mask id), encoded
  /// as `fill` says; rows are b·T + t. Empty when every position is free.
  KnownRows<S> known_latents(Context& ctx, const TokenTensor& ids, KnownFill fill) const {
    const Config& c = model_->config;
    const Index B = ids.dimension(0), T = ids.dimension(1), d = c.d_model;
    const std::int64_t mask = mask_id(c);
    KnownRows<S> known;
    for (Index r = 0; r < B * T; ++r)
      if (ids.data()[r] != mask) known.rows.push_back(r);
    if (known.rows.empty()) return known;
    known.z.resize(static_cast<Index>(known.rows.size()), d);
    if (fill == KnownFill::separate) {
      Index k = 0;
      for (Index b = 0; b < B; ++b)
        for (Index t = 0; t < T;) {
          if (ids(b, t) == mask) {
            ++t;
            continue;
          }
          Index end = t;
          while (end < T && ids(b, end) != mask) ++end;
          TokenTensor run(1, end - t);
          for (Index j = t; j < end; ++j) run(0, j - t) = ids(b, j);
          const Tensor3<S> z = encode(ctx, run);
          known.z.middleRows(k, end - t) = as_matrix(z);
          k += end - t;
          t = end;
        }
      return known;
    }
    TokenTensor filled = ids;
    const std::int64_t stand_in = fill == KnownFill::pad ? pad_id(c) : mask;
    for (Index r = 0; r < B * T; ++r)
      if (filled.data()[r] == mask) filled.data()[r] = stand_in;
    const Tensor3<S> z = encode(ctx, filled);
    const auto all = as_matrix(z);
    for (std::size_t k = 0; k < known.rows.size(); ++k) known.z.row(static_cast<Index>(k)) = all.row(known.rows[k]);
    return known;
  }

  /// Samples latents [B, T, d] given the known tokens `ids` [B, T] (the mask id at every
  /// position to generate; docs/model.md §Conditioning). Every position masked is
  /// unconditional sampling, bit for bit.
  Tensor3<S> sample(Context& ctx, const TokenTensor& ids, const SamplerOptions& options,
                    const ConditionOptions& condition, SamplingStats* stats = nullptr) const {
    check_condition_ids("generate", model_->config, ids);
    check_condition_options("generate", condition);
    const Index B = ids.dimension(0), T = ids.dimension(1);
    check_sampling_arguments("generate", model_->config, B, T, options.steps);
    const KnownRows<S> known = known_latents(ctx, ids, condition.fill);
    return detail::sample_latent_tensor("generate", ctx, model_->denoiser, B, T, options, stats, {}, &known, condition);
  }

  /// Tokens [B, T] given the known tokens `ids`: sample, decode, and give every known
  /// position its given id (the decoded id there is the model's reading of its latent,
  /// which may differ).
  /// `preview`, if set, sees the tokens of every step's x̂0 (TokenPreview).
  TokenTensor generate(Context& ctx, const TokenTensor& ids, const SamplerOptions& options,
                       const ConditionOptions& condition, GenerationStats* stats = nullptr,
                       const TokenPreview& preview = {}) const {
    check_condition_ids("generate", model_->config, ids);
    check_condition_options("generate", condition);
    const Index B = ids.dimension(0), T = ids.dimension(1);
    check_sampling_arguments("generate", model_->config, B, T, options.steps);
    GenerationStats local;
    GenerationStats& s = stats ? *stats : local;
    s = GenerationStats{};
    Stopwatch clock;
    const KnownRows<S> known = known_latents(ctx, ids, condition.fill);
    s.encode_seconds = clock.lap();
    return generate_from(ctx, &ids, B, T, options, &known, condition, s, preview);
  }

  /// B sequences of T tokens: sample, then decode. Throws InvalidArgument for B < 1,
  /// T outside [1, max_positions] or steps < 1, SamplingCancelled if the progress
  /// callback returns false.
  TokenTensor generate(Context& ctx, Index B, Index T, const SamplerOptions& options, GenerationStats* stats = nullptr,
                       const TokenPreview& preview = {}) const {
    check_sampling_arguments("generate", model_->config, B, T, options.steps);
    GenerationStats local;
    GenerationStats& s = stats ? *stats : local;
    s = GenerationStats{};
    return generate_from(ctx, nullptr, B, T, options, nullptr, {}, s, preview);
  }

 private:
  /// Every id of `ids` but the mask id written over `tokens` (both [B, T]).
  void keep_known(const TokenTensor* ids, TokenTensor& tokens) const {
    if (!ids) return;
    const std::int64_t mask = mask_id(model_->config);
    for (Index r = 0; r < tokens.size(); ++r)
      if (ids->data()[r] != mask) tokens.data()[r] = ids->data()[r];
  }

  /// Samples (with `known` rows when given), decodes, and puts the known ids back; the
  /// preview decodes the latest x̂0 after every step.
  TokenTensor generate_from(Context& ctx, const TokenTensor* ids, Index B, Index T, SamplerOptions options,
                            const KnownRows<S>* known, const ConditionOptions& condition, GenerationStats& s,
                            const TokenPreview& preview) const {
    Stopwatch clock;
    SolverHooks<S> observers;
    if (preview) {
      // The latest x̂0 is kept from each call (n values, copied: the solver reuses its
      // buffer), and decoded once its step is done.
      auto latest = std::make_shared<Tensor3<S>>(B, T, model_->config.d_model);
      auto t_latest = std::make_shared<double>(1.0);
      observers.on_denoised = [latest, t_latest](double t, S* x0) {
        std::copy(x0, x0 + latest->size(), latest->data());
        *t_latest = t;
      };
      options.progress = [&, latest, t_latest, progress = std::move(options.progress)](const SamplingProgress& p) {
        if (progress && !progress(p)) return false;
        Stopwatch preview_clock;
        TokenTensor tokens = decode_tokens(ctx, *latest);
        keep_known(ids, tokens);
        const bool go_on = preview(StepTokens{p, *t_latest, tokens});
        s.preview_seconds += preview_clock.lap();
        return go_on;
      };
    }
    const Tensor3<S> z =
        detail::sample_latent_tensor("generate", ctx, model_->denoiser, B, T, options, &s, observers, known, condition);
    s.sample_seconds = clock.lap() - s.preview_seconds;
    TokenTensor tokens = decode_tokens(ctx, z);
    keep_known(ids, tokens);
    s.decode_seconds = clock.lap();
    return tokens;
  }

  static constexpr Index kLogitRows = 128;
  const LDLM<S>* model_;
};

}  // namespace ldlm
