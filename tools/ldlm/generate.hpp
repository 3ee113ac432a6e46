// ldlm generate: sample token sequences, from noise or continuing a prompt.
#pragma once

#include "common.hpp"
#include "sampling_options.hpp"
#include "sampling_run.hpp"
#include "text.hpp"

namespace ldlm::cli {

const Command kGenerate{
    "generate",
    "sample token sequences with the diffusion model",
    "",
    "Sample latents with the denoiser (a solver from pure noise; docs/model.md §Sampler),\n"
    "decode them and print the text: one sample, or each of --batch samples after a\n"
    "'--- sample i of B ---' line. Token ids, one line per sample, with --ids or when no\n"
    "tokenizer fits the model's vocabulary (GPT-2's built-in one fits V = " +
        std::to_string(kDefaultVocabSize) +
        ").\n"
        "With --prompt, the prompt's tokens take the first positions and the sampler fills the\n"
        "rest; with --suffix, the suffix's take the last (docs/model.md §Conditioning). The\n"
        "output is the whole text, every given token as given; --ids prints all T ids.",
    sampling_command_options(
        {{"length", "T", "tokens per sequence (default " + std::to_string(kDefaultLength) + ")"}},
        {{"prompt", "TEXT", "the text the samples begin with"}, {"suffix", "TEXT", "the text the samples end with"}}),
    sampler_table() + condition_table() + "\n" + kModelChoice + "Generation runs the " +
        std::string(Denoiser<>::kName) + ", " + std::string(LatentDecoder<>::kName) + " and " +
        std::string(TokenDecoder<>::kName) + ". ldlm-base's\n" + "generator weights (--init-seed " +
        std::to_string(kDefaultInitSeed) +
        ") allocate about 1 GB and take a few seconds on\n"
        "2 cores; --prompt and --suffix also run the " +
        std::string(GPT2Features<>::kName) + " and the " + std::string(LatentEncoder<>::kName) +
        ". On a terminal a progress bar with steps and\n"
        "denoiser calls is shown on stderr.\n"};

/// The known tokens of generate: --prompt's ids first, --suffix's last, the mask id
/// between, for each of the B sequences.
TokenTensor prompt_ids(const Args& args, const Config& config, Index B, Index T) {
  TokenTensor ids(B, T);
  ids.setConstant(mask_id(config));
  if (!args.has("prompt") && !args.has("suffix")) return ids;
  const Tokenizer tokenizer = load_tokenizer(args, config.vocab_size);
  const auto encode = [&](const char* option) {
    const auto text = args.value(option);
    return text ? tokenizer.encode(*text) : std::vector<std::int64_t>{};
  };
  const std::vector<std::int64_t> prompt = encode("prompt"), suffix = encode("suffix");
  const Index n = static_cast<Index>(prompt.size()), m = static_cast<Index>(suffix.size());
  if (n + m > config.max_positions)
    throw InvalidArgument("generate: the prompt's " + std::to_string(n) + " tokens and the suffix's " +
                          std::to_string(m) + " need " + std::to_string(n + m) +
                          " positions, more than the model's max_positions = " + std::to_string(config.max_positions));
  if (n + m > T)
    throw InvalidArgument("generate: the prompt's " + std::to_string(n) + " tokens and the suffix's " +
                          std::to_string(m) + " need " + std::to_string(n + m) + " positions, more than --length " +
                          std::to_string(T) + ": the suffix would start at position " + std::to_string(T - m) +
                          ", inside the prompt (positions 0 to " + std::to_string(n - 1) + ")");
  for (Index b = 0; b < B; ++b) {
    for (Index t = 0; t < n; ++t) ids(b, t) = prompt[t];
    for (Index t = 0; t < m; ++t) ids(b, T - m + t) = suffix[t];
  }
  return ids;
}

int run_generate(const Args& args) {
  args.expect_positionals(0, 0);
  const auto weights = open_model(args);
  const Config config = load_config(args, weights);
  const Index T = args.get_int("length", kDefaultLength, 1);
  const Index B = args.get_int("batch", kDefaultBatch, 1, kMaxBatch);
  const SamplerOptions options = sampler_options(args);
  const ConditionOptions condition = condition_options(args);
  // Checked before the prompt is encoded, so that a --length beyond max_positions is named.
  check_sampling_arguments("generate", config, B, T, options.steps);
  return sample_and_write(args, weights, config, prompt_ids(args, config, B, T), options, condition, "generate");
}

}  // namespace ldlm::cli
