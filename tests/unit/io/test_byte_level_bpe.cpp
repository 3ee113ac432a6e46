// GPT-2's byte-level BPE (io/byte_level_bpe.hpp) on small vocabularies: merge order is
// the rank, not the position; equal ranks merge leftmost first; long words stay exact.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "ldlm/io/tokenizer.hpp"
#include "support/errors.hpp"
#include "support/reference.hpp"
#include "support/vocabulary.hpp"

namespace ldlm {
namespace unit_io_byte_level_bpe {
namespace {

using Ids = std::vector<std::int64_t>;

using test::vocab_json;

// ---------------------------------------------------------------------------
// BPE on small vocabularies: merge order is the rank, not the position
// ---------------------------------------------------------------------------

TEST(ByteLevelBpe, MergesByRankNotPosition) {
  // "b c" has the better rank, so "abc" is a + bc although "a b" comes first in the text.
  const auto t = Tokenizer::from_vocab_and_merges(vocab_json({"bc", "ab"}), "#version: 0.2\nb c\na b\n");
  EXPECT_EQ(t.encode("abc"), (Ids{'a', 256}));
  EXPECT_EQ(t.encode("abd"), (Ids{257, 'd'}));
  EXPECT_EQ(t.vocab_size(), 256 + 2 + 2);
  EXPECT_EQ(t.pad_id(), 258);
}

TEST(ByteLevelBpe, EqualRanksMergeLeftmostFirst) {
  const auto t = Tokenizer::from_vocab_and_merges(vocab_json({"aa", "aaa"}), "a a\naa a\n");
  EXPECT_EQ(t.encode("aa"), (Ids{256}));
  EXPECT_EQ(t.encode("aaaa"), (Ids{256, 256}));
  // "aaa": a a -> aa at the left, then aa a -> aaa.
  EXPECT_EQ(t.encode("aaaaa"), (Ids{256, 257}));
}

TEST(ByteLevelBpe, LongWordsStayExact) {
  // 20000 bytes in one piece: the heap keeps BPE O(n log n), and every merge is right.
  const auto t = Tokenizer::from_vocab_and_merges(vocab_json({"ab", "abab"}), "a b\nab ab\n");
  std::string word;
  for (int i = 0; i < 10000; ++i) word += "ab";
  const Ids ids = t.encode(word);
  ASSERT_EQ(ids.size(), 5000u);
  for (auto id : ids) ASSERT_EQ(id, 257);
  EXPECT_EQ(t.decode(ids), word);
}

}  // namespace
}  // namespace unit_io_byte_level_bpe
}  // namespace ldlm
