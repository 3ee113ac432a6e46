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

/// What an attention module needs to know beyond its weights.
struct AttentionSettings {
  Index d_model = 768;
  Index heads = 12;
  Index head_dim = 64;
  double softcap = 0.0;  // 0 disables
  bool rotary = false;
  bool rotary_interleaved = false;
  double rope_base = 10000.0;
  bool qk_norm = false;
  double rms_eps = 1e-5;
  bool causal = false;
};

namespace detail {
/// Rotary (when on) and attention over a [rows, 3d] buffer holding q | k | v;
/// writes the merged heads to a [rows, d].
template <class S>
void attend_qkv(Context& ctx, const AttentionSettings& s, Precision precision, MatrixMap<S> qkv, Index B, Index T,
                const RotaryTable<S>* rotary, MatrixMap<S> a) {
  const Index d = s.d_model;
  if (s.rotary) {
    RotaryTable<S> local;
    if (!rotary) rotary = &(local = make_rotary_table<S>(ctx.arena(), T, s.head_dim, s.rope_base));
    // q and k are adjacent: 2H heads starting at column 0.
    apply_rotary_inplace<S>(ctx, qkv, 0, 2 * s.heads, s.head_dim, T, *rotary, s.rotary_interleaved);
  }
  const Index stride = 3 * d;
  attention<S>(ctx, {qkv.data(), stride}, {qkv.data() + d, stride}, {qkv.data() + 2 * d, stride}, a.data(), d,
               {B, T, T, s.heads, s.head_dim}, {s.softcap, s.causal, precision});
}
}  // namespace detail

/// The denoiser's self-attention: fused bias-free `attn_qkv` [3d, d] and `attn_out`
/// [d, d], rotary and softcap. Names sit directly under the block prefix.
template <class S = float>
struct FusedSelfAttention {
  AttentionSettings settings;
  Linear<S> attn_qkv, attn_out;

  FusedSelfAttention() = default;
  explicit FusedSelfAttention(const AttentionSettings& s)
      : settings(s), attn_qkv(s.d_model, 3 * s.d_model, false), attn_out(s.d_model, s.d_model, false) {}

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    attn_qkv.visit(prefix + "attn_qkv.", f);
    attn_out.visit(prefix + "attn_out.", f);
  }

  /// x, y: [B*T, d]; y must not alias x. `rotary` may be null (built on the fly).
  void forward(Context& ctx, ConstMatRef<S> x, Index B, Index T, const RotaryTable<S>* rotary, MatRef<S> y) const {
    Arena::Scope scope(ctx.arena());
    const Index rows = B * T, d = settings.d_model;
    MatrixMap<S> qkv(ctx.arena().allocate<S>(rows * 3 * d), rows, 3 * d);  // [B*T, 3d]
    MatrixMap<S> a(ctx.arena().allocate<S>(rows * d), rows, d);             // [B*T, d]
    attn_qkv.forward(ctx, x, qkv);
    detail::attend_qkv<S>(ctx, settings, attn_qkv.precision(), qkv, B, T, rotary, a);
    attn_out.forward(ctx, a, y);
  }
};

/// The token decoder's self-attention: separate bias-free q/k/v/o projections.
template <class S = float>
struct SelfAttention {
  AttentionSettings settings;
  Linear<S> q_proj, k_proj, v_proj, o_proj;

  SelfAttention() = default;
  explicit SelfAttention(const AttentionSettings& s)
      : settings(s),
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

  void forward(Context& ctx, ConstMatRef<S> x, Index B, Index T, const RotaryTable<S>* rotary, MatRef<S> y) const {
    Arena::Scope scope(ctx.arena());
    const Index rows = B * T, d = settings.d_model;
    MatrixMap<S> qkv(ctx.arena().allocate<S>(rows * 3 * d), rows, 3 * d);  // [B*T, 3d] = q | k | v
    MatrixMap<S> a(ctx.arena().allocate<S>(rows * d), rows, d);             // [B*T, d]
    q_proj.forward(ctx, x, qkv.middleCols(0, d));
    k_proj.forward(ctx, x, qkv.middleCols(d, d));
    v_proj.forward(ctx, x, qkv.middleCols(2 * d, d));
    detail::attend_qkv<S>(ctx, settings, q_proj.precision(), qkv, B, T, rotary, a);
    o_proj.forward(ctx, a, y);
  }
};

