// The options of every subcommand that samples (generate, infill): the solver, its time
// grid, the noise seed, the condition's method, and what the run prints; the sampler table
// of their help.
#pragma once

#include "common.hpp"
#include "text.hpp"

namespace ldlm::cli {

constexpr Index kDefaultLength = 32;
constexpr Index kMaxBatch = Index{1} << 16;
constexpr int kMaxSteps = 1 << 20;

/// What a sampling command produces and shows, besides the samples' content.
struct SamplingRun {
  Index batch = 1;
  std::optional<std::string> output;
  bool ids = false;
  bool quiet = false;
  bool show_steps = false;
};

inline constexpr std::array<NamedChoice<Endpoint>, 2> kEndpoints{{
    {Endpoint::sample, "sample", "x at t_min, the last step's mean"},
    {Endpoint::denoised, "denoised", "the last x0 prediction"},
}};

/// The help's paragraph on what a sampling run writes to stderr.
const std::string kSamplingStderr =
    "On stderr: a progress bar while sampling, when stderr is a terminal, and a timing\n"
    "summary after the run (load, encode, sampling, decode, total, tokens/s); --quiet\n"
    "hides both. --show-steps shows the text of every step's x0 prediction instead of the\n"
    "bar: when stderr is a terminal, redrawn in place (a 'step i/N  t=...' header, then each\n"
    "sample, cut to the terminal's height); otherwise one line per step and sample,\n"
    "'step i/N t=0.512 [sample b] TEXT', with newlines written as \\n. stdout holds the\n"
    "final samples either way.\n";

/// A help table of named choices: name, summary, "(default)" at `fallback`'s entry.
template <class Table, class Value>
std::string choice_table(const std::string& title, const Table& table, Value fallback, const std::string& extra = {}) {
  std::string s = title + ":\n";
  for (const auto& entry : table) {
    const std::string name(entry.name);
    s += "  " + name + std::string(14 - name.size(), ' ');
    if constexpr (requires { entry.calls_per_step; })
      s += std::to_string(entry.calls_per_step) + " call" + (entry.calls_per_step > 1 ? "s" : " ") + "  ";
    s += std::string(entry.summary) + (detail::entry_value(entry) == fallback ? " (default)" : "") + "\n";
  }
  return s + extra;
}

/// The sampler and time grid tables of generate's help.
std::string sampler_table() {
  return choice_table("samplers (--sampler; calls = denoiser calls per step)", kSamplers, SamplerOptions{}.kind) +
         choice_table("time grids (--schedule)", kTimeGrids, TimeGridOptions{}.grid);
}

/// The condition methods' table of the help.
std::string condition_table() {
  return choice_table("condition methods (--method)", kConditionMethods, ConditionOptions{}.method);
}

/// The options shared by every command that samples: the solver, its grid and the noise.
std::vector<Option> sampler_option_list() {
  return {
      value_option("steps", "N", &SamplerOptions::steps, {1, kMaxSteps},
                   "solver steps; denoiser calls = N x calls per step"),
      choice_option("sampler", "NAME", &SamplerOptions::kind, kSamplers, "sampler", "the solver, from the table below"),
      choice_option("schedule", "GRID", &TimeGridOptions::grid, kTimeGrids, "time grid",
                    "the time grid, from the table below"),
      value_option("sigma-max", "R", &TimeGridOptions::sigma_max, {0.0},
                   "sigma/alpha where the lambda and karras grids start after the first step;\n"
                   "0: that of the uniform grid's second time, about 19.9 at 10 steps"),
      value_option("rho", "P", &TimeGridOptions::rho, {0.0}, "the karras grid's exponent"),
      choice_option("endpoint", ldlm::detail::joined_names(kEndpoints, "|"), &SamplerOptions::endpoint, kEndpoints,
                    "endpoint",
                    "the result: sample, x at t_min (the last step's mean), or denoised, the last x0\n"
                    "prediction"),
      choice_option("self-condition", ldlm::detail::joined_names(kSelfConditions, "|"), &SamplerOptions::self_condition,
                    kSelfConditions, "self-condition",
                    "the x0 each denoiser call is conditioned on: previous, the last step's, or\n"
                    "extrapolated to the call's time from the last two steps'"),
      choice_option("unipc-variant", ldlm::detail::joined_names(kUniPCVariants, "|"), &SamplerOptions::unipc_variant,
                    kUniPCVariants, "UniPC variant",
                    "UniPC's B(h) (unipc, unipc-3m): bh2, e^h - 1, or bh1, h; it changes only the\n"
                    "weight of the predictor with one earlier x0"),
      value_option("seed", "S", &SamplerOptions::seed, {},
                   "noise seed; the same seed and --threads give the same tokens"),
  };
}

/// --steps, --sampler, --schedule, --sigma-max, --rho, --endpoint, --self-condition,
/// --unipc-variant and --seed.
SamplerOptions sampler_options(const Args& args) {
  SamplerOptions options = args.read<SamplerOptions>();
  options.grid = args.read(options.grid);
  return options;
}

/// The options of sampling with known tokens (generate --prompt/--suffix, infill).
std::vector<Option> condition_option_list() {
  return {
      choice_option("method", "NAME", &ConditionOptions::method, kConditionMethods, "condition method",
                    "how the known tokens enter the sampler, from the table below"),
      choice_option("fill", ldlm::detail::joined_names(kKnownFills, "|"), &ConditionOptions::fill, kKnownFills, "fill",
                    "what stands at the free positions while the known tokens are encoded"),
      value_option("resample", "R", &ConditionOptions::resample, {0, 1000},
                   "RePaint: take every step 1 + R times, re-noising in between; R more denoiser\n"
                   "calls per step"),
      value_option("condition-from", "T", &ConditionOptions::from_t, {0.0, 1.0, true},
                   "apply the known tokens only at times t <= T; 1: always"),
  };
}

/// The options of a command that samples (generate, infill): `own`, --batch, the
/// sampler's, `extra`, the condition's, the model's, then what the run writes and shows.
std::vector<Option> sampling_command_options(std::vector<Option> own, const std::vector<Option>& extra) {
  own.push_back(value_option("batch", "B", &SamplingRun::batch, {1, kMaxBatch}, "number of samples"));
  for (Option& option : sampler_option_list()) own.push_back(std::move(option));
  own.insert(own.end(), extra.begin(), extra.end());
  for (Option& option : condition_option_list()) own.push_back(std::move(option));
  return with_model_options(
      std::move(own),
      {text_option("output", "FILE", &SamplingRun::output, "write the samples there instead of stdout"),
       flag_option("ids", &SamplingRun::ids, "print token ids, one line per sample, instead of text"), kTokenizerOption,
       flag_option("show-steps", &SamplingRun::show_steps,
                   "show the text of every step's x0 prediction on stderr (see below; costs a\n"
                   "decode per step)"),
       flag_option("quiet", &SamplingRun::quiet, "no progress bar and no timing summary on stderr")});
}

}  // namespace ldlm::cli
