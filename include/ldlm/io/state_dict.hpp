// Checkpoint loading and saving by state-dict name: every parameter a module's
// visitor names is looked up in a safetensors file, so loading is name matching.
// Strict by default: a missing, unexpected or mis-shaped tensor is an error that
// names it. Generic over modules; the LDLM-aware layer (configuration in the file's
// metadata, the generated feature model) is ldlm/model/checkpoint.hpp.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ldlm/core/parameter.hpp"
#include "ldlm/io/safetensors.hpp"

namespace ldlm {

struct LoadOptions {
  /// Options that consider only the tensors under `prefix` (one module of a full checkpoint).
  static LoadOptions scoped(std::string prefix) {
    LoadOptions o;
    o.scope = std::move(prefix);
    return o;
  }

  /// Only tensors whose names start with this are considered (others in the file are
  /// ignored): "denoiser." loads one module from a full LDLM checkpoint.
  std::string scope;
  /// A tensor in scope that no parameter claims is an error.
  bool reject_unexpected = true;
  /// Exact names of tensors that are not parameters and are skipped (GPT-2's
  /// attention buffers are always skipped, see is_gpt2_buffer).
  std::vector<std::string> ignored_names;
  /// Each matrix-product weight is packed for this precision as soon as it is read
  /// (see nn::MatmulWeight), so a bf16 model never holds all its weights in fp32;
  /// std::nullopt keeps every parameter's plain values readable.
  std::optional<Precision> pack = Precision::fp32;
};

/// GPT-2's attention-mask buffers, which full GPT-2 state dicts carry but which are
/// not parameters: exactly `h.<block>.attn.bias` and `h.<block>.attn.masked_bias`,
/// bare, under `feature_model.` (LDLM) or under `transformer.` (Hugging Face).
/// `h.0.attn.c_attn.bias` is a parameter and does not match.
inline bool is_gpt2_buffer(std::string_view name) {
  for (std::string_view owner : {"feature_model.", "transformer."})
    if (name.starts_with(owner)) {
      name.remove_prefix(owner.size());
      break;
    }
  if (!name.starts_with("h.")) return false;
  name.remove_prefix(2);
  std::size_t digits = 0;
  while (digits < name.size() && std::isdigit(static_cast<unsigned char>(name[digits]))) ++digits;
  if (digits == 0 || (digits > 1 && name[0] == '0')) return false;  // a block index as PyTorch prints it
  name.remove_prefix(digits);
  return name == ".attn.bias" || name == ".attn.masked_bias";
}

/// `__metadata__` key of a quantized checkpoint, and its one value: every weight that
/// Precision::int8 quantizes (nn::MatmulWeight::quantized_at_int8) is stored as I8
/// values in its own shape under its state-dict name, with F32 scales, one per output
/// channel, under that name + kScaleSuffix (docs/checkpoints.md §Quantized checkpoints).
/// A parameter's name never has children in a state dict, so no parameter can be
/// called `<weight>.scale`.
inline constexpr std::string_view kQuantizationMetadataKey = "ldlm.quantization";
inline constexpr std::string_view kQuantizationInt8 = "int8";
inline constexpr std::string_view kScaleSuffix = ".scale";

namespace detail {
inline std::string file_label(const SafetensorsFile& file) { return "checkpoint '" + file.path() + "'"; }

inline bool is_float_dtype(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16;
}

/// Whether `file` says it holds quantized weights: its `ldlm.quantization` metadata,
/// which must be kQuantizationInt8 when present.
inline bool is_quantized(const SafetensorsFile& file) {
  const auto it = file.metadata().find(std::string(kQuantizationMetadataKey));
  if (it == file.metadata().end()) return false;
  if (it->second != kQuantizationInt8)
    throw CheckpointError(file_label(file) + ": __metadata__ '" + std::string(kQuantizationMetadataKey) +
                          "' must be '" + std::string(kQuantizationInt8) + "', got '" + it->second.substr(0, 64) +
                          (it->second.size() > 64 ? "..." : "") + "'");
  return true;
}

/// Reads the I8 tensor `name` and its scales `name + kScaleSuffix` into the matrix-product
/// weight p, which int8 quantizes (p.load_quantized: packed as they are at int8,
/// dequantized otherwise).
template <class P>
void load_quantized_tensor(const SafetensorsFile& file, const std::string& name, P& p, std::optional<Precision> pack) {
  const std::string t = file_label(file) + ": tensor '" + name + "' ";
  if constexpr (requires { p.quantized_at_int8(); }) {
    if (!p.quantized_at_int8())
      throw CheckpointError(t +
                            "has dtype I8, expected a floating dtype: only the weights int8 quantizes are stored "
                            "quantized (docs/checkpoints.md)");
    if (!is_quantized(file))
      throw CheckpointError(t + "has dtype I8, but the file's __metadata__ has no '" +
                            std::string(kQuantizationMetadataKey) + "': it does not say how to read quantized weights");
    const std::string scale_name = name + std::string(kScaleSuffix);
    if (!file.contains(scale_name))
      throw CheckpointError(t + "is quantized (I8) but its scales '" + scale_name + "' are missing: expected F32 " +
                            shape_string(Shape{p.out_features()}));
    const TensorInfo& scale = file.info(scale_name);
    if (scale.dtype != DType::F32 || scale.shape != Shape{p.out_features()})
      throw CheckpointError(file_label(file) + ": tensor '" + scale_name + "' (the scales of '" + name +
                            "') expected F32 " + shape_string(Shape{p.out_features()}) + ", got " +
                            std::string(dtype_name(scale.dtype)) + " " + shape_string(scale.shape));
    const auto bytes = file.bytes(name);
    p.load_quantized(reinterpret_cast<const std::int8_t*>(bytes.data()), file.read<float>(scale_name), pack);
    file.release_pages();
  } else {
    throw CheckpointError(t +
                          "has dtype I8, expected a floating dtype (F32, F16, BF16 or F64): this parameter "
                          "does not feed matrix products and is never quantized");
  }
}

/// Reads tensor `name` of `file` into parameter `p` after checking its shape and dtype:
/// a floating tensor, or in a quantized file (is_quantized) an I8 weight with its
/// scales, which every weight that int8 quantizes must be there. Returns the name of
/// the scales it read too, if any.
template <class P>
std::optional<std::string> load_tensor(const SafetensorsFile& file, const std::string& name, P& p,
                                       std::optional<Precision> pack) {
  const TensorInfo& info = file.info(name);
  if (info.shape != p.shape())
    throw CheckpointError(file_label(file) + ": tensor '" + name + "' expected shape " + shape_string(p.shape()) +
                          ", got " + shape_string(info.shape));
  if (info.dtype == DType::I8) {
    load_quantized_tensor(file, name, p, pack);
    return name + std::string(kScaleSuffix);
  }
  if constexpr (requires { p.quantized_at_int8(); }) {
    if (p.quantized_at_int8() && is_quantized(file))
      throw CheckpointError(file_label(file) + ": tensor '" + name + "' has dtype " +
                            std::string(dtype_name(info.dtype)) + ", expected I8: the file's __metadata__ '" +
                            std::string(kQuantizationMetadataKey) +
                            "' says every weight int8 quantizes is stored "
                            "quantized");
  }
  if (!is_float_dtype(info.dtype))
    throw CheckpointError(file_label(file) + ": tensor '" + name + "' has dtype " +
                          std::string(dtype_name(info.dtype)) + ", expected a floating dtype (F32, F16, BF16 or F64)");
  // A float weight that int8 quantizes is quantized a block of rows at a time as it is
  // read, each block's file pages dropped at once: it is never held whole in float.
  const auto read = [&](std::int64_t first, std::int64_t count, float* dst) {
    file.read_elements_into(name, first, count, dst);
    file.release_pages();
  };
  if (pack_int8_from_blocks(p, pack, read)) return std::nullopt;
  p.allocate();
  file.read_into(name, p.data(), p.numel());
  file.release_pages();
  pack_if_matmul_weight(p, pack);
  return std::nullopt;
}

/// "name [shape]" of each tensor in scope that no parameter claimed and that is
/// neither a GPT-2 buffer nor ignored by name.
inline std::vector<std::string> unclaimed_tensors(const SafetensorsFile& file, const std::set<std::string>& claimed,
                                                  const LoadOptions& options) {
  std::vector<std::string> unclaimed;
  for (const TensorInfo& t : file.tensors()) {
    if (!t.name.starts_with(options.scope) || claimed.count(t.name) || is_gpt2_buffer(t.name)) continue;
    const auto& ignored = options.ignored_names;
    if (std::find(ignored.begin(), ignored.end(), t.name) == ignored.end())
      unclaimed.push_back(t.name + " " + shape_string(t.shape));
  }
  return unclaimed;
}

/// The first eight names, quoted, and how many more there are.
inline std::string quoted_names(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < 8; ++i) out += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > 8) out += " and " + std::to_string(names.size() - 8) + " more";
  return out;
}

