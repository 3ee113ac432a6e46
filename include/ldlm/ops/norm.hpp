// Normalisations over the last axis of a row-major [rows, n] matrix. Each row is
// read completely before it is written, so y may alias x (in-place is allowed).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#include "ldlm/core/context.hpp"
#include "ldlm/core/error.hpp"
#include "ldlm/core/precision.hpp"
#include "ldlm/core/tensor.hpp"

namespace ldlm {

namespace detail {
/// [rows, cols] of a matrix for the shape checks, without the heap allocation of a
/// Shape: these checks run on every call, inside the allocation-free sampling loop.
template <class M>
std::array<std::int64_t, 2> extents(const M& m) {
  return {m.rows(), m.cols()};
}

/// Throws ShapeError unless x [rows, n], the gain [n] and y [rows, n] agree; the
/// arguments come in the order the message names them.
inline void check_norm_shapes(const char* op, std::array<std::int64_t, 2> x, std::int64_t gain,
                              std::array<std::int64_t, 2> y) {
  if (x[1] != gain || y != x)
    throw ShapeError(std::string(op) + ": x " + shape_string(x) + ", weight " +
                     shape_string(std::array<std::int64_t, 1>{gain}) + ", y " + shape_string(y) + " do not fit");
}

/// One row of layer_norm_gain: y[0, n) from x[0, n). y may alias x.
template <class S>
void layer_norm_gain_row(const S* x, const S* gamma, float eps, Index n, S* y) {
  const auto row = ConstRowVectorMap<S>(x, n).template cast<float>().array();  // lazy: no copy for S = float
  const float mean = row.mean();
  const float inv_std = 1.0f / std::sqrt((row - mean).square().mean() + eps);
  RowVectorMap<S>(y, n) =
      ((row - mean) * inv_std).matrix().template cast<S>().cwiseProduct(ConstRowVectorMap<S>(gamma, n));
}
}  // namespace detail

/// Gain-only LayerNorm computed in float32 whatever S is:
/// y = γ ⊙ (x − μ) / sqrt(σ² + ε), biased σ². Matches F.layer_norm(x.float(), [n]) * γ.
template <class S>
void layer_norm_gain(Context& ctx, ConstMatRef<S> x, const S* gamma, float eps, MatRef<S> y) {
  const Index n = x.cols();
  detail::check_norm_shapes("layer_norm_gain", detail::extents(x), n, detail::extents(y));
  for_each_row(ctx, x.rows(),
               [&](Index r) { detail::layer_norm_gain_row(x.row(r).data(), gamma, eps, n, y.row(r).data()); });
}

/// torch.nn.LayerNorm with weight and bias, computed in S.
template <class S>
void layer_norm(Context& ctx, ConstMatRef<S> x, const S* gamma, const S* beta, S eps, MatRef<S> y) {
  const Index n = x.cols();
  detail::check_norm_shapes("layer_norm", detail::extents(x), n, detail::extents(y));
  ConstRowVectorMap<S> g(gamma, n), b(beta, n);
  for_each_row(ctx, x.rows(), [&](Index r) {
    const S mean = x.row(r).mean();
    const S var = (x.row(r).array() - mean).square().mean();
    const S inv_std = S(1) / std::sqrt(var + eps);
    y.row(r) = ((x.row(r).array() - mean) * inv_std).matrix().cwiseProduct(g) + b;
  });
}

/// Cosmos RMSNorm: y = x / max(‖x‖₂ · n^-1/2, ε) ⊙ γ (a clamp of the RMS, not sqrt(mean + ε)).
template <class S>
void rms_norm(Context& ctx, ConstMatRef<S> x, const S* gamma, S eps, MatRef<S> y) {
  const Index n = x.cols();
  detail::check_norm_shapes("rms_norm", detail::extents(x), n, detail::extents(y));
  ConstRowVectorMap<S> g(gamma, n);
  const S inv_sqrt_n = S(1) / std::sqrt(static_cast<S>(n));
  for_each_row(ctx, x.rows(), [&](Index r) {
    const S rms = std::max(x.row(r).norm() * inv_sqrt_n, eps);
    y.row(r) = (x.row(r) / rms).cwiseProduct(g);
  });
}

/// RMSNorm applied to each head's slice of hd features (q/k-norm), in place over
/// columns [col0, col0 + heads*hd) of every row.
template <class S>
void rms_norm_heads_inplace(Context& ctx, MatRef<S> x, Index col0, Index heads, const S* gamma, Index hd, S eps) {
  ConstRowVectorMap<S> g(gamma, hd);
  const S inv_sqrt_n = S(1) / std::sqrt(static_cast<S>(hd));
  for_each_row(ctx, x.rows(), [&](Index r) {
    for (Index h = 0; h < heads; ++h) {
      auto seg = x.row(r).segment(col0 + h * hd, hd);
      const S rms = std::max(seg.norm() * inv_sqrt_n, eps);
      seg = (seg / rms).cwiseProduct(g);
    }
  });
}

}  // namespace ldlm
