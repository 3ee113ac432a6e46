// Filling gaps with the text API (docs/model.md §Conditioning).
//
//   example_infill ["TEXT with <|mask|> markers" [WEIGHTS.safetensors [TOKENIZER_DIR]]]
//
// Each <|mask|> is one token position to sample; every other token is kept. Prints
// three samples of the text, filled by the built-in demo model or by the model of
// WEIGHTS, then the same on token ids, for callers that tokenize themselves.
#include <ldlm/text_model.hpp>

#include <cstdio>
#include <exception>
#include <string>

int main(int argc, char** argv) try {
  const std::string text = argc > 1 ? argv[1] : "The children played in the <|mask|> after school.";
  const ldlm::TextModel lm =
      argc > 2 ? ldlm::TextModel::open(argv[2], argc > 3 ? argv[3] : "") : ldlm::TextModel::demo();

  for (const std::string& filled : lm.infill(text, {.batch = 3})) std::printf("%s\n", filled.c_str());

  // The same on ids: the mask id (vocab_size - 1) at each position to fill.
  ldlm::TokenIds ids = lm.tokenize("The children played in the");
  ids.push_back(lm.info().mask_id);
  for (const std::int64_t id : lm.tokenize(" after school.")) ids.push_back(id);
  for (const ldlm::TokenIds& sample : lm.infill_ids(ids)) {
    for (const std::int64_t id : sample) std::printf("%lld ", static_cast<long long>(id));
    std::printf("\n");
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "example_infill: %s\n", e.what());
  return 1;
}
