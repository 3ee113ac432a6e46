// GPT-2's tokenizer (io/tokenizer.hpp): parity with OpenAI's tiktoken (tests/data/tokenizer,
// written by tools/reference/tokenizer/generate.mjs), exact round trips, special tokens,
// decoding and encoding errors, and concurrent use. Ids must match exactly.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ldlm/io/tokenizer.hpp"
#include "support/errors.hpp"
#include "support/reference.hpp"
#include "support/gpt2.hpp"

namespace ldlm {
namespace unit_io_tokenizer {
namespace {

using ldlm::test::gpt2;
using ldlm::test::kGpt2Dir;
using ldlm::test::read_text;
using test::error_of;
using ::testing::HasSubstr;
using Ids = std::vector<std::int64_t>;

std::string ids_string(const Ids& ids, std::size_t from = 0, std::size_t count = 12) {
  std::string s;
  // Appended piece by piece: g++ 12 warns (-Wrestrict, a false positive) on
  // `const char* + std::string&&` here.
  for (std::size_t i = from; i < ids.size() && i < from + count; ++i) {
    if (i > from) s += ' ';
    s += std::to_string(ids[i]);
  }
  return "[" + s + (from + count < ids.size() ? " ..." : "") + "]";
}

/// Equal ids, or the first difference with both sides around it.
::testing::AssertionResult same_ids(const Ids& got, const Ids& want) {
  if (got == want) return ::testing::AssertionSuccess();
  std::size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  const std::size_t from = i > 3 ? i - 3 : 0;
  return ::testing::AssertionFailure() << "first difference at id " << i << " of " << want.size() << " (got "
                                       << got.size() << "): got " << ids_string(got, from) << ", want "
                                       << ids_string(want, from);
}

// ---------------------------------------------------------------------------
// Parity with tiktoken
// ---------------------------------------------------------------------------

TEST(TokenizerParity, MatchesTiktokenOnEveryCase) {
  const auto data = nlohmann::json::parse(read_text(test::data_path("tokenizer/tiktoken_gpt2.json")));
  const auto& cases = data.at("cases");
  ASSERT_GE(cases.size(), 1500u);
  int failures = 0;
  for (const auto& c : cases) {
    const auto text = c.at("text").get<std::string>();
    const auto want = c.at("ids").get<Ids>();
    const auto got = gpt2().encode(text);
    const auto result = same_ids(got, want);
    EXPECT_TRUE(result) << "case '" << c.at("name").get<std::string>() << "', text " << detail::quote(text);
    EXPECT_EQ(gpt2().decode(want), text) << "decode, case '" << c.at("name").get<std::string>() << "'";
    if (!result && ++failures >= 10) FAIL() << "stopping after 10 differences";
  }
}

// tiktoken counts a character as white space by Unicode's White_Space property (Rust's
// \s). PCRE2's \s also matches U+180E; JavaScript's \s (the pure-JS ports) matches
// U+FEFF but not U+0085. "a  Xb" shows the rule: before a space character X the two
// spaces stay one run ("a", "  ", X, "b" -> 220 220), before anything else the second
// space joins X (" X").
TEST(TokenizerParity, WhiteSpaceIsUnicodesProperty) {
  const struct {
    const char* character;
    Ids ids;
  } cases[] = {
      {"\xc2\x85", {64, 220, 220, 126, 227, 65}},        // U+0085 NEL: white space
      {"\xc2\xa0", {64, 220, 220, 1849, 65}},            // U+00A0 NBSP: white space
      {"\xe2\x80\xa8", {64, 220, 220, 447, 101, 65}},    // U+2028: white space
      {"\xe3\x80\x80", {64, 220, 220, 5099, 222, 65}},   // U+3000: white space
      {"\xe1\xa0\x8e", {64, 220, 28053, 254, 236, 65}},  // U+180E: not (since Unicode 6.3)
      {"\xef\xbb\xbf", {64, 220, 27332, 119, 123, 65}},  // U+FEFF: not
      {"\xe2\x80\x8b", {64, 220, 20126, 65}},            // U+200B: not
  };
  for (const auto& c : cases)
    EXPECT_EQ(gpt2().encode(std::string("a  ") + c.character + "b"), c.ids) << detail::quote(c.character);
  EXPECT_EQ(gpt2().encode("\n\n\xef\xbb\xbf"), (Ids{198, 198, 171, 119, 123}));
}

TEST(Tokenizer, SpecialTokensAndSizes) {
  const Tokenizer& t = gpt2();
  EXPECT_EQ(t.vocab_size(), 50259);
  EXPECT_EQ(t.pad_id(), 50257);
  EXPECT_EQ(t.mask_id(), 50258);
  EXPECT_EQ(t.token(50256), "<|endoftext|>");
  EXPECT_EQ(t.decode(Ids{50257, 50258, 50256}), "<|pad|><|mask|><|endoftext|>");
  // Plain text: the strings of special tokens are encoded as characters.
  EXPECT_EQ(t.encode("<|endoftext|>"), (Ids{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(t.encode("<|pad|>"), (Ids{27, 91, 15636, 91, 29}));
  EXPECT_TRUE(t.encode("").empty());
  EXPECT_EQ(t.decode(Ids{}), "");
}

// ---------------------------------------------------------------------------
// Exactness
// ---------------------------------------------------------------------------

TEST(Tokenizer, RoundTripsRandomUtf8) {
  std::mt19937_64 rng(20240513);
  const Tokenizer& t = gpt2();
  for (int i = 0; i < 3000; ++i) {
    std::string text;
    const int length = 1 + static_cast<int>(rng() % 40);
    for (int k = 0; k < length; ++k) {
      const auto kind = rng() % 4;
      char32_t c = kind == 0   ? char32_t(rng() % 0x80)
                   : kind == 1 ? char32_t(rng() % 0x800)
                   : kind == 2 ? char32_t(rng() % 0x10000)
                               : char32_t(rng() % 0x110000);
      if (c >= 0xD800 && c < 0xE000) c = 0x20;
      detail::append_utf8(text, c);
    }
    const auto ids = t.encode(text);
    ASSERT_EQ(t.decode(ids), text) << "text " << detail::quote(text) << " ids " << ids_string(ids);
  }
}

TEST(Tokenizer, DecodesEveryIdAndCutCharacters) {
  const Tokenizer& t = gpt2();
  std::size_t single_bytes = 0;
  for (std::int64_t id = 0; id < t.vocab_size(); ++id) {
    const std::string bytes = t.decode(Ids{id});
    ASSERT_FALSE(bytes.empty()) << "id " << id;
    single_bytes += bytes.size() == 1;
  }
  EXPECT_EQ(single_bytes, 256u);
  // "😀" is two tokens; the first holds three of its four bytes.
  const std::string emoji = "\xf0\x9f\x98\x80";
  const Ids ids = t.encode(emoji);
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(t.decode(Ids{ids[0]}), emoji.substr(0, 3));
  EXPECT_EQ(t.decode(Ids{ids[1]}), emoji.substr(3));
  EXPECT_EQ(t.decode(Ids{ids[1], ids[0]}), emoji.substr(3) + emoji.substr(0, 3));
}

TEST(Tokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  for (const std::int64_t bad : {std::int64_t(-1), std::int64_t(50259), std::int64_t(1) << 40}) {
    const Ids ids{15496, 995, bad};
    EXPECT_THAT(error_of<InvalidArgument>([&] { gpt2().decode(ids); }),
                HasSubstr("Tokenizer::decode: id " + std::to_string(bad) +
                          " at position 2 is outside the vocabulary [0, 50259)"));
    EXPECT_THAT(error_of<InvalidArgument>([&] { gpt2().token(bad); }),
                HasSubstr("Tokenizer::token: id " + std::to_string(bad) + " is outside the vocabulary [0, 50259)"));
  }
}

TEST(Tokenizer, EncodeRejectsInvalidUtf8WithItsOffset) {
  const struct {
    std::string text, message;
  } cases[] = {
      {"ab\xff", "at byte offset 2: byte 0xff is not a UTF-8 byte"},
      {"\x80x", "at byte offset 0: byte 0x80 is a continuation byte without a lead byte"},
      {"x\xc0\xaf", "at byte offset 1: byte 0xc0 is the lead byte of an overlong encoding"},
      {"\xe0\x80\xaf", "at byte offset 0: byte 0x80 cannot follow 0xe0 in a well-formed sequence (overlong)"},
      {"12345678\xed\xa0\x80",
       "at byte offset 8: byte 0xa0 cannot follow 0xed in a well-formed sequence (a surrogate)"},
      {"\xf4\x90\x80\x80", "at byte offset 0: byte 0x90 cannot follow 0xf4 in a well-formed sequence (above U+10FFFF)"},
      {"caf\xc3", "at byte offset 3: the 2-byte sequence starting with 0xc3 is cut off by the end of the text"},
      {"a\xe2\x82(b", "at byte offset 1: byte 0x28 cannot follow 0xe2 ... in a well-formed sequence"},
      {"\xf8\x88\x80\x80\x80", "at byte offset 0: byte 0xf8 is not a UTF-8 byte"},
  };
  for (const auto& c : cases)
    EXPECT_THAT(error_of<InvalidArgument>([&] { gpt2().encode(c.text); }),
                HasSubstr("Tokenizer::encode: the text is not valid UTF-8 " + c.message))
        << detail::quote(c.text);
}

// ---------------------------------------------------------------------------
// Threads (run under ThreadSanitizer by the tsan preset: ctest -R Concurrent)
// ---------------------------------------------------------------------------

TEST(TokenizerConcurrent, LoadAndEncodeFromManyThreads) {
  const auto data = nlohmann::json::parse(read_text(test::data_path("tokenizer/tiktoken_gpt2.json")));
  std::vector<std::pair<std::string, Ids>> cases;
  for (const auto& c : data.at("cases")) cases.emplace_back(c.at("text").get<std::string>(), c.at("ids").get<Ids>());
  const Tokenizer shared = Tokenizer::load(kGpt2Dir);  // a fresh, empty cache
  constexpr int kThreads = 4;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int w = 0; w < kThreads; ++w)
    threads.emplace_back([&, w] {
      const Tokenizer own = w == 0 ? Tokenizer::load(kGpt2Dir) : shared;  // loading races with encoding
      for (std::size_t i = 0; i < cases.size(); ++i) {
        const auto& [text, want] = cases[(i * 7 + std::size_t(w) * 131) % cases.size()];
        mismatches[std::size_t(w)] += own.encode(text) != want || own.decode(want) != text;
      }
    });
  for (auto& t : threads) t.join();
  for (int w = 0; w < kThreads; ++w) EXPECT_EQ(mismatches[std::size_t(w)], 0) << "thread " << w;
}

}  // namespace
}  // namespace unit_io_tokenizer
}  // namespace ldlm
