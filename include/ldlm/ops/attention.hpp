// Scaled dot-product attention over many heads, tile by tile. For each (batch,
// head, tile of queries) one task computes the tile's scores against every key
// with a GEMM, caps and exponentiates them, multiplies by V and normalises; a
// task holds at most tile_rows × Tk scores, in its worker's scratch arena. bf16
// attention on AMX CPUs runs ldlm's own kernel instead (attention_amx, with the
// tile products in ops/attention_amx.hpp), the same loop on AMX tiles.
//
// In bf16 (docs/model.md §Precision) Q, K and V are rounded to bf16 once, and the
// softmax, computed in fp32 and normalised, is rounded to bf16 before P·V: the
// order of `softmax(q kᵀ) @ v` under autocast, whose fp32 softmax output is cast
// for the second product.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <type_traits>

#include "ldlm/core/context.hpp"
#include "ldlm/core/precision.hpp"
#include "ldlm/ops/attention_amx.hpp"
#include "ldlm/ops/gemm.hpp"
#include "ldlm/ops/softmax.hpp"

namespace ldlm {

/// Queries per attention task. The GEMM repacks K and V for every tile; 256
/// queries (1 MB of float scores at Tk = 1024) cut that packing against 64-query
/// tiles. Tiles shrink (down to 64 queries) only when there would otherwise be
/// fewer than four tasks per thread.
inline constexpr Index kAttentionQueryTile = 256;
inline constexpr Index kAttentionMinQueryTile = 64;

struct AttentionShape {
  Index batch = 1;
  Index q_len = 0;   // Tq: query rows per batch element
  Index kv_len = 0;  // Tk: key/value rows per batch element
  Index heads = 1;
  Index head_dim = 1;
};

/// How attention's products run, decided in one place (attention_path):
enum class AttentionPath {
  fp32,          // fp32 (or double) operands, the tile loop
  bf16_rounded,  // bf16-rounded fp32 operands on fp32 kernels (no bf16 instructions)
  bf16_native,   // bf16 operands on oneDNN's bf16 kernels, the tile loop
  bf16_amx,      // bf16 on ldlm's own AMX kernel (ops/attention_amx.hpp)
};

/// The path of attention in `precision` with heads of head_dim in this process.
inline AttentionPath attention_path(Precision precision, [[maybe_unused]] Index head_dim) {
  if (precision == Precision::fp32) return AttentionPath::fp32;
#if defined(LDLM_HAVE_AMX)
  if (bf16_attention_amx() && detail::amx::supports_head_dim(head_dim)) return AttentionPath::bf16_amx;
#endif
  return bf16_operands_native() ? AttentionPath::bf16_native : AttentionPath::bf16_rounded;
}

struct AttentionOptions {
  double softcap = 0.0;                   // c · tanh(s / c) after the 1/sqrt(hd) scale; 0 disables it
  bool causal = false;                    // query i sees keys j <= i (requires Tq == Tk)
  Precision precision = Precision::fp32;  // of QKᵀ and P·V
};

/// One head's columns [h*hd, (h+1)*hd) of a row-major matrix whose rows are (b, t).
template <class S>
struct HeadRows {
  const S* data;
  Index row_stride;  // elements between consecutive rows
};

namespace detail {
/// Where each (batch, head) block of rows starts: element d of row t of head h of
/// batch b is at data[b·batch_stride + h·head_stride + t·row_stride + d]. Callers'
/// tensors are [B·T, H·hd] (head_stride = hd); bf16 operands are copied into
/// [B, H, T, hd], which makes every head's rows dense, as fixed-shape kernels want.
template <class E>
struct HeadBlocks {
  const E* data;
  Index row_stride, head_stride, batch_stride;
  const E* head(Index b, Index h) const { return data + b * batch_stride + h * head_stride; }
};

template <class S>
HeadBlocks<S> head_blocks(HeadRows<S> x, Index len, Index hd) {
  return {x.data, x.row_stride, hd, len * x.row_stride};
}

/// c[M, N] = alpha · a · op(b) on operands of type E (S, or bf16), into float or S.
template <class E, class S>
void attention_product(const E* a, Index lda, const E* b, Index ldb, bool transpose_b, Index M, Index N, Index K,
                       S alpha, S* c, Index ldc) {
  if constexpr (std::is_same_v<E, bf16>) {
    gemm_bf16({a, M, K, lda}, {b, transpose_b ? N : K, transpose_b ? K : N, ldb}, transpose_b, alpha, 0.0f,
              StridedMap<float>(c, M, N, Eigen::OuterStride<>(ldc)));
  } else {
    gemm<S>(ConstStridedMap<S>(a, M, K, Eigen::OuterStride<>(lda)),
            ConstStridedMap<S>(b, transpose_b ? N : K, transpose_b ? K : N, Eigen::OuterStride<>(ldb)), transpose_b,
            alpha, S(0), StridedMap<S>(c, M, N, Eigen::OuterStride<>(ldc)));
  }
}

/// Queries per task: kAttentionQueryTile, halved (down to kAttentionMinQueryTile)
/// while there would be fewer than four tasks per thread.
inline Index attention_query_tile(const Context& ctx, const AttentionShape& shape) {
  Index tile_rows = std::min(kAttentionQueryTile, shape.q_len);
  while (tile_rows > kAttentionMinQueryTile &&
         shape.batch * shape.heads * ((shape.q_len + tile_rows - 1) / tile_rows) < 4 * ctx.threads())
    tile_rows /= 2;
  return tile_rows;
}

/// Turns a tile's scores P [rows, keys] into exp(capped − max) row by row (queries
/// first_query + r; a causal row sees keys up to its own position, the rest become
/// 0) and records each row's sum. With `bf16_probabilities` each row is normalised
/// and rounded to bf16: into `probabilities` ([rows, keys] of E) when E is bf16,
/// else in place.
template <class S, class E>
void exponentiate_tile_scores(MatrixMap<S> P, Index first_query, bool causal, S cap, bool bf16_probabilities,
                              E* probabilities, S* row_sum) {
  const Index rows = P.rows(), keys = P.cols();
#if defined(LDLM_HAVE_AVX512_SOFTMAX)
  // bf16 operands mean bf16 instructions: the AMX kernel's one-pass row, which needs no
  // pass for the maximum under a cap and writes the bf16 probabilities as it normalises.
  if constexpr (std::is_same_v<E, bf16> && std::is_same_v<S, float>) {
    if (bf16_probabilities && cpu_features().avx512_bf16 && cpu_features().avx512bw && cpu_features().avx512dq) {
      for (Index r = 0; r < rows; ++r)
        softmax_row_to_bf16_avx512(P.row(r).data(), causal ? first_query + r + 1 : keys, keys, 1.0f, cap,
                                   probabilities + r * keys);
      return;
    }
  }
#endif
  for (Index r = 0; r < rows; ++r) {
    const Index visible = causal ? first_query + r + 1 : keys;
    row_sum[r] = exp_shifted_capped(P.row(r).data(), visible, cap);
    P.row(r).tail(keys - visible).setZero();  // masked keys: exp(-inf) = 0
    if (!bf16_probabilities) continue;
    const S inverse = S(1) / row_sum[r];
    if constexpr (!std::is_same_v<E, S>)
      to_bf16(P.row(r).data(), keys, probabilities + r * keys, inverse);
    else if constexpr (std::is_same_v<S, float>)
      round_to_bf16(P.row(r).data(), keys, P.row(r).data(), inverse);
    else
      P.row(r) *= inverse;
  }
}

/// The tile loop over operands of type E. With `bf16_probabilities`, each softmax row
/// is normalised and rounded to bf16 before P·V (as E, or as bf16-valued S when E
/// is S); otherwise P·V takes exp(s − max) and the 1/Σ waits until the output rows,
/// which are hd wide rather than Tk. bf16 operands multiply on fixed-shape kernels,
/// which want a dense output too: their P·V goes to a dense tile, then to `out`.
template <class S, class E>
void attention_tiles(Context& ctx, HeadBlocks<E> q, HeadBlocks<E> k, HeadBlocks<E> v, S* out, Index out_stride,
                     const AttentionShape& shape, const AttentionOptions& options, bool bf16_probabilities) {
  const Index B = shape.batch, Tq = shape.q_len, Tk = shape.kv_len, H = shape.heads, hd = shape.head_dim;
  const Index tile_rows = attention_query_tile(ctx, shape);
  const Index tiles = (Tq + tile_rows - 1) / tile_rows;
  const S scale = S(1) / std::sqrt(static_cast<S>(hd));
  const S cap = static_cast<S>(options.softcap);

  constexpr bool convert_probabilities = !std::is_same_v<E, S>;  // bf16 operands: P gets its own copy
  constexpr bool dense_output = std::is_same_v<E, bf16>;

  ctx.pool().parallel_for(B * H * tiles, [&](Index task, int worker) {
    const Index tile = task % tiles, h = (task / tiles) % H, b = task / (tiles * H);
    const Index i0 = tile * tile_rows, rows = std::min(tile_rows, Tq - i0);
    // Causal tiles only need keys up to their last query.
    const Index keys = options.causal ? i0 + rows : Tk;
    const E* Q = q.head(b, h) + i0 * q.row_stride;
    const E* K = k.head(b, h);
    const E* V = v.head(b, h);
    S* const O = out + (b * Tq + i0) * out_stride + h * hd;
    // Arena blocks are 64-byte aligned, whichever worker runs the tile: the generic
    // exponentials (ops/softmax.hpp) compute a row's unaligned head with scalar
    // exp/tanh, which round differently from the vector ones.
    Arena& arena = ctx.worker_arena(worker);
    Arena::Scope scope(arena);
    // Every task asks for the largest tile, so a worker's arena is sized by its first.
    const auto tile_capacity = static_cast<std::size_t>(tile_rows * Tk);
    MatrixMap<S> P(arena.allocate<S>(tile_capacity), rows, keys);  // [rows, keys]
    E* P_operand = convert_probabilities ? arena.allocate<E>(tile_capacity) : reinterpret_cast<E*>(P.data());
    S* const PV = dense_output ? arena.allocate<S>(static_cast<std::size_t>(tile_rows * hd)) : O;
    const Index pv_stride = dense_output ? hd : out_stride;
    std::array<S, kAttentionQueryTile> row_sum;

    attention_product<E, S>(Q, q.row_stride, K, k.row_stride, true, rows, keys, hd, scale, P.data(),
                            keys);  // (Q/√hd) Kᵀ
    exponentiate_tile_scores<S, E>(P, i0, options.causal, cap, bf16_probabilities, P_operand, row_sum.data());
    attention_product<E, S>(P_operand, keys, V, v.row_stride, false, rows, hd, keys, S(1), PV, pv_stride);  // P V
    if (dense_output)
      for (Index r = 0; r < rows; ++r) std::copy_n(PV + r * hd, hd, O + r * out_stride);
    if (!bf16_probabilities)
      for (Index r = 0; r < rows; ++r) StridedMap<S>(O + r * out_stride, 1, hd, Eigen::OuterStride<>(hd)) /= row_sum[r];
  });
}

/// Copies the heads of a [batch·len, heads·hd] source into [batch, heads, len, hd]:
/// bf16 values, or bf16-rounded floats.
template <class E>
HeadBlocks<E> bf16_operand(Context& ctx, HeadRows<float> x, Index batch, Index len, const AttentionShape& s) {
  const Index H = s.heads, hd = s.head_dim;
  E* heads = ctx.arena().allocate<E>(static_cast<std::size_t>(batch * len * H * hd));
  for_each_row(ctx, batch * len, [&](Index r) {
    const Index b = r / len, t = r % len;
    for (Index h = 0; h < H; ++h) {
      const float* from = x.data + r * x.row_stride + h * hd;
      E* to = heads + ((b * H + h) * len + t) * hd;
      if constexpr (std::is_same_v<E, bf16>)
        to_bf16(from, hd, to);
      else
        round_to_bf16(from, hd, to);
    }
  });
  return {heads, hd, len * hd, H * len * hd};
}

/// False when there is nothing to compute; throws for a causal shape that is not square.
inline bool attention_has_work(const AttentionShape& shape, const AttentionOptions& options) {
  if (options.causal && shape.q_len != shape.kv_len)
    throw ShapeError("attention: causal attention needs as many queries as keys, got Tq = " +
                     std::to_string(shape.q_len) + ", Tk = " + std::to_string(shape.kv_len));
  return shape.q_len > 0 && shape.kv_len > 0;
}

#if defined(LDLM_HAVE_AMX)
/// bf16 attention on ldlm's AMX kernel (ops/attention_amx.hpp): one task per 32
/// queries of one head. The same semantics as attention_tiles in bf16 (bf16 operands,
/// fp32 scores scaled and capped, each softmax row normalised and rounded to bf16
/// before P·V), not the same bits: the summation order, the exponential (base 2,
/// scale and cap folded, and with a cap no shift by the row's maximum) and subnormal
/// probabilities (flushed) differ. `out` is float, or bf16 for a product that reads
/// the result: the same values, rounded once.
template <class Out>
void attention_amx(Context& ctx, HeadRows<float> q, HeadRows<float> k, HeadRows<float> v, Out* out, Index out_stride,
                   const AttentionShape& s, const AttentionOptions& options) {
  const Index B = s.batch, Tq = s.q_len, Tk = s.kv_len, H = s.heads, hd = s.head_dim;
  const Index q_rows = amx::padded_rows(Tq), kv_rows = amx::padded_rows(Tk), head_elements = kv_rows * hd;
  Arena& arena = ctx.arena();
  Arena::Scope scope(arena);
  bf16* const queries = arena.allocate<bf16>(static_cast<std::size_t>(B * H * q_rows * hd));   // [B, H, Tq', hd]
  bf16* const keys = arena.allocate<bf16>(static_cast<std::size_t>(B * H * head_elements));    // key tiles
  bf16* const values = arena.allocate<bf16>(static_cast<std::size_t>(B * H * head_elements));  // value tiles
  auto head_start = [&](bf16* tensor, Index b, Index h, Index elements) { return tensor + (b * H + h) * elements; };

  for_each_row(ctx, B * q_rows, [&](Index r) {
    const Index b = r / q_rows, t = r % q_rows;
    for (Index h = 0; h < H; ++h) {
      bf16* to = head_start(queries, b, h, q_rows * hd) + t * hd;
      if (t < Tq)
        to_bf16(q.data + (b * Tq + t) * q.row_stride + h * hd, hd, to);
      else
        std::fill_n(to, hd, bf16{});
    }
  });
  // Rows past Tk are zeros: their scores are never read and their probabilities are
  // zero, which must not meet a NaN of uninitialised memory.
  const Index kv_blocks = kv_rows / amx::kBlock;
  ctx.pool().parallel_for(B * H * kv_blocks, [&](Index task, int) {
    const Index block = task % kv_blocks, h = (task / kv_blocks) % H, b = task / (kv_blocks * H);
    const Index t0 = block * amx::kBlock, count = std::min(amx::kBlock, Tk - t0);
    const Index offset = (b * Tk + t0) * k.row_stride + h * hd;
    bf16* const key_tiles = head_start(keys, b, h, head_elements) + t0 * hd;  // a block's tiles: 32 · hd values
    amx::pack_key_block(k.data + offset, k.row_stride, std::min<Index>(count, 16), hd, key_tiles);
    const float* second_keys = count > 16 ? k.data + offset + 16 * k.row_stride : nullptr;  // (null: all zero)
    amx::pack_key_block(second_keys, k.row_stride, std::max<Index>(count - 16, 0), hd, key_tiles + 16 * hd);
    amx::pack_value_block(v.data + (b * Tk + t0) * v.row_stride + h * hd, v.row_stride, count, hd,
                          head_start(values, b, h, head_elements) + t0 * hd);
  });

  const Index blocks = q_rows / amx::kBlock;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd)), cap = static_cast<float>(options.softcap);
  ctx.pool().parallel_for(B * H * blocks, [&](Index task, int worker) {
    const Index block = task % blocks, h = (task / blocks) % H, b = task / (blocks * H);
    const Index i0 = block * amx::kBlock, rows = std::min(amx::kBlock, Tq - i0);
    const Index visible_keys = options.causal ? i0 + rows : Tk;  // causal blocks stop at their last query
    const Index keys_used = amx::padded_rows(visible_keys);
    // Rows one cache line longer than a power of two: a tile's 16 rows would
    // otherwise fall into one L1 set (bench/results/README.md, "Score rows one cache
    // line past a power of two").
    const Index score_ld = keys_used + 16, probability_ld = keys_used + 32;
    Arena& scratch = ctx.worker_arena(worker);
    Arena::Scope task_scope(scratch);
    // Every task asks for the largest block, so a worker's arena is sized by its first.
    float* const scores = scratch.allocate<float>(static_cast<std::size_t>(amx::kBlock * (kv_rows + 16)));
    bf16* const probabilities = scratch.allocate<bf16>(static_cast<std::size_t>(amx::kBlock * (kv_rows + 32)));
    float* const block_out = scratch.allocate<float>(static_cast<std::size_t>(amx::kBlock * hd));  // [32, hd]

    amx::query_key_tiles(head_start(queries, b, h, q_rows * hd) + i0 * hd, hd, head_start(keys, b, h, head_elements),
                         keys_used, scores, score_ld);
    for (Index r = 0; r < amx::kBlock; ++r) {
      bf16* p = probabilities + r * probability_ld;
      if (r < rows)
        softmax_row_to_bf16_avx512(scores + r * score_ld, options.causal ? i0 + r + 1 : Tk, keys_used, scale, cap, p);
      else
        std::fill_n(p, keys_used, bf16{});
    }
    Out* const to = out + (b * Tq + i0) * out_stride + h * hd;
    if constexpr (std::is_same_v<Out, float>) {
      if (rows == amx::kBlock)  // a whole block: the tiles go where they belong
        return amx::probability_value_tiles(probabilities, probability_ld, head_start(values, b, h, head_elements),
                                            keys_used, hd, to, out_stride);
    }
    amx::probability_value_tiles(probabilities, probability_ld, head_start(values, b, h, head_elements), keys_used, hd,
                                 block_out, hd);
    for (Index r = 0; r < rows; ++r)
      if constexpr (std::is_same_v<Out, float>)
        std::copy_n(block_out + r * hd, hd, to + r * out_stride);
      else
        to_bf16(block_out + r * hd, hd, to + r * out_stride);
  });
}
#endif

