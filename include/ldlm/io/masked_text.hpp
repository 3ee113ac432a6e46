// Text with mask markers, the input of `ldlm infill` (docs/model.md §Conditioning): each
// "<|mask|>" stands for one token position to generate.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ldlm/core/error.hpp"
#include "ldlm/io/tokenizer.hpp"
#include "ldlm/io/utf8.hpp"

namespace ldlm {

inline constexpr std::string_view kMaskMarker = "<|mask|>";

/// The ids of `text`, with each kMaskMarker as one tokenizer.mask_id(). The text between
/// markers is encoded piece by piece, so no token spans a marker. GPT-2's words carry
/// their leading space, so one space right before a marker is left out of the piece:
/// "The <|mask|> sat" is "The", one free position (the masked word, space and all), and
/// " sat". Anything that is not exactly the marker, such as "<|mask", is plain text.
/// Text that is not valid UTF-8 is an InvalidArgument naming the byte offset.
inline std::vector<std::int64_t> encode_masked_text(const Tokenizer& tokenizer, std::string_view text) {
  if (auto bad = detail::find_invalid_utf8(text))
    throw InvalidArgument("masked text: the text is not valid UTF-8 at byte offset " + std::to_string(bad->offset) +
                          ": " + bad->reason);
  std::vector<std::int64_t> ids;
  for (std::size_t pos = 0;;) {
    const std::size_t marker = text.find(kMaskMarker, pos);
    std::string_view piece = text.substr(pos, marker == std::string_view::npos ? text.npos : marker - pos);
    if (marker != std::string_view::npos && piece.ends_with(' ')) piece.remove_suffix(1);
    const std::vector<std::int64_t> piece_ids = tokenizer.encode(piece);
    ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
    if (marker == std::string_view::npos) return ids;
    ids.push_back(tokenizer.mask_id());
    pos = marker + kMaskMarker.size();
  }
}

}  // namespace ldlm
