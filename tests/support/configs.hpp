// Test support: configurations shared by several test files.
#pragma once

#include "ldlm/model/config.hpp"

namespace ldlm::test {

/// ldlm-base with every bounded size key at its maximum (still a valid config).
inline Config largest_config() {
  Config c;
  c.d_model = 1 << 16;
  c.n_heads = 1;
  c.head_dim = 1 << 16;
  c.mlp_mult = 64;
  c.max_positions = 1 << 20;
  c.vocab_size = 1 << 22;
  c.token_decoder_mlp_hidden = 1 << 22;
  c.encoder_layers = c.latent_decoder_layers = c.token_decoder_layers = 1024;
  c.denoiser_blocks = c.gpt2_layers = c.gpt2_feature_layers = 1024;
  return c;
}

}  // namespace ldlm::test
