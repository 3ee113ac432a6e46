#!/usr/bin/python3
"""Write every reference dump of tests/data (see tests/data/README.md).

    PYTHONPATH=tools /usr/bin/python3 -m reference.generate [--out tests/data] [--only CASE]

CASE is a case name (e.g. `rotary`, `latent_attention`, `dpmpp-2m_karras`), a group
(`primitives`, `attention`, `sampling`), or a model directory (`model_small`, `model_base`).
Deterministic: fixed seeds, one thread, sorted tensor names, no timestamps.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import ldlm_init, sampling
from . import ldlm_torch as L
from .safetensors_io import write_safetensors

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

# ------------------------------------------------------------------------ helpers
def case_seed(name: str) -> int:
    return ldlm_init.fnv1a64(name) & 0x7FFFFFFF


def gen(name):
    return torch.Generator().manual_seed(case_seed(name))


def randn(g, *shape):
    return torch.randn(*shape, generator=g, dtype=torch.float32)


def param(name, shape, seed=1):
    """Parameters of single-file cases: full_name = the tensor's name in the file."""
    return torch.from_numpy(ldlm_init.init_tensor(name, shape, seed))


def dump(out_dir, group, case, inputs, params, outputs, config):
    tensors = {}
    tensors.update({f"input.{k}": v for k, v in inputs.items()})
    tensors.update({f"param.{k}": v for k, v in params.items()})
    tensors.update({f"output.{k}": v for k, v in outputs.items()})
    for k, v in tensors.items():
        assert v.dtype in (torch.float32, torch.int64), (case, k, v.dtype)
        assert torch.isfinite(v.float()).all(), (case, k)
    meta = {"case": case, "config": json.dumps(config, sort_keys=True)}
    write_safetensors(os.path.join(out_dir, group, case + ".safetensors"), tensors, meta)


def module_params(module, prefix="param."):
    """init_module with the file names, then return {name-without-prefix: tensor}."""
    ldlm_init.init_module(module, prefix, 1)
    return {k: v.detach().clone() for k, v in module.named_parameters()}


# -------------------------------------------------------------------- primitives
EPS = 1e-5
PRIMS = {}


def prim(fn):
    PRIMS[fn.__name__[2:]] = fn
    return fn


@prim
def p_layer_norm_gain(name):
    g = gen(name)
    x = randn(g, 2, 7, 768) * 3 + 0.5
    w = param("param.weight", (768,))
    return {"x": x}, {"weight": w}, {"y": L.layer_norm_gain(x, w, EPS)}, {"eps": EPS}


@prim
def p_layer_norm_bias(name):
    g = gen(name)
    x = randn(g, 2, 7, 48)
    ln = nn.LayerNorm(48, eps=EPS)
    p = module_params(ln)
    return {"x": x}, p, {"y": ln(x)}, {"eps": EPS}


@prim
def p_rms_norm(name):
    g = gen(name)
    x = randn(g, 2, 7, 48)
    x[1, 3, :] *= 1e-7
    m = L.RMSNorm(48, EPS)
    p = module_params(m)
    y = m(x)
    rms = torch.linalg.vector_norm(x[1, 3]) * 48 ** -0.5
    assert rms < EPS  # the clamp is active on that row
    return {"x": x}, p, {"y": y}, {"eps": EPS}


@prim
def p_linear(name):
    g = gen(name)
    x = randn(g, 2, 7, 24)
    w, b = param("param.weight", (40, 24)), param("param.bias", (40,))
    return {"x": x}, {"weight": w, "bias": b}, {"y": F.linear(x, w, b), "y_nobias": F.linear(x, w)}, {}


@prim
def p_activations(name):
    x = torch.linspace(-8, 8, 1001, dtype=torch.float32)
    return {"x": x}, {}, {"gelu_erf": F.gelu(x), "gelu_tanh": F.gelu(x, approximate="tanh"), "silu": F.silu(x)}, {}


@prim
def p_swiglu(name):
    g = gen(name)
    x = randn(g, 2, 7, 32)
    m = L.SwiGLU(32, 48)
    p = module_params(m)
    return {"x": x}, p, {"y": m(x)}, {"d": 32, "hidden": 48}


@prim
def p_perceiver_ffn(name):
    g = gen(name)
    x = randn(g, 2, 7, 32)
    m = L.PerceiverFFN(32, 128, EPS)
    p = module_params(m)
    return {"x": x}, p, {"y": m(x)}, {"d": 32, "hidden": 128, "eps": EPS}


