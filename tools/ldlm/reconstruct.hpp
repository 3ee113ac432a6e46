// ldlm reconstruct: encode token ids and decode them again.
#pragma once

#include "common.hpp"
#include "inputs.hpp"
#include "progress.hpp"
#include "text.hpp"

namespace ldlm::cli {

/// reconstruct's own options.
struct ReconstructOptions {
  std::optional<std::string> text, tokens, inputs;
  bool quiet = false;
};

const Command kReconstruct{
    "reconstruct",
    "encode and decode token ids",
    "",
    "Encode token ids (GPT-2 features, latent encoder) and decode them again (latent\n"
    "decoder, token decoder, argmax); print the reconstructed ids, one line per sequence.",
    with_model_options({text_option("text", "S", &ReconstructOptions::text,
                                    "text to reconstruct (tokenized; prints the reconstructed text)"),
                        text_option("tokens", "\"1 2 3 ...\"", &ReconstructOptions::tokens,
                                    "token ids; ';' separates sequences of equal length"),
                        text_option("inputs", "I.safetensors", &ReconstructOptions::inputs,
                                    "token ids from tensor 'tokens' [B, T] (I64 or I32)"),
                        kTokenizerOption},
                       {flag_option("quiet", &ReconstructOptions::quiet, "no timing summary on stderr")}),
    "Exactly one of --text, --tokens and --inputs.\n" + kModelChoice +
        "\nAfter the run, a timing summary on stderr (load, encode, decode, total, tokens/s).\n"};

/// The ids of --tokens: sequences of equal length separated by ';'.
TokenTensor parse_tokens(const Args& args, const std::string& text) {
  std::vector<std::vector<std::int64_t>> rows;
  std::size_t start = 0;
  for (std::size_t end = 0; end <= text.size(); ++end) {
    if (end < text.size() && text[end] != ';') continue;
    rows.push_back(parse_ids(std::string_view(text).substr(start, end - start), "reconstruct",
                             "sequence " + std::to_string(rows.size() + 1) + " of --tokens"));
    start = end + 1;
  }
  for (std::size_t b = 0; b < rows.size(); ++b) {
    if (rows[b].empty()) args.fail("option '--tokens': sequence " + std::to_string(b + 1) + " is empty");
    if (rows[b].size() != rows[0].size())
      args.fail("option '--tokens': sequences must have equal lengths, got " + std::to_string(rows[0].size()) +
                " and " + std::to_string(rows[b].size()));
  }
  TokenTensor tokens(static_cast<Index>(rows.size()), static_cast<Index>(rows[0].size()));
  for (std::size_t b = 0; b < rows.size(); ++b)
    for (std::size_t t = 0; t < rows[b].size(); ++t) tokens(b, t) = rows[b][t];
  return tokens;
}

int run_reconstruct(const Args& args) {
  Stopwatch clock;
  args.expect_positionals(0, 0);
  const ReconstructOptions own = args.read<ReconstructOptions>();
  const ModelOptions model_options = args.read<ModelOptions>();
  const TokenizerOptions tokenizer_options = args.read<TokenizerOptions>();
  if (int(own.text.has_value()) + int(own.tokens.has_value()) + int(own.inputs.has_value()) != 1)
    args.fail("give exactly one of --text, --tokens and --inputs");
  const auto weights = open_model(args, model_options);
  const Config config = load_config(model_options, weights);
  std::optional<Tokenizer> tokenizer;
  TokenTensor tokens;
  if (own.text) {
    tokenizer = load_tokenizer(tokenizer_options, config.vocab_size);
    const std::vector<std::int64_t> ids = tokenizer->encode(*own.text);
    if (ids.empty()) args.fail("option '--text': the text is empty");
    tokens = TokenTensor(1, static_cast<Index>(ids.size()));
    std::copy(ids.begin(), ids.end(), tokens.data());
  } else {
    tokens = own.tokens ? parse_tokens(args, *own.tokens) : Inputs(*own.inputs, "reconstruct").tokens("tokens");
  }
  Context ctx(thread_count(model_options));
  const bool parallel = ctx.threads() > 1;
  LDLM<float> model(config);
  // Large tables first (lm_head, wte), as in generate.
  fill_modules(model, model_options, weights, {TokenDecoder<>::kName, LatentDecoder<>::kName},
               {GPT2Features<>::kName, LatentEncoder<>::kName}, parallel);
  RunTimes times;
  times.load = clock.lap();
  // Pipeline::reconstruct's two halves, timed apart.
  const Pipeline<float> pipeline(model);
  const Tensor3<float> latents = pipeline.encode(ctx, tokens);
  times.encode = clock.lap();
  const TokenTensor out = pipeline.decode(ctx, latents).tokens;
  times.decode = clock.lap();
  print_samples(std::cout, tokenizer, out);
  times.positions = out.size();
  times.total = clock.elapsed();
  if (!own.quiet) print_times(times);
  return 0;
}

}  // namespace ldlm::cli
