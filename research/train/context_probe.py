#!/usr/bin/python3
"""How much a demo-model denoiser reads its context: its x̂0 error on held-out windows with
their own context, with a context mixed across the batch, and with none.

    PYTHONPATH=tools /usr/bin/python3 -m research.train.context_probe --model ldlm-demo.safetensors --data build/train-data

For each t, every window is noised once (x_t = α(t) z + σ(t) ε, z = encoder(features)) and
the denoiser (self-conditioned on its own first call, as train.py validates it) predicts x̂0:
  own     the windows as they are;
  mixed   position j of window b is taken, x_t and z together, from window perm_j(b): every
          position keeps its own input and target, its neighbours come from other windows
          (the length and the positions stay);
  alone   every position as a sequence of length 1.
The error is the mean squared error against z. A denoiser that ignores its context scores
the same in all three.
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from . import common as C


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="safetensors file written by export.py")
    ap.add_argument("--data", default=C.DATA_DIR, help="prepare_data.py's output (default: build/train-data)")
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    C.set_threads(a.threads)
    model, _ = C.load_model_file(a.model)
    heldout = C.TokenStream(a.data, "heldout")
    B, T = a.windows, a.length
    tokens = heldout.windows(B, T, torch.Generator().manual_seed(a.seed), 1.0)
    g = torch.Generator().manual_seed(a.seed + 1)

    def x0_error(x, z, t):
        tt = torch.full((x.shape[0],), t)
        x0 = model.denoiser(x, tt, model.denoiser(x, tt, None))
        return F.mse_loss(x0, z).item()

    with torch.no_grad():
        z = model.encoder(model.feature_model(tokens))
        perm = torch.stack([torch.randperm(B, generator=g) for _ in range(T)], 1)  # [B, T]
        index = perm[:, :, None].expand(-1, -1, z.shape[-1])
        print(f"{B} held-out windows of {T} tokens; x̂0 error (MSE) with own / mixed / no context")
        for t in (0.1, 0.3, 0.5, 0.7, 0.9):
            alpha, sigma = (v.float() for v in C.alpha_sigma(torch.tensor(t)))
            x = alpha * z + sigma * torch.randn(z.shape, generator=g)
            own = x0_error(x, z, t)
            mixed = x0_error(torch.gather(x, 0, index), torch.gather(z, 0, index), t)
            alone = x0_error(x.reshape(B * T, 1, -1), z.reshape(B * T, 1, -1), t)
            print(f"t = {t}: own {own:.4f}   mixed {mixed:.4f} ({mixed / own - 1:+.1%})   "
                  f"alone {alone:.4f} ({alone / own - 1:+.1%})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
