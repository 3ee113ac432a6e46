// ldlm quantize: a quantized checkpoint (docs/checkpoints.md §Quantized checkpoints).
#pragma once

#include <filesystem>

#include "common.hpp"

namespace ldlm::cli {

const Command kQuantize{"quantize",
                        "write the model as a quantized checkpoint (int8 weights and their scales)",
                        "OUT",
                        "Write the model (see below) to OUT with every weight that --precision int8 quantizes\n"
                        "(docs/model.md §int8) stored as I8 values with one F32 scale per output\n"
                        "channel, the other matrix-product weights in BF16 (what int8 multiplies), and every\n"
                        "other parameter in BF16 where that is exact, else in F32.\n"
                        "Loaded with --precision int8, OUT gives the same outputs as the model quantized at\n"
                        "load, bit for bit; at fp32 or bf16 its int8 weights are dequantized (value * scale).\n"
                        "A generated feature model stays generated (its seed in the metadata).\n\n" +
                            kModelChoice,
                        {kWeightsOption, kInitSeedOption, kConfigOption},
                        ""};

int run_quantize(const Args& args) {
  args.expect_positionals(1, 1);
  const std::string out = args.positionals()[0];
  const ModelOptions options = args.read<ModelOptions>();
  const auto file = open_model(args, options);
  if (file && ldlm::detail::is_quantized(*file))
    throw Error("quantize: " + ldlm::detail::file_label(*file) + " is quantized already (__metadata__ '" +
                std::string(kQuantizationMetadataKey) + "'); quantize the file it was made from");
  LDLM<float> model(load_config(options, file));
  const std::uint64_t seed = options.init_seed.value_or(kDefaultInitSeed);
  for (const auto& name : module_names()) load_or_init_module(model, file, name, seed, std::nullopt);
  ModelSaveOptions save;
  save.quantize_int8 = true;
  save.feature_model_init_seed = file ? read_feature_model_init_seed(*file) : std::optional<std::uint64_t>(seed);
  save_model(model, out, save);
  std::int64_t quantized = 0;
  visit_parameters(model.denoiser, "", [&](const std::string&, const auto& p) {
    if constexpr (requires { p.quantized_at_int8(); })
      if (p.quantized_at_int8()) quantized += p.numel();
  });
  std::printf("wrote %s: %lld parameters quantized to int8, %.1f MB\n", out.c_str(), static_cast<long long>(quantized),
              static_cast<double>(std::filesystem::file_size(out)) / 1e6);
  return 0;
}

}  // namespace ldlm::cli
