// Generating text with the text API, and watching it form.
//
//   example_generate [LENGTH [WEIGHTS.safetensors [TOKENIZER_DIR]]]
//
// Samples two texts of LENGTH tokens (default 32) from noise with the default sampler
// (docs/model.md §Sampler): with the built-in demo model, or the model of WEIGHTS. After
// every solver step, stderr shows what the current estimate of the first text reads as;
// the timings of the call follow the texts.
#include <ldlm/text_model.hpp>

#include <cstdio>
#include <exception>
#include <string>

int main(int argc, char** argv) try {
  const int length = argc > 1 ? std::stoi(argv[1]) : 32;
  const ldlm::TextModel lm =
      argc > 2 ? ldlm::TextModel::open(argv[2], argc > 3 ? argv[3] : "") : ldlm::TextModel::demo();

  ldlm::TextTimings timings;
  const ldlm::TextOptions options{
      .length = length,
      .batch = 2,
      .seed = 2024,
      .on_step =
          [](const ldlm::TextStep& step) {
            std::fprintf(stderr, "step %d/%d, t = %.3f: %s\n", step.step, step.steps, step.t, step.texts[0].c_str());
            return true;  // false would cancel the call (ldlm::SamplingCancelled)
          },
      .timings = &timings,
  };
  for (const std::string& text : lm.generate(options)) std::printf("--- sample ---\n%s\n", text.c_str());
  std::printf("%d denoiser calls: sampling %.1f ms, previews %.1f ms, total %.1f ms\n", timings.denoiser_calls,
              timings.sample_ms, timings.preview_ms, timings.total_ms);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "example_generate: %s\n", e.what());
  return 1;
}
