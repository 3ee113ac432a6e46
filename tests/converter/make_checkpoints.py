#!/usr/bin/python3
"""Writes the PyTorch checkpoints the converter tests convert (into a build directory;
none is committed). Every one holds model_small's weights, which the reference
generator makes with seed 1 (tests/data/README.md), in a layout real training code
writes:

    make_checkpoints.py OUT_DIR            write every checkpoint below into a fresh OUT_DIR
    make_checkpoints.py check-bf16 B F     B is F (both convert.py outputs) rounded to BF16

  bare.pt                  torch.save(model.state_dict())
  lightning.ckpt           PyTorch Lightning: 'model.' prefix, GPT-2's attention buffers,
                           optimizer and scheduler state, counters, hyper-parameters
  compiled.pt              {'model': DDP + torch.compile state dict ('module._orig_mod.'),
                           'optimizer': ..., 'step': ...}
  buffers.pt               bare, plus GPT-2's attention buffers of every block
  ema.pt                   {'ema': state dict, 'step': ...}, found only with --key ema
  unknown_class.pt         Lightning-like, with hyper-parameters of a class of this module
  evil.pt, evil_float.pt   a state dict plus an object whose unpickling runs a shell
                           command creating OUT_DIR/PWNED (evil_float.pt also holds a float)
  misfit.pt                bare with 2 missing, 1 unexpected, 2 mis-shaped, 1 integer tensor
  weights_with_buffers.safetensors
                           model_small's weights plus the buffers and no ldlm.config:
                           not converted, for the ldlm commands themselves
  generated_feature_model.safetensors
                           model_small's weights without feature_model.*, whose values
                           are the generator's with seed 1 (ldlm.feature_model_init_seed)
"""
from __future__ import annotations

import collections
import json
import os
import shutil
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
from reference import ldlm_init  # with tools/ on PYTHONPATH, as CTest runs it
from reference import ldlm_torch as L
from reference.safetensors_io import read_safetensors, write_safetensors

CONFIG = os.path.join(REPO, "tests", "data", "model_small", "config.json")


