#!/usr/bin/python3
"""Check that a training run stopped and resumed gives bit-identical weights.

    PYTHONPATH=tools /usr/bin/python3 -m research.train.check_resume [--data build/train-data] [--threads 1]

Trains a tiny schedule (autoencoder then denoiser, a few steps of a few tokens) twice in
temporary directories: once straight through, once stopped inside phase 1 and again inside
phase 2 and resumed each time. Every tensor of the two final checkpoints (weights, EMA,
optimizer state) must be equal bit for bit. Takes a few minutes on one core.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import torch

from .common import DATA_DIR, REPO


def flatten(prefix, obj, out):
    if isinstance(obj, dict):
        for k, v in obj.items():
            flatten(f"{prefix}.{k}", v, out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            flatten(f"{prefix}.{i}", v, out)
    else:
        out[prefix] = obj


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=DATA_DIR, help="prepare_data.py's output (default: build/train-data)")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    flags = ["--data", os.path.abspath(a.data), "--threads", str(a.threads), "--ae-steps", "6", "--dn-steps", "6", "--tokens", "256",
             "--max-len", "32", "--warmup", "3", "--ckpt-every", "4", "--log-every", "2"]
    with tempfile.TemporaryDirectory() as tmp:
        straight, pieces = os.path.join(tmp, "straight"), os.path.join(tmp, "pieces")
        # The module runs from the repository root, which holds the research package.
        run = [sys.executable, "-m", "research.train.train"]
        env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "tools"))
        subprocess.run(run + flags + ["--work", straight], check=True, cwd=REPO, env=env)
        for stop in (["--stop-at-step", "2"], ["--stop-at-step", "8"], []):
            subprocess.run(run + flags + ["--work", pieces] + stop, check=True, cwd=REPO, env=env)
        sa, sb = (torch.load(os.path.join(d, "checkpoint.pt")) for d in (straight, pieces))
        fa, fb = {}, {}
        flatten("", sa, fa)
        flatten("", sb, fb)
        fa.pop(".elapsed"), fb.pop(".elapsed")
        same = lambda x, y: torch.equal(x, y) if torch.is_tensor(x) else x == y  # noqa: E731
        bad = sorted(set(fa) ^ set(fb)) + sorted(k for k in fa.keys() & fb.keys() if not same(fa[k], fb[k]))
        n_tensors = sum(torch.is_tensor(v) for v in fa.values())
        with open(os.path.join(straight, "log.jsonl")) as f1, open(os.path.join(pieces, "log.jsonl")) as f2:
            strip = lambda line: {k: v for k, v in __import__("json").loads(line).items() if k not in ("elapsed", "cpu_this_piece")}  # noqa: E731
            logs_equal = [strip(x) for x in f1] == [strip(x) for x in f2]
    if bad or not logs_equal:
        sys.exit(f"check_resume: FAILED: {len(bad)} entries differ (first: {bad[:5]}); logs equal: {logs_equal}")
    print(f"check_resume: OK: {n_tensors} tensors and the loss log identical after stops at steps 2 and 8 "
          f"(phase 1 ends at step 6)")


if __name__ == "__main__":
    main()
