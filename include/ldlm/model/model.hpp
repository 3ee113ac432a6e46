// The LDLM aggregate and its parameter accounting (docs/model.md §Parameter accounting).
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ldlm/model/denoiser.hpp"
#include "ldlm/model/gpt2.hpp"
#include "ldlm/model/perceiver.hpp"
#include "ldlm/model/token_decoder.hpp"

namespace ldlm {

template <class S = float>
class LDLM {
 public:
  Config config;
  GPT2Features<S> feature_model;
  LatentEncoder<S> encoder;
  LatentDecoder<S> latent_decoder;
  TokenDecoder<S> token_decoder;
  Denoiser<S> denoiser;

  /// Records every shape; allocates nothing (see init_parameters / load_checkpoint).
  explicit LDLM(const Config& c = Config{})
      : config((c.validate(), c)), feature_model(c), encoder(c), latent_decoder(c), token_decoder(c), denoiser(c) {}

  template <class F>
  void visit(const std::string& prefix, F&& f);
};

/// The one table of LDLM's modules: calls f(name, module) for each, in state-dict
/// order. The name (a std::string_view) is the module class's kName, its state-dict
/// prefix without the dot.
template <class Model, class F>
void for_each_module(Model& m, F&& f) {
  const auto entry = [&](auto& module) { f(std::remove_cvref_t<decltype(module)>::kName, module); };
  entry(m.feature_model);
  entry(m.encoder);
  entry(m.latent_decoder);
  entry(m.token_decoder);
  entry(m.denoiser);
}

/// The names of for_each_module, in its order.
inline const std::vector<std::string>& module_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> list;
    const LDLM<float> shapes_only;  // allocates no parameter
    for_each_module(shapes_only, [&](std::string_view name, const auto&) { list.emplace_back(name); });
    return list;
  }();
  return names;
}

/// Calls f(module) on the module called `name`; an unknown name is an InvalidArgument
/// that lists the known ones.
template <class Model, class F>
void with_module(Model& m, std::string_view name, F&& f) {
  bool found = false;
  for_each_module(m, [&](std::string_view module_name, auto& module) {
    if (name == module_name) found = true, f(module);
  });
  if (!found) {
    std::string known;
    for (const auto& n : module_names()) known += (known.empty() ? "" : ", ") + n;
    throw InvalidArgument("ldlm: unknown module '" + std::string(name) + "' (modules: " + known + ")");
  }
}

template <class S>
template <class F>
void LDLM<S>::visit(const std::string& prefix, F&& f) {
  for_each_module(*this,
                  [&](std::string_view name, auto& module) { module.visit(prefix + std::string(name) + ".", f); });
}

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

/// The parameter table as text: a row per module (trained, frozen), the totals and
/// the denoiser's final LayerNorm, the figures docs/model.md §Parameter accounting
/// documents. `ldlm params` and examples/params.cpp print it.
template <class S>
std::string parameter_table_text(const LDLM<S>& m) {
  char line[96];
  std::string text;
  const auto add = [&](const char* label, std::int64_t trained, std::optional<std::int64_t> frozen = {}) {
    if (frozen)
      std::snprintf(line, sizeof line, "%-26s %14lld %14lld\n", label, static_cast<long long>(trained),
                    static_cast<long long>(*frozen));
    else
      std::snprintf(line, sizeof line, "%-26s %14lld\n", label, static_cast<long long>(trained));
    text += line;
  };
  std::snprintf(line, sizeof line, "%-26s %14s %14s\n", "module", "trained", "frozen");
  text += line;
  for (const auto& row : parameter_table(m)) add(row.module.c_str(), row.counts.trained, row.counts.frozen);
  const ParameterCounts total = count_parameters(m);
  add("trained total", total.trained);
  add("frozen total", total.frozen);
  add("denoiser final LayerNorm", count_parameters(m.denoiser.output_layer.norm_final).total());
  return text;
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
