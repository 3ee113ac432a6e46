// The `ldlm` command line tool: parameter counts, single-module forward passes on
// named safetensors inputs (docs/model.md §Module inputs and outputs), tensor comparison, generation,
// reconstruction and GPT-2 tokenization. Errors print "ldlm: error: ..." and exit
// with 2 (usage) or 1 (runtime: files, tensors, configuration, numerics).
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
#include "ldlm/io/safetensors.hpp"
#include "ldlm/io/state_dict.hpp"
#include "ldlm/io/tokenizer.hpp"
#include "ldlm/ldlm.hpp"
#include "ldlm_embedded.hpp"

namespace ldlm::cli {
namespace {

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

// ---------------------------------------------------------------------------
// Reading named inputs
// ---------------------------------------------------------------------------

/// The inputs file of `forward`: every accessor names the tensor in its errors.
class Inputs {
 public:
  Inputs(const std::string& path, std::string module)
      : file_(SafetensorsFile::open(path)), module_(std::move(module)) {}

  /// A floating [B, T, d] activation.
  Tensor3<float> activation(const std::string& name, Index d) const {
    const TensorInfo& info = require(name);
    require_float(info);
    if (info.shape.size() != 3 || info.shape[2] != d)
      throw ShapeError(where(name) + " has shape " + shape_string(info.shape) + ", expected [B, T, " +
                       std::to_string(d) + "]");
    Tensor3<float> t(info.shape[0], info.shape[1], info.shape[2]);
    file_.read_into(name, t.data(), t.size());
    return t;
  }

  /// A floating [B] vector.
  Tensor1<float> vector(const std::string& name, Index B) const {
    const TensorInfo& info = require(name);
    require_float(info);
    if (info.shape != Shape{B})
      throw ShapeError(where(name) + " has shape " + shape_string(info.shape) + ", expected [" + std::to_string(B) +
                       "] (one time per sequence)");
    Tensor1<float> t(B);
    file_.read_into(name, t.data(), t.size());
    return t;
  }

  /// Token ids [B, T], I64 or I32.
  TokenTensor tokens(const std::string& name) const {
    const TensorInfo& info = require(name);
    if (!dtype_is_integer(info.dtype))
      throw InvalidArgument(where(name) + " has dtype " + std::string(dtype_name(info.dtype)) +
                            ", expected I64 or I32 token ids");
    if (info.shape.size() != 2)
      throw ShapeError(where(name) + " has shape " + shape_string(info.shape) + ", expected [B, T]");
    TokenTensor t(info.shape[0], info.shape[1]);
    file_.read_into(name, t.data(), t.size());
    return t;
  }

 private:
  std::string where(const std::string& name) const {
    return "forward " + module_ + ": input tensor '" + name + "' in '" + file_.path() + "'";
  }

  const TensorInfo& require(const std::string& name) const {
    if (file_.contains(name)) return file_.info(name);
    std::vector<std::string> present;
    for (const auto& t : file_.tensors()) present.push_back("'" + t.name + "'");
    throw InvalidArgument("forward " + module_ + ": inputs '" + file_.path() + "' have no tensor '" + name +
                          "' (they hold " + (present.empty() ? std::string("no tensors") : join(present, ", ")) + ")");
  }

  void require_float(const TensorInfo& info) const {
    if (dtype_is_integer(info.dtype))
      throw InvalidArgument(where(info.name) + " has dtype " + std::string(dtype_name(info.dtype)) +
                            ", expected a floating dtype (F32, F16, BF16 or F64)");
  }

