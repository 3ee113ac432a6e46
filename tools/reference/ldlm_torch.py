"""LDLM (Latent Diffusion Language Model) reference in PyTorch.

Written from docs/model.md alone.  State-dict names are exactly those of its module
sections.  Every reconstruction (docs/model.md §Documented facts and reconstructions)
that changes what the model computes is a Config switch.

Public API (`from reference import ldlm_torch`, with tools/ on the path; used by
reference.generate, the converter, the benchmarks and the research scripts):
  Config, Config.from_dict / from_json / to_dict / to_json, LDLM_BASE
  layer_norm_gain, rms_norm, timestep_embedding, rotary_cos_sin, apply_rotary,
  apply_softcap, attention, modulate, positions
  RMSNorm, GainLayerNorm, PerceiverFFN, ScaleMask, PositionalEmbedding,
  LatentAttention, GPT2Features, LatentEncoder, LatentDecoder, TokenDecoder,
  Denoiser, LDLM
  LDLM.forward_module(name, **inputs) -> dict of outputs (docs/model.md §Module inputs and outputs names)
  count_parameters(cfg) -> dict (analytic), module_counts(model) -> dict (actual)
  state_dict_shapes(cfg) -> {name: shape} of LDLM(cfg), built on the meta device
  SAMPLING_DEFAULTS: the sampling keys of ldlm's configuration, which shape no tensor
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


# --------------------------------------------------------------------------- config
@dataclass
class Config:
    d_model: int = 768
    n_heads: int = 12
    head_dim: int = 64
    mlp_mult: int = 4
    max_positions: int = 1024
    vocab_size: int = 50259
    softcap: float = 50.0
    layer_norm_eps: float = 1e-5
    rms_norm_eps: float = 1e-5
    rope_base: float = 10000.0
    encoder_layers: int = 6
    latent_decoder_layers: int = 6
    token_decoder_layers: int = 3
    token_decoder_mlp_hidden: int = 3072
    denoiser_blocks: int = 12
    time_max_period: float = 10.0
    gpt2_layers: int = 12
    gpt2_feature_layers: int = 10
    # reconstruction switches
    rotary_interleaved: bool = False  # True = the WRONG interleaved pairing (bug detection)
    latent_attention_softcap: bool = True
    latent_attention_qk_norm: bool = True
    token_decoder_rotary: bool = True
    token_decoder_softcap: bool = True
    time_embedding_flip: bool = False  # False: [cos, sin]; True: [sin, cos]

    def __post_init__(self):
        if self.n_heads * self.head_dim != self.d_model:
            raise ValueError("n_heads * head_dim must equal d_model")
        if not (0 < self.gpt2_feature_layers <= self.gpt2_layers):
            raise ValueError("gpt2_feature_layers must be in 1..gpt2_layers")

    @property
    def mlp_hidden(self) -> int:
        return self.mlp_mult * self.d_model

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kw = {}
        for k, v in d.items():
            if k not in fields:
                raise ValueError(f"unknown config key: {k}")
            t = fields[k].type
            t = {"int": int, "float": float, "bool": bool}.get(t, t)
            if t is bool:
                ok = isinstance(v, bool)
            elif t is int:
                ok = isinstance(v, int) and not isinstance(v, bool)
            else:
                ok = isinstance(v, (int, float)) and not isinstance(v, bool)
                v = float(v)
            if not ok:
                raise TypeError(f"config key {k}: wrong type {type(v).__name__}")
            kw[k] = v
        return cls(**kw)

    @classmethod
    def from_json(cls, text: str) -> "Config":
        return cls.from_dict(json.loads(text))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"


LDLM_BASE = Config()

# ldlm's configuration also holds the sampling schedule (docs/model.md). It shapes no
# tensor and this reference does not sample, so Config leaves it out; tools that write
# ldlm configurations (tools/convert.py) carry these keys along.
SAMPLING_DEFAULTS = {"schedule_d": 3.0, "t_min": 0.05, "beta_t_clip": 0.95}


# ------------------------------------------------------------------ bf16 operands
# ldlm's bf16 mode (docs/model.md §Precision): every matrix product takes operands
# rounded to bf16 and sums in fp32; everything else stays fp32. Inside
# `with bf16_operands():` this reference computes exactly that, so C++ can be held to
# it tightly. (torch.autocast is the other bf16 reference: it also rounds the products'
# outputs and runs some element-wise ops in bf16.)
_BF16_OPERANDS = False


@contextlib.contextmanager
def bf16_operands():
    global _BF16_OPERANDS
    previous, _BF16_OPERANDS = _BF16_OPERANDS, True
    try:
        yield
    finally:
        _BF16_OPERANDS = previous


def _operand(x):
    return x.to(torch.bfloat16).to(torch.float32) if _BF16_OPERANDS else x


def linear(x, weight, bias=None):
    return F.linear(_operand(x), _operand(weight), bias)


def matmul(a, b):
    return _operand(a) @ _operand(b)


class Linear(nn.Linear):
    """nn.Linear (same state-dict names) whose product follows bf16_operands()."""

    def forward(self, x):
        return linear(x, self.weight, self.bias)


# ------------------------------------------------------------------- functional ops
def layer_norm_gain(x, weight, eps=1e-5):
    """Gain-only LayerNorm, computed in float32 with autocast off, whatever the input type."""
    with torch.autocast("cpu", enabled=False):
        return F.layer_norm(x.float(), [x.shape[-1]], eps=eps) * weight


def rms_norm(x, gamma, eps=1e-5):
    """x / max(||x|| n^-0.5, eps) * gamma (clamp of the RMS, lineage)."""
    n = x.shape[-1]
    rms = torch.clamp(torch.linalg.vector_norm(x, dim=-1, keepdim=True) * n ** -0.5, min=eps)
    return x / rms * gamma


def apply_softcap(s, c):
    if c == 0:
        return s
    return c * torch.tanh(s / c)


def modulate(x, shift, scale):
    return x * (1 + scale) + shift


def positions(table_weight, T, d):
    """pos[p] = E[p] * d^-0.5, p < T."""
    return table_weight[:T] * d ** -0.5


def timestep_embedding(t, n, max_period, flip=False):
    """[cos(t f_j), sin(t f_j)], f_j = exp(-ln(P) j / (n/2)), j < n/2.
    Frequencies and angles in float64, rounded to float32 at the end."""
    half = n // 2
    j = torch.arange(half, dtype=torch.float64)
    f = torch.exp(-math.log(max_period) * j / half)
    a = t.to(torch.float64)[:, None] * f[None]
    parts = [torch.sin(a), torch.cos(a)] if flip else [torch.cos(a), torch.sin(a)]
    emb = torch.cat(parts, dim=-1)
    if n % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb.to(torch.float32)


def rotary_cos_sin(T, hd, base):
    """(cos, sin) [T, hd/2] of angle p * base^(-2j/hd); computed in float64, stored f32."""
    j = torch.arange(hd // 2, dtype=torch.float64)
    inv_freq = base ** (-2.0 * j / hd)
    a = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None]
    return torch.cos(a).to(torch.float32), torch.sin(a).to(torch.float32)


def apply_rotary(x, base, interleaved=False):
    """x [..., T, hd]. Half-split (rotate_half) pairing i <-> i + hd/2; the interleaved
    form pairs 2j <-> 2j+1 with the same inv_freq_j (the wrong pairing for LDLM)."""
    T, hd = x.shape[-2], x.shape[-1]
    cos, sin = rotary_cos_sin(T, hd, base)
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        y1 = x1 * cos - x2 * sin
        y2 = x2 * cos + x1 * sin
        return torch.stack([y1, y2], dim=-1).flatten(-2)
    cos = torch.cat([cos, cos], dim=-1)
    sin = torch.cat([sin, sin], dim=-1)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    rot = torch.cat([-x2, x1], dim=-1)
    return x * cos + rot * sin


def split_heads(x, H):
    B, T, D = x.shape
    return x.view(B, T, H, D // H).transpose(1, 2)  # [B,H,T,hd]


def merge_heads(x):
    B, H, T, hd = x.shape
    return x.transpose(1, 2).reshape(B, T, H * hd)


def attention(q, k, v, softcap=0.0, causal=False, cap_before_scale=False):
    """q [B,H,Tq,hd], k/v [B,H,Tk,hd] -> [B,H,Tq,hd]. Logits q k^T / sqrt(hd), then
    softcap (skipped when 0), softmax over keys. cap_before_scale: the wrong order."""
    hd = q.shape[-1]
    s = matmul(q, k.transpose(-1, -2))
    if cap_before_scale:
        s = apply_softcap(s, softcap) / math.sqrt(hd)
    else:
        s = apply_softcap(s / math.sqrt(hd), softcap)
    if causal:
        Tq, Tk = s.shape[-2], s.shape[-1]
        m = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq)
        s = s.masked_fill(~m, float("-inf"))
    return matmul(torch.softmax(s, dim=-1), v)


# ------------------------------------------------------------------ small modules
class RMSNorm(nn.Module):
    def __init__(self, n, eps=1e-5):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.gamma, self.eps)


class GainLayerNorm(nn.Module):
    def __init__(self, n, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return layer_norm_gain(x, self.weight, self.eps)


class PerceiverFFN(nn.Module):
    """LayerNorm(bias) -> Linear -> GELU(erf) -> Dropout -> Linear (ffd.0 .. ffd.4)."""

    def __init__(self, d, hidden, eps=1e-5):
        super().__init__()
        self.ffd = nn.Sequential(
            nn.LayerNorm(d, eps=eps), Linear(d, hidden), nn.GELU(), nn.Dropout(0.0), Linear(hidden, d))

    def forward(self, x):
        return self.ffd(x)


class ScaleMask(nn.Module):
    """x * (1 + w m + b), a Linear(1,1) applied to the mask indicator m (1 everywhere)."""

    def __init__(self):
        super().__init__()
        self.scale_mlp = nn.Linear(1, 1)

    def forward(self, x, m=None):
        if m is None:
            m = torch.ones(*x.shape[:-1], 1, dtype=x.dtype)
        return x * (1 + self.scale_mlp(m))


class PositionalEmbedding(nn.Module):
    def __init__(self, n, d):
        super().__init__()
        self.emb = nn.Embedding(n, d)
        self.d = d

    def forward(self, T):
        return positions(self.emb.weight, T, self.d)


class Conv1D(nn.Module):
    """Hugging Face GPT-2 Conv1D: weight [in, out], y = x @ W + b."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out).normal_(std=0.02))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.addmm(self.bias, _operand(x.reshape(-1, x.shape[-1])), _operand(self.weight)).view(*x.shape[:-1], -1)