@prim
def p_modulate(name):
    g = gen(name)
    x, res = randn(g, 2, 7, 16), randn(g, 2, 7, 16)
    shift, scale, gate = randn(g, 2, 16), randn(g, 2, 16), randn(g, 2, 16)
    out = {"modulated": L.modulate(x, shift[:, None], scale[:, None]), "gated": res + gate[:, None] * x}
    return {"x": x, "residual": res, "shift": shift, "scale": scale, "gate": gate}, {}, out, {}


@prim
def p_scale_mask(name):
    g = gen(name)
    x = randn(g, 2, 7, 16)
    m = L.ScaleMask()
    p = module_params(m)
    return {"x": x}, p, {"y": m(x)}, {"mask": 1}


@prim
def p_positions(name):
    m = L.PositionalEmbedding(32, 16)
    p = module_params(m)
    return {}, p, {"pos": m(7)}, {"d": 16, "T": 7}


@prim
def p_timestep_embedding(name):
    t = torch.tensor([0, 0.05, 0.3, 0.5, 0.97, 1.0], dtype=torch.float32)
    out = {"emb": L.timestep_embedding(t, 768, 10.0), "emb_flip": L.timestep_embedding(t, 768, 10.0, flip=True)}
    return {"t": t}, {}, out, {"n": 768, "max_period": 10.0}


@prim
def p_rotary(name):
    g = gen(name)
    x = randn(g, 2, 3, 7, 16)
    out = {"y": L.apply_rotary(x, 10000.0), "y_interleaved": L.apply_rotary(x, 10000.0, interleaved=True)}
    return {"x": x}, {}, out, {"rope_base": 10000.0, "head_dim": 16}


# --------------------------------------------------------------------- attention
ATT_CFG = dict(d_model=64, n_heads=4, head_dim=16, softcap=5.0, rope_base=10000.0, rms_norm_eps=EPS)
ATTS = {}


def att(fn):
    ATTS[fn.__name__[2:]] = fn
    return fn


def att_cfg(**kw):
    d = dict(ATT_CFG)
    d.update(kw)
    return L.Config(**d)


def att_meta(extra=None):
    m = {"d_model": 64, "n_heads": 4, "head_dim": 16, "softcap": 5.0, "rope_base": 10000.0, "eps": EPS}
    m.update(extra or {})
    return m


@att
def a_denoiser_self_attention(name):
    g = gen(name)
    x = randn(g, 2, 37, 64) * 3
    wqkv, wo = param("param.attn_qkv.weight", (192, 64)), param("param.attn_out.weight", (64, 64))
    cfg = att_cfg()
    out = {
        "y": L.denoiser_self_attention(x, wqkv, wo, cfg),
        "y_interleaved": L.denoiser_self_attention(x, wqkv, wo, att_cfg(rotary_interleaved=True)),
        "y_cap_before_scale": L.denoiser_self_attention(x, wqkv, wo, cfg, cap_before_scale=True),
    }
    return {"x": x}, {"attn_qkv.weight": wqkv, "attn_out.weight": wo}, out, att_meta({"rotary": "half_split"})


@att
def a_token_decoder_self_attention(name):
    g = gen(name)
    x = randn(g, 2, 37, 64) * 3
    m = L.TokenDecoderAttention(att_cfg())
    p = module_params(m)
    out = {"y": m(x)}
    for key, kw in [("y_interleaved", dict(rotary_interleaved=True)), ("y_no_rotary", dict(token_decoder_rotary=False)),
                    ("y_no_softcap", dict(token_decoder_softcap=False))]:
        m.cfg = att_cfg(**kw)
        out[key] = m(x)
    return {"x": x}, p, out, att_meta({"rotary": "half_split"})


def _latent_attention(name, Tq):
    g = gen(name)
    context, queries = randn(g, 2, 37, 64) * 3, randn(g, 2, Tq, 64) * 3
    m = L.LatentAttention(att_cfg())
    p = module_params(m)
    out = {"y": m(context, queries), "y_qknorm_full_width": m(context, queries, qk_norm_full_width=True)}
    for key, kw in [("y_no_softcap", dict(latent_attention_softcap=False)),
                    ("y_no_qk_norm", dict(latent_attention_qk_norm=False))]:
        m.cfg = att_cfg(**kw)
        out[key] = m(context, queries)
    return {"context": context, "queries": queries}, p, out, att_meta({"rotary": "none"})


