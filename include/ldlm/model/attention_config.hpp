// What each of the four attention modules of LDLM takes from the configuration,
// in one place: the Config switches (softcap, rotary, q/k-norm) map to
// nn::AttentionModuleConfig here and nowhere else.
#pragma once

#include "ldlm/model/config.hpp"
#include "ldlm/nn/attention.hpp"

namespace ldlm {

/// The widths every attention module shares; the rest starts off.
inline nn::AttentionModuleConfig attention_widths(const Config& c) {
  nn::AttentionModuleConfig a;
  a.d_model = c.d_model;
  a.heads = c.n_heads;
  a.head_dim = c.head_dim;
  return a;
}

/// The frozen GPT-2 feature model: no softcap, no rotary (nn::GPT2Attention sets causal).
inline nn::AttentionModuleConfig gpt2_attention_config(const Config& c) { return attention_widths(c); }

/// The Perceiver latent attention (encoder and latent decoder).
inline nn::AttentionModuleConfig latent_attention_config(const Config& c) {
  nn::AttentionModuleConfig a = attention_widths(c);
  a.options.softcap = c.latent_attention_softcap ? c.softcap : 0.0;
  a.qk_norm = c.latent_attention_qk_norm;
  a.rms_eps = c.rms_norm_eps;
  return a;
}

/// The token decoder's self-attention.
inline nn::AttentionModuleConfig token_decoder_attention_config(const Config& c) {
  nn::AttentionModuleConfig a = attention_widths(c);
  a.options.softcap = c.token_decoder_softcap ? c.softcap : 0.0;
  a.rotary = c.token_decoder_rotary;
  a.rotary_interleaved = c.rotary_interleaved;
  a.rope_base = c.rope_base;
  return a;
}

/// The denoiser's fused self-attention: rotary always on.
inline nn::AttentionModuleConfig denoiser_attention_config(const Config& c) {
  nn::AttentionModuleConfig a = attention_widths(c);
  a.options.softcap = c.softcap;
  a.rotary = true;
  a.rotary_interleaved = c.rotary_interleaved;
  a.rope_base = c.rope_base;
  return a;
}

}  // namespace ldlm