  SafetensorsFile file_;
  std::string module_;
};

// ---------------------------------------------------------------------------
// ldlm params
// ---------------------------------------------------------------------------

const Command kParams{
    "params",
    "parameter counts per module and the totals",
    "",
    "Print the trained and frozen parameter counts of every module, then the totals\n"
    "(nothing is allocated).",
    {kConfigOption, {"weights", "W.safetensors", "count the model whose configuration this file stores"}},
    ""};

int run_params(const Args& args) {
  args.expect_positionals(0, 0);
  const auto weights = open_weights(args);
  std::fputs(parameter_table_text(LDLM<float>(load_config(args, weights))).c_str(), stdout);
  return 0;
}

// ---------------------------------------------------------------------------
// ldlm forward
// ---------------------------------------------------------------------------

/// The MODULE of `forward` that runs the encode-then-decode chain.
constexpr std::string_view kReconstructTarget = "reconstruct";

/// What `forward` reads and writes for each module (the table of its help).
std::string_view forward_io(const GPT2Features<float>&) {
  return "tokens [B,T] (I64 or I32)            -> features [B,T,d]";
}
std::string_view forward_io(const LatentEncoder<float>&) {
  return "features [B,T,d]                     -> latents [B,T,d]";
}
std::string_view forward_io(const LatentDecoder<float>&) {
  return "latents [B,T,d]                      -> hidden [B,T,d]";
}
std::string_view forward_io(const TokenDecoder<float>&) {
  return "hidden [B,T,d]                       -> logits [B,T,V]";
}
std::string_view forward_io(const Denoiser<float>&) { return "x_t [B,T,d], t [B], self_cond [B,T,d] -> x0 [B,T,d]"; }

/// The help table of `forward`: a row per module of the registry, then reconstruct.
std::string forward_table() {
  std::string table = "modules (inputs -> outputs):\n";
  const auto row = [&](std::string_view name, std::string_view io) {
    table += "  " + std::string(name) + std::string(16 - name.size(), ' ') + std::string(io) + "\n";
  };
  const LDLM<float> shapes_only;  // allocates no parameter
  for_each_module(shapes_only, [&](std::string_view name, const auto& module) { row(name, forward_io(module)); });
  row(kReconstructTarget, "tokens [B,T]                         -> features, latents, hidden, logits");
  return table;
}

const Command kForward{"forward",
                       "run one module on named safetensors inputs",
                       "MODULE",
                       "Run one module on named inputs and write named float32 outputs.",
                       {kWeightsOption,
                        {"inputs", "I.safetensors", "input tensors, named as in the table below"},
                        {"output", "O.safetensors", "where to write the outputs"},
                        kConfigOption,
                        kPrecisionOption,
                        kThreadsOption},
                       forward_table() +
                           "\nWeights carry full prefixed names (e.g. denoiser.blocks.0.norm1.weight); only the\n"
                           "modules that run are loaded, tensors of other modules in the file are ignored, and\n"
                           "so are GPT-2's attention buffers (h.<i>.attn.bias, h.<i>.attn.masked_bias). The\n"
                           "configuration comes from the file's __metadata__ 'ldlm.config' (tools/convert.py\n"
                           "writes it); --config is needed only for files without one, and must match otherwise.\n"
                           "The output file carries the configuration too.\n"};

/// The MODULE of `forward`: one of module_names(), or "reconstruct" for the chain.
std::string forward_target(const Args& args) {
  std::vector<std::string> modules = module_names();
  modules.emplace_back(kReconstructTarget);
  const std::string& module = args.positionals()[0];
  if (std::find(modules.begin(), modules.end(), module) == modules.end())
    args.fail("unknown module '" + module + "' (expected one of: " + join(modules, ", ") + ")");
  return module;
}

/// One `forward` run. Each step reads its inputs before loading weights, so that a
/// wrong inputs file fails before the slow part.
struct ForwardRun {
  Context& ctx;
  LDLM<float>& model;
  const Inputs& inputs;
  const SafetensorsFile& weights;
  Precision precision;
  SafetensorsWriter& out;

