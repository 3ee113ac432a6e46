// Test support: attention straight from its definition, in double, which the
// attention kernels (ops/attention.hpp) and modules (nn/attention.hpp) are held to.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ldlm/ldlm.hpp"

namespace ldlm::test {

/// softmax(cap(q·k/√hd)) v per (batch, head), in double, straight from the definition.
/// Rows are (b, t), columns (h, i). cap_before_scale gives the wrong order
/// cap(q·k)/√hd, as a bug would compute it.
inline Matrix<double> naive_attention(const Matrix<double>& q, const Matrix<double>& k, const Matrix<double>& v,
                                      const AttentionShape& shape, double softcap, bool causal,
                                      bool cap_before_scale = false) {
  const Index B = shape.batch, Tq = shape.q_len, Tk = shape.kv_len, H = shape.heads, hd = shape.head_dim;
  const auto cap = [&](double s) { return softcap > 0 ? softcap * std::tanh(s / softcap) : s; };
  Matrix<double> out = Matrix<double>::Zero(B * Tq, H * hd);
  std::vector<double> logits(static_cast<std::size_t>(Tk));
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < Tq; ++i) {
        double max_logit = -std::numeric_limits<double>::infinity();
        for (Index j = 0; j < Tk; ++j) {
          double dot = 0;
          for (Index e = 0; e < hd; ++e) dot += q(b * Tq + i, h * hd + e) * k(b * Tk + j, h * hd + e);
          const double s = cap_before_scale ? cap(dot) / std::sqrt(double(hd)) : cap(dot / std::sqrt(double(hd)));
          logits[j] = causal && j > i ? -std::numeric_limits<double>::infinity() : s;
          max_logit = std::max(max_logit, logits[j]);
        }
        double total = 0;
        for (Index j = 0; j < Tk; ++j) total += logits[j] = std::exp(logits[j] - max_logit);
        for (Index j = 0; j < Tk; ++j)
          for (Index e = 0; e < hd; ++e) out(b * Tq + i, h * hd + e) += logits[j] / total * v(b * Tk + j, h * hd + e);
      }
  return out;
}

}  // namespace ldlm::test
