// Reading the named inputs of `ldlm forward` and `ldlm reconstruct --inputs`.
#pragma once

#include "common.hpp"

namespace ldlm::cli {

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

}  // namespace ldlm::cli