  void load(std::string_view module) const { load_module(model, weights, module, precision); }
  void add(const std::string& name, const Tensor3<float>& t) const { out.add(name, shape_of(t), t.data()); }
};

/// A module that maps one [B, T, d] activation to one output.
template <class Module>
void forward_one_input(const ForwardRun& run, const Module& part, const char* input, const char* output) {
  const auto x = run.inputs.activation(input, run.model.config.d_model);
  run.load(Module::kName);
  run.add(output, part.forward(run.ctx, x));
}

/// `forward` of each module: read its inputs, load it, run it, write its outputs.
void forward_part(const ForwardRun& run, const GPT2Features<float>& part) {
  const TokenTensor tokens = run.inputs.tokens("tokens");
  run.load(part.kName);
  run.add("features", part.forward(run.ctx, tokens));
}
void forward_part(const ForwardRun& run, const LatentEncoder<float>& part) {
  forward_one_input(run, part, "features", "latents");
}
void forward_part(const ForwardRun& run, const LatentDecoder<float>& part) {
  forward_one_input(run, part, "latents", "hidden");
}
void forward_part(const ForwardRun& run, const TokenDecoder<float>& part) {
  forward_one_input(run, part, "hidden", "logits");
}
void forward_part(const ForwardRun& run, const Denoiser<float>& part) {
  const Index d = run.model.config.d_model;
  const auto x_t = run.inputs.activation("x_t", d);
  const auto t = run.inputs.vector("t", x_t.dimension(0));
  const auto self_cond = run.inputs.activation("self_cond", d);
  run.load(part.kName);
  run.add("x0", part.forward(run.ctx, x_t, t, self_cond));
}

void forward_reconstruct(const ForwardRun& run) {
  const TokenTensor tokens = run.inputs.tokens("tokens");
  for (const auto part : {GPT2Features<>::kName, LatentEncoder<>::kName, LatentDecoder<>::kName, TokenDecoder<>::kName})
    run.load(part);
  const auto r = Pipeline<float>(run.model).reconstruct(run.ctx, tokens);
  run.add("features", r.features);
  run.add("latents", r.latents);
  run.add("hidden", r.hidden);
  run.add("logits", r.logits);
}

void forward_module(const ForwardRun& run, const std::string& module) {
  if (module == kReconstructTarget)
    forward_reconstruct(run);
  else
    with_module(run.model, module, [&](const auto& part) { forward_part(run, part); });
}

int run_forward(const Args& args) {
  args.expect_positionals(1, 1);
  const std::string module = forward_target(args);
  const std::string weights_path = args.required("weights");
  const std::string inputs_path = args.required("inputs");
  const std::string output_path = args.required("output");
  const std::optional<SafetensorsFile> weights = SafetensorsFile::open(weights_path);
  const Config config = load_config(args, weights);
  const Precision precision = precision_of(args);
  Context ctx(thread_count(args));

  const Inputs inputs(inputs_path, module);
  LDLM<float> model(config);
  SafetensorsWriter out;
  out.set_metadata("module", module);
  out.set_metadata(std::string(kConfigMetadataKey), config.to_json().dump());
  forward_module({ctx, model, inputs, *weights, precision, out}, module);
  out.write(output_path);
  return 0;
}

// ---------------------------------------------------------------------------
// ldlm compare
// ---------------------------------------------------------------------------

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

/// compare's atol and rtol when not given.
constexpr double kDefaultCompareTolerance = 1e-5;

const Command kCompare{"compare",
                       "compare two safetensors files tensor by tensor",
                       "OUT.safetensors REF.safetensors",
                       "Check every tensor of REF against OUT: same shape and |out - ref| <= atol + rtol*|ref|\n"
                       "elementwise. Prints one line per tensor; exits 1 on any mismatch.",
                       {{"atol", "A", "absolute tolerance (default " + number(kDefaultCompareTolerance) + ")"},
                        {"rtol", "R", "relative tolerance (default " + number(kDefaultCompareTolerance) + ")"}},
                       ""};

/// The line of a tensor that both files hold with the same shape.
std::string comparison_line(const std::string& label, const Shape& shape, const Comparison& c, Tolerance tol) {
  std::string line =
      std::string(c.ok() ? "ok       " : "MISMATCH ") + " " + label + ": max |error| " + number(c.max_error);
  if (c.worst >= 0)
    line += ", worst at " + index_string(c.worst, shape) + " (out " + number(c.worst_got) + ", ref " +
            number(c.worst_ref) + ", allowed " + number(tol.allowed(c.worst_ref)) + ")";
  if (!c.ok())
    line += "; " + std::to_string(c.failures) + " of " + std::to_string(c.count) + " elements outside tolerance";
  return line;
}

/// Checks REF's tensor `r` against OUT's and prints its line; false when they differ.
bool compare_tensor(const SafetensorsFile& out, const SafetensorsFile& ref, const TensorInfo& r, Tolerance tol) {
  const std::string label = r.name + " " + shape_string(r.shape);
  if (!out.contains(r.name)) {
    std::printf("MISSING   %s: not in %s\n", label.c_str(), out.path().c_str());
    return false;
  }
  const TensorInfo& o = out.info(r.name);
  if (o.shape != r.shape) {
    std::printf("SHAPE     %s: output has shape %s\n", label.c_str(), shape_string(o.shape).c_str());
    return false;
  }
  const auto got = out.read<double>(r.name);
  const auto want = ref.read<double>(r.name);
  const Comparison c = compare_values(got.data(), want.data(), static_cast<std::int64_t>(want.size()), tol);
  std::printf("%s\n", comparison_line(label, r.shape, c, tol).c_str());
  return c.ok();
}

int run_compare(const Args& args) {
  args.expect_positionals(2, 2);
  const Tolerance tol{args.get_double("atol", kDefaultCompareTolerance, 0.0),
                      args.get_double("rtol", kDefaultCompareTolerance, 0.0)};
  const auto out = SafetensorsFile::open(args.positionals()[0]);
  const auto ref = SafetensorsFile::open(args.positionals()[1]);
  int bad = 0, count = 0;
  for (const TensorInfo& r : ref.tensors()) {
    ++count;
    if (!compare_tensor(out, ref, r, tol)) ++bad;
  }
  const std::string tolerance = "atol " + number(tol.atol) + ", rtol " + number(tol.rtol);
  if (bad) {
    std::printf("compare: %d of %d tensor(s) differ (%s)\n", bad, count, tolerance.c_str());
    return 1;
  }
  std::printf("compare: all %d tensor(s) within %s\n", count, tolerance.c_str());
  return 0;
}

// ---------------------------------------------------------------------------
// Text: the tokenizer shared by tokenize, detokenize, generate and reconstruct
// ---------------------------------------------------------------------------

/// ldlm-base's vocabulary: GPT-2's 50257 tokens, pad and mask.
const std::int64_t kDefaultVocabSize = Config{}.vocab_size;

const Option kTokenizerOption{"tokenizer", "DIR", "tokenizer files (see below); default: GPT-2's, built into ldlm"};
const std::string kTokenizerDetails =
    "--tokenizer DIR reads encoder.json + vocab.bpe (OpenAI), vocab.json + merges.txt or\n"
    "tokenizer.json (Hugging Face). pad and mask follow the files' tokens (GPT-2: ids 50257\n"
    "and 50258), so GPT-2's vocabulary has " +
    std::to_string(kDefaultVocabSize) + " tokens, ldlm-base's V.\n";
const Option kVocabSizeOption{
    "vocab-size", "V",
    "the model's vocabulary size, which the tokenizer must match (default " + std::to_string(kDefaultVocabSize) + ")"};

/// The tokenizer of --tokenizer DIR, or GPT-2's files built into the tool; its
/// vocabulary (with pad and mask) must have the model's size V.
Tokenizer load_tokenizer(const Args& args, std::int64_t vocab_size) {
  std::string origin;
  const Tokenizer tokenizer = [&] {
    if (auto dir = args.value("tokenizer")) {
      origin = "'" + *dir + "'";
      return Tokenizer::load(*dir);
    }
    origin = "built-in GPT-2";
    const auto vocab = embedded::find("gpt2/encoder.json"), merges = embedded::find("gpt2/vocab.bpe");
    if (!vocab || !merges) throw Error("the built-in GPT-2 tokenizer files are missing from this ldlm binary");
    return Tokenizer::from_vocab_and_merges(*vocab, *merges, "<built-in>/encoder.json", "<built-in>/vocab.bpe");
  }();
  if (tokenizer.vocab_size() != vocab_size)
    throw InvalidArgument("the " + origin + " tokenizer has " + std::to_string(tokenizer.vocab_size()) + " tokens (" +
                          std::to_string(tokenizer.pad_id()) + " from its files, pad and mask), but the model's " +
                          "vocabulary size V is " + std::to_string(vocab_size));
  return tokenizer;
}

std::string read_stdin() {
  std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  if (std::cin.bad()) throw IoError("reading stdin failed");
  return text;
}

/// The tokenizer that turns the model's ids into text: --tokenizer's (which must fit),
/// else the built-in GPT-2 one when it fits the model's vocabulary. None with --ids,
/// or when no tokenizer fits: the ids are printed then.
std::optional<Tokenizer> text_tokenizer(const Args& args, const Config& config) {
  if (args.has("ids")) return std::nullopt;
  if (args.has("tokenizer") || config.vocab_size == kDefaultVocabSize) return load_tokenizer(args, config.vocab_size);
  return std::nullopt;
}

/// One sample per block: the text alone for one sample; with several, each after a
/// "--- sample i of B ---" line, so that samples with newlines stay apart.
void print_text(std::ostream& out, const Tokenizer& tokenizer, const TokenTensor& tokens) {
  const Index B = tokens.dimension(0), T = tokens.dimension(1);
  for (Index b = 0; b < B; ++b) {
    if (B > 1) out << "--- sample " << b + 1 << " of " << B << " ---\n";
    out << tokenizer.decode(std::span<const std::int64_t>(tokens.data() + b * T, static_cast<std::size_t>(T))) << "\n";
  }
}

/// The samples as text with a tokenizer, else as token ids.
void print_samples(std::ostream& out, const std::optional<Tokenizer>& tokenizer, const TokenTensor& tokens) {
  if (tokenizer)
    print_text(out, *tokenizer, tokens);
  else
    print_tokens(out, tokens);
}

// ---------------------------------------------------------------------------
// ldlm generate
// ---------------------------------------------------------------------------

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
  for (const TimeGridInfo& info : kTimeGrids) {
    const std::string name(info.name);
    s += "  " + name + std::string(14 - name.size(), ' ') + std::string(info.summary) +
         (info.grid == SamplerOptions{}.grid.grid ? " (default)" : "") + "\n";
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
  return {{"steps", "N",
           "solver steps (default " + std::to_string(defaults.steps) + "); denoiser calls = N x calls per step"},
          {"sampler", "NAME", "the solver (default " + std::string(sampler_info(defaults.kind).name) + "; table below)"},
          {"schedule", "GRID",
           "the time grid: " + time_grid_names("|") + " (default " +
               std::string(time_grid_info(defaults.grid.grid).name) + ")"},
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

const Command kGenerate{
    "generate",
    "sample token sequences with the diffusion model",
    "",
    "Sample latents with the denoiser (a solver from pure noise; docs/model.md §Sampler),\n"
    "decode them and print the text: one sample, or each of --batch samples after a\n"
    "'--- sample i of B ---' line. Token ids, one line per sample, with --ids or when no\n"
    "tokenizer fits the model's vocabulary (GPT-2's built-in one fits V = " +
        std::to_string(kDefaultVocabSize) + ").",
    with_model_options(
        [] {
          std::vector<Option> o = {{"length", "T", "tokens per sequence (default " + std::to_string(kDefaultLength) + ")"},
                                   {"batch", "B",
                                    "number of sequences, 1 to " + std::to_string(kMaxBatch) + " (default " +
                                        std::to_string(kDefaultBatch) + ")"}};
          for (Option& option : sampler_option_list()) o.push_back(std::move(option));
          return o;
        }(),
        {{"output", "FILE", "write the samples there instead of stdout"},
         {"ids", "", "print token ids, one line per sample, instead of text"},
         kTokenizerOption}),
    sampler_table() + "\n" + kModelChoice + "Generation runs the " + std::string(Denoiser<>::kName) + ", " +
        std::string(LatentDecoder<>::kName) + " and " + std::string(TokenDecoder<>::kName) + ". ldlm-base's\n" +
        "generator weights (--init-seed " + std::to_string(kDefaultInitSeed) +
        ") allocate about 1 GB and take a few seconds on\n"
        "2 cores. On a terminal a progress bar with steps and denoiser calls is shown on stderr.\n"};

/// Writes the samples to --output, else stdout: as text when a tokenizer fits, else as ids.
void write_samples(const Args& args, const Config& config, const TokenTensor& tokens) {
  std::ofstream file;
  if (auto path = args.value("output")) {
    file.open(*path);
    if (!file) throw IoError("generate: cannot open '" + *path + "' for writing");
  }
  std::ostream& out = args.has("output") ? file : std::cout;
  print_samples(out, text_tokenizer(args, config), tokens);
  if (!out.flush()) throw IoError("generate: writing the samples failed");
}

int run_generate(const Args& args) {
  args.expect_positionals(0, 0);
  const auto weights = open_model(args);
  const Config config = load_config(args, weights);
  const Index T = args.get_int("length", kDefaultLength, 1);
  const Index B = args.get_int("batch", kDefaultBatch, 1, kMaxBatch);
  SamplerOptions options = sampler_options(args);
  // Pipeline::generate checks these again; checking them here makes a --length beyond
  // the model's max_positions fail at once, not after the slow loading of the weights.
  check_sampling_arguments("generate", config, B, T, options.steps);
  const Precision precision = precision_of(args);
  Context ctx(thread_count(args));
  const bool parallel = ctx.threads() > 1;

  LDLM<float> model(config);
  // The token decoder first: packing its [V, d] lm_head briefly holds its plain values
  // too (154 MB at ldlm-base width), and the peak is lowest while little else is resident.
  fill_modules(model, args, weights, {TokenDecoder<>::kName, LatentDecoder<>::kName}, {Denoiser<>::kName}, parallel,
               precision);
  if (isatty(STDERR_FILENO)) options.progress = ProgressBar();
  write_samples(args, config, Pipeline<float>(model).generate(ctx, B, T, options));
  return 0;
}

// ---------------------------------------------------------------------------
// ldlm reconstruct
// ---------------------------------------------------------------------------

const Command kReconstruct{
    "reconstruct",
    "encode and decode token ids",
    "",
    "Encode token ids (GPT-2 features, latent encoder) and decode them again (latent\n"
    "decoder, token decoder, argmax); print the reconstructed ids, one line per sequence.",
    with_model_options({{"text", "S", "text to reconstruct (tokenized; prints the reconstructed text)"},
                        {"tokens", "\"1 2 3 ...\"", "token ids; ';' separates sequences of equal length"},
                        {"inputs", "I.safetensors", "token ids from tensor 'tokens' [B, T] (I64 or I32)"},
                        kTokenizerOption}),
    "Exactly one of --text, --tokens and --inputs.\n" + kModelChoice};

TokenTensor parse_tokens(const Args& args, const std::string& text) {
  std::vector<std::vector<std::int64_t>> rows(1);
  std::string word;
  auto flush = [&] {
    if (word.empty()) return;
    std::int64_t id = 0;
    const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
    if (ec != std::errc() || end != word.data() + word.size())
      args.fail("option '--tokens' expects integer ids, got '" + word + "'");
    rows.back().push_back(id);
    word.clear();
  };
  for (char c : text) {
    if (c == ';') {
      flush();
      rows.emplace_back();
    } else if (std::isspace(static_cast<unsigned char>(c)) || c == ',') {
      flush();
    } else {
      word += c;
    }
  }
  flush();
  for (std::size_t b = 0; b < rows.size(); ++b) {
    if (rows[b].empty()) args.fail("option '--tokens': sequence " + std::to_string(b + 1) + " is empty");
    if (rows[b].size() != rows[0].size())
      args.fail("option '--tokens': sequences must have equal lengths, got " + std::to_string(rows[0].size()) +
                " and " + std::to_string(rows[b].size()));
  }
  TokenTensor tokens(static_cast<Index>(rows.size()), static_cast<Index>(rows[0].size()));
  for (std::size_t b = 0; b < rows.size(); ++b)
    for (std::size_t t = 0; t < rows[b].size(); ++t) tokens(b, t) = rows[b][t];
  return tokens;
}

int run_reconstruct(const Args& args) {
  args.expect_positionals(0, 0);
  if (int(args.has("text")) + int(args.has("tokens")) + int(args.has("inputs")) != 1)
    args.fail("give exactly one of --text, --tokens and --inputs");
  const auto weights = open_model(args);
  const Config config = load_config(args, weights);
  std::optional<Tokenizer> tokenizer;
  TokenTensor tokens;
  if (auto text = args.value("text")) {
    tokenizer = load_tokenizer(args, config.vocab_size);
    const std::vector<std::int64_t> ids = tokenizer->encode(*text);
    if (ids.empty()) args.fail("option '--text': the text is empty");
    tokens = TokenTensor(1, static_cast<Index>(ids.size()));
    std::copy(ids.begin(), ids.end(), tokens.data());
  } else {
    tokens = args.has("tokens") ? parse_tokens(args, *args.value("tokens"))
                                : Inputs(*args.value("inputs"), "reconstruct").tokens("tokens");
  }
  const Precision precision = precision_of(args);
  Context ctx(thread_count(args));
  const bool parallel = ctx.threads() > 1;
  LDLM<float> model(config);
  // Large tables first (lm_head, wte), as in generate.
  fill_modules(model, args, weights, {TokenDecoder<>::kName, LatentDecoder<>::kName},
               {GPT2Features<>::kName, LatentEncoder<>::kName}, parallel, precision);
  print_samples(std::cout, tokenizer, Pipeline<float>(model).reconstruct(ctx, tokens).tokens);
  return 0;
}

// ---------------------------------------------------------------------------
// Tokenizer: ldlm tokenize, ldlm detokenize
// ---------------------------------------------------------------------------

const Command kTokenize{"tokenize",
                        "UTF-8 text to GPT-2 token ids",
                        "",
                        "Print the token ids of UTF-8 text (stdin, or --text) on one line.",
                        {{"text", "S", "the text to encode instead of stdin"}, kTokenizerOption, kVocabSizeOption},
                        "The text is taken as plain text: \"<|endoftext|>\" in it is encoded as characters, never\n"
                        "as the special token. Text that is not valid UTF-8 is an error naming the byte offset.\n" +
                            kTokenizerDetails};

int run_tokenize(const Args& args) {
  args.expect_positionals(0, 0);
  const Tokenizer tokenizer = load_tokenizer(args, args.get_int("vocab-size", kDefaultVocabSize, 1));
  const std::string text = args.has("text") ? *args.value("text") : read_stdin();
  std::string line;
  for (const std::int64_t id : tokenizer.encode(text)) {
    if (!line.empty()) line += ' ';
    line += std::to_string(id);
  }
  std::cout << line << "\n";
  return 0;
}

const Command kDetokenize{"detokenize",
                          "token ids to text",
                          "",
                          "Write the bytes of token ids (stdin, or --ids) to stdout, exactly: no newline is\n"
                          "added, and ids that end inside a UTF-8 character give that character's first bytes.",
                          {{"ids", "\"1 2 3 ...\"", "the ids instead of stdin (spaces, newlines or commas between)"},
                           kTokenizerOption,
                           kVocabSizeOption},
                          kTokenizerDetails};

/// Integer ids separated by white space or commas; `source` names the text in errors.
std::vector<std::int64_t> parse_ids(std::string_view text, const std::string& source) {
  std::vector<std::int64_t> ids;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && !std::isspace(static_cast<unsigned char>(text[i])) && text[i] != ',') continue;
    if (i > start) {
      const std::string_view word = text.substr(start, i - start);
      std::int64_t id = 0;
      const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
      if (ec != std::errc() || end != word.data() + word.size())
        throw InvalidArgument("detokenize: '" + std::string(word.substr(0, 40)) + "' at byte " + std::to_string(start) +
                              " of " + source + " is not an integer token id");
      ids.push_back(id);
    }
    start = i + 1;
  }
  return ids;
}

int run_detokenize(const Args& args) {
  args.expect_positionals(0, 0);
  const Tokenizer tokenizer = load_tokenizer(args, args.get_int("vocab-size", kDefaultVocabSize, 1));
  const auto ids = args.has("ids") ? parse_ids(*args.value("ids"), "--ids") : parse_ids(read_stdin(), "stdin");
  const std::string bytes = tokenizer.decode(ids);
  if (std::fwrite(bytes.data(), 1, bytes.size(), stdout) != bytes.size() || std::fflush(stdout) != 0)
    throw IoError("detokenize: writing stdout failed");
  return 0;
}

// ---------------------------------------------------------------------------
// ldlm info
// ---------------------------------------------------------------------------

const Command kInfo{"info",
                    "CPU features and the kernels chosen for fp32 and bf16",
                    "",
                    "Print the CPU's features and the kernel that runs each kind of product, in fp32\n"
                    "and bf16. The choice follows CPUID, never the CPU model; LDLM_GEMM_BACKEND=eigen and\n"
                    "oneDNN's ONEDNN_MAX_CPU_ISA force other paths (for tests and diagnosis).",
                    {},
                    ""};

int run_info(const Args& args) {
  args.expect_positionals(0, 0);
  const CpuFeatures& cpu = cpu_features();
  const GemmPaths paths = gemm_paths();
  std::printf("ldlm %s\n", LDLM_VERSION);
  std::printf("cpu:       %s (%s, family %d, model %d), %u hardware threads\n",
              cpu.brand.empty() ? "unknown" : cpu.brand.c_str(), cpu.vendor.c_str(), cpu.family, cpu.model,
              std::max(1u, std::thread::hardware_concurrency()));
  std::printf("features:  %s\n", cpu.summary().c_str());
  std::printf("products:  %s\n", gemm_library().c_str());
  std::printf("fp32:      linear %s, attention %s\n", paths.fp32_linear.c_str(), paths.fp32_attention.c_str());
  std::printf("bf16:      linear %s, attention %s\n", paths.bf16_linear.c_str(), paths.bf16_attention.c_str());
  if (const auto demo = embedded::find("ldlm-demo.safetensors"))
    std::printf("model:     built-in demo model, %.1f MB (the default of generate and reconstruct)\n",
                static_cast<double>(demo->size()) / 1e6);
  return 0;
}

// ---------------------------------------------------------------------------
// Dispatch
// ---------------------------------------------------------------------------

struct Subcommand {
  const Command* command;
  int (*run)(const Args&);
};

const std::vector<Subcommand>& subcommands() {
  static const std::vector<Subcommand> all = {{&kParams, run_params},           {&kForward, run_forward},
                                              {&kCompare, run_compare},         {&kGenerate, run_generate},
                                              {&kReconstruct, run_reconstruct}, {&kTokenize, run_tokenize},
                                              {&kDetokenize, run_detokenize},   {&kInfo, run_info}};
  return all;
}

std::string main_usage() {
  std::size_t width = 0;
  for (const auto& sub : subcommands()) width = std::max(width, sub.command->name.size());
  std::string s =
      "usage: ldlm COMMAND [options]\n\n"
      "LDLM, the latent diffusion language model, in header-only C++.\n\ncommands:\n";
  for (const auto& sub : subcommands())
    s += "  " + sub.command->name + std::string(width - sub.command->name.size() + 2, ' ') + sub.command->brief + "\n";
  s += "\n'ldlm COMMAND --help' describes a command. Errors exit with 2 (usage) or 1 (runtime).\n";
  return s;
}

int run(const std::vector<std::string>& argv) {
  if (argv.empty()) throw UsageError("no command given\n" + main_usage());
  std::string name = argv[0];
  std::vector<std::string> rest(argv.begin() + 1, argv.end());
  if (name == "--help" || name == "-h") {
    std::cout << main_usage();
    return 0;
  }
  if (name == "help") {
    if (rest.empty()) {
      std::cout << main_usage();
      return 0;
    }
    name = rest[0];
    rest = {"--help"};
  }
  for (const auto& sub : subcommands()) {
    if (sub.command->name != name) continue;
    const Args args(*sub.command, rest);
    if (args.help()) {
      std::cout << sub.command->usage();
      return 0;
    }
    return sub.run(args);
  }
  std::vector<std::string> names;
  for (const auto& sub : subcommands()) names.push_back(sub.command->name);
  throw UsageError("unknown command '" + name + "' (commands: " + join(names, ", ") + "; see 'ldlm --help')");
}

}  // namespace
}  // namespace ldlm::cli

int main(int argc, char** argv) {
  try {
    return ldlm::cli::run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const ldlm::cli::UsageError& e) {
    std::fprintf(stderr, "ldlm: error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "ldlm: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {  // ldlm::Error and everything else
    std::fprintf(stderr, "ldlm: error: %s\n", e.what());
    return 1;
  }
}
