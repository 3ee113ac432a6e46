// The pieces of ldlm's own bf16 attention kernel for AMX (the loop that drives them
// is in ops/attention.hpp). A task takes 32 queries of one head and keeps its
// scores, probabilities and output in L2: tiles of QKᵀ, then the softmax rows, then
// tiles of P·V, with no library call per tile. oneDNN's fixed-shape primitives ran
// each product of a 256-query tile in one call, and the softmax between them read
// the scores back from memory (timings in bench/results/README.md).
//
// AMX multiplies a 16 × 32 bf16 tile by a 32 × 16 one into 16 × 16 fp32; the right
// operand is stored in pairs along the depth ("VNNI" order): row r of the tile holds,
// for each of its 16 columns n, the two values at depth 2r and 2r + 1. K and V are
// copied into that order once per call, so every tile load reads 1 KB in one piece:
//   keys   [B, H, Tk'/16, hd/32, 16, 16, 2]: tile (key block, depth block), element
//          (r, n, e) = k[key 16·block + n][dim 32·depth + 2r + e]   (QKᵀ's right operand)
//   values [B, H, Tk'/32, hd/16, 16, 16, 2]: tile (key block, column block), element
//          (r, n, e) = v[key 32·block + 2r + e][dim 16·column + n]  (P·V's right operand)
// Queries are plain rows, [B, H, Tq', hd]. Tq' and Tk' are Tq and Tk rounded up to 32
// with zero rows, so every tile is whole.
#pragma once

#include <algorithm>
#include <array>
#include <cstring>

#include "ldlm/core/amx.hpp"
#include "ldlm/core/precision.hpp"
#include "ldlm/core/tensor.hpp"

namespace ldlm::detail::amx {

inline constexpr Index kBlock = 32;          // queries per task, keys per step: two tiles of 16
inline constexpr Index kTileElements = 512;  // bf16 values in a 16 × 64-byte tile
inline constexpr Index kMaxHeadDim = 256;

/// Head widths the kernel takes: whole 32-deep steps of QKᵀ, pairs of 16-wide output tiles.
inline bool supports_head_dim(Index head_dim) { return head_dim % kBlock == 0 && head_dim <= kMaxHeadDim; }

inline Index padded_rows(Index rows) { return (rows + kBlock - 1) / kBlock * kBlock; }

/// `count` rows of hd floats (row stride ld) into `rows` rows of bf16, zeros past count.
inline void bf16_rows(const float* x, Index ld, Index count, Index rows, Index hd, bf16* to) {
  for (Index r = 0; r < rows; ++r)
    if (r < count)
      to_bf16(x + r * ld, hd, to + r * hd);
    else
      std::fill_n(to + r * hd, hd, bf16{});
}

/// The 16 keys of one block of one head (`count` real rows of x, row stride ld; the
/// rest zero) into that block's hd/32 key tiles, each written in order.
inline void pack_key_block(const float* x, Index ld, Index count, Index hd, bf16* tiles) {
  std::array<bf16, 16 * kMaxHeadDim> keys;  // [16, hd]
  bf16_rows(x, ld, count, 16, hd, keys.data());
  for (Index c = 0; c < hd / kBlock; ++c)
    for (Index r = 0; r < 16; ++r)
      for (Index n = 0; n < 16; ++n)  // element (r, n) is the pair at depth 32c + 2r of key n
        std::memcpy(tiles + c * kTileElements + r * kBlock + 2 * n, keys.data() + n * hd + c * kBlock + 2 * r,
                    2 * sizeof(bf16));
}

/// The 32 values of one block of one head into that block's hd/16 value tiles.
inline void pack_value_block(const float* x, Index ld, Index count, Index hd, bf16* tiles) {
  std::array<bf16, kBlock * kMaxHeadDim> values;  // [32, hd]
  bf16_rows(x, ld, count, kBlock, hd, values.data());
  for (Index ct = 0; ct < hd / 16; ++ct)
    for (Index r = 0; r < 16; ++r)
      for (Index n = 0; n < 16; ++n) {  // element (r, n) pairs values 2r and 2r + 1 of column 16ct + n
        bf16* pair = tiles + ct * kTileElements + r * kBlock + 2 * n;
        pair[0] = values[static_cast<std::size_t>(2 * r * hd + 16 * ct + n)];
        pair[1] = values[static_cast<std::size_t>((2 * r + 1) * hd + 16 * ct + n)];
      }
}

#if defined(LDLM_HAVE_AMX)
/// scores[32, keys] (row stride ld) = q[32, hd] · kᵀ for the first `keys` (a multiple
/// of 32) of one head's key tiles. Unscaled: the softmax scales.
__attribute__((target("amx-tile,amx-bf16"))) inline void query_key_tiles(const bf16* q, Index hd,
                                                                         const bf16* keys_tiles, Index keys,
                                                                         float* scores, Index ld) {
  load_full_tiles();
  const Index depth_tiles = hd / kBlock;
  const long q_stride = static_cast<long>(hd * sizeof(bf16)), s_stride = static_cast<long>(ld * sizeof(float));
  const bf16* q_low = q + 16 * hd;
  float* s_low = scores + 16 * ld;
  for (Index n = 0; n < keys; n += kBlock) {
    const bf16* left = keys_tiles + (n / 16) * depth_tiles * kTileElements;  // keys n .. n+15
    const bf16* right = left + depth_tiles * kTileElements;                  // keys n+16 .. n+31
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (Index c = 0; c < depth_tiles; ++c) {
      _tile_loadd(4, q + c * kBlock, q_stride);
      _tile_loadd(5, q_low + c * kBlock, q_stride);
      _tile_loadd(6, left + c * kTileElements, kAmxTileBytes);
      _tile_loadd(7, right + c * kTileElements, kAmxTileBytes);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, scores + n, s_stride);
    _tile_stored(1, scores + n + 16, s_stride);
    _tile_stored(2, s_low + n, s_stride);
    _tile_stored(3, s_low + n + 16, s_stride);
  }
  amx_memory_barrier();
}

/// out[32, hd] (row stride ldo) = p[32, keys] (row stride ld) · v for the first `keys`
/// (a multiple of 32) of one head's value tiles. Releases the tiles.
__attribute__((target("amx-tile,amx-bf16"))) inline void probability_value_tiles(const bf16* p, Index ld,
                                                                                 const bf16* value_tiles, Index keys,
                                                                                 Index hd, float* out, Index ldo) {
  load_full_tiles();
  const Index column_tiles = hd / 16;
  const long p_stride = static_cast<long>(ld * sizeof(bf16)), o_stride = static_cast<long>(ldo * sizeof(float));
  const bf16* p_low = p + 16 * ld;
  float* o_low = out + 16 * ldo;
  for (Index ct = 0; ct < column_tiles; ct += 2) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (Index k = 0; k < keys; k += kBlock) {
      const bf16* left = value_tiles + ((k / kBlock) * column_tiles + ct) * kTileElements;
      _tile_loadd(4, p + k, p_stride);
      _tile_loadd(5, p_low + k, p_stride);
      _tile_loadd(6, left, kAmxTileBytes);
      _tile_loadd(7, left + kTileElements, kAmxTileBytes);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, out + ct * 16, o_stride);
    _tile_stored(1, out + ct * 16 + 16, o_stride);
    _tile_stored(2, o_low + ct * 16, o_stride);
    _tile_stored(3, o_low + ct * 16 + 16, o_stride);
  }
  amx_memory_barrier();
  _tile_release();
}
#endif

}  // namespace ldlm::detail::amx