@att
def a_latent_attention(name):
    return _latent_attention(name, 37)


@att
def a_latent_attention_tq(name):
    return _latent_attention(name, 20)


@att
def a_gpt2_attention(name):
    g = gen(name)
    x = randn(g, 2, 37, 64) * 3
    m = L.GPT2Attention(att_cfg())
    p = module_params(m)
    return {"x": x}, p, {"y": m(x)}, att_meta({"softcap": 0.0, "rotary": "none", "causal": True})


# ------------------------------------------------------------------------ models
SMALL = dict(d_model=64, n_heads=4, head_dim=16, max_positions=48, vocab_size=101, encoder_layers=2,
             latent_decoder_layers=2, token_decoder_layers=2, token_decoder_mlp_hidden=96, denoiser_blocks=2,
             gpt2_layers=3, gpt2_feature_layers=2)


def model_inputs(cfg: L.Config, mdir: str, B: int, T: int):
    d, V = cfg.d_model, cfg.vocab_size

    def g(mod):
        return gen(f"{mdir}/{mod}")

    ins = {}
    ins["feature_model"] = {"tokens": torch.randint(0, V, (B, T), generator=g("feature_model"), dtype=torch.int64)}
    ins["encoder"] = {"features": randn(g("encoder"), B, T, d)}
    ins["latent_decoder"] = {"latents": randn(g("latent_decoder"), B, T, d)}
    ins["token_decoder"] = {"hidden": randn(g("token_decoder"), B, T, d)}
    gd = g("denoiser")
    ins["denoiser"] = {"x_t": randn(gd, B, T, d), "t": torch.tensor([0.3, 0.85], dtype=torch.float32)[:B],
                       "self_cond": randn(gd, B, T, d)}
    ins["reconstruct"] = {"tokens": torch.randint(0, V, (B, T), generator=g("reconstruct"), dtype=torch.int64)}
    return ins


def write_model(out_dir, mdir, cfg: L.Config, seed: int, B: int, T: int, write_weights: bool, write_blocks=False):
    path = os.path.join(out_dir, mdir)
    os.makedirs(path, exist_ok=True)
    model = L.LDLM(cfg)
    ldlm_init.init_module(model, "", seed)
    model.eval()
    counts = L.module_counts(model)
    ana = L.count_parameters(cfg)
    for k, v in counts.items():
        assert ana[k] == v, (mdir, k, ana[k], v)
    sd = model.state_dict()
    assert set(sd) == {n for n, _ in model.named_parameters()}, "state dict must hold parameters only"
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write(cfg.to_json())
    if write_weights:
        write_safetensors(os.path.join(path, "weights.safetensors"), {k: v for k, v in sd.items()},
                          {"init_seed": str(seed), "config": json.dumps(cfg.to_dict(), sort_keys=True)})
    ins = model_inputs(cfg, mdir, B, T)
    for mod in L.MODULES:
        outs = model.forward_module(mod, **ins[mod])
        for k, v in outs.items():
            assert v.dtype == torch.float32 and torch.isfinite(v).all(), (mdir, mod, k)
        meta = {"case": f"{mdir}/{mod}", "module": mod, "init_seed": str(seed),
                "config": json.dumps(cfg.to_dict(), sort_keys=True)}
        write_safetensors(os.path.join(path, f"{mod}.inputs.safetensors"), ins[mod], meta)
        write_safetensors(os.path.join(path, f"{mod}.outputs.safetensors"), outs, meta)
        write_bf16_outputs(path, mod, model, ins[mod], outs, meta)
        if write_blocks and mod in BLOCK_STREAMS:
            write_block_outputs(path, mod, model, ins[mod], meta)
    # the chain must agree with the per-module forwards
    r = model.forward_module("reconstruct", **ins["reconstruct"])
    with torch.no_grad():
        assert torch.equal(model.encoder(r["features"]), r["latents"])
    return counts


