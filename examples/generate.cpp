// Generating token ids with the library API.
//
//   example_generate [WEIGHTS.safetensors [CONFIG.json]]
//
// Builds an LDLM from a Config (ldlm-base, or CONFIG.json), loads the three
// modules generation needs from WEIGHTS (full state-dict names, e.g.
// denoiser.blocks.0.norm1.weight) or, without a file, fills them with the
// deterministic generator, then samples two sequences of 24 tokens with the default
// sampler (docs/model.md §Sampler) and prints them.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <optional>
#include <thread>

#include "ldlm/io/state_dict.hpp"
#include "ldlm/ldlm.hpp"

int main(int argc, char** argv) try {
  const ldlm::Config config = argc > 2 ? ldlm::Config::load(argv[2]) : ldlm::Config{};
  ldlm::LDLM<float> model(config);  // records shapes only; nothing allocated yet

  // The three modules generation runs: from WEIGHTS, where the other modules' tensors
  // are ignored, or else from the deterministic generator.
  const std::optional<ldlm::SafetensorsFile> file =
      argc > 1 ? std::optional(ldlm::SafetensorsFile::open(argv[1])) : std::nullopt;
  if (!file)
    std::fprintf(stderr, "no weights given: using generator weights (seed %llu), which produce no meaningful text\n",
                 static_cast<unsigned long long>(ldlm::kDefaultInitSeed));
  for (const auto name : {ldlm::Denoiser<>::kName, ldlm::LatentDecoder<>::kName, ldlm::TokenDecoder<>::kName})
    ldlm::load_or_init_module(model, file, name);

  ldlm::Context ctx(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  ldlm::SamplerOptions options;  // the default sampler and step count
  options.seed = 2024;
  options.progress = [](const ldlm::SamplingProgress& p) {
    std::fprintf(stderr, "\rstep %d/%d, %d/%d denoiser calls", p.step, p.steps, p.denoiser_calls, p.total_calls);
    if (p.step == p.steps) std::fprintf(stderr, "\n");
    return true;  // false would cancel (SamplingCancelled)
  };

  const ldlm::Pipeline<float> pipeline(model);
  const ldlm::TokenTensor tokens = pipeline.generate(ctx, /*B=*/2, /*T=*/24, options);
  for (ldlm::Index b = 0; b < tokens.dimension(0); ++b) {
    for (ldlm::Index t = 0; t < tokens.dimension(1); ++t)
      std::printf(t ? " %lld" : "%lld", static_cast<long long>(tokens(b, t)));
    std::printf("\n");
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "example_generate: %s\n", e.what());
  return 1;
}
