#!/usr/bin/python3
"""Side-by-side timings of ldlm (bench/bench_layers.cpp) and PyTorch (bench/torch_bench.py).

Usage (Debian's python, which has torch and matplotlib):
    /usr/bin/python3 bench/compare.py [LDLM_BENCH] [--env best|ambient] [--filter REGEX]
                                      [--repetitions N] [--torch-budget SECONDS]
LDLM_BENCH defaults to build/default/bench/ldlm_bench (build it first:
`cmake --preset default && cmake --build build/default --target ldlm_bench`).

Runs the ldlm benchmark, then the PyTorch one (never both at once), matches the
cases by name and thread count, and writes
    bench/results/results.json  every number, the environment and both contexts
    bench/results/results.md    the table: case, threads, ldlm ms, PyTorch ms,
                                PyTorch/ldlm (> 1: ldlm faster), ldlm GFLOP/s,
                                % of the FMA peak (214 GFLOP/s per core × threads)
    bench/results/ratios.png    the ratios per case and thread count, line at 1.0

--env best     (default) both sides without OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE,
               with GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296
               (big buffers stay in the heap instead of being mapped and faulted in
               anew on every call); PyTorch also gets ATEN_CPU_CAPABILITY=avx512.
--env ambient  the environment as it is.
The mode and the variables actually used are written into every output.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH_DIR)
PEAK_GFLOPS_PER_CORE = 214.0  # FP32 FMA peak of one core of the target machine (the project's figure)
REPORTED_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "ATEN_CPU_CAPABILITY", "GLIBC_TUNABLES",
                 "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
BEST_GLIBC_TUNABLES = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296"
TIME_UNIT_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}


def environments(mode: str) -> tuple[dict, dict]:
    """(ldlm env, torch env) for the mode."""
    base = dict(os.environ)
    if mode == "ambient":
        return base, dict(base)
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        base.pop(var, None)
    base["GLIBC_TUNABLES"] = BEST_GLIBC_TUNABLES
    return base, dict(base, ATEN_CPU_CAPABILITY="avx512")


def split_name(name: str) -> tuple[str, int]:
    """'denoiser_T/T:128/threads:1/real_time' -> ('denoiser_T/T:128', 1)."""
    parts = [p for p in name.split("/") if p != "real_time"]
    threads = next(int(p.split(":")[1]) for p in parts if p.startswith("threads:"))
    return "/".join(p for p in parts if not p.startswith("threads:")), threads


def run_ldlm(binary: str, env: dict, pattern: str, repetitions: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        path = out.name
    cmd = [binary, f"--benchmark_out={path}", "--benchmark_out_format=json"]
    if pattern:
        cmd.append(f"--benchmark_filter={pattern}")
    if repetitions > 1:
        cmd += [f"--benchmark_repetitions={repetitions}", "--benchmark_report_aggregates_only=true"]
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, env=env, check=True, stdout=sys.stderr)  # console table as progress
    if os.path.getsize(path) == 0:
        sys.exit(f"compare.py: no ldlm benchmark matches --filter {pattern!r} (ldlm names look like "
                 "'denoiser/threads:1/real_time')")
    with open(path) as f:
        doc = json.load(f)
    os.unlink(path)
    results = {}
    for b in doc["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        case, threads = split_name(b.get("run_name", b["name"]))
        results[(case, threads)] = {
            "ms": b["real_time"] * TIME_UNIT_MS[b["time_unit"]],
            "cpu_ms": b["cpu_time"] * TIME_UNIT_MS[b["time_unit"]],  # calling thread only
            "flops": b["FLOPS"] * b["real_time"] * TIME_UNIT_MS[b["time_unit"]] * 1e-3,  # rate × seconds
            "iterations": b["iterations"],
        }
    return {"context": doc["context"], "results": results}


def run_torch(env: dict, pattern: str, budget: float) -> dict:
    cmd = [sys.executable, os.path.join(BENCH_DIR, "torch_bench.py"), "--budget", str(budget)]
    if pattern:
        cmd += ["--filter", pattern]
    print("+", " ".join(cmd), file=sys.stderr)
    doc = json.loads(subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout)
    return {"context": doc["context"], "results": {(b["name"], b["threads"]): b for b in doc["benchmarks"]}}


def case_order(ldlm: dict) -> list:
    seen = []
    for key in ldlm:
        if key[0] not in seen:
            seen.append(key[0])
    return seen


def build_rows(ldlm: dict, torch: dict) -> list:
    rows = []
    for case in case_order(ldlm):
        for (c, threads), r in sorted(ldlm.items(), key=lambda kv: kv[0][1]):
            if c != case:
                continue
            t = torch.get((case, threads))
            gflops = r["flops"] / (r["ms"] * 1e-3) * 1e-9
            rows.append({
                "case": case, "threads": threads, "ldlm_ms": r["ms"], "torch_ms": t["ms"] if t else None,
                # CPU time (ldlm: calling thread; PyTorch: whole process): at one thread, a
                # hint that survives a loaded machine.
                "ldlm_cpu_ms": r["cpu_ms"], "torch_cpu_ms": t.get("cpu_ms") if t else None,
                "ratio": t["ms"] / r["ms"] if t else None, "flops": r["flops"], "ldlm_gflops": gflops,
                "torch_gflops": r["flops"] / (t["ms"] * 1e-3) * 1e-9 if t else None,
                "pct_peak": 100 * gflops / (PEAK_GFLOPS_PER_CORE * threads),
            })
    return rows


def fmt(v, spec):
    return "—" if v is None else format(v, spec)


def write_markdown(path: str, rows: list, meta: dict) -> None:
    lines = [
        f"# ldlm vs PyTorch CPU — env `{meta['env_mode']}`",
        "",
        f"{meta['date']}, {meta['host_cpu']}, load average before the run {meta['load_average']}. "
        f"PyTorch {meta['torch_version']} (CPU capability {meta['torch_cpu_capability']}). "
        f"B = 1, T = 1024, float32. Environment: " +
        ", ".join(f"`{k}={v}`" for k, v in meta["env_ldlm"].items() if v is not None) +
        (f"; PyTorch also `ATEN_CPU_CAPABILITY={meta['env_torch']['ATEN_CPU_CAPABILITY']}`"
         if meta["env_torch"].get("ATEN_CPU_CAPABILITY") != meta["env_ldlm"].get("ATEN_CPU_CAPABILITY") else "") + ".",
        "",
        "Ratio = PyTorch ms / ldlm ms (> 1: ldlm faster). GFLOP/s count useful FLOPs (formulas in "
        "bench/bench_layers.cpp); peak = 214 GFLOP/s per core × threads. results.json also "
        "holds CPU times (ldlm: calling thread; PyTorch: process), a hint at one thread when the machine is loaded.",
        "",
        "| case | threads | ldlm ms | PyTorch ms | PyTorch/ldlm | ldlm GFLOP/s | % of peak |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['case']} | {r['threads']} | {r['ldlm_ms']:.2f} | {fmt(r['torch_ms'], '.2f')} | "
                     f"{fmt(r['ratio'], '.2f')} | {r['ldlm_gflops']:.1f} | {r['pct_peak']:.1f} |")
    scaling = [r for r in rows if r["case"].startswith("denoiser_T/")]
    if scaling:
        first = scaling[0]
        lines += ["", "## Denoiser scaling (1 thread)", "",
                  "| T | ldlm ms | × T=" + first["case"].split(":")[1] + " | PyTorch ms | PyTorch/ldlm |",
                  "|---:|---:|---:|---:|---:|"]
        for r in scaling:
            lines.append(f"| {r['case'].split(':')[1]} | {r['ldlm_ms']:.1f} | {r['ldlm_ms'] / first['ldlm_ms']:.2f} | "
                         f"{fmt(r['torch_ms'], '.1f')} | {fmt(r['ratio'], '.2f')} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write_plot(path: str, rows: list, env_mode: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    rows = [r for r in rows if r["ratio"] is not None]
    cases = case_order({(r["case"], r["threads"]): r for r in rows})
    thread_counts = sorted({r["threads"] for r in rows})
    width = 0.8 / max(len(thread_counts), 1)
    fig, ax = plt.subplots(figsize=(max(8, 0.7 * len(cases) + 2), 5))
    for i, n in enumerate(thread_counts):
        xs, ys = [], []
        for j, case in enumerate(cases):
            r = next((r for r in rows if r["case"] == case and r["threads"] == n), None)
            if r:
                xs.append(j + (i - (len(thread_counts) - 1) / 2) * width)
                ys.append(r["ratio"])
        ax.bar(xs, ys, width, label=f"{n} thread{'s' if n > 1 else ''}")
        for x, y in zip(xs, ys):
            ax.annotate(f"{y:.2f}", (x, y), ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_yscale("log")  # a ratio and its inverse sit at equal distances from 1
    lo, hi = min(r["ratio"] for r in rows), max(r["ratio"] for r in rows)
    ticks = [2.0 ** k for k in range(math.floor(math.log2(min(lo, 1.0))), math.ceil(math.log2(max(hi, 1.0))) + 1)]
    ax.set_yticks(ticks)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(ticks[0] / 1.1, ticks[-1] * 1.1)
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels(cases, rotation=45, ha="right")
    ax.set_ylabel("PyTorch time / ldlm time  (> 1: ldlm faster)")
    ax.set_title(f"ldlm vs PyTorch CPU, B=1, T=1024 (env: {env_mode})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() + f" × {os.cpu_count()}"
    except OSError:
        pass
    return "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ldlm_bench", nargs="?", default=os.path.join(REPO, "build", "default", "bench", "ldlm_bench"))
    parser.add_argument("--env", choices=("best", "ambient"), default="best")
    parser.add_argument("--filter", default="", help="regex on case names, passed to both sides")
    parser.add_argument("--repetitions", type=int, default=1, help="ldlm repetitions (median is used)")
    parser.add_argument("--torch-budget", type=float, default=2.0, help="seconds of timed PyTorch calls per case")
    parser.add_argument("--out-dir", default=os.path.join(BENCH_DIR, "results"))
    args = parser.parse_args()
    if not os.access(args.ldlm_bench, os.X_OK):
        sys.exit(f"compare.py: no ldlm_bench at {args.ldlm_bench}; build it or pass its path")

    ldlm_env, torch_env = environments(args.env)
    load = os.getloadavg()
    ldlm = run_ldlm(args.ldlm_bench, ldlm_env, args.filter, args.repetitions)
    torch = run_torch(torch_env, args.filter, args.torch_budget)
    rows = build_rows(ldlm["results"], torch["results"])
    if not any(r["torch_ms"] is not None for r in rows):
        sys.exit("compare.py: no case ran on both sides; --filter matches case names such as "
                 "'denoiser' or '^attn_' (without the '/threads:N' suffix)")

    meta = {
        "env_mode": args.env,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "host_cpu": cpu_name(),
        "load_average": " / ".join(f"{x:.1f}" for x in load),
        "torch_version": torch["context"]["torch_version"],
        "torch_cpu_capability": ", ".join(f"{n}T: {c}" for n, c in torch["context"]["cpu_capability"].items()),
        "env_ldlm": {v: ldlm_env.get(v) for v in REPORTED_VARS},
        "env_torch": {v: torch_env.get(v) for v in REPORTED_VARS},
        "peak_gflops_per_core": PEAK_GFLOPS_PER_CORE,
    }
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "ldlm_context": ldlm["context"], "torch_context": torch["context"]},
                  f, indent=2)
        f.write("\n")
    write_markdown(os.path.join(args.out_dir, "results.md"), rows, meta)
    write_plot(os.path.join(args.out_dir, "ratios.png"), rows, args.env)
    missing = [f"{r['case']}@{r['threads']}" for r in rows if r["torch_ms"] is None]
    if missing:
        print("compare.py: no PyTorch timing for " + ", ".join(missing), file=sys.stderr)
    with open(os.path.join(args.out_dir, "results.md")) as f:
        print(f.read())


if __name__ == "__main__":
    main()
