// Downstream smoke test: the whole library compiles from a foreign project, the
// ldlm-base parameter totals come out, and the GPT-2 tokenizer (PCRE2, the installed
// or source-tree GPT-2 files in LDLM_CONSUMER_GPT2_DIR) encodes.
#include <ldlm/ldlm.hpp>

int main() {
  ldlm::ParameterCounts c = ldlm::count_parameters(ldlm::Config{});
  const auto ids = ldlm::Tokenizer::load(LDLM_CONSUMER_GPT2_DIR).encode("Hello world");
  return (c.trained == 306011162 && c.frozen == 124442112 && ids == std::vector<std::int64_t>{15496, 995}) ? 0 : 1;
}
