// Tensor conventions: Eigen tensors in PyTorch axis order (row-major, last index
// fastest). Hot code views the same storage as row-major matrices [rows, features],
// so a [B, T, d] activation is a [B*T, d] matrix without copying.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "ldlm/core/eigen.hpp"
#include "ldlm/core/error.hpp"

namespace ldlm {

using Index = Eigen::Index;

template <class S, int Rank>
using Tensor = Eigen::Tensor<S, Rank, Eigen::RowMajor>;
template <class S>
using Tensor1 = Tensor<S, 1>;
template <class S>
using Tensor2 = Tensor<S, 2>;
template <class S>
using Tensor3 = Tensor<S, 3>;
template <class S>
using Tensor4 = Tensor<S, 4>;
using TokenTensor = Tensor<std::int64_t, 2>;  // [B, T]

template <class S>
using Matrix = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S>
using Vector = Eigen::Matrix<S, Eigen::Dynamic, 1>;
template <class S>
using MatrixMap = Eigen::Map<Matrix<S>>;
template <class S>
using ConstMatrixMap = Eigen::Map<const Matrix<S>>;
/// A row-major block with its own row stride (one head's columns of a wider matrix).
template <class S>
using StridedMap = Eigen::Map<Matrix<S>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class S>
using ConstStridedMap = Eigen::Map<const Matrix<S>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class S>
using RowVectorMap = Eigen::Map<Eigen::Matrix<S, 1, Eigen::Dynamic>>;
template <class S>
using ConstRowVectorMap = Eigen::Map<const Eigen::Matrix<S, 1, Eigen::Dynamic>>;
template <class S>
using ArrayMap = Eigen::Map<Eigen::Array<S, Eigen::Dynamic, 1>>;  // n contiguous values, element-wise

/// What ops take: any row-major matrix view with unit inner stride (a map, a column
/// block, a strided head view) binds without a copy.
template <class S>
using MatRef = Eigen::Ref<Matrix<S>, 0, Eigen::OuterStride<>>;
template <class S>
using ConstMatRef = Eigen::Ref<const Matrix<S>, 0, Eigen::OuterStride<>>;

/// The product of `factors`, or nullopt when a factor is negative or the product
/// does not fit in I: for sizes formed from caller-supplied extents (a batch
/// size, an arena byte count) before anything is allocated.
template <class I>
std::optional<I> checked_product(std::initializer_list<I> factors) {
  I product = 1;
  for (const I f : factors) {
    if constexpr (std::is_signed_v<I>)
      if (f < 0) return std::nullopt;
    if (__builtin_mul_overflow(product, f, &product)) return std::nullopt;
  }
  return product;
}

/// B for a [rows, cols] matrix holding B whole sequences of T rows (row = b*T + t);
/// ShapeError naming `where` and `tensor` when T < 1 or T does not divide rows.
inline Index sequence_count(std::string_view where, std::string_view tensor, Index rows, Index cols, Index T) {
  if (T < 1 || rows % T != 0)
    throw ShapeError(std::string(where) + ": " + std::string(tensor) + " " + shape_string(Shape{rows, cols}) +
                     " is not a whole number of sequences of T = " + std::to_string(T) + " rows");
  return rows / T;
}

template <class S, int Rank>
Shape shape_of(const Tensor<S, Rank>& t) {
  Shape s(Rank);
  for (int i = 0; i < Rank; ++i) s[i] = t.dimension(i);
  return s;
}

/// [d0, ..., dn] -> [d0 * ... * d(n-1), dn]: rows are all leading axes.
template <class S, int Rank>
MatrixMap<S> as_matrix(Tensor<S, Rank>& t) {
  static_assert(Rank >= 1);
  const Index cols = t.dimension(Rank - 1);
  return MatrixMap<S>(t.data(), cols ? t.size() / cols : 0, cols);
}
template <class S, int Rank>
ConstMatrixMap<S> as_matrix(const Tensor<S, Rank>& t) {
  static_assert(Rank >= 1);
  const Index cols = t.dimension(Rank - 1);
  return ConstMatrixMap<S>(t.data(), cols ? t.size() / cols : 0, cols);
}

}  // namespace ldlm
