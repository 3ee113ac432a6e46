// The LDLM aggregate: its five modules, in state-dict order, and the one table of them.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ldlm/model/denoiser.hpp"
#include "ldlm/model/gpt2.hpp"
#include "ldlm/model/perceiver.hpp"
#include "ldlm/model/token_decoder.hpp"

namespace ldlm {

template <class S = float>
class LDLM {
 public:
  Config config;
  GPT2Features<S> feature_model;
  LatentEncoder<S> encoder;
  LatentDecoder<S> latent_decoder;
  TokenDecoder<S> token_decoder;
  Denoiser<S> denoiser;

  /// Records every shape; allocates nothing (see init_parameters / load_checkpoint).
  explicit LDLM(const Config& c = Config{})
      : config((c.validate(), c)), feature_model(c), encoder(c), latent_decoder(c), token_decoder(c), denoiser(c) {}

  template <class F>
  void visit(const std::string& prefix, F&& f);
};

/// The model as callers run it: fp32 activations (bf16 is a precision of the products,
/// chosen at load, not a scalar type). LDLM<double> serves the tests.
using Model = LDLM<float>;

/// The one table of LDLM's modules: calls f(name, module) for each, in state-dict
/// order. The name (a std::string_view) is the module class's kName, its state-dict
/// prefix without the dot.
template <class Model, class F>
void for_each_module(Model& m, F&& f) {
  const auto entry = [&](auto& module) { f(std::remove_cvref_t<decltype(module)>::kName, module); };
  entry(m.feature_model);
  entry(m.encoder);
  entry(m.latent_decoder);
  entry(m.token_decoder);
  entry(m.denoiser);
}

/// The names of for_each_module, in its order.
inline const std::vector<std::string>& module_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> list;
    const LDLM<float> shapes_only;  // allocates no parameter
    for_each_module(shapes_only, [&](std::string_view name, const auto&) { list.emplace_back(name); });
    return list;
  }();
  return names;
}

/// Calls f(module) on the module called `name`; an unknown name is an InvalidArgument
/// that lists the known ones.
template <class Model, class F>
void with_module(Model& m, std::string_view name, F&& f) {
  bool found = false;
  for_each_module(m, [&](std::string_view module_name, auto& module) {
    if (name == module_name) found = true, f(module);
  });
  if (!found) {
    std::string known;
    for (const auto& n : module_names()) known += (known.empty() ? "" : ", ") + n;
    throw InvalidArgument("ldlm: unknown module '" + std::string(name) + "' (modules: " + known + ")");
  }
}

template <class S>
template <class F>
void LDLM<S>::visit(const std::string& prefix, F&& f) {
  for_each_module(*this,
                  [&](std::string_view name, auto& module) { module.visit(prefix + std::string(name) + ".", f); });
}

}  // namespace ldlm
