// The four attention modules of LDLM. Projections are GEMMs over all B*T rows;
// q, k and v stay column blocks of one projection buffer and the kernel reads
// each head in place, so nothing is split, transposed or copied per head.
#pragma once

#include <string>

#include "ldlm/nn/linear.hpp"
#include "ldlm/nn/norm.hpp"
#include "ldlm/ops/attention.hpp"
#include "ldlm/ops/rotary.hpp"

namespace ldlm::nn {

/// The configuration of one attention module: its widths, what the module does
/// around the kernel (rotary on q and k, per-head q/k RMSNorm), and `options`, the
/// kernel's own ops-level AttentionOptions. The kernel's AttentionShape comes from
/// the widths and each call's sequence lengths (`shape`).
struct AttentionModuleConfig {
  Index d_model = 768;
  Index heads = 12;
  Index head_dim = 64;
  bool rotary = false;
  bool rotary_interleaved = false;
  double rope_base = 10000.0;
  bool qk_norm = false;
  double rms_eps = 1e-5;
  /// softcap and causal. Its precision is not consulted: a module computes in the
  /// precision its projections were packed in (`kernel_options`).
  AttentionOptions options;

  AttentionShape shape(Index batch, Index q_len, Index kv_len) const { return {batch, q_len, kv_len, heads, head_dim}; }
  /// int8 projections come with bf16 attention: QKᵀ and P·V stay bf16 products.
  AttentionOptions kernel_options(Precision precision) const {
    AttentionOptions o = options;
    o.precision = precision == Precision::int8 ? Precision::bf16 : precision;
    return o;
  }
};

namespace detail {
/// Rotary (when on) and attention over a [rows, 3d] buffer holding q | k | v;
/// writes the merged heads to `a`, [rows, d] (row stride d): S, or bf16 rows for a
/// bf16 product in bf16 precision.
template <class S, class Out>
void attend_qkv(Context& ctx, const AttentionModuleConfig& config, Precision precision, MatrixMap<S> qkv, Index B,
                Index T, const RotaryTable<S>* rotary, Out* a) {
  const Index d = config.d_model;
  if (config.rotary) {
    RotaryTable<S> local;
    if (!rotary) rotary = &(local = make_rotary_table<S>(ctx.arena(), T, config.head_dim, config.rope_base));
    // q and k are adjacent: 2H heads starting at column 0.
    apply_rotary_inplace<S>(ctx, qkv, 0, 2 * config.heads, config.head_dim, T, *rotary, config.rotary_interleaved);
  }
  const Index stride = 3 * d;
  const HeadRows<S> q{qkv.data(), stride}, k{qkv.data() + d, stride}, v{qkv.data() + 2 * d, stride};
  // float or double rows: attention<S>; bf16 rows: the overload that rounds them.
  attention(ctx, q, k, v, a, d, config.shape(B, T, T), config.kernel_options(precision));
}
}  // namespace detail

/// The denoiser's self-attention: fused bias-free `attn_qkv` [3d, d] and `attn_out`
/// [d, d], rotary and softcap. Names sit directly under the block prefix.
template <class S = float>
struct FusedSelfAttention {
  AttentionModuleConfig config;
  Linear<S> attn_qkv, attn_out;

  FusedSelfAttention() = default;
  explicit FusedSelfAttention(const AttentionModuleConfig& s)
      : config(s), attn_qkv(s.d_model, 3 * s.d_model, false), attn_out(s.d_model, s.d_model, false) {}

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    attn_qkv.visit(prefix + "attn_qkv.", f);
    attn_out.visit(prefix + "attn_out.", f);
  }

  /// Marks its projections as ones Precision::int8 quantizes (docs/model.md §int8).
  void quantize_at_int8() {
    for (Linear<S>* map : {&attn_qkv, &attn_out}) map->weight.quantize_at_int8();
  }

