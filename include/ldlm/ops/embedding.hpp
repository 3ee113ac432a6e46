// Position and time embeddings.
#pragma once

#include <cmath>

#include "ldlm/core/context.hpp"

namespace ldlm {

/// The d^-1/2 factor applied to absolute-position tables, rounded to S as PyTorch
/// rounds a Python float multiplied into a tensor.
template <class S>
S position_scale(Index d) {
  return static_cast<S>(std::pow(static_cast<double>(d), -0.5));
}

/// x[b*T + t] += E[t] · d^-1/2 for every batch b: the scaled absolute positions.
template <class S>
void add_positions(Context& ctx, ConstMatRef<S> table, Index T, MatRef<S> x) {
  sequence_count("add_positions", "x", x.rows(), x.cols(), T);
  if (T > table.rows() || table.cols() != x.cols())
    throw ShapeError("add_positions: position table " + shape_string(Shape{table.rows(), table.cols()}) +
                     " cannot serve T = " + std::to_string(T) + " with " + std::to_string(x.cols()) + " features");
  const S s = position_scale<S>(table.cols());
  for_each_row(ctx, x.rows(), [&](Index r) { x.row(r) += table.row(r % T) * s; });
}

/// emb[b] = [cos(t_b f_j), sin(t_b f_j)], f_j = exp(−ln(P) j / (n/2)), j < n/2.
/// `flip` gives the [sin, cos] order.
template <class S>
void timestep_embedding(const S* t, Index batch, double max_period, bool flip, MatRef<S> emb) {
  const Index n = emb.cols(), half = n / 2;
  if (n % 2 != 0 || emb.rows() != batch)
    throw ShapeError("timestep_embedding: output " + shape_string(Shape{emb.rows(), n}) + " for batch " +
                     std::to_string(batch) + " (width must be even)");
  // Frequencies and angles in double, rounded once.
  const double log_p = std::log(max_period);
  for (Index b = 0; b < batch; ++b) {
    for (Index j = 0; j < half; ++j) {
      const double arg =
          static_cast<double>(t[b]) * std::exp(-log_p * static_cast<double>(j) / static_cast<double>(half));
      emb(b, flip ? half + j : j) = static_cast<S>(std::cos(arg));
      emb(b, flip ? j : half + j) = static_cast<S>(std::sin(arg));
    }
  }
}

}  // namespace ldlm
