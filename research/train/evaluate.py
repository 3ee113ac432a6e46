#!/usr/bin/python3
"""Evaluate a demo-model file: reconstruction accuracy, generation samples, loss curves.

    PYTHONPATH=tools /usr/bin/python3 -m research.train.evaluate --model ldlm-demo.safetensors --data build/train-data \
        --log build/train-run/log.jsonl --out build/train-run/eval

Runs the reference PyTorch model (tools/reference/ldlm_torch.py) on the file's weights
(the feature model regenerated from its seed), in float32, and writes into --out:
  eval.json    every figure below
  samples.txt  the generated texts, the modern-English reconstructions that differ
  loss.png     the training curves of the log
Figures:
  heldout      reconstruction token accuracy (argmax over the full vocabulary) on every
               held-out document, each at its own length (documents > max_positions are
               cut into pieces), overall and per source; the autoencoder's perplexity there
  modern       the same on research/train/modern_english.txt, one sentence per sequence
  generation   --samples texts of --length tokens from the sampler of ldlm (SDE, --steps
               steps), and the share of their words found in /usr/share/dict/words
               (Debian wamerican), next to the same share for held-out text and for
               uniformly random GPT-2 ids
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from . import common as C
from .dictionary import DICT_PATH, dictionary_share
from .dictionary import load_dictionary as read_dictionary


@torch.no_grad()
def reconstruct_accuracy(model, sequences: list[list[int]]):
    """Token accuracy and mean cross-entropy; sequences of equal length share a batch."""
    by_len = {}
    for i, s in enumerate(sequences):
        by_len.setdefault(len(s), []).append(i)
    correct, nll, predicted = [0] * len(sequences), [0.0] * len(sequences), [None] * len(sequences)
    for T, idx in sorted(by_len.items()):
        for k in range(0, len(idx), 64):
            chunk = idx[k:k + 64]
            tokens = torch.tensor([sequences[i] for i in chunk], dtype=torch.int64)
            logits = model.reconstruct(tokens)["logits"]
            pred = logits.argmax(-1)
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1), reduction="none").view(tokens.shape)
            for j, i in enumerate(chunk):
                correct[i] = int((pred[j] == tokens[j]).sum())
                nll[i] = float(ce[j].sum())
                predicted[i] = pred[j].tolist()
    return correct, nll, predicted


def heldout_sequences(data_dir: str, max_len: int):
    """Every held-out document's ids (text + its "\\n\\n"), cut into pieces of <= max_len."""
    s = C.TokenStream(data_dir, "heldout")
    bounds = s.doc_starts.tolist() + [s.tokens.numel()]
    seqs, sources = [], []
    for d in range(len(bounds) - 1):
        ids = s.tokens[bounds[d]:bounds[d + 1]].tolist()
        for k in range(0, len(ids), max_len):
            seqs.append(ids[k:k + max_len])
            sources.append(int(s.doc_source[d]))
    return seqs, sources


def load_dictionary() -> set[str]:
    words = read_dictionary()
    if words is None:
        sys.exit(f"evaluate: {DICT_PATH} is missing; install it with: apt-get install wamerican")
    return words