/// Both lists in one message, as torch's load_state_dict does: a renamed tensor
/// shows up as one missing and one unexpected name side by side.
inline std::string missing_and_unexpected(const SafetensorsFile& file, const std::vector<std::string>& missing,
                                          const std::vector<std::string>& unexpected, const std::string& scope) {
  std::string msg = file_label(file) + ":";
  if (!missing.empty())
    msg += " missing " + std::to_string(missing.size()) + " tensor(s): " + quoted_names(missing) + ";";
  if (!unexpected.empty())
    msg += " unexpected " + std::to_string(unexpected.size()) + " tensor(s)" +
           (scope.empty() ? std::string() : " under '" + scope + "'") +
           " that no parameter claims: " + quoted_names(unexpected) + ";";
  msg.pop_back();
  return msg;
}
}  // namespace detail

/// Fills every parameter of `module` (named with `prefix`) from `file`; F16/BF16/F64
/// tensors are converted to S. Throws CheckpointError naming the first problem.
template <class M>
void load_parameters(M& module, const SafetensorsFile& file, const std::string& prefix = "",
                     const LoadOptions& options = {}) {
  std::set<std::string> claimed;
  std::vector<std::string> missing;
  module.visit(prefix, [&](const std::string& name, auto& p) {
    if (!file.contains(name)) {
      missing.push_back(name + " " + shape_string(p.shape()));
      return;
    }
    if (const auto scales = detail::load_tensor(file, name, p, options.pack)) claimed.insert(*scales);
    claimed.insert(name);
  });
  std::vector<std::string> unexpected;
  if (options.reject_unexpected) unexpected = detail::unclaimed_tensors(file, claimed, options);
  if (!missing.empty() || !unexpected.empty())
    throw CheckpointError(detail::missing_and_unexpected(file, missing, unexpected, options.scope));
}

/// Loads a Hugging Face GPT-2 file (GPT2Model or GPT2LMHeadModel) into the feature
/// model: plain names or a `transformer.` prefix, Conv1D layout as stored, the
/// attention-mask buffers and the tied lm_head ignored.
template <class M>
void load_hf_gpt2(M& feature_model, const SafetensorsFile& file) {
  const std::string prefix = file.contains("transformer.wte.weight") ? "transformer." : "";
  LoadOptions options;
  options.ignored_names = {"lm_head.weight"};
  load_parameters(feature_model, file, prefix, options);
}

/// Writes every parameter under its full state-dict name (F32 for float, F64 for double).
template <class M>
void save_parameters(const M& module, const std::string& path, const std::string& prefix = "",
                     const std::map<std::string, std::string>& metadata = {}) {
  SafetensorsWriter writer;
  for (const auto& [k, v] : metadata) writer.set_metadata(k, v);
  visit_parameters(module, prefix,
                   [&](const std::string& name, const auto& p) { writer.add(name, p.shape(), p.data()); });
  writer.write(path);
}

}  // namespace ldlm
