// Parameter accounting (docs/model.md §Parameter accounting): the per-module counts of a
// model, of a configuration without allocating it, and the same counts as closed-form
// expressions in the configuration, which a test holds to the modules.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ldlm/model/model.hpp"

namespace ldlm {

/// One row of the parameter table: a module and its trained/frozen counts.
struct ModuleParameters {
  std::string module;  // state-dict prefix without the dot
  ParameterCounts counts;

  bool operator==(const ModuleParameters&) const = default;
};

/// Per-module counts of an instantiated (not necessarily allocated) model.
template <class S>
std::vector<ModuleParameters> parameter_table(const LDLM<S>& m) {
  std::vector<ModuleParameters> table;
  for_each_module(m, [&](std::string_view name, const auto& module) {
    table.push_back({std::string(name), count_parameters(module)});
  });
  return table;
}

/// Counts of the model a config describes, from its shapes alone: nothing is
/// allocated, so counting ldlm-base costs no 1.7 GB.
inline ParameterCounts count_parameters(const Config& c) { return count_parameters(LDLM<float>(c)); }

/// The same counts as closed-form expressions in the config, written independently
/// of the modules; a test holds the two to each other.
inline std::vector<ModuleParameters> analytic_parameter_table(const Config& c) {
  const std::int64_t d = c.d_model, h = c.mlp_hidden(), P = c.max_positions, V = c.vocab_size;
  const std::int64_t ffn = 2 * d + d * h + h + h * d + d;
  const std::int64_t latent_attn =
      2 * d + d * d + 2 * (2 * d * d) + (c.latent_attention_qk_norm ? 2 * c.head_dim : 0) + d * d;
  const std::int64_t scale_mask = 2;
  const std::int64_t gpt2_block = 4 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * h + h) + (h * d + d);
  const std::int64_t ddit_block = 2 * d + 3 * d * d + d * d + (d * h + h) + (h * d + d) + (6 * d * d + 6 * d);
  const std::int64_t tok_block = 2 * d + 4 * d * d + 3 * d * c.token_decoder_mlp_hidden;
  return {
      {"feature_model", {0, V * d + P * d + c.gpt2_layers * gpt2_block + 2 * d}},
      {"encoder", {2 * P * d + 2 * d + c.encoder_layers * (latent_attn + ffn), 0}},
      {"latent_decoder",
       {P * d + ffn + scale_mask + c.latent_decoder_layers * (latent_attn + ffn + 2 * scale_mask), d}},
      {"token_decoder", {c.token_decoder_layers * tok_block + d + V * d, 0}},
      {"denoiser",
       {2 * d * d + (2 * d * d + 2 * d) + (2 * d * d + d) + c.denoiser_blocks * ddit_block + d + (2 * d * d + 2 * d) +
            (d * d + d),
        0}},
  };
}

}  // namespace ldlm
