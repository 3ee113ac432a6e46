// ldlm tokenize and ldlm detokenize: UTF-8 text to GPT-2 token ids and back.
#pragma once

#include "common.hpp"
#include "text.hpp"

namespace ldlm::cli {

/// The text of tokenize, the ids of detokenize: stdin when not given.
struct TokenizeOptions {
  std::optional<std::string> text, ids;
};

const Command kTokenize{"tokenize",
                        "UTF-8 text to GPT-2 token ids",
                        "",
                        "Print the token ids of UTF-8 text (stdin, or --text) on one line.",
                        {text_option("text", "S", &TokenizeOptions::text, "the text to encode instead of stdin"),
                         kTokenizerOption, kVocabSizeOption},
                        "The text is taken as plain text: \"<|endoftext|>\" in it is encoded as characters, never\n"
                        "as the special token. Text that is not valid UTF-8 is an error naming the byte offset.\n" +
                            kTokenizerDetails};

int run_tokenize(const Args& args) {
  args.expect_positionals(0, 0);
  const TokenizerOptions options = args.read<TokenizerOptions>();
  const TokenizeOptions own = args.read<TokenizeOptions>();
  const Tokenizer tokenizer = load_tokenizer(options, options.vocab_size);
  const std::string text = own.text ? *own.text : read_stdin();
  std::string line;
  for (const std::int64_t id : tokenizer.encode(text)) {
    if (!line.empty()) line += ' ';
    line += std::to_string(id);
  }
  std::cout << line << "\n";
  return 0;
}

const Command kDetokenize{"detokenize",
                          "token ids to text",
                          "",
                          "Write the bytes of token ids (stdin, or --ids) to stdout, exactly: no newline is\n"
                          "added, and ids that end inside a UTF-8 character give that character's first bytes.",
                          {text_option("ids", "\"1 2 3 ...\"", &TokenizeOptions::ids,
                                       "the ids instead of stdin (spaces, newlines or commas between)"),
                           kTokenizerOption, kVocabSizeOption},
                          kTokenizerDetails};

int run_detokenize(const Args& args) {
  args.expect_positionals(0, 0);
  const TokenizerOptions options = args.read<TokenizerOptions>();
  const TokenizeOptions own = args.read<TokenizeOptions>();
  const Tokenizer tokenizer = load_tokenizer(options, options.vocab_size);
  const auto ids =
      own.ids ? parse_ids(*own.ids, "detokenize", "--ids") : parse_ids(read_stdin(), "detokenize", "stdin");
  const std::string bytes = tokenizer.decode(ids);
  if (std::fwrite(bytes.data(), 1, bytes.size(), stdout) != bytes.size() || std::fflush(stdout) != 0)
    throw IoError("detokenize: writing stdout failed");
  return 0;
}

}  // namespace ldlm::cli
