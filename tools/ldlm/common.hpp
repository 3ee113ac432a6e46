// What every subcommand of the `ldlm` tool shares: the model options and their loading,
// the thread count, and printing token ids. Each subcommand is one header here,
// included once by main.cpp (one translation unit: ldlm's headers are compiled once).
#pragma once

#include <unistd.h>

#include <algorithm>
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

const Option kConfigOption{"config", "C.json",
                           "model configuration (JSON); default: the weights file's own, else ldlm-base"};
const Option kThreadsOption{"threads", "N", "threads of the execution context (default: all cores)"};
const Option kWeightsOption{"weights", "W.safetensors", "parameters under their full state-dict names"};
const Option kPrecisionOption{"precision", "fp32|bf16",
                              "precision of the matrix products (default fp32); bf16 keeps norms, softmax and\n"
                              "the residual stream in fp32 (docs/model.md §Precision)"};
const Option kInitSeedOption{"init-seed", "S",
                             "generator weights of this seed instead of the built-in model (with --config: of that\n"
                             "configuration, default seed " +
                                 std::to_string(kDefaultInitSeed) + ")"};

/// The model configuration: the weights file's own (which --config, if given, must
/// equal), else --config, else ldlm-base.
Config load_config(const Args& args, const std::optional<SafetensorsFile>& weights) {
  std::optional<Config> given;
  if (auto path = args.value("config")) given = Config::load(*path);
  if (weights) return resolve_config(*weights, given);
  return given.value_or(Config{});
}

/// The file of --weights, if given.
std::optional<SafetensorsFile> open_weights(const Args& args) {
  if (auto path = args.value("weights")) return SafetensorsFile::open(*path);
  return std::nullopt;
}

/// The model of `generate` and `reconstruct`: the file of --weights; generator
/// weights when --init-seed or --config asks for them; else the built-in demo model
/// (tools/assets/ldlm-demo), trained, linked into this program.
std::optional<SafetensorsFile> open_model(const Args& args) {
  if (args.has("weights") && args.has("init-seed")) args.fail("--init-seed applies only without --weights");
  if (args.has("weights") || args.has("init-seed") || args.has("config")) return open_weights(args);
  const auto bytes = embedded::find("ldlm-demo.safetensors");
  if (!bytes) throw Error("the built-in demo model is missing from this ldlm binary");
  std::vector<std::byte> buffer(bytes->size());
  std::memcpy(buffer.data(), bytes->data(), bytes->size());
  return SafetensorsFile::from_buffer(std::move(buffer));
}

const std::string kModelChoice =
    "The model: without options, the built-in demo model, a small LDLM trained on English\n"
    "text (tools/train/README.md): real reconstructions, English-like generations.\n"
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

int thread_count(const Args& args) {
  const auto cores = static_cast<std::int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  return static_cast<int>(args.get_int("threads", cores, 1, 1024));
}

Precision precision_of(const Args& args) {
  return parse_precision(args.get("precision", "fp32"), "option '--precision'");
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

/// Fills the named modules of `model` with load_or_init_module: from --weights, or
/// else with the generator weights of --init-seed. Two groups, on two threads when
/// `parallel`.
void fill_modules(LDLM<float>& model, const Args& args, const std::optional<SafetensorsFile>& weights,
                  const std::vector<std::string_view>& first, const std::vector<std::string_view>& second,
                  bool parallel, Precision precision) {
  const std::uint64_t seed = args.get_uint("init-seed", kDefaultInitSeed);
  auto fill = [&](const std::vector<std::string_view>& names) {
    for (const auto name : names) load_or_init_module(model, weights, name, seed, precision);
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