/// GPT-2's causal attention: Conv1D `c_attn` [d, 3d] with bias, `c_proj` [d, d].
template <class S = float>
struct GPT2Attention {
  AttentionSettings settings;
  Conv1D<S> c_attn, c_proj;

  GPT2Attention() = default;
  GPT2Attention(const AttentionSettings& s, Role role)
      : settings(s), c_attn(s.d_model, 3 * s.d_model, role), c_proj(s.d_model, s.d_model, role) {
    settings.causal = true;
    settings.rotary = false;
    settings.softcap = 0.0;
  }

  template <class F>
  void visit(const std::string& prefix, F&& f) {
    c_attn.visit(prefix + "c_attn.", f);
    c_proj.visit(prefix + "c_proj.", f);
  }

  void forward(Context& ctx, ConstMatRef<S> x, Index B, Index T, MatRef<S> y) const {
    Arena::Scope scope(ctx.arena());
    const Index rows = B * T, d = settings.d_model;
    MatrixMap<S> qkv(ctx.arena().allocate<S>(rows * 3 * d), rows, 3 * d);  // [B*T, 3d]
    MatrixMap<S> a(ctx.arena().allocate<S>(rows * d), rows, d);             // [B*T, d]
    c_attn.forward(ctx, x, qkv);
    detail::attend_qkv<S>(ctx, settings, c_attn.precision(), qkv, B, T, nullptr, a);
    c_proj.forward(ctx, a, y);
  }
};

/// Perceiver latent attention: queries from one stream (x), keys and values from
/// both streams (x then the context c) along the sequence axis, per-head q/k
/// RMSNorm, no rotary.
template <class S = float>
struct LatentAttention {
  AttentionSettings settings;
  RMSNorm<S> norm_embeddings, norm_latents;
  Linear<S> latents_to_Q, latents_to_KV, embeddings_to_KV, projector_latents;
  RMSNorm<S> query_norm, key_norm;

  LatentAttention() = default;
  explicit LatentAttention(const AttentionSettings& s)
      : settings(s),
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
    if (settings.qk_norm) {
      query_norm.visit(prefix + "query_norm.", f);
      key_norm.visit(prefix + "key_norm.", f);
    }
    projector_latents.visit(prefix + "projector_latents.", f);
  }

  /// context c: [B*Tc, d]; queries x: [B*Tq, d]; y: [B*Tq, d], must not alias x or c.
  void forward(Context& ctx, ConstMatRef<S> c, Index Tc, ConstMatRef<S> x, Index B, Index Tq, MatRef<S> y) const {
    Arena::Scope scope(ctx.arena());
    Arena& arena = ctx.arena();
    const Index d = settings.d_model, hd = settings.head_dim, L = Tq + Tc;
    MatrixMap<S> cn(arena.allocate<S>(B * Tc * d), B * Tc, d);  // [B*Tc, d]
    MatrixMap<S> xn(arena.allocate<S>(B * Tq * d), B * Tq, d);  // [B*Tq, d]
    MatrixMap<S> q(arena.allocate<S>(B * Tq * d), B * Tq, d);   // [B*Tq, d]
    MatrixMap<S> kv(arena.allocate<S>(B * L * 2 * d), B * L, 2 * d);  // [B, Tq+Tc, 2d] = k | v
    MatrixMap<S> a(arena.allocate<S>(B * Tq * d), B * Tq, d);   // [B*Tq, d]
    norm_embeddings.forward(ctx, c, cn);
    norm_latents.forward(ctx, x, xn);
    latents_to_Q.forward(ctx, xn, q);
    for (Index b = 0; b < B; ++b) {
      latents_to_KV.forward(ctx, xn.middleRows(b * Tq, Tq), kv.middleRows(b * L, Tq));
      embeddings_to_KV.forward(ctx, cn.middleRows(b * Tc, Tc), kv.middleRows(b * L + Tq, Tc));
    }
    if (settings.qk_norm) {
      rms_norm_heads_inplace<S>(ctx, q, 0, settings.heads, query_norm.gamma.data(), hd, query_norm.eps);
      rms_norm_heads_inplace<S>(ctx, kv, 0, settings.heads, key_norm.gamma.data(), hd, key_norm.eps);
    }
    attention<S>(ctx, {q.data(), d}, {kv.data(), 2 * d}, {kv.data() + d, 2 * d}, a.data(), d,
                 {B, Tq, L, settings.heads, hd}, {settings.softcap, false, latents_to_Q.precision()});
    projector_latents.forward(ctx, a, y);
  }
};

}  // namespace ldlm::nn
