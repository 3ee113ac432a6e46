// Downstream smoke test: the whole library compiles from a foreign project, the
// ldlm-base parameter totals come out, the GPT-2 tokenizer (PCRE2, the installed
// or source-tree GPT-2 files in LDLM_CONSUMER_GPT2_DIR) encodes, and the kernels
// compile and run without the -march flags of ldlm's own targets: attention in fp32
// and in bf16 (head_dim 64: ldlm's AMX kernel where the CPU has AMX) agree. And the
// compiled text API, ldlm::text, finds the demo model with no configuration: it fills
// a gap and keeps the given text.
#include <ldlm/ldlm.hpp>

#include <cmath>
#include <vector>

namespace {
bool attention_precisions_agree() {
  ldlm::Context ctx(1);
  const ldlm::Index T = 40, H = 2, hd = 64, d = H * hd;
  std::vector<float> qkv(static_cast<std::size_t>(T * 3 * d)), fp32(static_cast<std::size_t>(T * d)), bf16(fp32);
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
  for (auto [precision, out] : {std::pair{ldlm::Precision::fp32, &fp32}, std::pair{ldlm::Precision::bf16, &bf16}})
    ldlm::attention<float>(ctx, {qkv.data(), 3 * d}, {qkv.data() + d, 3 * d}, {qkv.data() + 2 * d, 3 * d}, out->data(),
                           d, {1, T, T, H, hd}, {50.0, false, precision});
  double worst = 0;
  for (std::size_t i = 0; i < fp32.size(); ++i) {
    const double difference = std::abs(double(fp32[i]) - double(bf16[i]));
    if (!(difference <= worst)) worst = difference;  // a NaN becomes the worst and fails
  }
  return worst < 0.05;  // bf16 operands: errors of order 1e-2 at most on values of order 1
}

bool demo_model_fills_a_gap() {
  const auto texts = ldlm::TextModel::demo().infill("The <|mask|> sat on the mat.", {.steps = 4});
  return texts.size() == 1 && texts[0].starts_with("The") && texts[0].ends_with(" sat on the mat.");
}
}  // namespace

int main() {
  ldlm::ParameterCounts c = ldlm::count_parameters(ldlm::Config{});
  const auto ids = ldlm::Tokenizer::load(LDLM_CONSUMER_GPT2_DIR).encode("Hello world");
  return (c.trained == 306011162 && c.frozen == 124442112 && ids == std::vector<std::int64_t>{15496, 995} &&
          attention_precisions_agree() && demo_model_fills_a_gap())
             ? 0
             : 1;
}