def write_bf16_outputs(path, mod, model, inputs, fp32_outs, meta):
    """The two bf16 references of a module (docs/model.md §Precision):
    - `<mod>.outputs.bf16.safetensors`: ldlm's bf16 mode exactly (operands of every
      matrix product rounded to bf16, fp32 everywhere else), for tight parity;
    - `<mod>.outputs.autocast_bf16.safetensors`: torch.autocast('cpu', bfloat16), the
      way the model ran. Its metadata records autocast's own error against fp32 per
      output (`autocast_error.<name>` = max |autocast - fp32| / max |fp32|), the bar
      that ldlm's bf16 error must not exceed."""
    with L.bf16_operands():
        exact = model.forward_module(mod, **inputs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = {k: v.float() for k, v in model.forward_module(mod, **inputs).items()}
    ameta = dict(meta)
    for k, v in autocast.items():
        assert torch.isfinite(v).all() and torch.isfinite(exact[k]).all(), (path, mod, k)
        ref = fp32_outs[k]
        ameta[f"autocast_error.{k}"] = repr(float((v - ref).abs().max() / ref.abs().max()))
    write_safetensors(os.path.join(path, f"{mod}.outputs.bf16.safetensors"), exact, meta)
    write_safetensors(os.path.join(path, f"{mod}.outputs.autocast_bf16.safetensors"), autocast, ameta)


# (stream, names of the first block's inputs, the head whose input is dumped)
BLOCK_STREAMS = {
    "feature_model": ("h", ("input",), None),
    "encoder": ("latent_layers", ("context", "input"), None),
    "latent_decoder": ("layers", ("context", "input"), None),
    "token_decoder": ("blocks", ("input",), "lm_head"),
    "denoiser": ("blocks", ("input", "condition"), "output_layer.linear"),
}


def block_outputs(model, mod, inputs):
    """llm.c-style intermediate values of one module, captured by forward hooks on the
    reference itself: the first block's inputs, each block's output (`h.0`, ...) and
    the head's input (`lm_head.input`). Returns them in the order they are computed."""
    stream, first_inputs, head = BLOCK_STREAMS[mod]
    module, seen = getattr(model, mod), {}
    blocks = getattr(module, stream)

    def keep(name, t):
        assert name not in seen and t.dtype == torch.float32 and torch.isfinite(t).all(), (mod, name)
        seen[name] = t.detach().clone()

    def keep_first_inputs(_, args):  # returns None: a pre-hook's result would replace the inputs
        for name, a in zip(first_inputs, args):
            keep(name, a)

    hooks = [blocks[0].register_forward_pre_hook(keep_first_inputs)]
    for i, block in enumerate(blocks):
        hooks.append(block.register_forward_hook(lambda _, __, y, name=f"{stream}.{i}": keep(name, y)))
    if head:
        hooks.append(module.get_submodule(head).register_forward_pre_hook(lambda _, args: keep(f"{head}.input", args[0])))
    try:
        model.forward_module(mod, **inputs)
    finally:
        for h in hooks:
            h.remove()
    return seen


def write_block_outputs(path, mod, model, inputs, meta):
    """`<mod>.blocks.safetensors` (fp32) and `<mod>.blocks.bf16.safetensors` (ldlm's bf16
    mode, as `.outputs.bf16`); `__metadata__.order` lists the names in computed order."""
    for suffix, mode in (("", contextlib.nullcontext), (".bf16", L.bf16_operands)):
        with mode():
            values = block_outputs(model, mod, inputs)
        bmeta = dict(meta, order=json.dumps(list(values)))
        write_safetensors(os.path.join(path, f"{mod}.blocks{suffix}.safetensors"), values, bmeta)


# -------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "..", "tests", "data"))
    ap.add_argument("--only", default=None)
    a = ap.parse_args()
    only = a.only

    def want(group, case):
        return only is None or only in (group, case)

    with torch.no_grad():
        for case, fn in PRIMS.items():
            if want("primitives", case):
                i, p, o, c = fn(case)
                dump(a.out, "primitives", case, i, p, o, c)
        for case, fn in ATTS.items():
            if want("attention", case):
                i, p, o, c = fn(case)
                dump(a.out, "attention", case, i, p, o, c)
        if want("model_small", "model_small"):
            write_model(a.out, "model_small", L.Config(**SMALL), 1, 2, 37, True, write_blocks=True)
        # After model_small: the sampler runs its committed denoiser weights.
        sampling.write_dumps(a.out, lambda case: want("sampling", case))
        base_counts = L.count_parameters(L.LDLM_BASE)
        L.check_base_counts(base_counts)
        if want("model_base", "model_base"):
            base_counts = write_model(a.out, "model_base", L.LDLM_BASE, 7, 2, 5, False)
            L.check_base_counts(base_counts)  # counted on the real constructed ldlm-base
        print("ldlm-base parameter counts OK:", json.dumps({k: base_counts[k] for k in L.EXPECTED_BASE if k in base_counts}))


if __name__ == "__main__":
    main()
