#!/usr/bin/python3
"""Write the trained modules of a training checkpoint as a self-describing safetensors file.

    PYTHONPATH=tools /usr/bin/python3 -m research.train.export --checkpoint build/train-run/checkpoint.pt --out ldlm-demo.safetensors

The file holds encoder.*, latent_decoder.* (with the frozen mask_vector, kept F32 so it
stays exactly the generator's row), token_decoder.* and denoiser.* (its EMA weights)
under their full state-dict names, in BF16 (--dtype f32 for F32), and two metadata keys:
  ldlm.config                   the model configuration (every key of ldlm::Config)
  ldlm.feature_model_init_seed  the generator seed of the frozen feature model, which
                                is regenerated at load and never stored
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

from . import common as C


def export(checkpoint: str, out: str, dtype: str = "bf16", allow_partial: bool = False) -> dict:
    s = torch.load(checkpoint)
    total = s["recipe"]["ae_steps"] + s["recipe"]["dn_steps"]
    if s["step"] < total and not allow_partial:
        sys.exit(f"export: {checkpoint} stopped at step {s['step']} of {total}; "
                 f"resume training first, or pass --allow-partial")
    cfg = C.L.Config.from_dict(s["config"])
    model = C.L.LDLM(cfg)
    C.regenerate_frozen(model, C.FEATURE_MODEL_SEED)
    mask_row = model.latent_decoder.mask_vector.clone()
    model.load_state_dict(s["model"], strict=False)
    model.denoiser.load_state_dict(s["ema"])
    assert torch.equal(model.latent_decoder.mask_vector, mask_row), "mask_vector drifted from the generator row"
    tensors = C.trained_state(model)
    meta = {"ldlm.config": C.config_json(cfg), "ldlm.feature_model_init_seed": str(C.FEATURE_MODEL_SEED)}
    C.write_safetensors(out, tensors, meta, dtype.upper(), keep_f32={"latent_decoder.mask_vector"})

    # Read it back through the loader the evaluation uses.
    loaded, _ = C.load_model_file(out)
    back = C.trained_state(loaded)
    for name, t in tensors.items():
        want = t if dtype == "f32" or name == "latent_decoder.mask_vector" else t.to(torch.bfloat16).float()
        assert torch.equal(back[name], want), name
    info = {"step": s["step"], "of": total, "tensors": len(tensors), "parameters": sum(t.numel() for t in tensors.values()),
            "bytes": os.path.getsize(out), "training_minutes": s["elapsed"] / 60}
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default=os.path.join(C.RUN_DIR, "checkpoint.pt"),
                    help="train.py's checkpoint (default: build/train-run/checkpoint.pt of the repository)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", choices=("bf16", "f32"), default="bf16")
    ap.add_argument("--allow-partial", action="store_true", help="export a checkpoint of an unfinished run")
    a = ap.parse_args()
    info = export(a.checkpoint, a.out, a.dtype, a.allow_partial)
    print(f"{a.out}: step {info['step']}/{info['of']}, {info['tensors']} tensors, {info['parameters']:,} parameters, "
          f"{info['bytes'] / 1e6:.2f} MB, {info['training_minutes']:.1f} min of training")


if __name__ == "__main__":
    main()