  /// x, y: [B*T, d]; y must not alias x. `rotary` may be null (built on the fly).
  /// y is written, or a gated residual added to (attn_out's product adds to it
  /// itself on bf16 kernels). Attention writes attn_out's operand in the form
  /// attn_out reads it: bf16 rows for bf16 kernels, not float rows to round.
  void forward(Context& ctx, const OperandRows<S>& x, Index B, Index T, const RotaryTable<S>* rotary,
               const Destination<S>& y) const {
    Arena::Scope scope(ctx.arena());
    const Index rows = B * T, d = config.d_model;
    MatrixMap<S> qkv(ctx.arena().allocate<S>(rows * 3 * d), rows, 3 * d);  // [B*T, 3d]
    attn_qkv.forward(ctx, x, qkv);
    const auto a = OperandBuffer<S>::allocate(ctx.arena(), rows, d,
                                              common_form(attn_qkv.input_form(), attn_out.input_form()));  // [B*T, d]
    a.write([&](auto out) {
      detail::attend_qkv<S>(ctx, config, attn_qkv.precision(), qkv, B, T, rotary, dense_data(out));
    });
    attn_out.forward(ctx, a, y);
  }
  RowForm input_form() const { return attn_qkv.input_form(); }
};

/// The token decoder's self-attention: separate bias-free q/k/v/o projections.
template <class S = float>
struct SelfAttention {
  AttentionModuleConfig config;
  Linear<S> q_proj, k_proj, v_proj, o_proj;

  SelfAttention() = default;
  explicit SelfAttention(const AttentionModuleConfig& s)
      : config(s),
        q_proj(s.d_model, s.d_model, false),
        k_proj(s.d_model, s.d_model, false),
        v_proj(s.d_model, s.d_model, false),
        o_proj(s.d_model, s.d_model, false) {}

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    q_proj.visit(prefix + "q_proj.", f);
    k_proj.visit(prefix + "k_proj.", f);
    v_proj.visit(prefix + "v_proj.", f);
    o_proj.visit(prefix + "o_proj.", f);
  }

  /// Marks its projections as ones Precision::int8 quantizes (docs/model.md §int8).
  void quantize_at_int8() {
    for (Linear<S>* map : {&q_proj, &k_proj, &v_proj, &o_proj}) map->weight.quantize_at_int8();
  }

  void forward(Context& ctx, ConstMatRef<S> x, Index B, Index T, const RotaryTable<S>* rotary, MatRef<S> y) const {
    Arena::Scope scope(ctx.arena());
    const Index rows = B * T, d = config.d_model;
    MatrixMap<S> qkv(ctx.arena().allocate<S>(rows * 3 * d), rows, 3 * d);  // [B*T, 3d] = q | k | v
    MatrixMap<S> a(ctx.arena().allocate<S>(rows * d), rows, d);            // [B*T, d]
    q_proj.forward(ctx, x, qkv.middleCols(0, d));
    k_proj.forward(ctx, x, qkv.middleCols(d, d));
    v_proj.forward(ctx, x, qkv.middleCols(2 * d, d));
    detail::attend_qkv<S>(ctx, config, q_proj.precision(), qkv, B, T, rotary, a.data());
    o_proj.forward(ctx, a, y);
  }
};

/// GPT-2's causal attention: Conv1D `c_attn` [d, 3d] with bias, `c_proj` [d, d].
template <class S = float>
struct GPT2Attention {
  AttentionModuleConfig config;
  Conv1D<S> c_attn, c_proj;

  GPT2Attention() = default;
  GPT2Attention(const AttentionModuleConfig& s, Role role)
      : config(s), c_attn(s.d_model, 3 * s.d_model, role), c_proj(s.d_model, s.d_model, role) {
    config.options.causal = true;
    config.rotary = false;
    config.options.softcap = 0.0;
  }

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    c_attn.visit(prefix + "c_attn.", f);
    c_proj.visit(prefix + "c_proj.", f);
  }

  void forward(Context& ctx, ConstMatRef<S> x, Index B, Index T, MatRef<S> y) const {
    Arena::Scope scope(ctx.arena());
    const Index rows = B * T, d = config.d_model;
    MatrixMap<S> qkv(ctx.arena().allocate<S>(rows * 3 * d), rows, 3 * d);  // [B*T, 3d]
    MatrixMap<S> a(ctx.arena().allocate<S>(rows * d), rows, d);            // [B*T, d]
    c_attn.forward(ctx, x, qkv);
    detail::attend_qkv<S>(ctx, config, c_attn.precision(), qkv, B, T, nullptr, a.data());
    c_proj.forward(ctx, a, y);
  }
};

