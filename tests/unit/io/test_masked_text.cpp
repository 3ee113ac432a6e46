// The mask markers of `ldlm infill` (io/masked_text.hpp): each "<|mask|>" is one mask id,
// the text between markers is encoded piece by piece, one space right before a marker
// belongs to the masked token, and anything but the exact marker is plain text.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ldlm/io/masked_text.hpp"
#include "support/errors.hpp"
#include "support/gpt2.hpp"

namespace ldlm {
namespace unit_io_masked_text {
namespace {

using ldlm::test::gpt2;
using Ids = std::vector<std::int64_t>;
using ::testing::HasSubstr;

constexpr std::int64_t kMask = 50258;

TEST(MaskedText, EachMarkerIsOneMaskIdAndTheSpaceBeforeItBelongsToIt) {
  // "The" = 464, " sat" = 3332, " on the" = 319 262, "." = 13.
  EXPECT_EQ(encode_masked_text(gpt2(), "The <|mask|> sat"), (Ids{464, kMask, 3332}));
  EXPECT_EQ(encode_masked_text(gpt2(), "The <|mask|> sat on the <|mask|><|mask|>."),
            (Ids{464, kMask, 3332, 319, 262, kMask, kMask, 13}));
  // Markers at both ends and alone; an empty text is no ids.
  EXPECT_EQ(encode_masked_text(gpt2(), "<|mask|> sat <|mask|>"), (Ids{kMask, 3332, kMask}));
  EXPECT_EQ(encode_masked_text(gpt2(), "<|mask|>"), (Ids{kMask}));
  EXPECT_EQ(encode_masked_text(gpt2(), ""), Ids{});
  // Only one space goes with the marker: the other stays text (" " = 220).
  EXPECT_EQ(encode_masked_text(gpt2(), "The  <|mask|>"), (Ids{464, 220, kMask}));
  // Without markers it is the tokenizer's own encoding.
  EXPECT_EQ(encode_masked_text(gpt2(), "The cat sat on the mat."), gpt2().encode("The cat sat on the mat."));
}

TEST(MaskedText, AnythingButTheExactMarkerIsPlainText) {
  for (const std::string text : {"a <|mask b", "<|MASK|>", "<|mask |>", "<| mask|>", "<|mask", "mask|>"})
    EXPECT_EQ(encode_masked_text(gpt2(), text), gpt2().encode(text)) << text;
  // "a" = 64; " <|mask b" = 1279 91 27932 275.
  EXPECT_EQ(encode_masked_text(gpt2(), "a <|mask|> <|mask b"), (Ids{64, kMask, 1279, 91, 27932, 275}));
}

TEST(MaskedText, InvalidUtf8IsAnErrorAtItsOffsetInTheWholeText) {
  EXPECT_THAT(test::error_of<InvalidArgument>([] { encode_masked_text(gpt2(), "ab <|mask|> c\xff"); }),
              HasSubstr("masked text: the text is not valid UTF-8 at byte offset 13: byte 0xff is not a UTF-8 byte"));
}

}  // namespace
}  // namespace unit_io_masked_text
}  // namespace ldlm
