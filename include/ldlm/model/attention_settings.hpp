// What each of the four attention modules of LDLM takes from the configuration,
// in one place: the Config switches (softcap, rotary, q/k-norm) map to
// nn::AttentionSettings here and nowhere else.
#pragma once

#include "ldlm/model/config.hpp"
#include "ldlm/nn/attention.hpp"

namespace ldlm {

/// The frozen GPT-2 feature model: no softcap, no rotary (nn::GPT2Attention sets causal).
inline nn::AttentionSettings gpt2_attention_settings(const Config& c) {
  nn::AttentionSettings s;
  s.d_model = c.d_model;
  s.heads = c.n_heads;
  s.head_dim = c.head_dim;
  return s;
}

/// The Perceiver latent attention (encoder and latent decoder).
inline nn::AttentionSettings latent_attention_settings(const Config& c) {
  nn::AttentionSettings s;
  s.d_model = c.d_model;
  s.heads = c.n_heads;
  s.head_dim = c.head_dim;
  s.softcap = c.latent_attention_softcap ? c.softcap : 0.0;
  s.qk_norm = c.latent_attention_qk_norm;
  s.rms_eps = c.rms_norm_eps;
  return s;
}

/// The token decoder's self-attention.
inline nn::AttentionSettings token_decoder_attention_settings(const Config& c) {
  nn::AttentionSettings s;
  s.d_model = c.d_model;
  s.heads = c.n_heads;
  s.head_dim = c.head_dim;
  s.softcap = c.token_decoder_softcap ? c.softcap : 0.0;
  s.rotary = c.token_decoder_rotary;
  s.rotary_interleaved = c.rotary_interleaved;
  s.rope_base = c.rope_base;
  return s;
}

/// The denoiser's fused self-attention: rotary always on.
inline nn::AttentionSettings denoiser_attention_settings(const Config& c) {
  nn::AttentionSettings s;
  s.d_model = c.d_model;
  s.heads = c.n_heads;
  s.head_dim = c.head_dim;
  s.softcap = c.softcap;
  s.rotary = true;
  s.rotary_interleaved = c.rotary_interleaved;
  s.rope_base = c.rope_base;
  return s;
}

}  // namespace ldlm