/// Perceiver latent attention: queries from one stream (x), keys and values from
/// both streams (x then the context c) along the sequence axis, per-head q/k
/// RMSNorm, no rotary.
template <class S = float>
struct LatentAttention {
  AttentionModuleConfig config;
  RMSNorm<S> norm_embeddings, norm_latents;
  Linear<S> latents_to_Q, latents_to_KV, embeddings_to_KV, projector_latents;
  RMSNorm<S> query_norm, key_norm;

  LatentAttention() = default;
  explicit LatentAttention(const AttentionModuleConfig& s)
      : config(s),
        norm_embeddings(s.d_model, s.rms_eps),
        norm_latents(s.d_model, s.rms_eps),
        latents_to_Q(s.d_model, s.d_model, false),
        latents_to_KV(s.d_model, 2 * s.d_model, false),
        embeddings_to_KV(s.d_model, 2 * s.d_model, false),
        projector_latents(s.d_model, s.d_model, false),
        query_norm(s.head_dim, s.rms_eps),
        key_norm(s.head_dim, s.rms_eps) {}

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    norm_embeddings.visit(prefix + "norm_embeddings.", f);
    norm_latents.visit(prefix + "norm_latents.", f);
    latents_to_Q.visit(prefix + "latents_to_Q.", f);
    latents_to_KV.visit(prefix + "latents_to_KV.", f);
    embeddings_to_KV.visit(prefix + "embeddings_to_KV.", f);
    if (config.qk_norm) {
      query_norm.visit(prefix + "query_norm.", f);
      key_norm.visit(prefix + "key_norm.", f);
    }
    projector_latents.visit(prefix + "projector_latents.", f);
  }

  /// Marks its projections as ones Precision::int8 quantizes (docs/model.md §int8).
  void quantize_at_int8() {
    for (Linear<S>* map : {&latents_to_Q, &latents_to_KV, &embeddings_to_KV, &projector_latents})
      map->weight.quantize_at_int8();
  }

  /// context c: [B*Tc, d]; queries x: [B*Tq, d]; y: [B*Tq, d], must not alias x or c.
  void forward(Context& ctx, ConstMatRef<S> c, Index Tc, ConstMatRef<S> x, Index B, Index Tq, MatRef<S> y) const {
    Arena::Scope scope(ctx.arena());
    Arena& arena = ctx.arena();
    const Index d = config.d_model, hd = config.head_dim, L = Tq + Tc;
    MatrixMap<S> q(arena.allocate<S>(B * Tq * d), B * Tq, d);         // [B*Tq, d]
    MatrixMap<S> kv(arena.allocate<S>(B * L * 2 * d), B * L, 2 * d);  // [B, Tq+Tc, 2d] = k | v
    MatrixMap<S> a(arena.allocate<S>(B * Tq * d), B * Tq, d);         // [B*Tq, d]
    {
      // The normed rows are given back before the attention's own operands: 6.3 MB of
      // the latent decoder's peak at T 1024.
      Arena::Scope norms_scope(arena);
      MatrixMap<S> cn(arena.allocate<S>(B * Tc * d), B * Tc, d);  // [B*Tc, d]
      MatrixMap<S> xn(arena.allocate<S>(B * Tq * d), B * Tq, d);  // [B*Tq, d]
      norm_embeddings.forward(ctx, c, cn);
      norm_latents.forward(ctx, x, xn);
      latents_to_Q.forward(ctx, xn, q);
      for (Index b = 0; b < B; ++b) {
        latents_to_KV.forward(ctx, xn.middleRows(b * Tq, Tq), kv.middleRows(b * L, Tq));
        embeddings_to_KV.forward(ctx, cn.middleRows(b * Tc, Tc), kv.middleRows(b * L + Tq, Tc));
      }
    }
    if (config.qk_norm) {
      rms_norm_heads_inplace<S>(ctx, q, 0, config.heads, query_norm.gamma.data(), hd, query_norm.eps);
      rms_norm_heads_inplace<S>(ctx, kv, 0, config.heads, key_norm.gamma.data(), hd, key_norm.eps);
    }
    attention<S>(ctx, {q.data(), d}, {kv.data(), 2 * d}, {kv.data() + d, 2 * d}, a.data(), d, config.shape(B, Tq, L),
                 config.kernel_options(latents_to_Q.precision()));
    projector_latents.forward(ctx, a, y);
  }
};

}  // namespace ldlm::nn
