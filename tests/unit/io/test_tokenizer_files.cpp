// The tokenizer's three file formats (io/tokenizer_files.hpp): GPT-2's own files, Hugging
// Face's vocab.json + merges.txt and tokenizer.json give the same ids; every loader error
// names the file, the place and what was wrong.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ldlm/io/tokenizer.hpp"
#include "support/errors.hpp"
#include "support/reference.hpp"
#include "support/vocabulary.hpp"
#include "support/gpt2.hpp"

namespace ldlm {
namespace unit_io_tokenizer_files {
namespace {

using ldlm::test::gpt2;
using ldlm::test::kGpt2Dir;
using ldlm::test::read_text;
using test::error_of;
using ::testing::HasSubstr;
using Ids = std::vector<std::int64_t>;

using test::vocab_json;

// ---------------------------------------------------------------------------
// File formats
// ---------------------------------------------------------------------------

class TokenizerFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("ldlm_tokenizer_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  std::string dir() const { return dir_.string(); }

  /// GPT-2's files as one Hugging Face tokenizer.json.
  static std::string gpt2_tokenizer_json(bool merges_as_pairs) {
    nlohmann::json merges = nlohmann::json::array();
    const std::string bpe = read_text(kGpt2Dir + "/vocab.bpe");
    std::size_t pos = bpe.find('\n') + 1;
    while (pos < bpe.size()) {
      const std::size_t end = bpe.find('\n', pos), space = bpe.find(' ', pos);
      const std::string left = bpe.substr(pos, space - pos), right = bpe.substr(space + 1, end - space - 1);
      merges.push_back(merges_as_pairs ? nlohmann::json::array({left, right}) : nlohmann::json(left + " " + right));
      pos = end + 1;
    }
    return nlohmann::json{
        {"version", "1.0"},
        {"added_tokens", {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}}},
        {"normalizer", nullptr},
        {"pre_tokenizer",
         {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
        {"model",
         {{"type", "BPE"},
          {"vocab", nlohmann::json::parse(read_text(kGpt2Dir + "/encoder.json"))},
          {"merges", merges}}}}
        .dump();
  }

  std::filesystem::path dir_;
};

const std::string kSample =
    "Hello world! It's 2024, we'LL see.\n\n  \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd\t\r\nend  ";

TEST_F(TokenizerFiles, HuggingFaceFilesGiveTheSameIds) {
  write("vocab.json", read_text(kGpt2Dir + "/encoder.json"));
  write("merges.txt", read_text(kGpt2Dir + "/vocab.bpe"));
  EXPECT_EQ(Tokenizer::load(dir()).encode(kSample), gpt2().encode(kSample));
}

TEST_F(TokenizerFiles, TokenizerJsonGivesTheSameIds) {
  for (const bool pairs : {false, true}) {
    write("tokenizer.json", gpt2_tokenizer_json(pairs));
    const Tokenizer t = Tokenizer::load(dir());
    EXPECT_EQ(t.vocab_size(), 50259);
    EXPECT_EQ(t.encode(kSample), gpt2().encode(kSample)) << (pairs ? "merges as pairs" : "merges as strings");
  }
}

TEST_F(TokenizerFiles, DirectoryErrors) {
  EXPECT_THAT(error_of<IoError>([&] { Tokenizer::load(dir() + "/missing"); }),
              HasSubstr("tokenizer: '" + dir() +
                        "/missing' is not a directory (expected encoder.json + vocab.bpe, "
                        "vocab.json + merges.txt, or tokenizer.json)"));
  EXPECT_THAT(error_of<IoError>([&] { Tokenizer::load(dir()); }),
              HasSubstr("tokenizer: '" + dir() + "' holds no tokenizer files"));
  write("encoder.json", "{}");
  EXPECT_THAT(error_of<IoError>([&] { Tokenizer::load(dir()); }),
              HasSubstr("tokenizer: '" + dir() + "' has encoder.json but no vocab.bpe"));
  std::filesystem::create_directory(dir_ / "vocab.bpe");
  EXPECT_THAT(error_of<IoError>([&] { Tokenizer::load(dir()); }),
              HasSubstr("tokenizer: '" + (dir_ / "vocab.bpe").string() + "' is not a regular file"));
}

// ---------------------------------------------------------------------------
// Hostile files: each error names the file, the place and what was wrong
// ---------------------------------------------------------------------------

std::string vocab_error(const std::string& vocab, const std::string& merges = "") {
  return error_of<FormatError>([&] { Tokenizer::from_vocab_and_merges(vocab, merges, "v.json", "m.txt"); });
}

TEST(TokenizerFilesHostile, Vocabulary) {
  const std::string bytes = vocab_json({});
  const std::string body = bytes.substr(1, bytes.size() - 2);  // the 256 entries without braces
  const struct {
    std::string vocab, message;
  } cases[] = {
      {"", "tokenizer v.json: not valid JSON: [json.exception.parse_error.101]"},
      {bytes.substr(0, 300),
       "tokenizer v.json: not valid JSON: [json.exception.parse_error.101] parse error at line 1, column 301"},
      {"[1, 2]", "tokenizer v.json: expected an object of token -> id, found an array"},
      {"42", "tokenizer v.json: expected an object of token -> id, found number 42"},
      {"{}", "tokenizer v.json: the vocabulary is empty (expected at least the 256 byte tokens)"},
      {"{" + body + ", \"ab\": {\"x\": 1}}",
       "tokenizer v.json: key 'ab': expected a non-negative integer id, found an object"},
      {"{" + body + ", \"ab\": [256]}", "key 'ab': expected a non-negative integer id, found an array"},
      {"{" + body + ", \"ab\": \"256\"}", "key 'ab': expected a non-negative integer id, found string \"256\""},
      {"{" + body + ", \"ab\": 256.0}", "key 'ab': expected a non-negative integer id, found number 256.0"},
      {"{" + body + ", \"ab\": null}", "key 'ab': expected a non-negative integer id, found null"},
      {"{" + body + ", \"ab\": -1}",
       "key 'ab': id -1 is outside [0, 257): the ids of 257 tokens must be 0..256, each once"},
      {"{" + body + ", \"ab\": 300}", "key 'ab': id 300 is outside [0, 257)"},
      {"{" + body + ", \"ab\": 18446744073709551615}", "key 'ab': id 18446744073709551615 is outside [0, 257)"},
      {"{" + body + ", \"ab\": 99999999999999999999999}", "key 'ab': expected a non-negative integer id, found number"},
      {"{" + body + ", \"ab\": 38}", "key 'ab': id 38 is already the id of '&' (ids must be unique)"},
      {"{" + body + ", \"a\": 256}", "tokenizer v.json: token 'a' appears twice, with ids 97 and 256"},
      {"{" + body + ", \"\": 256}", "key '': a token cannot be empty"},
      {"{" + body + ", \"a b\": 256}",
       "key 'a b': character U+0020 is not one of GPT-2's 256 byte-level characters (a space is written U+0120 'Ġ')"},
      {"{" + body + ", \"\\u3042\": 256}", "character U+3042 is not one of GPT-2's 256 byte-level characters"},
      {"{" + body + ", \"" + std::string(5000, 'a') + "\": 256}",
       "the token has 5000 bytes, more than the limit of 4096"},
      {"{" + body + ", \"a\xff\": 256}", "not valid JSON: [json.exception.parse_error.101] parse error at line 1"},
      {"{" + body + ", \"\\ud800\": 256}", "not valid JSON: [json.exception.parse_error.101]"},
      {"{" + body + "} trailing", "not valid JSON: [json.exception.parse_error.101]"},
      {"{" + body.substr(body.find(',') + 2) + ", \"ab\": 0}",
       "tokenizer v.json: no token for byte 0x00 (expected the key 'Ā'"},
      {std::string(detail::tok::kMaxFileBytes + 1, ' '),
       "tokenizer v.json: file is 67108865 bytes, more than the limit of 67108864"},
  };
  for (const auto& c : cases) EXPECT_THAT(vocab_error(c.vocab), HasSubstr(c.message)) << detail::quote(c.vocab);
  std::string huge = "{";
  for (int i = 0; i <= 1'000'000; ++i) huge += "\"t" + std::to_string(i) + "\": 0, ";
  EXPECT_THAT(vocab_error(huge), HasSubstr("tokenizer v.json: more than the limit of 1000000 tokens"));
  // A newline's token is "Ċ" (U+010A).
  std::string no_newline = bytes;
  const std::string newline_entry = "\"\xc4\x8a\": 10,";
  no_newline.replace(no_newline.find(newline_entry), newline_entry.size(), "\"ab\": 10,");
  EXPECT_THAT(vocab_error(no_newline),
              HasSubstr("no token for byte 0x0a (expected the key '\xc4\x8a': every byte needs a token)"));
}

TEST(TokenizerFilesHostile, Merges) {
  const std::string vocab = vocab_json({"ab", "abc", "bc"});
  const struct {
    std::string merges, message;
  } cases[] = {
      {"a b\nabc\n", "tokenizer m.txt: line 2: expected 'LEFT RIGHT' (two tokens and one space), found 'abc'"},
      {"a b c\n", "line 1: expected 'LEFT RIGHT' (two tokens and one space), found 'a b c'"},
      {" ab\n", "line 1: expected 'LEFT RIGHT'"},
      {"a  b\n", "line 1: expected 'LEFT RIGHT'"},
      {"a \n", "line 1: expected 'LEFT RIGHT'"},
      {"#version: 0.2\na b\n\nab c\n", "tokenizer m.txt: line 3: empty line before more merges (line 4)"},
      {"a zz\n", "tokenizer m.txt: line 1: merge 'a zz': part 'zz' is not in v.json"},
      {"a b\nab d\n", "line 2: merge 'ab d': the result 'abd' is not in v.json"},
      {"ab c\na b\n", "line 1: merge 'ab c': part 'ab' is neither a byte nor made by an earlier merge"},
      {"a b\nb c\na b\n", "line 3: merge 'a b': the result 'ab' is already made by line 1"},
      {"a b\nb c\nab c\na bc\n", "line 4: merge 'a bc': the result 'abc' is already made by line 3"},
      {"a b\na\xffz\n", "tokenizer m.txt: line 2: not valid UTF-8 at byte offset 5: byte 0xff is not a UTF-8 byte"},
      {"a \xe3\x81\x82\n",
       "line 1: merge 'a \xe3\x81\x82': character U+3042 in '\xe3\x81\x82' is not one of GPT-2's 256 byte-level "
       "characters"},
      {std::string(detail::tok::kMaxFileBytes + 1, 'a'),
       "tokenizer m.txt: file is 67108865 bytes, more than the limit of 67108864"},
  };
  for (const auto& c : cases)
    EXPECT_THAT(vocab_error(vocab, c.merges), HasSubstr(c.message)) << detail::quote(c.merges);
  std::string many;
  for (int i = 0; i < 300; ++i) many += "a b\n";
  EXPECT_THAT(vocab_error(vocab, many),
              HasSubstr("tokenizer m.txt: 300 merges for 259 tokens (each merge makes a new token)"));
  // CRLF line ends and a missing final newline are fine.
  EXPECT_EQ(Tokenizer::from_vocab_and_merges(vocab, "#version: 0.2\r\na b\r\nab c").encode("abc"), (Ids{257}));
}

TEST(TokenizerFilesHostile, TokenizerJson) {
  const nlohmann::json vocab = nlohmann::json::parse(vocab_json({"ab"}));
  auto file = [&](nlohmann::json edits) {
    nlohmann::json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b"}}}}};
    j.merge_patch(edits);
    return j.dump();
  };
  auto error = [](const std::string& text) {
    return error_of<FormatError>([&] { Tokenizer::from_tokenizer_json(text, "t.json"); });
  };
  EXPECT_EQ(Tokenizer::from_tokenizer_json(file(nlohmann::json::object())).encode("ab"), (Ids{256}));
  std::string deep = "{\"model\": ";
  for (int i = 0; i < 20; ++i) deep += "[";
  const struct {
    std::string text, message;
  } cases[] = {
      {"[]", "tokenizer t.json: expected a JSON object, found array []"},
      {"{\"model\": {}, \"model\": {}}", "tokenizer t.json: duplicate key 'model' in the top-level object"},
      {deep, "tokenizer t.json: JSON is nested deeper than 16 levels"},
      {"{\"mod", "tokenizer t.json: not valid JSON"},
      {"{}", "tokenizer t.json: missing key 'model'"},
      {file({{"model", 3}}), "tokenizer t.json: model: expected an object, found number 3"},
      {file({{"model", {{"type", "WordPiece"}}}}),
       "tokenizer t.json: model.type: expected \"BPE\", found string \"WordPiece\""},
      {file({{"model", {{"vocab", nullptr}}}}), "tokenizer t.json: model: missing key 'vocab'"},
      {file({{"model", {{"vocab", {1, 2}}}}}),
       "tokenizer t.json: model.vocab: expected an object of token -> id, found array"},
      {R"({"model": {"vocab": {"a": 0}, "merges": []}})", "tokenizer t.json: no token for byte 0x00"},
      {file({{"model", {{"merges", "a b"}}}}),
       "tokenizer t.json: model.merges: expected an array of merges, found string"},
      {file({{"model", {{"merges", nlohmann::json::array({"a b", 7})}}}}),
       "tokenizer t.json: model.merges[1]: expected \"LEFT RIGHT\" or [\"LEFT\", \"RIGHT\"] (non-empty), found number "
       "7"},
      {file({{"model", {{"merges", nlohmann::json::array({nlohmann::json::array({"a", "b", "c"})})}}}}),
       "model.merges[0]: expected \"LEFT RIGHT\" or [\"LEFT\", \"RIGHT\"]"},
      {file({{"model", {{"merges", nlohmann::json::array({nlohmann::json::array({"a", ""})})}}}}),
       "model.merges[0]: expected \"LEFT RIGHT\" or [\"LEFT\", \"RIGHT\"]"},
      {file({{"model", {{"merges", {"ab"}}}}}),
       "model.merges[0]: expected 'LEFT RIGHT' (two tokens and one space), found 'ab'"},
      {file({{"model", {{"merges", {"a x"}}}}}), "model.merges[0]: merge 'a x': the result 'ax' is not in model.vocab"},
      {file({{"normalizer", {{"type", "NFC"}}}}),
       "tokenizer t.json: normalizer: expected null (GPT-2 does not normalize text)"},
      {file({{"pre_tokenizer", {{"type", "Whitespace"}}}}),
       "tokenizer t.json: pre_tokenizer: expected {\"type\": \"ByteLevel\"}"},
      {file({{"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", true}}}}),
       "pre_tokenizer.add_prefix_space: expected false (GPT-2 adds no space before the text)"},
      {file({{"pre_tokenizer", {{"type", "ByteLevel"}, {"use_regex", false}}}}),
       "pre_tokenizer.use_regex: expected true"},
      {file({{"added_tokens", {{{"id", 257}, {"content", "<|pad|>"}}}}}),
       "tokenizer t.json: added_tokens[0]: id 257 ('<|pad|>') is not in model.vocab of 257 tokens; ldlm adds only pad "
       "and mask"},
      {file({{"added_tokens", {{{"id", 256}, {"content", "<|endoftext|>"}}}}}),
       "added_tokens[0]: content '<|endoftext|>' differs from model.vocab's token 256, 'ab'"},
      {file({{"added_tokens", {{{"id", -1}}}}}),
       "added_tokens[0]: expected an object with an unsigned \"id\" and a string \"content\""},
      {file({{"added_tokens", 5}}), "tokenizer t.json: added_tokens: expected an array, found number 5"},
  };
  for (const auto& c : cases) EXPECT_THAT(error(c.text), HasSubstr(c.message)) << c.text.substr(0, 200);
}

}  // namespace
}  // namespace unit_io_tokenizer_files
}  // namespace ldlm
