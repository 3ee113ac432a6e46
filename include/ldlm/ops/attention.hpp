// Scaled dot-product attention over many heads, tile by tile. For each (batch,
// head, tile of queries) one task computes the tile's scores against every key
// with a GEMM, caps and exponentiates them, multiplies by V and normalises; a
// task holds at most tile_rows × Tk scores, in scratch reserved once per call.
#pragma once

#include <array>
#include <cmath>

#include "ldlm/core/context.hpp"
#include "ldlm/ops/linear.hpp"

namespace ldlm {

/// Queries per attention task. OpenBLAS repacks K and V for every tile; 256
/// queries (1 MB of float scores at Tk = 1024) cut that packing from ~10% to ~5%
/// of attention time against 64-query tiles. Tiles shrink (down to 64 queries)
/// only when there would otherwise be fewer than four tasks per thread.
inline constexpr Index kAttentionQueryTile = 256;
inline constexpr Index kAttentionMinQueryTile = 64;

struct AttentionShape {
  Index batch = 1;
  Index q_len = 0;   // Tq: query rows per batch element
  Index kv_len = 0;  // Tk: key/value rows per batch element
  Index heads = 1;
  Index head_dim = 1;
};

struct AttentionOptions {
  double softcap = 0.0;  // c · tanh(s / c) after the 1/sqrt(hd) scale; 0 disables it
  bool causal = false;   // query i sees keys j <= i (requires Tq == Tk)
};

/// One head's columns [h*hd, (h+1)*hd) of a row-major matrix whose rows are (b, t).
template <class S>
struct HeadRows {
  const S* data;
  Index row_stride;  // elements between consecutive rows
};

/// out[b*Tq + i, h*hd : (h+1)*hd] = Σ_j softmax_j(cap(q_i · k_j / √hd)) v_j for all b, h.
/// q, k, v and out carry their own row strides (so q, k, v may be column blocks
/// of one fused projection). out must not alias q, k or v.
template <class S>
void attention(Context& ctx, HeadRows<S> q, HeadRows<S> k, HeadRows<S> v, S* out, Index out_stride,
               const AttentionShape& shape, const AttentionOptions& options) {
  const Index B = shape.batch, Tq = shape.q_len, Tk = shape.kv_len, H = shape.heads, hd = shape.head_dim;
  if (options.causal && Tq != Tk)
    throw ShapeError("attention: causal attention needs as many queries as keys, got Tq = " + std::to_string(Tq) +
                     ", Tk = " + std::to_string(Tk));
  if (Tq == 0 || Tk == 0) return;
  Index tile_rows = std::min(kAttentionQueryTile, Tq);
  while (tile_rows > kAttentionMinQueryTile && B * H * ((Tq + tile_rows - 1) / tile_rows) < 4 * ctx.threads())
    tile_rows /= 2;
  const Index tiles = (Tq + tile_rows - 1) / tile_rows;
  const S scale = S(1) / std::sqrt(static_cast<S>(hd));
  const S cap = static_cast<S>(options.softcap);

  // Every worker's scores start 64-byte aligned: Eigen computes a row's unaligned
  // head with scalar exp/tanh, which round differently from the vector ones, so
  // the alignment must not depend on which worker runs a tile.
  constexpr Index kAlignFloats = 64 / static_cast<Index>(sizeof(S));
  const Index worker_stride = (tile_rows * Tk + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  Arena::Scope scope(ctx.arena());
  S* scratch = ctx.arena().allocate<S>(static_cast<std::size_t>(ctx.threads() * worker_stride));

  ctx.pool().parallel_for(B * H * tiles, [&](Index task, int worker) {
    const Index tile = task % tiles, h = (task / tiles) % H, b = task / (tiles * H);
    const Index i0 = tile * tile_rows, rows = std::min(tile_rows, Tq - i0);
    // Causal tiles only need keys up to their last query.
    const Index keys = options.causal ? i0 + rows : Tk;
    ConstStridedMap<S> Q(q.data + (b * Tq + i0) * q.row_stride + h * hd, rows, hd, Eigen::OuterStride<>(q.row_stride));
    ConstStridedMap<S> K(k.data + b * Tk * k.row_stride + h * hd, keys, hd, Eigen::OuterStride<>(k.row_stride));
    ConstStridedMap<S> V(v.data + b * Tk * v.row_stride + h * hd, keys, hd, Eigen::OuterStride<>(v.row_stride));
    StridedMap<S> O(out + (b * Tq + i0) * out_stride + h * hd, rows, hd, Eigen::OuterStride<>(out_stride));
    MatrixMap<S> P(scratch + static_cast<Index>(worker) * worker_stride, rows, keys);  // [rows, keys]
    std::array<S, kAttentionQueryTile> row_sum;

    gemm<S>(Q, K, /*transpose_b=*/true, scale, S(0), P);  // P = (Q / √hd) Kᵀ
    // Each score row is capped, shifted and exponentiated while it sits in L1;
    // the 1/Σ normalisation waits until after P·V, where a row is hd wide, not Tk.
    for (Index r = 0; r < rows; ++r) {
      const Index visible = options.causal ? i0 + r + 1 : keys;
      Eigen::Map<Eigen::Array<S, 1, Eigen::Dynamic>> row(P.row(r).data(), visible);
      if (cap > S(0)) row = (row / cap).tanh() * cap;
      row = (row - row.maxCoeff()).exp();
      row_sum[r] = row.sum();
      P.row(r).tail(keys - visible).setZero();  // masked keys: exp(-inf) = 0
    }
    gemm<S>(P, V, /*transpose_b=*/false, S(1), S(0), O);  // O = exp(P) V
    for (Index r = 0; r < rows; ++r) O.row(r) /= row_sum[r];
  });
}

}  // namespace ldlm