class Evil:
    """Unpickling this runs a shell command that creates `marker`."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class UnknownHParams:
    """Stands for any class a training script pickles (Lightning's AttributeDict, ...)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def small_model() -> L.LDLM:
    with open(CONFIG) as f:
        cfg = L.Config.from_json(f.read())
    model = L.LDLM(cfg)
    ldlm_init.init_module(model, "", 1)
    return model


def gpt2_buffers(cfg: L.Config, prefix: str) -> dict:
    """What Hugging Face's GPT-2 registers per block: a causal mask and a fill value."""
    P = cfg.max_positions
    causal = torch.tril(torch.ones(P, P, dtype=torch.bool)).view(1, 1, P, P)
    out = {}
    for i in range(cfg.gpt2_layers):
        out[f"{prefix}h.{i}.attn.bias"] = causal
        out[f"{prefix}h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    return out


def optimizer_state(model: L.LDLM) -> dict:
    """AdamW after one step on copies of the trained parameters (the model is untouched)."""
    params = [p.detach().clone().requires_grad_() for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.99))
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    opt.step()
    return opt.state_dict()


def prefixed(sd: dict, prefix: str) -> collections.OrderedDict:
    return collections.OrderedDict((prefix + k, v) for k, v in sd.items())


def lightning(model: L.LDLM, hparams) -> dict:
    sd = prefixed(model.state_dict(), "model.")
    sd.update(gpt2_buffers(model.cfg, "model.feature_model."))
    return {"epoch": 3, "global_step": 1200, "pytorch-lightning_version": "1.9.5", "state_dict": sd,
            "loops": {"fit_loop": {"epoch_progress": {"current": {"completed": 3}}}}, "callbacks": {},
            "optimizer_states": [optimizer_state(model)],
            "lr_schedulers": [{"last_epoch": 1200, "_step_count": 1201, "base_lrs": [1e-4], "verbose": False}],
            "hparams_name": "kwargs", "hyper_parameters": hparams}


MARKER = ".ldlm_converter_tests"  # an OUT_DIR with it is ours to wipe


def fresh_directory(out: str) -> None:
    """Empties OUT_DIR, so no file of an earlier run (a converted output the tests
    compare) can stand in for one this run failed to write."""
    if os.path.isdir(out) and os.listdir(out):
        if not os.path.exists(os.path.join(out, MARKER)):
            sys.exit(f"make_checkpoints: {out} is not empty and was not written by this script; not wiping it")
        shutil.rmtree(out)
    os.makedirs(out, exist_ok=True)
    open(os.path.join(out, MARKER), "w").close()


def write_all(out: str) -> None:
    fresh_directory(out)
    model = small_model()
    sd = model.state_dict()
    cfg = model.cfg
    save = lambda obj, name: torch.save(obj, os.path.join(out, name))  # noqa: E731

    save(sd, "bare.pt")
    save(lightning(model, {"lr": 1e-4, "betas": (0.9, 0.99), "config": cfg.to_dict()}), "lightning.ckpt")
    save({"model": prefixed(sd, "module._orig_mod."), "optimizer": optimizer_state(model), "step": 1200,
          "scaler": None}, "compiled.pt")
    save({**sd, **gpt2_buffers(cfg, "feature_model.")}, "buffers.pt")
    save({"ema": sd, "step": 1200, "decay": 0.999}, "ema.pt")
    from make_checkpoints import UnknownHParams as Importable  # pickled as make_checkpoints.UnknownHParams
    save(lightning(model, Importable(lr=1e-4)), "unknown_class.pt")

    # Payloads that must never run: one beside a float (torch 1.13's weights-only
    # unpickler stops at the float, so the fallback meets the payload), one without.
    marker = os.path.join(out, "PWNED")
    save({"state_dict": sd, "lr": 1e-4, "hook": Evil(marker)}, "evil_float.pt")
    save({"state_dict": sd, "hook": Evil(marker)}, "evil.pt")

    misfit = dict(sd)
    del misfit["encoder.latents"], misfit["token_decoder.lm_head.weight"]
    misfit["denoiser.extra_proj.weight"] = torch.zeros(3, 3)
    misfit["denoiser.input_proj.weight"] = misfit["denoiser.input_proj.weight"].t().contiguous()
    misfit["feature_model.wpe.weight"] = torch.zeros(cfg.max_positions + 1, cfg.d_model)
    misfit["latent_decoder.mask_vector"] = torch.zeros(cfg.d_model, dtype=torch.int64)
    save(misfit, "misfit.pt")

    weights, _ = read_safetensors(os.path.join(REPO, "tests", "data", "model_small", "weights.safetensors"))
    weights.update(gpt2_buffers(cfg, "feature_model."))
    weights.update({"h.0.attn.bias": gpt2_buffers(cfg, "")["h.0.attn.bias"]})  # bare GPT-2 name
    write_safetensors(os.path.join(out, "weights_with_buffers.safetensors"), weights)
    trained = {k: v for k, v in weights.items() if not k.startswith("feature_model.") and not k.startswith("h.")}
    write_safetensors(os.path.join(out, "generated_feature_model.safetensors"), trained,
                      {"ldlm.feature_model_init_seed": "1"})

    with open(os.path.join(out, "mismatch.json"), "w") as f:  # model_small at twice the width
        json.dump({**cfg.to_dict(), "d_model": 128, "n_heads": 8, "softcap": 30.0}, f)
    with open(os.path.join(out, "garbage.pt"), "wb") as f:
        f.write(bytes(range(256)) * 4)
    with open(os.path.join(REPO, "tests", "data", "model_small", "weights.safetensors"), "rb") as f:
        data = f.read()
    with open(os.path.join(out, "truncated.safetensors"), "wb") as f:
        f.write(data[: len(data) // 2])
    print(f"make_checkpoints: wrote the converter test inputs to {out}")


def check_bf16(bf16_path: str, f32_path: str) -> int:
    b, bmeta = read_safetensors(bf16_path)
    f, fmeta = read_safetensors(f32_path)
    problems = []
    if bmeta != fmeta:
        problems.append("the metadata differ")
    if set(b) != set(f):
        problems.append("the tensor names differ")
    for name in sorted(set(b) & set(f)):
        if b[name].dtype != torch.bfloat16:
            problems.append(f"{name} is {b[name].dtype}")
        elif not torch.equal(b[name], f[name].to(torch.bfloat16)):
            problems.append(f"{name} is not the F32 tensor rounded to BF16")
    for p in problems:
        print(f"check-bf16: {p}", file=sys.stderr)
    print(f"check-bf16: {len(b)} tensor(s) checked, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "check-bf16":
        sys.exit(check_bf16(sys.argv[2], sys.argv[3]))
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    write_all(sys.argv[1])
