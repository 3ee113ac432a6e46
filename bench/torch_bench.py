#!/usr/bin/python3
"""PyTorch CPU timings of the cases in bench/bench_layers.cpp, under the same names.

Usage (Debian's python, which has torch 1.13; the pyenv `python3` on PATH has none):
    /usr/bin/python3 bench/torch_bench.py [--threads 1,2] [--filter REGEX] [--precisions fp32,bf16]
                                          [--min-reps 3] [--max-reps 50] [--budget 2.0]
Prints one JSON document on stdout; progress goes to stderr.

Precisions: fp32 (plain eval) and bf16, which runs the same fp32 module under
torch.autocast('cpu', dtype=torch.bfloat16), the way PyTorch users run bf16 on a
CPU (autocast casts the weights on every call; that cost is PyTorch's and counted).
Each result carries its "precision".

The modules come from tools/reference/ldlm_torch.py at ldlm-base sizes (B = 1,
T = 1024), weights from tools/reference/ldlm_init.py (the generator C++'s
init_parameters(module, 1) uses), inputs uniform in [-1, 1), eval mode, no_grad.
Each case runs warm-up calls, then the median of N timed calls (N chosen so the
timed calls take about --budget seconds, within [--min-reps, --max-reps]).

One worker subprocess runs per thread count, with OMP_NUM_THREADS,
OPENBLAS_NUM_THREADS and MKL_NUM_THREADS set to it before torch loads: OpenBLAS
sizes its own pool at load time, so torch.set_num_threads alone does not give a
true one-thread figure. Every other variable is inherited (bench/compare.py
--env best|ambient decides those).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
REPORTED_VARS = THREAD_VARS + ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "ATEN_CPU_CAPABILITY", "GLIBC_TUNABLES")
B, T = 1, 1024
SCALING_T = (128, 256, 512, 1024)


def case_list(threads: int):
    """(name, module key, builder) in the order of bench_layers.cpp. A builder gets the
    module and returns the zero-argument callable to time."""
    import torch
    import torch.nn.functional as F
    from reference import ldlm_torch as lt

    cfg = lt.LDLM_BASE
    d = cfg.d_model

    def uniform(*shape, seed):
        g = torch.Generator().manual_seed(seed)
        return torch.rand(*shape, generator=g) * 2 - 1

    def gemm(_):
        x, w = uniform(1024, 768, seed=1), uniform(3072, 768, seed=2)  # nn.Linear layout, as in C++
        return lambda: F.linear(x, w)

    def layer_norm_gain(m):
        x = uniform(B, T, d, seed=1)
        return lambda: m(x)

    def attn_denoiser(blk):
        x = uniform(B, T, d, seed=1)
        return lambda: lt.denoiser_self_attention(x, blk.attn_qkv.weight, blk.attn_out.weight, cfg)

    def one_input(m):
        x = uniform(B, T, d, seed=1)
        return lambda: m(x)

    def attn_latent(m):
        context, queries = uniform(B, T, d, seed=1), uniform(B, T, d, seed=2)
        return lambda: m(context, queries)

    def ddit_block(blk):
        x, c = uniform(B, T, d, seed=1), uniform(B, d, seed=2)
        return lambda: blk(x, c)

    def denoiser_at(length):
        def build(m):
            x_t, self_cond = uniform(B, length, d, seed=1), uniform(B, length, d, seed=2)
            t = torch.full((B,), 0.5)
            return lambda: m(x_t, t, self_cond)
        return build

    def gpt2_features(m):
        tokens = torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(1))
        return lambda: m(tokens)

    cases = [
        ("gemm", None, gemm),
        ("layer_norm_gain", ("layer_norm_gain", lambda: lt.GainLayerNorm(d, cfg.layer_norm_eps)), layer_norm_gain),
        ("attn_denoiser", ("ddit_block", lambda: lt.DenoiserBlock(cfg)), attn_denoiser),
        ("attn_token_decoder", ("attn_token_decoder", lambda: lt.TokenDecoderAttention(cfg)), one_input),
        ("attn_latent", ("attn_latent", lambda: lt.LatentAttention(cfg)), attn_latent),
        ("attn_gpt2", ("attn_gpt2", lambda: lt.GPT2Attention(cfg)), one_input),
        ("ddit_block", ("ddit_block", lambda: lt.DenoiserBlock(cfg)), ddit_block),
        ("denoiser", ("denoiser", lambda: lt.Denoiser(cfg)), denoiser_at(T)),
    ]
    # The scaling table, at every thread count, as in C++.
    cases += [(f"denoiser_T/T:{n}", ("denoiser", lambda: lt.Denoiser(cfg)), denoiser_at(n)) for n in SCALING_T]
    cases += [
        ("latent_encoder", ("latent_encoder", lambda: lt.LatentEncoder(cfg)), one_input),
        ("latent_decoder", ("latent_decoder", lambda: lt.LatentDecoder(cfg)), one_input),
        ("token_decoder", ("token_decoder", lambda: lt.TokenDecoder(cfg)), one_input),
        ("gpt2_features", ("gpt2_features", lambda: lt.GPT2Features(cfg)), gpt2_features),
    ]
    return cases


def time_case(fn, min_reps: int, max_reps: int, budget: float):
    """Warm-up (two calls, one when it took 5 s or more, and at least 0.3 s), then N
    timed calls: wall and process CPU seconds of each. (autocast-bf16 without bf16
    instructions takes minutes per call at T = 1024: an AMD EPYC Zen 1.)"""
    start = time.perf_counter()
    warmups = 0
    last = 0.0
    while (warmups < 2 and last < 5.0) or time.perf_counter() - start < 0.3:
        t0 = time.perf_counter()
        fn()
        last = time.perf_counter() - t0
        warmups += 1
    reps = max(min_reps, min(max_reps, math.ceil(budget / max(last, 1e-9))))
    samples, cpu = [], []
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return samples, cpu


def parse_precisions(text: str) -> list:
    precisions = [p for p in text.split(",") if p]
    for p in precisions:
        if p not in ("fp32", "bf16"):
            sys.exit(f"torch_bench.py: --precisions takes fp32 and/or bf16, got {p!r}")
    return precisions


def worker(args) -> None:
    import torch

    from reference import ldlm_init

    torch.set_num_threads(args.worker)
    precisions = parse_precisions(args.precisions)
    pattern = re.compile(args.filter) if args.filter else None
    results = []
    module_key, module = None, None
    with torch.no_grad():
        for name, spec, build in case_list(args.worker):
            if pattern and not pattern.search(name):
                continue
            if spec is None:
                module_key, module = None, None
            elif spec[0] != module_key:
                module = None  # free the previous module first: at most one is alive
                module = spec[1]().eval()
                ldlm_init.init_module(module, "", 1)
                module_key = spec[0]
            fp32_fn = build(module)
            for precision in precisions:
                if precision == "bf16":
                    def fn(f=fp32_fn):
                        with torch.autocast("cpu", dtype=torch.bfloat16):
                            return f()
                else:
                    fn = fp32_fn
                samples, cpu = time_case(fn, args.min_reps, args.max_reps, args.budget)
                ms = 1e3 * statistics.median(samples)
                print(f"torch {name} threads={args.worker} {precision}: {ms:.3f} ms (median of {len(samples)})",
                      file=sys.stderr)
                results.append({"name": name, "threads": args.worker, "precision": precision, "ms": ms,
                                "ms_min": 1e3 * min(samples), "cpu_ms": 1e3 * statistics.median(cpu),
                                "reps": len(samples)})
    capability = next((line.split(":", 1)[1].strip() for line in torch.__config__.show().splitlines()
                       if "CPU capability usage" in line), "unknown")
    json.dump({"threads": args.worker, "torch_num_threads": torch.get_num_threads(), "cpu_capability": capability,
               "results": results}, sys.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    parser.add_argument("--filter", default="", help="regex on case names")
    parser.add_argument("--precisions", default="fp32", help="fp32 and/or bf16 (torch.autocast), comma-separated")
    parser.add_argument("--min-reps", type=int, default=3)
    parser.add_argument("--max-reps", type=int, default=50)
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of timed calls per case (approx.)")
    parser.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    parse_precisions(args.precisions)
    import torch  # only for the version string; workers load their own

    runs, capability = [], {}
    for n in [int(s) for s in args.threads.split(",") if s]:
        env = dict(os.environ, **{v: str(n) for v in THREAD_VARS})
        # The worker imports the reference package from tools/.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(REPO, "tools"), os.environ.get("PYTHONPATH")) if p)
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", str(n), "--filter", args.filter,
               "--precisions", args.precisions, "--min-reps", str(args.min_reps), "--max-reps", str(args.max_reps), "--budget", str(args.budget)]
        out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
        doc = json.loads(out)
        capability[n] = doc["cpu_capability"]
        if doc["torch_num_threads"] != n:
            print(f"warning: torch runs {doc['torch_num_threads']} threads, asked for {n}", file=sys.stderr)
        runs += doc["results"]
    json.dump({
        "context": {
            "torch_version": torch.__version__,
            "python": sys.executable,
            "cpu_capability": capability,
            "env": {v: os.environ.get(v) for v in REPORTED_VARS if v not in THREAD_VARS},
            "batch": B, "positions": T, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "load_average": os.getloadavg(),
        },
        "benchmarks": runs,
    }, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
