// ldlm reconstruct: encode token ids and decode them again.
#pragma once

#include "common.hpp"
#include "inputs.hpp"
#include "text.hpp"

namespace ldlm::cli {

const Command kReconstruct{
    "reconstruct",
    "encode and decode token ids",
    "",
    "Encode token ids (GPT-2 features, latent encoder) and decode them again (latent\n"
    "decoder, token decoder, argmax); print the reconstructed ids, one line per sequence.",
    with_model_options({{"text", "S", "text to reconstruct (tokenized; prints the reconstructed text)"},
                        {"tokens", "\"1 2 3 ...\"", "token ids; ';' separates sequences of equal length"},
                        {"inputs", "I.safetensors", "token ids from tensor 'tokens' [B, T] (I64 or I32)"},
                        kTokenizerOption}),
    "Exactly one of --text, --tokens and --inputs.\n" + kModelChoice};

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
  args.expect_positionals(0, 0);
  if (int(args.has("text")) + int(args.has("tokens")) + int(args.has("inputs")) != 1)
    args.fail("give exactly one of --text, --tokens and --inputs");
  const auto weights = open_model(args);
  const Config config = load_config(args, weights);
  std::optional<Tokenizer> tokenizer;
  TokenTensor tokens;
  if (auto text = args.value("text")) {
    tokenizer = load_tokenizer(args, config.vocab_size);
    const std::vector<std::int64_t> ids = tokenizer->encode(*text);
    if (ids.empty()) args.fail("option '--text': the text is empty");
    tokens = TokenTensor(1, static_cast<Index>(ids.size()));
    std::copy(ids.begin(), ids.end(), tokens.data());
  } else {
    tokens = args.has("tokens") ? parse_tokens(args, *args.value("tokens"))
                                : Inputs(*args.value("inputs"), "reconstruct").tokens("tokens");
  }
  const Precision precision = precision_of(args);
  Context ctx(thread_count(args));
  const bool parallel = ctx.threads() > 1;
  LDLM<float> model(config);
  // Large tables first (lm_head, wte), as in generate.
  fill_modules(model, args, weights, {TokenDecoder<>::kName, LatentDecoder<>::kName},
               {GPT2Features<>::kName, LatentEncoder<>::kName}, parallel, precision);
  print_samples(std::cout, tokenizer, Pipeline<float>(model).reconstruct(ctx, tokens).tokens);
  return 0;
}

}  // namespace ldlm::cli
