// Test support: running one LDLM module on the inputs of a reference dump, by the
// module names of docs/model.md#module-inputs-and-outputs.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ldlm/ldlm.hpp"
#include "support/reference.hpp"

namespace ldlm::test {

using NamedOutputs = std::vector<std::pair<std::string, Tensor3<float>>>;

/// The outputs of `module` (feature_model, encoder, latent_decoder, token_decoder,
/// denoiser or reconstruct) on the inputs file of a dump, named as in the outputs file.
inline NamedOutputs run_module(Context& ctx, const LDLM<float>& m, const std::string& module,
                               const SafetensorsFile& in) {
  if (module == "feature_model")
    return {{"features", m.feature_model.forward(ctx, read_tensor<std::int64_t, 2>(in, "tokens"))}};
  if (module == "encoder") return {{"latents", m.encoder.forward(ctx, read_tensor<float, 3>(in, "features"))}};
  if (module == "latent_decoder")
    return {{"hidden", m.latent_decoder.forward(ctx, read_tensor<float, 3>(in, "latents"))}};
  if (module == "token_decoder") return {{"logits", m.token_decoder.forward(ctx, read_tensor<float, 3>(in, "hidden"))}};
  if (module == "denoiser")
    return {{"x0", m.denoiser.forward(ctx, read_tensor<float, 3>(in, "x_t"), read_tensor<float, 1>(in, "t"),
                                      read_tensor<float, 3>(in, "self_cond"))}};
  if (module == "reconstruct") {
    NamedOutputs out;
    out.emplace_back("features", m.feature_model.forward(ctx, read_tensor<std::int64_t, 2>(in, "tokens")));
    out.emplace_back("latents", m.encoder.forward(ctx, out.back().second));
    out.emplace_back("hidden", m.latent_decoder.forward(ctx, out.back().second));
    out.emplace_back("logits", m.token_decoder.forward(ctx, out.back().second));
    return out;
  }
  throw InvalidArgument("run_module: unknown module '" + module + "'");
}

/// The modules `module` runs (reconstruct: all but the denoiser).
inline std::vector<std::string> modules_run_by(const std::string& module) {
  if (module == "reconstruct") return {"feature_model", "encoder", "latent_decoder", "token_decoder"};
  return {module};
}

}  // namespace ldlm::test
