"""Shared pieces of the demo-model training: configuration, model construction,
the tangent schedule, the token stream, safetensors I/O (F32 and BF16) and the tokenizer.

The modules themselves are imported from tools/reference/ldlm_torch.py, never copied:
the trained model is ldlm's architecture with ldlm's state-dict names.
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
# Default places of the corpus (prepare_data.py) and of a training run (train.py): under
# build/, which git ignores, so nothing generated lands in the tracked tree.
DATA_DIR = os.path.join(REPO, "build", "train-data")
RUN_DIR = os.path.join(REPO, "build", "train-run")
from reference import ldlm_init, safetensors_io  # noqa: E402  (tools/ on PYTHONPATH)
from reference import ldlm_torch as L  # noqa: E402

PAD_ID, MASK_ID = 50257, 50258

# The demo configuration (docs/model.md explains every key). d = 128 keeps the
# [V, d] token head at 12.9 MB in bf16, leaving room for the rest under ~25 MB.
DEMO_CONFIG = dict(
    d_model=128, n_heads=4, head_dim=32, mlp_mult=4, max_positions=128, vocab_size=50259,
    encoder_layers=3, latent_decoder_layers=3, token_decoder_layers=2, token_decoder_mlp_hidden=512,
    denoiser_blocks=8, gpt2_layers=4, gpt2_feature_layers=2)

# Sampling keys of the C++ Config (ldlm-base values) that the Python Config does not
# carry. The denoiser is trained for this schedule, so the file states them.
SAMPLING_KEYS = dict(schedule_d=3.0, t_min=0.05, beta_t_clip=0.95)
FEATURE_MODEL_SEED = 14  # generator seed of the frozen feature model (ldlm_init / ldlm::init_parameters)

TRAINED_MODULES = ("encoder", "latent_decoder", "token_decoder", "denoiser")
SOURCES = ("fortunes", "bible", "python_doc", "wordnet")  # corpus sources, in prepare_data.py's order


def set_threads(n: int) -> None:
    """torch's intra-op threads and, when torch uses OpenBLAS (Debian's build does),
    OpenBLAS's own pool, which torch.set_num_threads does not reach."""
    torch.set_num_threads(n)
    try:
        ctypes.CDLL("libopenblas.so.0").openblas_set_num_threads(n)
    except (OSError, AttributeError):
        pass


# --------------------------------------------------------------------------- config
def demo_config() -> L.Config:
    return L.Config(**DEMO_CONFIG)


def cpp_config_keys() -> list[str]:
    """Every key of the C++ ldlm::Config, read from include/ldlm/model/config.hpp."""
    with open(os.path.join(REPO, "include", "ldlm", "model", "config.hpp"), encoding="utf-8") as f:
        text = f.read()
    body = text[text.index("static void visit_fields"):]
    body = body[:body.index("\n  }\n")]
    return re.findall(r'f\("([a-z0-9_]+)", c\.', body)


def config_json(cfg: L.Config) -> str:
    """The file's `ldlm.config`: Config.to_json's keys plus the sampling keys; exactly
    the keys of the C++ Config, checked against config.hpp."""
    d = dict(cfg.to_dict())
    d.update(SAMPLING_KEYS)
    want = cpp_config_keys()
    if sorted(d) != sorted(want):
        raise RuntimeError(f"config keys differ from include/ldlm/model/config.hpp: "
                           f"extra {sorted(set(d) - set(want))}, missing {sorted(set(want) - set(d))}")
    return json.dumps(d, indent=2, sort_keys=True)


def config_from_json(text: str) -> L.Config:
    d = json.loads(text)
    for k, v in SAMPLING_KEYS.items():
        if d.pop(k, v) != v:
            raise ValueError(f"config key {k}: this pipeline samples with {v}")
    return L.Config.from_dict(d)


# ---------------------------------------------------------------------------- model
def regenerate_frozen(model: L.LDLM, feature_seed: int) -> None:
    """The feature model from the deterministic generator (never stored) and the
    latent decoder's frozen mask_vector = the generator's wte row of the mask id."""
    ldlm_init.init_module(model.feature_model, "feature_model.", feature_seed)
    with torch.no_grad():
        model.latent_decoder.mask_vector.copy_(model.feature_model.wte.weight[MASK_ID])


POSITION_STD = 1 / 3  # initial std of d^-0.5 E[p]: about the RMS of the frozen features


