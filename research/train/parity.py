#!/usr/bin/python3
"""Reference dumps of the shipped demo model, from the training code's own forward.

    PYTHONPATH=tools /usr/bin/python3 -m research.train.parity --model tools/assets/ldlm-demo/ldlm-demo.safetensors \
        --out tests/data/demo

The model is loaded the way evaluate.py loads it (the reference modules of
tools/reference/ldlm_torch.py, the trained tensors, the feature model regenerated from
its seed), then every module runs on inputs that come from real text: held-out lines
and modern English sentences, tokenized with GPT-2's tokenizer. The files have the
layout of tests/data/model_small (docs/model.md §Module inputs and outputs):
  <module>.inputs.safetensors, <module>.outputs.safetensors (fp32) and
  <module>.outputs.bf16.safetensors (matrix-product operands rounded to bf16, as
  ldlm's --precision bf16 computes).
The token decoder's logits are [B, T, 50259] floats, so its case is one short
sentence. reconstruct.tokens.safetensors holds the argmax ids of the whole chain for
longer sentences, with the margin between the best and second-best logit, so the C++
test can demand equal ids wherever the margin is above rounding noise. heldout_text.json
holds 32 held-out documents as text, for the reconstruction-accuracy test.
"""
from __future__ import annotations

import argparse
import json
import os

import torch

from reference.safetensors_io import write_safetensors

from . import common as C

SENTENCES = [
    "The river ran quietly past the old mill, and the children watched the boats go by.",
    "She opened the window, and the smell of fresh bread filled the kitchen.",
    "In the beginning God created the heaven and the earth.",
    "Please send me the report before the meeting on Monday morning.",
]
SHORT = "A good book is a friend that never fails."


def batch(ids: list[list[int]]) -> torch.Tensor:
    """[B, T]: every sentence cut to the shortest one's length."""
    T = min(len(x) for x in ids)
    return torch.tensor([x[:T] for x in ids], dtype=torch.int64)


def module_cases(model, tokens: torch.Tensor, short: torch.Tensor) -> dict:
    """{module: inputs} along the chain, fixed by a seeded generator."""
    with torch.no_grad():
        features = model.feature_model(tokens)
        latents = model.encoder(features)
        hidden = model.latent_decoder(latents)
        short_hidden = model.latent_decoder(model.encoder(model.feature_model(short)))
    g = torch.Generator().manual_seed(2026)
    t = torch.tensor([0.3, 0.7, 0.5, 0.9])[: tokens.shape[0]]
    alpha, sigma = C.alpha_sigma(t)
    x_t = alpha[:, None, None] * latents + sigma[:, None, None] * torch.randn(latents.shape, generator=g)
    self_cond = torch.zeros_like(latents)
    self_cond[1:] = latents[1:] * 0.5  # rows with and without a self-condition
    return {
        "feature_model": {"tokens": tokens},
        "encoder": {"features": features},
        "latent_decoder": {"latents": latents},
        "token_decoder": {"hidden": short_hidden},
        "denoiser": {"x_t": x_t.float(), "t": t, "self_cond": self_cond},
    }


def chain_tokens(model, tokens: torch.Tensor) -> dict:
    with torch.no_grad():
        logits = model.forward_module("reconstruct", tokens=tokens)["logits"]
    top2 = logits.topk(2, dim=-1).values
    return {"tokens": tokens, "argmax": logits.argmax(-1), "margin": (top2[..., 0] - top2[..., 1]).float()}


def heldout_texts(data_dir: str, count: int, max_tokens: int) -> list[str]:
    """`count` held-out documents of at most `max_tokens` ids, spread evenly over the
    held-out split (so every source is represented), as text. Documents with an e-mail
    address or a URL (a few fortunes quote them) are left out of the committed file."""
    s = C.TokenStream(data_dir, "heldout")
    bounds = s.doc_starts.tolist() + [s.tokens.numel()]
    fitting = [d for d in range(len(bounds) - 1) if 4 <= bounds[d + 1] - bounds[d] <= max_tokens]
    texts = [t.strip() for t in C.decode([s.tokens[bounds[d]:bounds[d + 1]].tolist() for d in fitting])]
    clean = [t for t in texts if "@" not in t and "://" not in t]
    return [clean[round(i * (len(clean) - 1) / (count - 1))] for i in range(count)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the demo model (export.py's output)")
    ap.add_argument("--out", required=True, help="directory of the dumps")
    ap.add_argument("--data", default=C.DATA_DIR,
                    help="prepare_data.py's output, for held-out text (default: build/train-data)")
    a = ap.parse_args()
    model, meta = C.load_model_file(a.model)
    torch.manual_seed(0)
    tokens = batch(C.encode(SENTENCES))
    short = batch([C.encode([SHORT])[0][:5]])  # 5 rows of 50,259 logits: 1 MB per file
    os.makedirs(a.out, exist_ok=True)
    base_meta = {"model": os.path.basename(a.model), "config": meta["ldlm.config"]}
    for mod, inputs in module_cases(model, tokens, short).items():
        m = dict(base_meta, case=f"demo/{mod}", module=mod)
        with torch.no_grad():
            fp32 = model.forward_module(mod, **inputs)
            with C.L.bf16_operands():
                bf16 = model.forward_module(mod, **inputs)
        write_safetensors(os.path.join(a.out, f"{mod}.inputs.safetensors"), inputs, m)
        write_safetensors(os.path.join(a.out, f"{mod}.outputs.safetensors"), fp32, m)
        write_safetensors(os.path.join(a.out, f"{mod}.outputs.bf16.safetensors"), bf16, m)
    write_safetensors(os.path.join(a.out, "reconstruct.tokens.safetensors"), chain_tokens(model, tokens),
                      dict(base_meta, case="demo/reconstruct", module="reconstruct"))
    with open(os.path.join(a.out, "heldout_text.json"), "w", encoding="utf-8") as f:
        json.dump({"source": "held-out documents of prepare_data.py's split (research/train/README.md)",
                   "texts": heldout_texts(a.data, 32, 120)}, f, ensure_ascii=False, indent=1)
    sizes = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out))
    print(f"{a.out}: {len(os.listdir(a.out))} files, {sizes / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
