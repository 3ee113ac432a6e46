// Filling masked tokens with the library API (docs/model.md §Conditioning).
//
//   example_infill WEIGHTS.safetensors TOKENIZER_DIR ["TEXT with <|mask|> markers"]
//
// For example, with the demo model and GPT-2's tokenizer files of this repository:
//   example_infill tools/assets/ldlm-demo/ldlm-demo.safetensors tools/assets/gpt2
//       "The children played in the <|mask|> after school."   (one command line)
// Loads every module (encoding the known text needs the feature model and the encoder),
// turns the text into ids with one mask id per marker, samples the masked positions with
// the default sampler and condition, and prints two samples.
#include <cstdio>
#include <exception>
#include <string>

#include "ldlm/io/masked_text.hpp"
#include "ldlm/ldlm.hpp"

int main(int argc, char** argv) try {
  if (argc < 3) {
    std::fprintf(stderr, "usage: example_infill WEIGHTS.safetensors TOKENIZER_DIR [\"TEXT with <|mask|>\"]\n");
    return 2;
  }
  const ldlm::LDLM<float> model = ldlm::load_model(argv[1]);
  const ldlm::Tokenizer tokenizer = ldlm::Tokenizer::load(argv[2]);
  const std::string text = argc > 3 ? argv[3] : "The children played in the <|mask|> after school.";
  const std::vector<std::int64_t> ids = ldlm::encode_masked_text(tokenizer, text);

  const ldlm::Index B = 2, T = static_cast<ldlm::Index>(ids.size());
  ldlm::TokenTensor known(B, T);  // the same known tokens for both samples
  for (ldlm::Index b = 0; b < B; ++b)
    for (ldlm::Index t = 0; t < T; ++t) known(b, t) = ids[static_cast<std::size_t>(t)];

  ldlm::Context ctx(1);
  ldlm::SamplerOptions options;      // the default sampler; the noise differs per sample
  ldlm::ConditionOptions condition;  // the default method: see docs/model.md §Conditioning
  ldlm::SamplingStats stats;
  const ldlm::TokenTensor tokens = ldlm::Pipeline<float>(model).generate(ctx, known, options, condition, &stats);
  for (ldlm::Index b = 0; b < B; ++b)
    std::printf("%s\n", tokenizer.decode({tokens.data() + b * T, static_cast<std::size_t>(T)}).c_str());
  std::printf("(%d denoiser calls)\n", stats.denoiser_calls);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "infill: %s\n", e.what());
  return 1;
}