def build_model(cfg: L.Config, init_seed: int, feature_seed: int = FEATURE_MODEL_SEED) -> L.LDLM:
    """A fresh model: PyTorch default initialisation from `init_seed`, plus
    - the frozen feature model and mask_vector from the generator;
    - a copy-friendly start of both Perceivers. Latent p must read position p, and
      with random weights every latent attends uniformly and the loss sits at the
      unigram level for hundreds of steps. So the position tables start at the
      scale of the features, the encoder's latents start as its position rows, the
      key half of embeddings_to_KV starts equal to latents_to_Q (a query and the key
      of its own position then agree) and the per-head q/k RMSNorm gains start at 2
      (sharp attention): the encoder begins with near-diagonal attention;
    - ScaleMask weights and biases at 0 (every scale starts at 1);
    - token head rows = the frozen GPT-2 token table (as GPT-2 ties them), so ids
      rarely or never seen in training start from a row that matches their features;
    - DiT-style zero init of the denoiser's adaLN modulations and output linear
      (every block starts as the identity; the first x̂0 is 0, the data mean);
    - encoder.output_norm.gamma frozen at 1: every latent has RMS 1, the scale of the
      diffusion's unit Gaussian noise."""
    torch.manual_seed(init_seed)
    model = L.LDLM(cfg)
    regenerate_frozen(model, feature_seed)
    d = cfg.d_model
    with torch.no_grad():
        enc, ld = model.encoder, model.latent_decoder
        for table in (enc.positional_emb.emb.weight, ld.positional_emb.emb.weight):
            table.mul_(POSITION_STD * math.sqrt(d))
        enc.latents.copy_(enc.positional_emb.emb.weight)
        for layer in list(enc.latent_layers) + list(ld.layers):
            la = layer.latent_attn
            la.embeddings_to_KV.weight[:d].copy_(la.latents_to_Q.weight)
            la.query_norm.gamma.fill_(2.0)
            la.key_norm.gamma.fill_(2.0)
        for sm in [ld.scale_embedding] + [s for layer in ld.layers for s in (layer.attn_scale, layer.ffn_scale)]:
            sm.scale_mlp.weight.zero_()
            sm.scale_mlp.bias.zero_()
        model.token_decoder.lm_head.weight.copy_(model.feature_model.wte.weight * math.sqrt(3.0))
        dn = model.denoiser
        for blk in dn.blocks:
            blk.adaLN_modulation.weight.zero_()
            blk.adaLN_modulation.bias.zero_()
        for lin in (dn.output_layer.adaLN_modulation, dn.output_layer.linear):
            lin.weight.zero_()
            lin.bias.zero_()
    model.encoder.output_norm.gamma.requires_grad_(False)
    return model


def trained_state(model: L.LDLM) -> dict:
    """Every tensor of the trained modules under its full state-dict name."""
    return {k: v for k, v in model.state_dict().items() if k.split(".", 1)[0] in TRAINED_MODULES}


def token_decoder_hidden(td: L.TokenDecoder, hidden: torch.Tensor) -> torch.Tensor:
    """The token decoder up to lm_head's input: norm_final(blocks(hidden))."""
    x = hidden
    for blk in td.blocks:
        x = blk(x)
    return td.norm_final(x)


# ------------------------------------------------------------------------- schedule
def alpha_sigma(t: torch.Tensor, D: float = SAMPLING_KEYS["schedule_d"]):
    """Tangent schedule α(t) = (1 + D² tan²(πt/2))^-1/2, σ = sqrt(1 − α²), in float64."""
    dt = D * torch.tan(math.pi * t.double() / 2).abs()
    alpha = 1.0 / torch.sqrt(1.0 + dt * dt)
    sigma = dt / torch.sqrt(1.0 + dt * dt)
    return alpha, sigma


def beta(t: float, D: float = SAMPLING_KEYS["schedule_d"], clip: float = SAMPLING_KEYS["beta_t_clip"]) -> float:
    tan = math.tan(math.pi * min(t, clip) / 2)
    return math.pi * D * D * tan * (1 + tan * tan) / (1 + D * D * tan * tan)


@torch.no_grad()
def sample_latents(denoiser, B: int, T: int, steps: int, generator: torch.Generator, sde: bool = True,
                   t_min: float = SAMPLING_KEYS["t_min"]) -> torch.Tensor:
    """ldlm's sampler (include/ldlm/sampling/sampler.hpp) in PyTorch: N Euler steps
    from t = 1 to t_min, self-conditioning on the previous x̂0, the result is the last
    deterministic mean. Same algorithm; the noise comes from torch, not ldlm's generator."""
    d = denoiser.cfg.d_model
    times = [1.0 - (1.0 - t_min) * i / steps for i in range(steps + 1)]
    times[-1] = t_min
    x = torch.randn(B, T, d, generator=generator, dtype=torch.float64)
    self_cond = torch.zeros(B, T, d)
    for i in range(steps):
        t, t_next = times[i], times[i + 1]
        x0 = denoiser(x.float(), torch.full((B,), t, dtype=torch.float32), self_cond).double()
        a, s = alpha_sigma(torch.tensor(t))
        b, dt = beta(t), t_next - t
        score = -((x - a * x0) / s) / s
        x = x + (-0.5 * b * x - (b if sde else 0.5 * b) * score) * dt
        if sde and i + 1 < steps:
            x = x + math.sqrt(b) * math.sqrt(-dt) * torch.randn(x.shape, generator=generator, dtype=torch.float64)
        self_cond = x0.float()
    return x.float()


