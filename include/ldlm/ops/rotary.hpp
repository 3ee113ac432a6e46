// Rotary position embedding with half-split (GPT-NeoX, rotate_half) pairing:
// feature i pairs with i + hd/2. The interleaved pairing (2j, 2j+1) is kept only as
// a switch for checkpoints that use it; it is wrong for LDLM.
#pragma once

#include <cmath>

#include "ldlm/core/context.hpp"

namespace ldlm {

/// cos/sin of p · inv_freq_j for p < T, j < hd/2, in arena memory: build it once per
/// sequence length and share it across heads and layers.
template <class S>
struct RotaryTable {
  const S* cos = nullptr;  // [T, hd/2]
  const S* sin = nullptr;  // [T, hd/2]
  Index T = 0, half = 0;
};

template <class S>
RotaryTable<S> make_rotary_table(Arena& arena, Index T, Index hd, double base) {
  if (hd % 2 != 0) throw ShapeError("rotary: head_dim must be even, got " + std::to_string(hd));
  const Index half = hd / 2;
  S* c = arena.allocate<S>(T * half);
  S* s = arena.allocate<S>(T * half);
  // Angles in double, rounded once: the table is as exact as S allows, also at p ~ 1000.
  for (Index j = 0; j < half; ++j) {
    const double inv_freq = std::pow(base, -2.0 * static_cast<double>(j) / static_cast<double>(hd));
    for (Index p = 0; p < T; ++p) {
      const double angle = static_cast<double>(p) * inv_freq;
      c[p * half + j] = static_cast<S>(std::cos(angle));
      s[p * half + j] = static_cast<S>(std::sin(angle));
    }
  }
  return {c, s, T, half};
}

/// Rotates columns [col0, col0 + heads*hd) of every row in place; row r is
/// position r % T.
template <class S>
void apply_rotary_inplace(Context& ctx, MatRef<S> x, Index col0, Index heads, Index hd, Index T,
                          const RotaryTable<S>& table, bool interleaved = false) {
  const Index half = hd / 2;
  if (table.T < T || table.half != half)
    throw ShapeError("rotary: table for T = " + std::to_string(table.T) + ", hd = " + std::to_string(2 * table.half) +
                     " cannot serve T = " + std::to_string(T) + ", hd = " + std::to_string(hd));
  for_each_row(ctx, x.rows(), [&](Index r) {
    const Index p = r % T;
    const S* c = table.cos + p * half;
    const S* s = table.sin + p * half;
    for (Index h = 0; h < heads; ++h) {
      S* v = &x(r, col0 + h * hd);
      for (Index j = 0; j < half; ++j) {
        const Index i1 = interleaved ? 2 * j : j, i2 = interleaved ? 2 * j + 1 : j + half;
        const S a = v[i1], b = v[i2];
        v[i1] = a * c[j] - b * s[j];
        v[i2] = b * c[j] + a * s[j];
      }
    }
  });
}

}  // namespace ldlm
