// What every subcommand of the `ldlm` tool shares: the model options and their loading,
// the thread count, and printing token ids. Each subcommand is one header here,
// included once by main.cpp (one translation unit: ldlm's headers are compiled once).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <iterator>
#include <new>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "args.hpp"
#include "ldlm/io/state_dict.hpp"
#include "ldlm/io/safetensors.hpp"
#include "ldlm/io/tokenizer.hpp"
#include "ldlm/ldlm.hpp"
#include "ldlm_embedded.hpp"

namespace ldlm::cli {

/// The model options: which model, in which precision, on how many threads.
struct ModelOptions {
  std::optional<std::string> weights, config;
  std::optional<std::uint64_t> init_seed;
  Precision precision = Precision::fp32;
  std::optional<int> threads;  // all cores when not given
};

inline constexpr std::array<NamedChoice<Precision>, 3> kPrecisions{{
    {Precision::fp32, "fp32", "float32 products"},
    {Precision::bf16, "bf16", "bf16 operands, fp32 accumulation"},
    {Precision::int8, "int8", "Linear products in int8 (VNNI or AMX-INT8), the denoiser's conditioning bf16"},
}};

const Option kConfigOption = text_option("config", "C.json", &ModelOptions::config,
                                         "model configuration (JSON); default: the weights file's own, else ldlm-base");
const Option kThreadsOption = value_option("threads", "N", &ModelOptions::threads, {1, 1024},
                                           "threads of the execution context; all cores when not given");
const Option kWeightsOption =
    text_option("weights", "W.safetensors", &ModelOptions::weights, "parameters under their full state-dict names");
const Option kPrecisionOption =
    choice_option("precision", "fp32|bf16|int8", &ModelOptions::precision, kPrecisions, "precision",
                  "precision of the matrix products; bf16 keeps norms, softmax and the residual\n"
                  "stream in fp32, int8 quantizes the Linear weights per output channel and their\n"
                  "inputs per row, but the denoiser's adaLN, time MLP and ends (docs/model.md §int8)");
const Option kInitSeedOption =
    value_option("init-seed", "S", &ModelOptions::init_seed, {},
                 "generator weights of this seed instead of the built-in model (with --config: of that\n"
                 "configuration, default seed " +
                     std::to_string(kDefaultInitSeed) + ")");

/// The model configuration: the weights file's own (which --config, if given, must
/// equal), else --config, else ldlm-base.
Config load_config(const ModelOptions& options, const std::optional<SafetensorsFile>& weights) {
  std::optional<Config> given;
  if (options.config) given = Config::load(*options.config);
  if (weights) return resolve_config(*weights, given);
  return given.value_or(Config{});
}

/// The file of --weights, if given.
std::optional<SafetensorsFile> open_weights(const ModelOptions& options) {
  if (options.weights) return SafetensorsFile::open(*options.weights);
  return std::nullopt;
}

/// The model of `generate` and `reconstruct`: the file of --weights; generator
/// weights when --init-seed or --config asks for them; else the built-in demo model
/// (tools/assets/ldlm-demo), trained, linked into this program.
std::optional<SafetensorsFile> open_model(const Args& args, const ModelOptions& options) {
  if (options.weights && options.init_seed) args.fail("--init-seed applies only without --weights");
  if (options.weights || options.init_seed || options.config) return open_weights(options);
  const auto bytes = embedded::find("ldlm-demo.safetensors");
  if (!bytes) throw Error("the built-in demo model is missing from this ldlm binary");
  std::vector<std::byte> buffer(bytes->size());
  std::memcpy(buffer.data(), bytes->data(), bytes->size());
  return SafetensorsFile::from_buffer(std::move(buffer));
}

const std::string kModelChoice =
    "The model: without options, the built-in demo model, a small LDLM trained on English\n"
    "text (research/train/README.md): real reconstructions, English-like generations.\n"
    "--weights W runs the model of a file, with the configuration from its __metadata__\n"
    "'ldlm.config' when it has one (see 'ldlm forward --help'). --init-seed S (or --config C)\n"
    "gives the generator weights of ldlm-base (or of C): reproducible random weights that\n"
    "show the machinery working, not meaningful text.\n";

/// `before`, the options of the model that kModelChoice describes, then `after`.
std::vector<Option> with_model_options(std::vector<Option> before, const std::vector<Option>& after = {}) {
  for (const Option& option : {kWeightsOption, kInitSeedOption, kConfigOption, kPrecisionOption, kThreadsOption})
    before.push_back(option);
  before.insert(before.end(), after.begin(), after.end());
  return before;
}

int thread_count(const ModelOptions& options) {
  return options.threads.value_or(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

/// Runs a() and b(), on two threads when `parallel`: initialising or loading ldlm-base
/// is dominated by first-touch page faults and generator arithmetic, which split
/// well. Rethrows the first exception after both finish.
template <class A, class B>
void run_pair(bool parallel, A&& a, B&& b) {
  if (!parallel) {
    a();
    b();
    return;
  }
  std::exception_ptr error;
  std::thread worker([&] {
    try {
      a();
    } catch (...) {
      error = std::current_exception();
    }
  });
  try {
    b();
  } catch (...) {
    worker.join();
    throw;
  }
  worker.join();
  if (error) std::rethrow_exception(error);
}

/// Fills the named modules of `model` with load_or_init_module, in --precision: from
/// --weights, or else with the generator weights of --init-seed. Two groups, on two threads when
/// `parallel`.
void fill_modules(LDLM<float>& model, const ModelOptions& options, const std::optional<SafetensorsFile>& weights,
                  const std::vector<std::string_view>& first, const std::vector<std::string_view>& second,
                  bool parallel) {
  const std::uint64_t seed = options.init_seed.value_or(kDefaultInitSeed);
  auto fill = [&](const std::vector<std::string_view>& names) {
    for (const auto name : names) load_or_init_module(model, weights, name, seed, options.precision);
  };
  run_pair(
      parallel, [&] { fill(first); }, [&] { fill(second); });
}

void print_tokens(std::ostream& out, const TokenTensor& tokens) {
  const Index B = tokens.dimension(0), T = tokens.dimension(1);
  for (Index b = 0; b < B; ++b) {
    for (Index t = 0; t < T; ++t) out << (t ? " " : "") << tokens(b, t);
    out << "\n";
  }
}

std::string join(const std::vector<std::string>& words, const std::string& sep) {
  std::string s;
  for (std::size_t i = 0; i < words.size(); ++i) s += (i ? sep : "") + words[i];
  return s;
}

}  // namespace ldlm::cli
