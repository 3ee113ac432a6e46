// What generate and infill share once their known tokens are set: loading the modules
// that sampling with them needs, sampling, writing the samples, and what the run shows on
// stderr (progress, --show-steps, the timing summary).
#pragma once

#include "common.hpp"
#include "progress.hpp"
#include "sampling_options.hpp"
#include "text.hpp"

namespace ldlm::cli {

/// The options every sampling command reads, besides its own.
struct SamplingRequest {
  ModelOptions model;
  TokenizerOptions tokenizer;
  SamplingRun run;
  SamplerOptions sampler;
  ConditionOptions condition;
};

SamplingRequest sampling_request(const Args& args) {
  return {args.read<ModelOptions>(), args.read<TokenizerOptions>(), args.read<SamplingRun>(), sampler_options(args),
          args.read<ConditionOptions>()};
}

/// Writes the samples to --output, else stdout: as text with a tokenizer, else as ids.
void write_samples(const SamplingRun& run, const std::optional<Tokenizer>& tokenizer, const TokenTensor& tokens,
                   std::string_view op) {
  std::ofstream file;
  if (run.output) {
    file.open(*run.output);
    if (!file) throw IoError(std::string(op) + ": cannot open '" + *run.output + "' for writing");
  }
  std::ostream& out = run.output ? file : std::cout;
  print_samples(out, tokenizer, tokens);
  if (!out.flush()) throw IoError(std::string(op) + ": writing the samples failed");
}

/// Samples B = ids.dimension(0) sequences given the known tokens `ids` [B, T] (the mask id
/// at every free position) and writes them; then the timing summary, with `clock` started
/// when the command did. `tokenizer` is the one the command loaded for its input, if any.
/// The feature model and the encoder are loaded only when some position is known.
int sample_and_write(const SamplingRequest& request, const std::optional<SafetensorsFile>& weights,
                     const Config& config, const TokenTensor& ids, std::optional<Tokenizer> tokenizer, Stopwatch& clock,
                     std::string_view op) {
  // Pipeline checks these again; checking them here makes bad input fail at once, not
  // after the slow loading of the weights.
  check_condition_ids(op, config, ids);
  check_sampling_arguments(op, config, ids.dimension(0), ids.dimension(1), request.sampler.steps);
  bool any_known = false;
  for (Index r = 0; r < ids.size(); ++r) any_known = any_known || ids.data()[r] != mask_id(config);
  const SamplingRun& run = request.run;
  // The samples' text, loaded before the weights so that a bad --tokenizer fails early.
  if (run.ids)
    tokenizer.reset();
  else if (!tokenizer)
    tokenizer = text_tokenizer(request.tokenizer, config);
  Context ctx(thread_count(request.model));
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
  fill_modules(model, request.model, weights, first, second, parallel);
  RunTimes times;
  times.load = clock.lap();

  SamplerOptions options = request.sampler;
  if (weights) {
    options.grid.fitted = read_time_grids(*weights, config.t_min);
    options.grid.model_times = read_model_times(*weights, options.grid.fitted);
  }
  // The step view's header counts the steps, so it replaces the progress bar.
  if (!run.show_steps && !run.quiet && isatty(STDERR_FILENO)) options.progress = ProgressBar();
  StepView view(tokenizer, isatty(STDERR_FILENO) != 0, isatty(STDOUT_FILENO) && !run.output);
  TokenPreview preview;
  if (run.show_steps)
    preview = [&](const StepTokens& step) {
      ++times.previews;
      return view(step);
    };
  GenerationStats stats;
  const TokenTensor tokens = Pipeline<float>(model).generate(ctx, ids, options, request.condition, &stats, preview);
  write_samples(run, tokenizer, tokens, op);
  times.add(stats);
  times.positions = tokens.size();
  times.total = clock.elapsed();
  if (!run.quiet) print_times(times);
  return 0;
}

}  // namespace ldlm::cli