# ---------------------------------------------------------------------------- data
class TokenStream:
    """One split of prepare_data.py's output: the token stream and document starts."""

    def __init__(self, data_dir: str, split: str):
        def load(suffix, dtype):
            path = os.path.join(data_dir, f"{split}.{suffix}")
            if not os.path.exists(path):
                sys.exit(f"{path} is missing: run research/train/prepare_data.py --out {data_dir} first")
            return np.fromfile(path, dtype=dtype)

        self.tokens = torch.from_numpy(load("tokens.u16", np.uint16).astype(np.int64))
        self.doc_starts = torch.from_numpy(load("docs.u32", np.uint32).astype(np.int64))
        self.doc_source = torch.from_numpy(load("source.u8", np.uint8).astype(np.int64))

    def windows(self, B: int, T: int, g: torch.Generator, p_doc_start: float = 0.5) -> torch.Tensor:
        """[B, T] windows: half start at a document start, half at any token."""
        n = self.tokens.numel()
        starts = torch.randint(0, n - T, (B,), generator=g)
        docs = self.doc_starts[torch.randint(0, self.doc_starts.numel(), (B,), generator=g)].clamp(max=n - T)
        use_doc = torch.rand(B, generator=g) < p_doc_start
        starts = torch.where(use_doc, docs, starts)
        return self.tokens[starts[:, None] + torch.arange(T)[None]]


# ---------------------------------------------------------------------- safetensors
def write_safetensors(path: str, tensors: dict, metadata: dict, dtype: str = "BF16", keep_f32=()) -> None:
    """Float tensors as BF16 (round to nearest even) or F32, the names in keep_f32
    always F32, written by the reference's safetensors writer."""
    if dtype not in ("BF16", "F32"):
        raise ValueError(f"write_safetensors: dtype must be BF16 or F32, got {dtype}")

    def stored(name, t):
        t = t.detach().float().contiguous()
        return t.to(torch.bfloat16) if dtype == "BF16" and name not in keep_f32 else t

    safetensors_io.write_safetensors(path, {name: stored(name, t) for name, t in tensors.items()}, metadata)


def read_safetensors(path: str):
    """(tensors as float32, metadata) of a BF16/F32 file; malformed files are refused
    by the reference's reader (SafetensorsError, a ValueError)."""
    tensors, meta = safetensors_io.read_safetensors(path)
    for name, t in tensors.items():
        if t.dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"{path}: tensor {name} has dtype {t.dtype}, expected BF16 or F32")
    return {name: t.float() for name, t in tensors.items()}, meta


def load_model_file(path: str) -> tuple[L.LDLM, dict]:
    """The reference LDLM with the file's trained modules and the regenerated feature model."""
    tensors, meta = read_safetensors(path)
    for key in ("ldlm.config", "ldlm.feature_model_init_seed"):
        if key not in meta:
            raise ValueError(f"{path}: __metadata__ has no '{key}' (found keys: {sorted(meta)}); "
                             f"expected a file written by research/train/export.py")
    cfg = config_from_json(meta["ldlm.config"])
    model = L.LDLM(cfg)
    regenerate_frozen(model, int(meta["ldlm.feature_model_init_seed"]))
    want = trained_state(model)
    if set(tensors) != set(want):
        raise ValueError(f"{path}: tensor names differ from the trained modules: "
                         f"extra {sorted(set(tensors) - set(want))[:5]}, missing {sorted(set(want) - set(tensors))[:5]}")
    mask_row = model.latent_decoder.mask_vector.clone()
    model.load_state_dict(tensors, strict=False)
    if not torch.equal(model.latent_decoder.mask_vector, mask_row):
        raise ValueError(f"{path}: latent_decoder.mask_vector is not the generator's wte row {MASK_ID}")
    model.eval()
    return model, meta


# ------------------------------------------------------------------------ tokenizer
def _tiktoken(mode: str, values: list) -> list:
    script = os.path.join(HERE, "tiktoken_gpt2.mjs")
    if not os.path.isdir(os.path.join(HERE, "node_modules", "tiktoken")):
        sys.exit(f"tiktoken is not installed: run `npm ci` in {HERE}")
    payload = "".join(json.dumps(v) + "\n" for v in values).encode("utf-8")
    out = subprocess.run(["node", script, mode], input=payload, capture_output=True, check=True, cwd=HERE).stdout
    return [json.loads(line) for line in out.decode("utf-8").splitlines()]


def encode(texts: list[str]) -> list[list[int]]:
    return _tiktoken("encode", texts)


def decode(ids: list[list[int]]) -> list[str]:
    return _tiktoken("decode", [[int(i) for i in x] for x in ids])
