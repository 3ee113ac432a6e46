// Text in and out: the tokenizer shared by tokenize, detokenize, generate, infill and
// reconstruct, printing samples as text, and the one parser of token-id lists.
#pragma once

#include "common.hpp"

namespace ldlm::cli {

/// ldlm-base's vocabulary: GPT-2's 50257 tokens, pad and mask.
const std::int64_t kDefaultVocabSize = Config{}.vocab_size;

/// The tokenizer options: its files, and (tokenize, detokenize) the model's V it must fit.
struct TokenizerOptions {
  std::optional<std::string> dir;  // GPT-2's files, built into ldlm, when not given
  std::int64_t vocab_size = kDefaultVocabSize;
};

const Option kTokenizerOption = text_option("tokenizer", "DIR", &TokenizerOptions::dir,
                                            "tokenizer files (see below); default: GPT-2's, built into ldlm");
const std::string kTokenizerDetails =
    "--tokenizer DIR reads encoder.json + vocab.bpe (OpenAI), vocab.json + merges.txt or\n"
    "tokenizer.json (Hugging Face). pad and mask follow the files' tokens (GPT-2: ids 50257\n"
    "and 50258), so GPT-2's vocabulary has " +
    std::to_string(kDefaultVocabSize) + " tokens, ldlm-base's V.\n";
const Option kVocabSizeOption = value_option("vocab-size", "V", &TokenizerOptions::vocab_size, {1},
                                             "the model's vocabulary size, which the tokenizer must match");

/// The tokenizer of --tokenizer DIR, or GPT-2's files built into the tool; its
/// vocabulary (with pad and mask) must have the model's size V.
Tokenizer load_tokenizer(const TokenizerOptions& options, std::int64_t vocab_size) {
  std::string origin;
  const Tokenizer tokenizer = [&] {
    if (options.dir) {
      origin = "'" + *options.dir + "'";
      return Tokenizer::load(*options.dir);
    }
    origin = "built-in GPT-2";
    const auto vocab = embedded::find("gpt2/encoder.json"), merges = embedded::find("gpt2/vocab.bpe");
    if (!vocab || !merges) throw Error("the built-in GPT-2 tokenizer files are missing from this ldlm binary");
    return Tokenizer::from_vocab_and_merges(*vocab, *merges, "<built-in>/encoder.json", "<built-in>/vocab.bpe");
  }();
  if (tokenizer.vocab_size() != vocab_size)
    throw InvalidArgument("the " + origin + " tokenizer has " + std::to_string(tokenizer.vocab_size()) + " tokens (" +
                          std::to_string(tokenizer.pad_id()) + " from its files, pad and mask), but the model's " +
                          "vocabulary size V is " + std::to_string(vocab_size));
  return tokenizer;
}

std::string read_stdin() {
  std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  if (std::cin.bad()) throw IoError("reading stdin failed");
  return text;
}

/// The tokenizer that turns the model's ids into text: --tokenizer's (which must fit),
/// else the built-in GPT-2 one when it fits the model's vocabulary. None when no tokenizer
/// fits: the ids are printed then.
std::optional<Tokenizer> text_tokenizer(const TokenizerOptions& options, const Config& config) {
  if (options.dir || config.vocab_size == kDefaultVocabSize) return load_tokenizer(options, config.vocab_size);
  return std::nullopt;
}

/// One sample per block: the text alone for one sample; with several, each after a
/// "--- sample i of B ---" line, so that samples with newlines stay apart.
void print_text(std::ostream& out, const Tokenizer& tokenizer, const TokenTensor& tokens) {
  const Index B = tokens.dimension(0), T = tokens.dimension(1);
  for (Index b = 0; b < B; ++b) {
    if (B > 1) out << "--- sample " << b + 1 << " of " << B << " ---\n";
    out << tokenizer.decode(std::span<const std::int64_t>(tokens.data() + b * T, static_cast<std::size_t>(T))) << "\n";
  }
}

/// The samples as text with a tokenizer, else as token ids.
void print_samples(std::ostream& out, const std::optional<Tokenizer>& tokenizer, const TokenTensor& tokens) {
  if (tokenizer)
    print_text(out, *tokenizer, tokens);
  else
    print_tokens(out, tokens);
}

/// Integer ids separated by white space or commas; `op` and `source` name the command and
/// the text in errors.
std::vector<std::int64_t> parse_ids(std::string_view text, std::string_view op, const std::string& source) {
  std::vector<std::int64_t> ids;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && !std::isspace(static_cast<unsigned char>(text[i])) && text[i] != ',') continue;
    if (i > start) {
      const std::string_view word = text.substr(start, i - start);
      std::int64_t id = 0;
      const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
      if (ec != std::errc() || end != word.data() + word.size())
        throw InvalidArgument(std::string(op) + ": '" + std::string(word.substr(0, 40)) + "' at byte " +
                              std::to_string(start) + " of " + source + " is not an integer token id");
      ids.push_back(id);
    }
    start = i + 1;
  }
  return ids;
}

}  // namespace ldlm::cli
