// libFuzzer target for GPT-2's tokenizer (the files are embedded with
// ldlm_embed_files): encode() of arbitrary bytes and decode() of arbitrary ids.
// - Valid UTF-8 must round-trip exactly; invalid UTF-8 must be an InvalidArgument at
//   the offset where PCRE2's own UTF-8 check fails (an independent oracle).
// - decode() of ids in range gives the concatenated token bytes; an id out of range
//   is an InvalidArgument.
// - encode_masked_text() (`ldlm infill`'s marker parser) of the same bytes: invalid UTF-8
//   is an InvalidArgument at the same offset; otherwise each mask id stands for one
//   "<|mask|>" and the rest decodes to the text, less the one space dropped before each
//   marker. Anything else (crash, sanitizer report) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ldlm/io/masked_text.hpp"
#include "ldlm/io/tokenizer.hpp"
#include "ldlm_embedded.hpp"

namespace {

const ldlm::Tokenizer& gpt2() {
  static const ldlm::Tokenizer t = ldlm::Tokenizer::from_vocab_and_merges(*ldlm::embedded::find("gpt2/encoder.json"),
                                                                          *ldlm::embedded::find("gpt2/vocab.bpe"));
  return t;
}

/// PCRE2's verdict on UTF-8 validity: the offset of the first bad byte, or -1.
long pcre2_invalid_offset(std::string_view text) {
  static pcre2_code_8* const any = [] {
    int code;
    PCRE2_SIZE offset;
    return pcre2_compile_8(reinterpret_cast<PCRE2_SPTR8>("x"), 1, PCRE2_UTF, &code, &offset, nullptr);
  }();
  pcre2_match_data_8* md = pcre2_match_data_create_from_pattern_8(any, nullptr);
  const int rc = pcre2_match_8(any, reinterpret_cast<PCRE2_SPTR8>(text.data()), text.size(), 0, 0, md, nullptr);
  const long offset =
      rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21 ? static_cast<long>(pcre2_get_startchar_8(md)) : -1;
  pcre2_match_data_free_8(md);
  return offset;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const ldlm::Tokenizer& t = gpt2();
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  const long bad = pcre2_invalid_offset(text);
  try {
    const auto ids = t.encode(text);
    if (bad >= 0) __builtin_trap();  // accepted invalid UTF-8
    if (t.decode(ids) != text) __builtin_trap();
  } catch (const ldlm::InvalidArgument& e) {
    const std::string expected = "at byte offset " + std::to_string(bad) + ":";
    if (bad < 0 || std::string_view(e.what()).find(expected) == std::string_view::npos) __builtin_trap();
  }

  try {
    const auto ids = ldlm::encode_masked_text(t, text);
    if (bad >= 0) __builtin_trap();
    std::string rebuilt;
    for (const auto id : ids) rebuilt += id == t.mask_id() ? std::string(ldlm::kMaskMarker) : t.token(id);
    std::string expected;
    const std::string spaced = " " + std::string(ldlm::kMaskMarker);
    for (std::size_t pos = 0; pos < text.size();) {
      if (text.compare(pos, spaced.size(), spaced) == 0) {
        expected += ldlm::kMaskMarker;
        pos += spaced.size();
      } else {
        expected += text[pos++];
      }
    }
    if (rebuilt != expected) __builtin_trap();
  } catch (const ldlm::InvalidArgument& e) {
    const std::string expected = "at byte offset " + std::to_string(bad) + ":";
    if (bad < 0 || std::string_view(e.what()).find(expected) == std::string_view::npos) __builtin_trap();
  }

  // The same bytes as 16-bit ids, a few of them outside [0, V).
  std::vector<std::int64_t> ids;
  for (std::size_t i = 0; i + 1 < size; i += 2)
    ids.push_back(static_cast<std::int64_t>((data[i] | (data[i + 1] << 8)) % (t.vocab_size() + 16)) - 8);
  bool in_range = true;
  std::size_t bytes = 0;
  for (const auto id : ids) {
    in_range = in_range && id >= 0 && id < t.vocab_size();
    if (in_range) bytes += t.token(id).size();
  }
  try {
    const std::string decoded = t.decode(ids);
    if (!in_range || decoded.size() != bytes) __builtin_trap();
    if (!ldlm::detail::find_invalid_utf8(decoded) && t.decode(t.encode(decoded)) != decoded) __builtin_trap();
  } catch (const ldlm::InvalidArgument&) {
    if (in_range) __builtin_trap();
  }
  return 0;
}
