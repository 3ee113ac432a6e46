// Test support: running one LDLM module on the inputs of a reference dump, by the
// module names of docs/model.md §Module inputs and outputs.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ldlm/ldlm.hpp"
#include "support/reference.hpp"

namespace ldlm::test {

/// model_small's configuration (tests/data/model_small/config.json).
inline const Config& small_config() {
  static const Config c = Config::load(data_path("model_small/config.json"));
  return c;
}

/// model_small with its committed weights, loaded strictly (the file holds exactly its tensors).
template <class S>
const LDLM<S>& small_model() {
  static const LDLM<S> model = [] {
    LDLM<S> m(small_config());
    load_parameters(m, open_reference("model_small/weights.safetensors"));
    return m;
  }();
  return model;
}

/// Whether Precision::int8 quantizes the matrix-product weight `name` of a whole LDLM
/// (docs/model.md §int8), written out here apart from the modules' own marks: every
/// map of the trained modules but the denoiser's conditioning and its two ends.
inline bool quantized_at_int8(std::string_view name) {
  for (std::string_view stays_bf16 :
       {"feature_model.", "denoiser.input_proj.", "denoiser.time_emb.", "denoiser.output_layer."})
    if (name.starts_with(stays_bf16)) return false;
  return name.find("adaLN_modulation") == std::string_view::npos;
}

/// How many weights that is in a configuration: 4 maps in a denoiser block, 6 in an
/// encoder or latent decoder layer (4 projections and the FFN's 2), the latent decoder's
/// embedding FFN, 7 in a token decoder block (4 projections and SwiGLU's 3), lm_head.
inline int int8_weight_count(const Config& c) {
  return 4 * c.denoiser_blocks + 6 * c.encoder_layers + 6 * c.latent_decoder_layers + 2 + 7 * c.token_decoder_layers +
         1;
}

using NamedOutputs = std::vector<std::pair<std::string, Tensor3<float>>>;

/// The name that runs the encode-then-decode chain, beside the modules' own names.
inline constexpr std::string_view kReconstruct = "reconstruct";

/// The outputs of each module on the inputs file of a dump, named as in the outputs file.
inline NamedOutputs outputs_of(Context& ctx, const GPT2Features<float>& m, const SafetensorsFile& in) {
  return {{"features", m.forward(ctx, read_tensor<std::int64_t, 2>(in, "tokens"))}};
}
inline NamedOutputs outputs_of(Context& ctx, const LatentEncoder<float>& m, const SafetensorsFile& in) {
  return {{"latents", m.forward(ctx, read_tensor<float, 3>(in, "features"))}};
}
inline NamedOutputs outputs_of(Context& ctx, const LatentDecoder<float>& m, const SafetensorsFile& in) {
  return {{"hidden", m.forward(ctx, read_tensor<float, 3>(in, "latents"))}};
}
inline NamedOutputs outputs_of(Context& ctx, const TokenDecoder<float>& m, const SafetensorsFile& in) {
  return {{"logits", m.forward(ctx, read_tensor<float, 3>(in, "hidden"))}};
}
inline NamedOutputs outputs_of(Context& ctx, const Denoiser<float>& m, const SafetensorsFile& in) {
  return {{"x0", m.forward(ctx, read_tensor<float, 3>(in, "x_t"), read_tensor<float, 1>(in, "t"),
                           read_tensor<float, 3>(in, "self_cond"))}};
}

/// The outputs of `module` (one of module_names(), or reconstruct) on the inputs file
/// of a dump, named as in the outputs file.
inline NamedOutputs run_module(Context& ctx, const LDLM<float>& m, const std::string& module,
                               const SafetensorsFile& in) {
  NamedOutputs out;
  if (module == kReconstruct) {
    out.emplace_back("features", m.feature_model.forward(ctx, read_tensor<std::int64_t, 2>(in, "tokens")));
    out.emplace_back("latents", m.encoder.forward(ctx, out.back().second));
    out.emplace_back("hidden", m.latent_decoder.forward(ctx, out.back().second));
    out.emplace_back("logits", m.token_decoder.forward(ctx, out.back().second));
  } else {
    with_module(m, module, [&](const auto& part) { out = outputs_of(ctx, part, in); });
  }
  return out;
}

/// The modules `module` runs (reconstruct: all but the denoiser).
inline std::vector<std::string> modules_run_by(const std::string& module) {
  if (module != kReconstruct) return {module};
  std::vector<std::string> modules = module_names();
  std::erase(modules, std::string(Denoiser<>::kName));
  return modules;
}

}  // namespace ldlm::test