template <class E>
void attention_bf16(Context& ctx, HeadRows<float> q, HeadRows<float> k, HeadRows<float> v, float* out, Index out_stride,
                    const AttentionShape& s, const AttentionOptions& options) {
  Arena::Scope scope(ctx.arena());
  const auto qb = bf16_operand<E>(ctx, q, s.batch, s.q_len, s);
  const auto kb = bf16_operand<E>(ctx, k, s.batch, s.kv_len, s);
  const auto vb = bf16_operand<E>(ctx, v, s.batch, s.kv_len, s);
  attention_tiles<float, E>(ctx, qb, kb, vb, out, out_stride, s, options, /*bf16_probabilities=*/true);
}
}  // namespace detail

/// out[b*Tq + i, h*hd : (h+1)*hd] = Σ_j softmax_j(cap(q_i · k_j / √hd)) v_j for all b, h.
/// q, k, v and out carry their own row strides (so q, k, v may be column blocks
/// of one fused projection). out must not alias q, k or v.
template <class S>
void attention(Context& ctx, HeadRows<S> q, HeadRows<S> k, HeadRows<S> v, S* out, Index out_stride,
               const AttentionShape& shape, const AttentionOptions& options) {
  if (!detail::attention_has_work(shape, options)) return;
  const AttentionPath path = attention_path(options.precision, shape.head_dim);
  if (path == AttentionPath::fp32)
    return detail::attention_tiles<S, S>(
        ctx, detail::head_blocks(q, shape.q_len, shape.head_dim), detail::head_blocks(k, shape.kv_len, shape.head_dim),
        detail::head_blocks(v, shape.kv_len, shape.head_dim), out, out_stride, shape, options, false);
  if constexpr (std::is_same_v<S, float>) {
    switch (path) {
      case AttentionPath::bf16_amx:
#if defined(LDLM_HAVE_AMX)
        return detail::attention_amx(ctx, q, k, v, out, out_stride, shape, options);
#endif
      case AttentionPath::bf16_native:
        return detail::attention_bf16<bf16>(ctx, q, k, v, out, out_stride, shape, options);
      case AttentionPath::bf16_rounded:
      case AttentionPath::fp32:
        return detail::attention_bf16<float>(ctx, q, k, v, out, out_stride, shape, options);
    }
  } else {
    throw InvalidArgument("attention: bf16 precision needs float tensors, these are double");
  }
}

