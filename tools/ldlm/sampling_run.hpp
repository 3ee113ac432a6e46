// What generate and infill share once their known tokens are set: loading the modules
// that sampling with them needs, sampling, and writing the samples.
#pragma once

#include "common.hpp"
#include "sampling_options.hpp"
#include "text.hpp"

namespace ldlm::cli {

/// Writes the samples to --output, else stdout: as text when a tokenizer fits, else as ids.
void write_samples(const Args& args, const Config& config, const TokenTensor& tokens, std::string_view op) {
  std::ofstream file;
  if (auto path = args.value("output")) {
    file.open(*path);
    if (!file) throw IoError(std::string(op) + ": cannot open '" + *path + "' for writing");
  }
  std::ostream& out = args.has("output") ? file : std::cout;
  print_samples(out, text_tokenizer(args, config), tokens);
  if (!out.flush()) throw IoError(std::string(op) + ": writing the samples failed");
}

/// Samples B = ids.dimension(0) sequences given the known tokens `ids` [B, T] (the mask id
/// at every free position) and writes them. The feature model and the encoder are loaded
/// only when some position is known.
int sample_and_write(const Args& args, const std::optional<SafetensorsFile>& weights, const Config& config,
                     const TokenTensor& ids, SamplerOptions options, const ConditionOptions& condition,
                     std::string_view op) {
  // Pipeline checks these again; checking them here makes bad input fail at once, not
  // after the slow loading of the weights.
  check_condition_ids(op, config, ids);
  check_sampling_arguments(op, config, ids.dimension(0), ids.dimension(1), options.steps);
  bool any_known = false;
  for (Index r = 0; r < ids.size(); ++r) any_known = any_known || ids.data()[r] != mask_id(config);
  const Precision precision = precision_of(args);
  Context ctx(thread_count(args));
  const bool parallel = ctx.threads() > 1;

  LDLM<float> model(config);
  // The large tables first (lm_head, wte): packing a [V, d] table briefly holds its plain
  // values too (154 MB at ldlm-base width), and the peak is lowest while little else is
  // resident.
  std::vector<std::string_view> first = {TokenDecoder<>::kName, LatentDecoder<>::kName}, second = {Denoiser<>::kName};
  if (any_known) {
    first.insert(first.begin() + 1, GPT2Features<>::kName);
    second.push_back(LatentEncoder<>::kName);
  }
  fill_modules(model, args, weights, first, second, parallel, precision);
  show_progress(options);
  write_samples(args, config, Pipeline<float>(model).generate(ctx, ids, options, condition), op);
  return 0;
}

}  // namespace ldlm::cli