# -------------------------------------------------------------------------- GPT-2
class GPT2Attention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.c_attn = Conv1D(cfg.d_model, 3 * cfg.d_model)
        self.c_proj = Conv1D(cfg.d_model, cfg.d_model)
        self.H = cfg.n_heads

    def forward(self, x):
        q, k, v = self.c_attn(x).split(x.shape[-1], dim=-1)
        a = attention(split_heads(q, self.H), split_heads(k, self.H), split_heads(v, self.H), causal=True)
        return self.c_proj(merge_heads(a))


class GPT2MLP(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.c_fc = Conv1D(cfg.d_model, cfg.mlp_hidden)
        self.c_proj = Conv1D(cfg.mlp_hidden, cfg.d_model)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class GPT2Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.attn = GPT2Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.mlp = GPT2MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Features(nn.Module):
    """Frozen GPT-2 small; returns the output of block gpt2_feature_layers-1 (no ln_f),
    i.e. hidden_states[-3] for 12 layers / 10 feature layers."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.max_positions, cfg.d_model)
        self.h = nn.ModuleList([GPT2Block(cfg) for _ in range(cfg.gpt2_layers)])
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)  # owned, never run

    def forward(self, tokens):
        T = tokens.shape[1]
        x = self.wte(tokens.long()) + self.wpe(torch.arange(T))[None]
        for blk in self.h[: self.cfg.gpt2_feature_layers]:
            x = blk(x)
        return x


# -------------------------------------------------------------- Perceiver pieces
class LatentAttention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        d, hd = cfg.d_model, cfg.head_dim
        self.cfg = cfg
        self.norm_embeddings = RMSNorm(d, cfg.rms_norm_eps)
        self.norm_latents = RMSNorm(d, cfg.rms_norm_eps)
        self.latents_to_Q = Linear(d, d, bias=False)
        self.latents_to_KV = Linear(d, 2 * d, bias=False)
        self.embeddings_to_KV = Linear(d, 2 * d, bias=False)
        self.query_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.key_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.projector_latents = Linear(d, d, bias=False)

    def forward(self, context, queries, qk_norm_full_width=False):
        cfg, d, H = self.cfg, self.cfg.d_model, self.cfg.n_heads
        c = self.norm_embeddings(context)
        x = self.norm_latents(queries)
        q = self.latents_to_Q(x)
        kv_lat = self.latents_to_KV(x)
        kv_emb = self.embeddings_to_KV(c)
        k = torch.cat([kv_lat[..., :d], kv_emb[..., :d]], dim=1)
        v = torch.cat([kv_lat[..., d:], kv_emb[..., d:]], dim=1)
        if cfg.latent_attention_qk_norm and qk_norm_full_width:  # the wrong width (tests only)
            q = rms_norm(q, self.query_norm.gamma.repeat(H), cfg.rms_norm_eps)
            k = rms_norm(k, self.key_norm.gamma.repeat(H), cfg.rms_norm_eps)
        q, k, v = split_heads(q, H), split_heads(k, H), split_heads(v, H)
        if cfg.latent_attention_qk_norm and not qk_norm_full_width:
            q, k = self.query_norm(q), self.key_norm(k)
        cap = cfg.softcap if cfg.latent_attention_softcap else 0.0
        return self.projector_latents(merge_heads(attention(q, k, v, softcap=cap)))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.latent_attn = LatentAttention(cfg)
        self.ffn_latent = PerceiverFFN(cfg.d_model, cfg.mlp_hidden, cfg.layer_norm_eps)

    def forward(self, context, z):
        z = z + self.latent_attn(context, z)
        return z + self.ffn_latent(z)


class LatentEncoder(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.latents = nn.Parameter(torch.randn(cfg.max_positions, cfg.d_model))
        self.positional_emb = PositionalEmbedding(cfg.max_positions, cfg.d_model)
        self.latent_norm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.output_norm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.latent_layers = nn.ModuleList([EncoderLayer(cfg) for _ in range(cfg.encoder_layers)])

    def forward(self, features):
        B, T, _ = features.shape
        e = features + self.positional_emb(T)[None]
        z = self.latent_norm(self.latents[:T])[None].expand(B, -1, -1)
        for layer in self.latent_layers:
            z = layer(e, z)
        return self.output_norm(z)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.latent_attn = LatentAttention(cfg)
        self.attn_scale = ScaleMask()
        self.ffn_latent = PerceiverFFN(cfg.d_model, cfg.mlp_hidden, cfg.layer_norm_eps)
        self.ffn_scale = ScaleMask()

    def forward(self, c, x):
        x = x + self.attn_scale(self.latent_attn(c, x))
        return x + self.ffn_scale(self.ffn_latent(x))


class LatentDecoder(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.mask_vector = nn.Parameter(torch.zeros(cfg.d_model), requires_grad=False)  # frozen
        self.positional_emb = PositionalEmbedding(cfg.max_positions, cfg.d_model)
        self.embedding_ffn = PerceiverFFN(cfg.d_model, cfg.mlp_hidden, cfg.layer_norm_eps)
        self.scale_embedding = ScaleMask()
        self.layers = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg.latent_decoder_layers)])

    def forward(self, latents):
        B, T, d = latents.shape
        pos = self.positional_emb(T)[None]
        q = self.scale_embedding(self.embedding_ffn(self.mask_vector))  # [d]
        x = q.expand(B, T, d) + pos
        c = latents + pos
        for layer in self.layers:
            x = layer(c, x)
        return x  # no output norm, no head


# ------------------------------------------------------------------ token decoder
class TokenDecoderAttention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        d = cfg.d_model
        self.cfg = cfg
        self.q_proj = Linear(d, d, bias=False)
        self.k_proj = Linear(d, d, bias=False)
        self.v_proj = Linear(d, d, bias=False)
        self.o_proj = Linear(d, d, bias=False)

    def forward(self, x):
        cfg, H = self.cfg, self.cfg.n_heads
        q, k, v = split_heads(self.q_proj(x), H), split_heads(self.k_proj(x), H), split_heads(self.v_proj(x), H)
        if cfg.token_decoder_rotary:
            q = apply_rotary(q, cfg.rope_base, cfg.rotary_interleaved)
            k = apply_rotary(k, cfg.rope_base, cfg.rotary_interleaved)
        cap = cfg.softcap if cfg.token_decoder_softcap else 0.0
        return self.o_proj(merge_heads(attention(q, k, v, softcap=cap)))


class SwiGLU(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.gate_proj = Linear(d, hidden, bias=False)
        self.up_proj = Linear(d, hidden, bias=False)
        self.down_proj = Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TokenDecoderBlock(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.norm1 = GainLayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.attn = TokenDecoderAttention(cfg)
        self.norm2 = GainLayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.token_decoder_mlp_hidden)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TokenDecoder(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.blocks = nn.ModuleList([TokenDecoderBlock(cfg) for _ in range(cfg.token_decoder_layers)])
        self.norm_final = GainLayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.lm_head = Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, hidden):
        x = hidden
        for blk in self.blocks:
            x = blk(x)
        return self.lm_head(self.norm_final(x))


# ------------------------------------------------------------------------ denoiser
def denoiser_self_attention(x, qkv_weight, out_weight, cfg: Config, cap_before_scale=False):
    """The denoiser block's attention on y (already modulated): rotary q,k, softcap."""
    H, d = cfg.n_heads, cfg.d_model
    q, k, v = linear(x, qkv_weight).split(d, dim=-1)
    q, k, v = split_heads(q, H), split_heads(k, H), split_heads(v, H)
    q = apply_rotary(q, cfg.rope_base, cfg.rotary_interleaved)
    k = apply_rotary(k, cfg.rope_base, cfg.rotary_interleaved)
    a = attention(q, k, v, softcap=cfg.softcap, cap_before_scale=cap_before_scale)
    return linear(merge_heads(a), out_weight)


class DenoiserBlock(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        d = cfg.d_model
        self.cfg = cfg
        self.norm1 = GainLayerNorm(d, cfg.layer_norm_eps)
        self.norm2 = GainLayerNorm(d, cfg.layer_norm_eps)
        self.attn_qkv = Linear(d, 3 * d, bias=False)
        self.attn_out = Linear(d, d, bias=False)
        self.mlp = nn.Sequential(Linear(d, cfg.mlp_hidden), nn.GELU(approximate="tanh"), Linear(cfg.mlp_hidden, d))
        self.adaLN_modulation = Linear(d, 6 * d)

    def forward(self, x, c):
        mod = self.adaLN_modulation(c)[:, None]  # [B,1,6d]
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = mod.chunk(6, dim=-1)
        y = modulate(self.norm1(x), shift_a, scale_a)
        x = x + gate_a * denoiser_self_attention(y, self.attn_qkv.weight, self.attn_out.weight, self.cfg)
        return x + gate_m * self.mlp(modulate(self.norm2(x), shift_m, scale_m))


class DenoiserOutputLayer(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        d = cfg.d_model
        self.norm_final = GainLayerNorm(d, cfg.layer_norm_eps)
        self.adaLN_modulation = Linear(d, 2 * d)
        self.linear = Linear(d, d)

    def forward(self, x, c):
        shift, scale = self.adaLN_modulation(c)[:, None].chunk(2, dim=-1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class Denoiser(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        d = cfg.d_model
        self.cfg = cfg
        self.input_proj = Linear(2 * d, d, bias=False)
        self.time_emb = nn.Sequential(Linear(d, 2 * d), nn.SiLU(), Linear(2 * d, d))
        self.blocks = nn.ModuleList([DenoiserBlock(cfg) for _ in range(cfg.denoiser_blocks)])
        self.output_layer = DenoiserOutputLayer(cfg)

    def forward(self, x_t, t, self_cond=None):
        cfg = self.cfg
        if self_cond is None:
            self_cond = torch.zeros_like(x_t)
        x = self.input_proj(torch.cat([x_t, self_cond], dim=-1))
        temb = timestep_embedding(t, cfg.d_model, cfg.time_max_period, cfg.time_embedding_flip)
        c = F.silu(self.time_emb(temb))
        for blk in self.blocks:
            x = blk(x, c)
        return self.output_layer(x, c)


# ---------------------------------------------------------------------- aggregate
MODULES = ("feature_model", "encoder", "latent_decoder", "token_decoder", "denoiser", "reconstruct")


class LDLM(nn.Module):
    def __init__(self, cfg: Config = LDLM_BASE):
        super().__init__()
        self.cfg = cfg
        self.feature_model = GPT2Features(cfg)
        self.encoder = LatentEncoder(cfg)
        self.latent_decoder = LatentDecoder(cfg)
        self.token_decoder = TokenDecoder(cfg)
        self.denoiser = Denoiser(cfg)
        for p in self.feature_model.parameters():
            p.requires_grad_(False)

    def reconstruct(self, tokens):
        features = self.feature_model(tokens)
        latents = self.encoder(features)
        hidden = self.latent_decoder(latents)
        logits = self.token_decoder(hidden)
        return {"features": features, "latents": latents, "hidden": hidden, "logits": logits}

    @torch.no_grad()
    def forward_module(self, name, **inp):
        """Run one module of docs/model.md §Module inputs and outputs on named inputs; returns named outputs."""
        if name == "feature_model":
            return {"features": self.feature_model(inp["tokens"])}
        if name == "encoder":
            return {"latents": self.encoder(inp["features"])}
        if name == "latent_decoder":
            return {"hidden": self.latent_decoder(inp["latents"])}
        if name == "token_decoder":
            return {"logits": self.token_decoder(inp["hidden"])}
        if name == "denoiser":
            return {"x0": self.denoiser(inp["x_t"], inp["t"], inp.get("self_cond"))}
        if name == "reconstruct":
            return self.reconstruct(inp["tokens"])
        raise ValueError(f"unknown module {name}")


# ----------------------------------------------------------------------- counting
def count_parameters(cfg: Config = LDLM_BASE) -> dict:
    """Analytic parameter counts (no allocation)."""
    d, V, P, F4 = cfg.d_model, cfg.vocab_size, cfg.max_positions, cfg.mlp_hidden
    hd, S = cfg.head_dim, cfg.token_decoder_mlp_hidden
    ffn = 2 * d + (F4 * d + F4) + (d * F4 + d)
    latent_attn = 2 * d + d * d + 2 * (2 * d * d) + 2 * hd + d * d
    enc_layer = latent_attn + ffn
    encoder = 2 * P * d + 2 * d + cfg.encoder_layers * enc_layer
    dec_block = enc_layer + 2 * 2
    latent_decoder = P * d + ffn + 2 + cfg.latent_decoder_layers * dec_block
    td_block = 2 * d + 4 * d * d + 3 * d * S
    token_decoder = cfg.token_decoder_layers * td_block + d + V * d
    dn_block = 2 * d + 3 * d * d + d * d + (F4 * d + F4) + (d * F4 + d) + (6 * d * d + 6 * d)
    final_ln = d
    output_layer = final_ln + (2 * d * d + 2 * d) + (d * d + d)
    denoiser = 2 * d * d + (2 * d * d + 2 * d) + (2 * d * d + d) + cfg.denoiser_blocks * dn_block + output_layer
    gpt2_block = 4 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * F4 + F4) + (F4 * d + d)
    gpt2 = V * d + P * d + cfg.gpt2_layers * gpt2_block + 2 * d
    trained = encoder + latent_decoder + token_decoder + denoiser
    return {
        "feature_model": gpt2,
        "encoder": encoder,
        "encoder_layer": enc_layer,
        "latent_decoder": latent_decoder,
        "latent_decoder_block": dec_block,
        "mask_vector": d,
        "token_decoder": token_decoder,
        "token_decoder_block": td_block,
        "denoiser": denoiser,
        "denoiser_block": dn_block,
        "denoiser_final_layer_norm": final_ln,
        "trained": trained,
        "frozen": gpt2 + d,
    }


def module_counts(model: LDLM) -> dict:
    """Actual counts of a constructed LDLM (any device, including meta)."""
    def n(m):
        return sum(p.numel() for p in m.parameters())
    ld_trained = sum(p.numel() for nm, p in model.latent_decoder.named_parameters() if nm != "mask_vector")
    out = {
        "feature_model": n(model.feature_model),
        "encoder": n(model.encoder),
        "latent_decoder": ld_trained,
        "mask_vector": model.latent_decoder.mask_vector.numel(),
        "token_decoder": n(model.token_decoder),
        "denoiser": n(model.denoiser),
        "denoiser_final_layer_norm": n(model.denoiser.output_layer.norm_final),
    }
    out["trained"] = out["encoder"] + out["latent_decoder"] + out["token_decoder"] + out["denoiser"]
    out["frozen"] = out["feature_model"] + out["mask_vector"]
    assert out["trained"] == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert out["frozen"] == sum(p.numel() for p in model.parameters() if not p.requires_grad)
    return out


EXPECTED_BASE = {
    "denoiser_final_layer_norm": 768,
    "encoder": 51_161_856,
    "latent_decoder": 55_097_882,
    "token_decoder": 66_915_840,
    "denoiser": 132_835_584,
    "trained": 306_011_162,
    "frozen": 124_442_112,
    "feature_model": 124_441_344,
    "encoder_layer": 8_264_576,
    "latent_decoder_block": 8_264_580,
    "token_decoder_block": 9_438_720,
    "denoiser_block": 10_626_816,
}


class _OnMetaDevice(torch.overrides.TorchFunctionMode):
    """While active, the tensor factories that module constructors call build on the
    meta device: shapes without storage, so ldlm-base costs no 1.7 GB."""
    FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.full, torch.randn, torch.rand, torch.arange, torch.tensor}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in self.FACTORIES:
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


def state_dict_shapes(cfg: Config = LDLM_BASE) -> dict:
    """{state-dict name: shape} of LDLM(cfg), without allocating any parameter."""
    with _OnMetaDevice():
        model = LDLM(cfg)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def check_base_counts(counts: dict) -> None:
    for k, v in EXPECTED_BASE.items():
        if k in counts:
            assert counts[k] == v, f"{k}: {counts[k]} != {v}"


if __name__ == "__main__":
    c = count_parameters(LDLM_BASE)
    check_base_counts(c)
    for k, v in c.items():
        print(f"{k:28s} {v:>14,}")
    print("ldlm-base parameter counts match docs/model.md")