/// attention() in bf16 precision with its output rounded to bf16, for a bf16 product
/// that reads it: the values attention() writes, each rounded once. The AMX kernel
/// rounds each block's rows as it copies them out of its L1 scratch, so float rows
/// never reach memory; other paths write float rows to the arena, then round them.
/// out must not alias q, k or v.
inline void attention(Context& ctx, HeadRows<float> q, HeadRows<float> k, HeadRows<float> v, bf16* out,
                      Index out_stride, const AttentionShape& shape, const AttentionOptions& options) {
  if (options.precision != Precision::bf16)
    throw InvalidArgument("attention: a bf16 output needs bf16 precision; these options ask for " +
                          std::string(precision_name(options.precision)));
  if (!detail::attention_has_work(shape, options)) return;
#if defined(LDLM_HAVE_AMX)
  if (attention_path(options.precision, shape.head_dim) == AttentionPath::bf16_amx)
    return detail::attention_amx(ctx, q, k, v, out, out_stride, shape, options);
#endif
  Arena::Scope scope(ctx.arena());
  const Index rows = shape.batch * shape.q_len, width = shape.heads * shape.head_dim;
  float* const result = ctx.arena().allocate<float>(static_cast<std::size_t>(rows * width));
  attention<float>(ctx, q, k, v, result, width, shape, options);
  for_each_row(ctx, rows, [&](Index r) { to_bf16(result + r * width, width, out + r * out_stride); });
}

}  // namespace ldlm
