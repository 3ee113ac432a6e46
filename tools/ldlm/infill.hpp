// ldlm infill: fill the masked positions of a text or of token ids with the diffusion model.
#pragma once

#include "common.hpp"
#include "sampling_options.hpp"
#include "sampling_run.hpp"
#include "text.hpp"
#include "ldlm/io/masked_text.hpp"

namespace ldlm::cli {

/// infill's own options.
struct InfillOptions {
  std::optional<std::string> text, tokens;
};

const Command kInfill{"infill",
                      "fill masked token positions with the diffusion model",
                      "",
                      "Sample the positions marked in --text or --tokens and keep every other token as\n"
                      "given (docs/model.md §Conditioning); print the whole text: one sample, or each of\n"
                      "--batch samples after a '--- sample i of B ---' line; --ids prints the ids.",
                      sampling_command_options({text_option("text", "S", &InfillOptions::text,
                                                            "the text; each " + std::string(kMaskMarker) +
                                                                " in it is one token position to fill"),
                                                text_option("tokens", "\"464 50258 ...\"", &InfillOptions::tokens,
                                                            "token ids instead; the mask id marks a position to fill")},
                                               {}),
                      "At most one of --text and --tokens; without either, the text comes from stdin. In\n"
                      "the text, only the exact characters " +
                          std::string(kMaskMarker) +
                          " are the mask (in every other command such\n"
                          "text is plain text, and a fragment such as '<|mask' is plain text here too). A space\n"
                          "right before a mask belongs to the masked token, as GPT-2's words carry their leading\n"
                          "space: 'The " +
                          std::string(kMaskMarker) + " sat' fills one word after 'The'. The mask id is V - 1 (" +
                          std::to_string(kDefaultVocabSize - 1) +
                          " for GPT-2's\n"
                          "vocabulary). A sequence with every position masked is unconditional generation; one\n"
                          "without a mask is an error.\n\n" +
                          sampler_table() + condition_table() + "\n" + kModelChoice + "\n" + kSamplingStderr};

int run_infill(const Args& args) {
  Stopwatch clock;
  args.expect_positionals(0, 0);
  const InfillOptions own = args.read<InfillOptions>();
  if (own.text && own.tokens) args.fail("give at most one of --text and --tokens");
  const SamplingRequest request = sampling_request(args);
  const auto weights = open_model(args, request.model);
  const Config config = load_config(request.model, weights);
  const Index B = request.run.batch;
  std::vector<std::int64_t> row;
  std::optional<Tokenizer> tokenizer;
  if (!own.tokens) {
    const std::string text = own.text ? *own.text : read_stdin();
    tokenizer = load_tokenizer(request.tokenizer, config.vocab_size);
    row = encode_masked_text(*tokenizer, text);
    if (std::find(row.begin(), row.end(), mask_id(config)) == row.end())
      throw InvalidArgument("infill: the text has no " + std::string(kMaskMarker) +
                            "; each one marks a token position to fill");
  } else {
    row = parse_ids(*own.tokens, "infill", "--tokens");
    if (row.empty()) args.fail("option '--tokens' holds no ids");
    if (std::find(row.begin(), row.end(), mask_id(config)) == row.end())
      throw InvalidArgument("infill: --tokens has no mask id " + std::to_string(mask_id(config)) +
                            "; each one marks a token position to fill");
  }
  TokenTensor ids(B, static_cast<Index>(row.size()));
  for (Index b = 0; b < B; ++b) std::copy(row.begin(), row.end(), ids.data() + b * static_cast<Index>(row.size()));
  return sample_and_write(request, weights, config, ids, std::move(tokenizer), clock, "infill");
}

}  // namespace ldlm::cli
