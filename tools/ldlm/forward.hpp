// ldlm forward: one module's forward pass on named safetensors inputs
// (docs/model.md §Module inputs and outputs).
#pragma once

#include "common.hpp"
#include "inputs.hpp"

namespace ldlm::cli {

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

/// forward's own options.
struct ForwardOptions {
  std::string inputs, output;
};

const Command kForward{
    "forward",
    "run one module on named safetensors inputs",
    "MODULE",
    "Run one module on named inputs and write named float32 outputs.",
    {required(kWeightsOption),
     required(
         text_option("inputs", "I.safetensors", &ForwardOptions::inputs, "input tensors, named as in the table below")),
     required(text_option("output", "O.safetensors", &ForwardOptions::output, "where to write the outputs")),
     kConfigOption, kPrecisionOption, kThreadsOption},
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
  const ModelOptions model_options = args.read<ModelOptions>();
  const ForwardOptions own = args.read<ForwardOptions>();
  const std::optional<SafetensorsFile> weights = open_weights(model_options);
  const Config config = load_config(model_options, weights);
  const Precision precision = model_options.precision;
  Context ctx(thread_count(model_options));

  const Inputs inputs(own.inputs, module);
  LDLM<float> model(config);
  SafetensorsWriter out;
  out.set_metadata("module", module);
  out.set_metadata(std::string(kConfigMetadataKey), config.to_json().dump());
  forward_module({ctx, model, inputs, *weights, precision, out}, module);
  out.write(own.output);
  return 0;
}

}  // namespace ldlm::cli
