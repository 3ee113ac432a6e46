// The options of every subcommand that samples (generate, infill): the solver, its time
// grid, the noise seed and the condition's method; the sampler table of their help; and
// the progress bar.
#pragma once

#include "common.hpp"
#include "text.hpp"

namespace ldlm::cli {

/// Defaults and bounds of generate's options, which its help quotes.
constexpr Index kDefaultLength = 32;
constexpr Index kDefaultBatch = 1;
constexpr Index kMaxBatch = Index{1} << 16;
const std::uint64_t kDefaultNoiseSeed = SamplerOptions{}.seed;
constexpr int kMaxSteps = 1 << 20;

/// The sampler table of generate's help: name, denoiser calls per step, what it is.
std::string sampler_table() {
  std::string s = "samplers (--sampler; calls = denoiser calls per step):\n";
  for (const SamplerInfo& info : kSamplers) {
    const std::string name(info.name);
    s += "  " + name + std::string(14 - name.size(), ' ') + std::to_string(info.calls_per_step) + " call" +
         (info.calls_per_step > 1 ? "s" : " ") + "  " + std::string(info.summary) +
         (info.kind == kDefaultSampler ? " (default)" : "") + "\n";
  }
  s += "time grids (--schedule):\n";
  for (const NamedChoice<TimeGrid>& info : kTimeGrids) {
    const std::string name(info.name);
    s += "  " + name + std::string(14 - name.size(), ' ') + std::string(info.summary) +
         (info.value == SamplerOptions{}.grid.grid ? " (default)" : "") + "\n";
  }
  return s;
}

std::string number_text(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

/// The options shared by every command that samples: the solver, its grid and the noise.
std::vector<Option> sampler_option_list() {
  const SamplerOptions defaults;
  return {
      {"steps", "N",
       "solver steps (default " + std::to_string(defaults.steps) + "); denoiser calls = N x calls per step"},
      {"sampler", "NAME", "the solver (default " + std::string(sampler_info(defaults.kind).name) + "; table below)"},
      {"schedule", "GRID",
       "the time grid: " + time_grid_names("|") + " (default " + std::string(time_grid_info(defaults.grid.grid).name) +
           ")"},
      {"sigma-max", "R",
       "sigma/alpha where the lambda and karras grids start after the first step (default:\n"
       "that of the uniform grid's second time, about 19.9 at 10 steps)"},
      {"rho", "P", "the karras grid's exponent (default " + number_text(defaults.grid.rho) + ")"},
      {"endpoint", "denoised|sample",
       "the result: x at t_min, the last step's mean (default), or the last x0 prediction"},
      {"seed", "S",
       "noise seed (default " + std::to_string(kDefaultNoiseSeed) +
           "); the same seed and --threads give the same tokens"}};
}

/// Draws "sampling [#####.....] 4/10 steps, 4/10 calls  3.1 calls/s" on stderr.
class ProgressBar {
 public:
  ProgressBar() : start_(std::chrono::steady_clock::now()) {}

  bool operator()(const SamplingProgress& p) const {
    constexpr int kWidth = 30;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    char bar[kWidth + 1];  // no allocation: this runs inside the sampling loop
    const int filled = kWidth * p.step / p.steps;
    for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '#' : '.';
    bar[kWidth] = '\0';
    std::fprintf(stderr, "\rsampling [%s] %d/%d steps, %d/%d denoiser calls  %.2f calls/s", bar, p.step, p.steps,
                 p.denoiser_calls, p.total_calls, seconds > 0 ? p.denoiser_calls / seconds : 0.0);
    if (p.step == p.steps) std::fprintf(stderr, "  (%.2f s)\n", seconds);
    std::fflush(stderr);
    return true;
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

/// --steps, --sampler, --schedule, --sigma-max, --rho, --endpoint and --seed.
SamplerOptions sampler_options(const Args& args) {
  SamplerOptions options;
  options.steps = static_cast<int>(args.get_int("steps", options.steps, 1, kMaxSteps));
  options.seed = args.get_uint("seed", kDefaultNoiseSeed);
  const std::string sampler = args.get("sampler", std::string(sampler_info(options.kind).name));
  if (const auto kind = find_sampler(sampler))
    options.kind = *kind;
  else
    args.fail("unknown sampler '" + sampler + "' (expected one of: " + sampler_names() + ")");
  const std::string grid = args.get("schedule", std::string(time_grid_info(options.grid.grid).name));
  if (const auto found = find_time_grid(grid))
    options.grid.grid = *found;
  else
    args.fail("unknown time grid '" + grid + "' for '--schedule' (expected one of: " + time_grid_names() + ")");
  options.grid.sigma_max = args.get_double("sigma-max", options.grid.sigma_max, 0.0);
  options.grid.rho = args.get_double("rho", options.grid.rho, 0.0);
  const std::string endpoint = args.get("endpoint", options.endpoint == Endpoint::sample ? "sample" : "denoised");
  if (endpoint == "denoised")
    options.endpoint = Endpoint::denoised;
  else if (endpoint == "sample")
    options.endpoint = Endpoint::sample;
  else
    args.fail("option '--endpoint' must be 'denoised' or 'sample', got '" + endpoint + "'");
  return options;
}

/// The options of sampling with known tokens (generate --prompt/--suffix, infill).
std::vector<Option> condition_option_list() {
  const ConditionOptions defaults;
  return {{"method", "NAME",
           "how the known tokens enter the sampler: " + condition_method_names("|") + " (default " +
               std::string(condition_method_info(defaults.method).name) + "; below)"},
          {"fill", "NAME",
           "what stands at the free positions while the known tokens are encoded:\n" + known_fill_names("|") +
               " (default " + std::string(known_fill_info(defaults.fill).name) + ")"},
          {"resample", "R",
           "RePaint: take every step 1 + R times, re-noising in between (default " + std::to_string(defaults.resample) +
               "; R more denoiser calls per step)"},
          {"condition-from", "T", "apply the known tokens only at times t <= T, in (0, 1] (default 1: always)"}};
}

/// The options of a command that samples (generate, infill): `own`, --batch, the
/// sampler's, `extra`, the condition's, the model's, then --output, --ids and --tokenizer.
std::vector<Option> sampling_command_options(std::vector<Option> own, const std::vector<Option>& extra) {
  own.push_back(
      {"batch", "B",
       "number of samples, 1 to " + std::to_string(kMaxBatch) + " (default " + std::to_string(kDefaultBatch) + ")"});
  for (Option& option : sampler_option_list()) own.push_back(std::move(option));
  own.insert(own.end(), extra.begin(), extra.end());
  for (Option& option : condition_option_list()) own.push_back(std::move(option));
  return with_model_options(std::move(own), {{"output", "FILE", "write the samples there instead of stdout"},
                                             {"ids", "", "print token ids, one line per sample, instead of text"},
                                             kTokenizerOption});
}

/// The condition methods' table of the help.
std::string condition_table() {
  std::string s = "condition methods (--method):\n";
  for (const NamedChoice<ConditionMethod>& info : kConditionMethods) {
    const std::string name(info.name);
    s += "  " + name + std::string(14 - name.size(), ' ') + std::string(info.summary) +
         (info.value == ConditionOptions{}.method ? " (default)" : "") + "\n";
  }
  return s;
}

/// --method, --fill, --resample and --condition-from.
ConditionOptions condition_options(const Args& args) {
  ConditionOptions options;
  const std::string method = args.get("method", std::string(condition_method_info(options.method).name));
  if (const auto found = find_condition_method(method))
    options.method = *found;
  else
    args.fail("unknown condition method '" + method + "' for '--method' (expected one of: " + condition_method_names() +
              ")");
  const std::string fill = args.get("fill", std::string(known_fill_info(options.fill).name));
  if (const auto found = find_known_fill(fill))
    options.fill = *found;
  else
    args.fail("unknown fill '" + fill + "' for '--fill' (expected one of: " + known_fill_names() + ")");
  options.resample = static_cast<int>(args.get_int("resample", options.resample, 0, 1000));
  options.from_t = args.get_double("condition-from", options.from_t, 0.0);
  if (!(options.from_t > 0 && options.from_t <= 1))
    args.fail("option '--condition-from' must be in (0, 1], got " + *args.value("condition-from"));
  return options;
}

/// The progress bar when stderr is a terminal.
void show_progress(SamplerOptions& options) {
  if (isatty(STDERR_FILENO)) options.progress = ProgressBar();
}

}  // namespace ldlm::cli
