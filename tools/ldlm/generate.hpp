// ldlm generate: sample token sequences, from noise or continuing a prompt.
#pragma once

#include "common.hpp"
#include "sampling_options.hpp"
#include "sampling_run.hpp"
#include "text.hpp"

namespace ldlm::cli {

/// generate's own options.
struct GenerateOptions {
  Index length = kDefaultLength;
  std::optional<std::string> prompt, suffix;
};

const Command kGenerate{"generate",
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
                            {value_option("length", "T", &GenerateOptions::length, {1}, "tokens per sequence")},
                            {text_option("prompt", "TEXT", &GenerateOptions::prompt, "the text the samples begin with"),
                             text_option("suffix", "TEXT", &GenerateOptions::suffix, "the text the samples end with")}),
                        sampler_table() + condition_table() + "\n" + kModelChoice + "Generation runs the " +
                            std::string(Denoiser<>::kName) + ", " + std::string(LatentDecoder<>::kName) + " and " +
                            std::string(TokenDecoder<>::kName) + ". ldlm-base's\n" + "generator weights (--init-seed " +
                            std::to_string(kDefaultInitSeed) +
                            ") allocate about 1 GB and take a few seconds on\n"
                            "2 cores; --prompt and --suffix also run the " +
                            std::string(GPT2Features<>::kName) + " and the " + std::string(LatentEncoder<>::kName) +
                            ".\n\n" + kSamplingStderr};

/// The known tokens of generate: --prompt's ids first, --suffix's last, the mask id
/// between, for each of the B sequences.
/// `tokenizer` is loaded when there is a prompt or a suffix.
TokenTensor prompt_ids(const GenerateOptions& own, const std::optional<Tokenizer>& tokenizer, const Config& config,
                       Index B, Index T) {
  TokenTensor ids(B, T);
  ids.setConstant(mask_id(config));
  if (!tokenizer) return ids;
  const auto encode = [&](const std::optional<std::string>& text) {
    return text ? tokenizer->encode(*text) : std::vector<std::int64_t>{};
  };
  const std::vector<std::int64_t> prompt = encode(own.prompt), suffix = encode(own.suffix);
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
  Stopwatch clock;
  args.expect_positionals(0, 0);
  const GenerateOptions own = args.read<GenerateOptions>();
  const SamplingRequest request = sampling_request(args);
  const auto weights = open_model(args, request.model);
  const Config config = load_config(request.model, weights);
  const Index B = request.run.batch, T = own.length;
  // Checked before the prompt is encoded, so that a --length beyond max_positions is named.
  check_sampling_arguments("generate", config, B, T, request.sampler.steps);
  std::optional<Tokenizer> tokenizer;
  if (own.prompt || own.suffix) tokenizer = load_tokenizer(request.tokenizer, config.vocab_size);
  const TokenTensor ids = prompt_ids(own, tokenizer, config, B, T);
  return sample_and_write(request, weights, config, ids, std::move(tokenizer), clock, "generate");
}

}  // namespace ldlm::cli