def plot_log(log_path: str, out_png: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(log_path) as f:
        rows = [json.loads(line) for line in f]
    ae = [r for r in rows if r["phase"] == "ae" and "loss" in r]
    ae_val = [r for r in rows if "val_acc" in r]
    dn = [r for r in rows if r["phase"] == "dn" and "loss" in r]
    dn_val = [r for r in rows if any(k.startswith("val_mse") for k in r)]
    # A run started with --init-from --ae-steps 0 has the denoiser's panel only.
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2)) if ae else plt.subplots(1, 1, figsize=(6.5, 4.2))
    axes = axes if ae else [None, axes]
    ax = axes[0]
    if ae:
        ax.plot([r["step"] for r in ae], [r.get("ce", r["loss"]) for r in ae], lw=0.8,
                label="train cross-entropy (sampled softmax)")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy")
        ax.set_title("1. autoencoder")
        ax2 = ax.twinx()
        ax2.plot([r["step"] for r in ae], [r["acc"] for r in ae], lw=0.8, color="tab:green", label="train token accuracy")
        ax2.plot([r["step"] for r in ae_val], [r["val_acc"] for r in ae_val], "o-", ms=3, color="tab:red",
                 label="held-out token accuracy (full vocabulary)")
        ax2.set_ylim(0, 1)
        ax2.set_ylabel("accuracy")
        lines = ax.get_lines() + ax2.get_lines()
        ax.legend(lines, [x.get_label() for x in lines], loc="center right", fontsize=8)
    ax = axes[1]
    if dn:
        ax.plot([r["step"] for r in dn], [r["loss"] for r in dn], lw=0.8, label="train MSE of x̂0 (t ~ U(0,1))")
        for key in sorted({k for r in dn_val for k in r if k.startswith("val_mse")}):
            ax.plot([r["step"] for r in dn_val], [r[key] for r in dn_val], "o-", ms=3,
                    label=f"held-out MSE, EMA, t = {key.split('_t')[1]}")
        ax.legend(fontsize=8)
    ax.set_xlabel("step")
    ax.set_ylabel("MSE")
    ax.set_title("2. denoiser (x̂0 prediction, self-conditioning)")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="safetensors file written by export.py")
    ap.add_argument("--data", default=C.DATA_DIR, help="prepare_data.py's output (default: build/train-data)")
    ap.add_argument("--log", default=None, help="log.jsonl of the training run (for loss.png)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heldout-limit", type=int, default=0,
                    help="evaluate only every k-th held-out sequence so that about this many remain (0: all)")
    ap.add_argument("--modern", default=os.path.join(C.HERE, "modern_english.txt"))
    ap.add_argument("--ldlm", default=None,
                    help="the ldlm tool: also score `ldlm generate --weights MODEL` (C++ sampler), seeds 0..samples-1")
    a = ap.parse_args()
    C.set_threads(a.threads)
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    model, meta = C.load_model_file(a.model)
    cfg = model.cfg
    result = {"model": os.path.abspath(a.model), "bytes": os.path.getsize(a.model),
              "feature_model_init_seed": meta["ldlm.feature_model_init_seed"]}
    train_counts = torch.bincount(C.TokenStream(a.data, "train").tokens, minlength=cfg.vocab_size)

    # Held-out corpus documents.
    seqs, sources = heldout_sequences(a.data, cfg.max_positions)
    if a.heldout_limit and len(seqs) > a.heldout_limit:
        stride = -(-len(seqs) // a.heldout_limit)
        seqs, sources = seqs[::stride], sources[::stride]
    correct, nll, _ = reconstruct_accuracy(model, seqs)
    n = sum(len(s) for s in seqs)
    per_source = {}
    for si, name in enumerate(C.SOURCES):
        sel = [i for i, s in enumerate(sources) if s == si]
        per_source[name] = sum(correct[i] for i in sel) / max(1, sum(len(seqs[i]) for i in sel))
    result["heldout"] = {"sequences": len(seqs), "tokens": n, "token_accuracy": sum(correct) / n,
                         "perplexity": float(torch.exp(torch.tensor(sum(nll) / n))), "per_source": per_source}
    print(f"held-out: {result['heldout']['token_accuracy']:.4f} token accuracy on {n} tokens "
          f"({len(seqs)} sequences); per source " + ", ".join(f"{k} {v:.4f}" for k, v in per_source.items()), flush=True)

    # Modern English sentences, not in the corpus.
    with open(a.modern, encoding="utf-8") as f:
        sentences = [line.rstrip("\n") for line in f if line.strip()]
    ids = C.encode(sentences)
    correct, nll, predicted = reconstruct_accuracy(model, ids)
    n = sum(len(s) for s in ids)
    unseen = sum(int(train_counts[i] == 0) for s in ids for i in s)
    texts = C.decode(predicted)
    result["modern"] = {"sentences": len(ids), "tokens": n, "token_accuracy": sum(correct) / n,
                        "exact_sentences": sum(c == len(s) for c, s in zip(correct, ids)),
                        "tokens_unseen_in_training": unseen}
    print(f"modern English: {result['modern']['token_accuracy']:.4f} token accuracy on {n} tokens, "
          f"{result['modern']['exact_sentences']}/{len(ids)} sentences exact ({unseen} ids never seen in training)",
          flush=True)

    # Generation.
    g = torch.Generator().manual_seed(a.seed)
    gen_ids = []
    for k in range(a.samples):
        z = C.sample_latents(model.denoiser, 1, a.length, a.steps, g)
        gen_ids.append(model.token_decoder(model.latent_decoder(z)).argmax(-1)[0].tolist())
    gen_texts = C.decode(gen_ids)
    words = load_dictionary()
    heldout_texts = C.decode(seqs[:2000])
    rng = torch.Generator().manual_seed(a.seed + 1)
    random_texts = C.decode([torch.randint(0, 50257, (a.length,), generator=rng).tolist() for _ in range(a.samples)])
    result["generation"] = {"samples": a.samples, "length": a.length, "steps": a.steps, "sampler": "sde",
                            "dictionary_word_share": dictionary_share(gen_texts, words),
                            "dictionary_word_share_heldout_text": dictionary_share(heldout_texts, words),
                            "dictionary_word_share_random_ids": dictionary_share(random_texts, words),
                            "distinct_samples": len(set(map(tuple, gen_ids)))}
    print("generation: {dictionary_word_share:.3f} of words in the dictionary (held-out text "
          "{dictionary_word_share_heldout_text:.3f}, random ids {dictionary_word_share_random_ids:.3f}); "
          "{distinct_samples}/{samples} distinct samples".format(**result["generation"]), flush=True)

    cpp_texts = []
    if a.ldlm:
        for k in range(a.samples):
            cmd = [a.ldlm, "generate", "--weights", a.model, "--length", str(a.length), "--steps", str(a.steps),
                   "--seed", str(k), "--threads", str(a.threads)]
            cpp_texts.append(subprocess.run(cmd, capture_output=True, check=True, text=True).stdout.rstrip("\n"))
        result["ldlm_generate"] = {"samples": a.samples, "length": a.length, "steps": a.steps, "seeds": f"0..{a.samples - 1}",
                                   "dictionary_word_share": dictionary_share(cpp_texts, words),
                                   "distinct_samples": len(set(cpp_texts))}
        print("ldlm generate: {dictionary_word_share:.3f} of words in the dictionary; "
              "{distinct_samples}/{samples} distinct samples".format(**result["ldlm_generate"]), flush=True)

    with open(os.path.join(a.out, "samples.txt"), "w", encoding="utf-8") as f:
        f.write(f"# generated by {os.path.basename(a.model)}: {a.samples} samples, length {a.length}, "
                f"{a.steps} SDE steps, seed {a.seed}\n\n")
        for i, t in enumerate(gen_texts):
            f.write(f"--- sample {i}\n{t}\n\n")
        for i, t in enumerate(cpp_texts):
            f.write(f"--- ldlm generate --seed {i}\n{t}\n\n")
        f.write("# modern English reconstructions that differ from the input\n\n")
        for s, t, c, x in zip(sentences, texts, correct, ids):
            if c != len(x):
                f.write(f"in:  {s}\nout: {t}\n\n")
    if a.log:
        plot_log(a.log, os.path.join(a.out, "loss.png"))
    result["eval_seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(a.out, "eval.json"), "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"wrote {a.out}/eval.json, samples.txt" + (", loss.png" if a.log else ""))


if __name__ == "__main__":
    main()
