// Named parameters. Modules declare each tensor once, with its PyTorch state-dict
// name and shape, inside `visit(prefix, f)`; counting, allocation, initialisation,
// loading and saving all walk that one visitor, so no second list can drift.
// Constructing a module only records shapes: nothing is allocated until asked.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "ldlm/core/memory.hpp"
#include "ldlm/core/precision.hpp"
#include "ldlm/core/tensor.hpp"

namespace ldlm {

enum class Role { trained, frozen };

template <class S>
class Parameter {
 public:
  Parameter() = default;
  explicit Parameter(Shape shape, Role role = Role::trained) : shape_(std::move(shape)), role_(role) {}
  // A copied module owns copies of its values (AlignedBytes itself only moves).
  Parameter(const Parameter& other) : shape_(other.shape_), role_(other.role_), released_(other.released_) {
    if (other.storage_.size() == 0) return;
    storage_ = AlignedBytes(other.storage_.size());
    std::memcpy(values(), other.values(), storage_.size());
  }
  Parameter(Parameter&&) noexcept = default;
  Parameter& operator=(Parameter other) noexcept {
    std::swap(shape_, other.shape_), std::swap(role_, other.role_);
    std::swap(storage_, other.storage_), std::swap(released_, other.released_);
    return *this;
  }

  const Shape& shape() const { return shape_; }
  Role role() const { return role_; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto e : shape_) n *= e;
    return n;
  }
  bool allocated() const { return storage_.size() == bytes(); }
  /// Reserves storage (uninitialised values); idempotent.
  void allocate() {
    if (!allocated()) storage_ = AlignedBytes(bytes());
    released_ = false;
  }
  /// Frees the values once a packed copy serves the products (nn::MatmulWeight);
  /// reading them afterwards is an error that says so.
  void release() {
    storage_ = AlignedBytes();
    released_ = true;
  }

  /// Storage to write; allocate() first.
  S* data() {
    require_values();
    return values();
  }
  const S* data() const {
    require_values();
    return values();
  }
  /// As a row-major matrix: [shape0, rest] (nn.Linear: [out, in]); rank 1 is [1, n].
  ConstMatrixMap<S> matrix() const {
    require_values();
    return ConstMatrixMap<S>(values(), rows(), numel() / std::max<Index>(rows(), 1));
  }
  MatrixMap<S> matrix() {
    allocate();
    return MatrixMap<S>(values(), rows(), numel() / std::max<Index>(rows(), 1));
  }
  /// Any parameter as a flat row vector in row-major order.
  ConstRowVectorMap<S> vector() const {
    require_values();
    return ConstRowVectorMap<S>(values(), numel());
  }
  RowVectorMap<S> vector() {
    allocate();
    return RowVectorMap<S>(values(), numel());
  }

 private:
  Index rows() const { return shape_.size() >= 2 ? shape_[0] : 1; }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * sizeof(S); }
  S* values() const { return reinterpret_cast<S*>(storage_.data()); }
  void require_values() const {
    if (released_)
      throw Error("ldlm: a parameter of shape " + shape_string(shape_) +
                  " was packed for the matrix products and its plain values released; load without packing "
                  "(LoadOptions::pack = std::nullopt) to read them");
    if (!allocated())
      throw Error("ldlm: a parameter of shape " + shape_string(shape_) +
                  " was used before it was loaded or initialised");
  }

  Shape shape_;
  Role role_ = Role::trained;
  // AlignedBytes, not the heap: once packed, a weight's float values are freed, and a
  // freed block of the heap stays resident while anything lives above it (core/memory.hpp).
  AlignedBytes storage_;
  bool released_ = false;
};

/// Calls f(full_name, const Parameter&) for every parameter of a module.
template <class M, class F>
void visit_parameters(const M& module, const std::string& prefix, F&& f) {
  // Visitors are written once, non-const; this view hands out const parameters only.
  const_cast<M&>(module).visit(prefix, [&](const std::string& name, const auto& p) { f(name, p); });
}

/// Packs p for products in `precision` when it feeds them (nn::MatmulWeight has
/// pack()); other parameters, and every parameter when precision is empty, stay plain.
template <class P>
void pack_if_matmul_weight(P& p, std::optional<Precision> precision) {
  if constexpr (requires { p.pack(Precision::fp32); }) {
    if (precision) p.pack(*precision);
  }
}

/// At int8, packs a weight that int8 quantizes from values that come a block at a time:
/// read(first, count, dst) writes its flat elements [first, first + count) to dst
/// (nn::MatmulWeight::pack_int8_from_blocks), so that they are never whole in float.
/// Returns false, having read nothing, for any other parameter or precision.
template <class P, class Read>
bool pack_int8_from_blocks(P& p, std::optional<Precision> precision, Read&& read) {
  if constexpr (requires { p.pack_int8_from_blocks(read); }) {
    if (precision == Precision::int8 && p.packs_int8_from_blocks()) {
      p.pack_int8_from_blocks(read);
      return true;
    }
  }
  return false;
}

/// Packs every matrix-product weight of a loaded module (see nn::MatmulWeight).
template <class M>
void pack_parameters(M& module, Precision precision) {
  module.visit("", [&](const std::string&, auto& p) { pack_if_matmul_weight(p, precision); });
}

struct ParameterCounts {
  std::int64_t trained = 0;
  std::int64_t frozen = 0;
  std::int64_t total() const { return trained + frozen; }
  bool operator==(const ParameterCounts&) const = default;
};

template <class M>
ParameterCounts count_parameters(const M& module) {
  ParameterCounts c;
  visit_parameters(module, "", [&](const std::string&, const auto& p) {
    (p.role() == Role::trained ? c.trained : c.frozen) += p.numel();
  });
  return c;
}

}  // namespace ldlm
