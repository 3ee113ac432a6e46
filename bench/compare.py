#!/usr/bin/python3
"""ldlm's denoiser forward against PyTorch CPU, fp32 and bf16, with the machine's measured peak.

One command (Debian's python, which has torch 1.13):
    /usr/bin/python3 bench/compare.py --build build/default --out bench/results/<cpu>.md
Build first: cmake --preset default
             cmake --build build/default --target ldlm_bench ldlm_cli

What it runs, one after the other (never two at once):
  1. ldlm: build/.../bench/ldlm_bench, cases denoiser_T (T = 128..1024, 1 and 2
     threads, bf16:0 and bf16:1) and peak_* (bench_peak.cpp: zmm fp32 FMA and,
     where the CPU has AVX512_BF16, the vdpbf16ps dot-product peak, and where it has
     AMX, the AMX tile peak: the bf16 column uses the AMX peak where ldlm's bf16
     linear kernel is AMX, else vdpbf16ps's). ldlm runs as
     shipped: LDLM_*, ONEDNN_*, DNNL_*, GLIBC_TUNABLES, MALLOC_* and LD_PRELOAD are
     removed from its environment.
  2. PyTorch (bench/torch_bench.py, same cases and FLOP counts): fp32, and
     torch.autocast('cpu', dtype=torch.bfloat16), each at its best. Every variant
     of TORCH_VARIANTS (instruction set, OpenBLAS core type, OpenMP wait policy, all
     with the malloc tunables that keep PyTorch's temporaries in the heap) is timed
     at T = --screen-T; the fastest variant of each (threads, precision) then runs
     every T, and each row takes the fastest time measured for it.
  3. With --paired-rounds N: N more rounds of ldlm fp32 and PyTorch fp32 (its winning
     variant) at T = 1024, one after the other in alternating order, each ldlm run
     with the fp32 peak in the same process. The fp32 targets are then also given as
     the medians of these paired ratios: on a shared host the clock moves by 10 %
     from one minute to the next (seen on an AMD EPYC Zen 1), which a single ratio
     of runs minutes apart cannot tell from a difference in speed.
  4. Memory: `ldlm generate --init-seed 7 --length 1024 --ids` (ldlm-base) at --precision fp32 and bf16, peak
     RSS of each process (wait4's ru_maxrss), and their ratio.
Writes --out (markdown: the table, the targets of issue 11, the environment), the
same name with .json (every number, both benchmark contexts) and with .png (the
PyTorch/ldlm ratios per T and thread count, fp32 and bf16; needs matplotlib).

Other forms:
    compare.py memory --build build/default [--length 1024]   # step 4 alone
    compare.py render bench/results/<cpu>.json   # the markdown and plot again, from the JSON
    compare.py ... --quick          # smoke test: T = 128, 1 repetition, short budgets
    compare.py ... --all-cases      # also every layer/module case of ldlm_bench
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH_DIR)
TORCH_PYTHON = "/usr/bin/python3"  # Debian's python3-torch
TIME_UNIT_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
BEST_GLIBC_TUNABLES = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296"
REPORTED_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "ATEN_CPU_CAPABILITY", "GLIBC_TUNABLES", "OMP_WAIT_POLICY",
                 "OMP_NUM_THREADS", "LDLM_GEMM_BACKEND", "ONEDNN_MAX_CPU_ISA")
# ldlm as shipped: nothing that changes its products or its allocator.
LDLM_SCRUBBED_PREFIXES = ("LDLM_", "ONEDNN_", "DNNL_", "MALLOC_")
LDLM_SCRUBBED_VARS = ("GLIBC_TUNABLES", "LD_PRELOAD")
# PyTorch variants: name -> (variables to set, variables to remove). "ambient" is
# the environment as it is (on this project's VM: OpenBLAS pinned to Haswell and
# mapped temporaries, several times slower); it runs only when asked for.
TORCH_VARIANTS = {
    "avx512": ({"ATEN_CPU_CAPABILITY": "avx512", "GLIBC_TUNABLES": BEST_GLIBC_TUNABLES},
               ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")),
    "avx512+SkylakeX": ({"ATEN_CPU_CAPABILITY": "avx512", "OPENBLAS_CORETYPE": "SkylakeX",
                         "GLIBC_TUNABLES": BEST_GLIBC_TUNABLES}, ("OPENBLAS_L2_SIZE",)),
    "avx2+Haswell": ({"ATEN_CPU_CAPABILITY": "avx2", "OPENBLAS_CORETYPE": "Haswell",
                      "GLIBC_TUNABLES": BEST_GLIBC_TUNABLES}, ("OPENBLAS_L2_SIZE",)),
    "avx512+omp-active": ({"ATEN_CPU_CAPABILITY": "avx512", "OMP_WAIT_POLICY": "ACTIVE",
                           "GLIBC_TUNABLES": BEST_GLIBC_TUNABLES}, ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")),
    # OpenBLAS's own choice of core, where it knows the CPU (an AMD EPYC Zen 1: "Zen").
    "avx2": ({"ATEN_CPU_CAPABILITY": "avx2", "GLIBC_TUNABLES": BEST_GLIBC_TUNABLES},
             ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")),
    "avx2+omp-active": ({"ATEN_CPU_CAPABILITY": "avx2", "OMP_WAIT_POLICY": "ACTIVE",
                         "GLIBC_TUNABLES": BEST_GLIBC_TUNABLES}, ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")),
    "ambient": ({}, ()),
}
# The /proc/cpuinfo flags a variant's instructions need: PyTorch's AVX512 kernels and
# OpenBLAS's SkylakeX core die on SIGILL without AVX-512 (seen on an AMD EPYC Zen 1).
AVX512_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq")
AVX2_FLAGS = ("avx2", "fma")
TORCH_VARIANT_NEEDS = {name: AVX512_FLAGS if name.startswith("avx512") else AVX2_FLAGS if name.startswith("avx2")
                       else () for name in TORCH_VARIANTS}
DEFAULT_TORCH_VARIANTS_AVX512 = ("avx512", "avx512+SkylakeX", "avx2+Haswell", "avx512+omp-active")
DEFAULT_TORCH_VARIANTS_AVX2 = ("avx2", "avx2+Haswell", "avx2+omp-active")
PRECISIONS = ("fp32", "bf16")
# Issue 11's targets (denoiser forward, B = 1, T = 1024).
TARGET_T = 1024
TARGET_FP32_VS_TORCH = 1.3
TARGET_FP32_PCT_PEAK = 75.0
TARGET_BF16_VS_FP32 = 1.6
TARGET_RSS_RATIO = 0.6
# With AMX: ldlm bf16 against PyTorch autocast-bf16 at its best, per thread count.
TARGET_BF16_AMX_VS_TORCH = {1: 4.0, 2: 3.5}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ldlm_env() -> dict:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(LDLM_SCRUBBED_PREFIXES) and k not in LDLM_SCRUBBED_VARS}


def torch_env(variant: str) -> dict:
    set_vars, removed = TORCH_VARIANTS[variant]
    env = {k: v for k, v in os.environ.items() if k not in removed}
    env.update(set_vars)
    return env


# --- CPU ----------------------------------------------------------------------------


def proc_cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def proc_cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def runnable_variants(variants: list, flags: set) -> list:
    """The variants whose instructions this CPU has; the others are named and left out."""
    if not flags:
        log("compare.py: no CPU flags in /proc/cpuinfo; every variant is tried")
        return variants
    runnable = [v for v in variants if all(f in flags for f in TORCH_VARIANT_NEEDS[v])]
    for v in variants:
        if v not in runnable:
            log(f"compare.py: PyTorch variant {v} left out: this CPU lacks "
                + ", ".join(f for f in TORCH_VARIANT_NEEDS[v] if f not in flags))
    return runnable


def default_variants(flags: set) -> tuple:
    return DEFAULT_TORCH_VARIANTS_AVX512 if all(f in flags for f in AVX512_FLAGS) else DEFAULT_TORCH_VARIANTS_AVX2


def cpu_name(context: dict) -> str:
    """/proc/cpuinfo's model name, and the CPUID brand (ldlm's) when it differs."""
    model = proc_cpu_model()
    brand = context.get("ldlm_cpu_brand", "")
    if brand and brand != "unknown" and brand != model:
        return f"{model} (CPUID: {brand})"
    return model


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "cpu"


# --- ldlm ---------------------------------------------------------------------------


def parse_ldlm_name(name: str) -> dict:
    """'denoiser_T/T:128/threads:1/bf16:0/real_time' -> {case: 'denoiser_T/T:128', threads: 1, precision: 'fp32'}."""
    parts = [p for p in name.split("/") if p != "real_time" and not p.startswith("repeats:")]
    out = {"threads": 1, "precision": "fp32"}
    case = []
    for p in parts:
        if p.startswith("threads:"):
            out["threads"] = int(p.split(":")[1])
        elif p.startswith("bf16:"):
            out["precision"] = "bf16" if p.split(":")[1] == "1" else "fp32"
        else:
            case.append(p)
    out["case"] = "/".join(case)
    return out


def run_ldlm(binary: str, pattern: str, repetitions: int, min_time: float | None) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        path = out.name
    cmd = [binary, f"--benchmark_out={path}", "--benchmark_out_format=json", f"--benchmark_filter={pattern}"]
    if repetitions > 1:  # the file keeps every repetition: the peak takes the fastest
        cmd += [f"--benchmark_repetitions={repetitions}", "--benchmark_display_aggregates_only=true"]
        # Repetitions of the cases and of the peak in one random order: on a shared
        # host a slow minute then weighs on a case and on the peak alike, instead of
        # on whichever happened to run in it.
        cmd.append("--benchmark_enable_random_interleaving=true")
    if min_time is not None:
        cmd.append(f"--benchmark_min_time={min_time}")
    log("+ " + " ".join(cmd))
    subprocess.run(cmd, env=ldlm_env(), check=True, stdout=sys.stderr)  # console table as progress
    with open(path) as f:
        doc = json.load(f)
    os.unlink(path)
    results, peaks = {}, {}
    # Cases: the median over repetitions (the single run without repetitions). Peaks:
    # the fastest repetition, since a peak is what the machine can do at best.
    for b in doc["benchmarks"]:
        aggregate = b.get("run_type") == "aggregate"
        if aggregate and b.get("aggregate_name") != "median":
            continue
        key = parse_ldlm_name(b.get("run_name", b["name"]))
        if b.get("error_occurred"):
            log(f"ldlm: {b['name']}: {b.get('error_message', 'error')}")
            continue
        ms = b["real_time"] * TIME_UNIT_MS[b["time_unit"]]
        entry = {"ms": ms, "cpu_ms": b["cpu_time"] * TIME_UNIT_MS[b["time_unit"]],
                 "gflops": b["FLOPS"] * 1e-9, "flops": b["FLOPS"] * ms * 1e-3, "label": b.get("label", "")}
        if key["case"].startswith("peak_"):
            k = (key["case"], key["threads"])
            if not aggregate and (k not in peaks or entry["gflops"] > peaks[k]["gflops"]):
                peaks[k] = entry
        elif aggregate or repetitions <= 1:
            results[(key["case"], key["threads"], key["precision"])] = entry
    return {"context": doc["context"], "results": results, "peaks": peaks}


# --- PyTorch ------------------------------------------------------------------------


def run_torch(variant: str, pattern: str, threads: list, precisions: list, budget: float, min_reps: int) -> dict:
    cmd = [TORCH_PYTHON, os.path.join(BENCH_DIR, "torch_bench.py"), "--filter", pattern,
           "--threads", ",".join(map(str, threads)), "--precisions", ",".join(precisions),
           "--budget", str(budget), "--min-reps", str(min_reps)]
    log(f"+ [{variant}] " + " ".join(cmd))
    doc = json.loads(subprocess.run(cmd, env=torch_env(variant), check=True, stdout=subprocess.PIPE, text=True).stdout)
    return doc


def torch_best(variants: list, case_patterns: dict, screen_pattern: str, threads: list, budget: float,
               screen_budget: float, min_reps: int) -> tuple[dict, dict, list]:
    """Times every variant on the screen case, then the fastest variant of each
    (threads, precision) on every case. Returns ({(case, threads, precision): best
    result + variant}, {(threads, precision): screen winner}, raw runs)."""
    measured, runs = {}, []

    def add(doc, variant):
        runs.append({"variant": variant, "context": doc["context"], "benchmarks": doc["benchmarks"]})
        for b in doc["benchmarks"]:
            key = (b["name"], b["threads"], b.get("precision", "fp32"))
            r = dict(b, variant=variant, cpu_capability=doc["context"]["cpu_capability"].get(str(b["threads"])))
            measured.setdefault(key, []).append(r)

    screen = {}
    if len(variants) > 1:
        for v in variants:
            doc = run_torch(v, screen_pattern, threads, list(PRECISIONS), screen_budget, min_reps)
            add(doc, v)
            for b in doc["benchmarks"]:
                k = (b["threads"], b["precision"])
                if k not in screen or b["ms"] < screen[k][1]:
                    screen[k] = (v, b["ms"])
        winners = {k: v for k, (v, _) in screen.items()}
    else:
        winners = {(n, p): variants[0] for n in threads for p in PRECISIONS}
    # One run per winning variant, over the (threads, precision) pairs it won.
    by_variant = {}
    for (n, p), v in sorted(winners.items()):
        by_variant.setdefault(v, {"threads": set(), "precisions": set(), "pairs": set()})
        by_variant[v]["threads"].add(n)
        by_variant[v]["precisions"].add(p)
        by_variant[v]["pairs"].add((n, p))
    for v, want in by_variant.items():
        # One run per precision when their cases differ (--torch-bf16-T), else one for both.
        groups = ([[p for p in PRECISIONS if p in want["precisions"]]] if len(set(case_patterns.values())) == 1
                  else [[p] for p in PRECISIONS if p in want["precisions"]])
        for precisions in groups:
            doc = run_torch(v, case_patterns[precisions[0]], sorted(want["threads"]), precisions, budget, min_reps)
            doc["benchmarks"] = [b for b in doc["benchmarks"] if (b["threads"], b["precision"]) in want["pairs"]]
            add(doc, v)
    best = {k: min(rs, key=lambda r: r["ms"]) for k, rs in measured.items()}
    return best, winners, runs


def paired_rounds(bench: str, winners: dict, threads: list, rounds: int, budget: float, min_reps: int,
                  min_time: float | None) -> list:
    """ldlm fp32 (with the fp32 FMA peak beside it) and PyTorch fp32 (the variant that
    won its screening) at T = TARGET_T, in `rounds` rounds per thread count. The
    order alternates from round to round, so a slow minute of a shared host falls on
    both sides of a ratio rather than on one. Returns one record per (round, threads)."""
    out = []
    case = f"denoiser_T/T:{TARGET_T}"
    for i in range(rounds):
        for n in threads:
            variant = winners.get((n, "fp32"))
            if variant is None:
                log(f"compare.py: no PyTorch fp32 timing at {n} threads, so no paired round there")
                continue

            def ldlm_side():
                run = run_ldlm(bench, f"^({case}/threads:{n}/bf16:0/|peak_fma_fp32/threads:{n}/)", 1, min_time)
                return run["results"].get((case, n, "fp32")), peak_of(run["peaks"], "peak_fma_fp32", n)

            def torch_side():
                doc = run_torch(variant, f"^{case}$", [n], ["fp32"], budget, min_reps)
                return next((b["ms"] for b in doc["benchmarks"] if b["threads"] == n), None)

            if i % 2 == 0:
                (mine, peak), theirs = ldlm_side(), torch_side()
            else:
                theirs = torch_side()
                mine, peak = ldlm_side()
            if mine is None or theirs is None:
                continue
            out.append({"round": i + 1, "threads": n, "ldlm_fp32_ms": mine["ms"], "torch_fp32_ms": theirs,
                        "torch_variant": variant, "peak_fp32_gflops": peak,
                        "torch_fp32_over_ldlm_fp32": ratio(theirs, mine["ms"]),
                        "fp32_pct_peak": ratio(mine["gflops"], peak) and 100 * ratio(mine["gflops"], peak)})
    return out


def paired_summary(paired: list, threads: int) -> dict | None:
    """Medians (and ranges) of a thread count's paired rounds."""
    mine = [p for p in paired if p["threads"] == threads]
    if not mine:
        return None

    def spread(key):
        values = [p[key] for p in mine if p[key] is not None]
        return (statistics.median(values), min(values), max(values)) if values else (None, None, None)

    return {"rounds": len(mine), "ratio": spread("torch_fp32_over_ldlm_fp32"), "pct_peak": spread("fp32_pct_peak")}


# --- memory -------------------------------------------------------------------------


def run_rss(cmd: list, env: dict) -> tuple[float, float]:
    """(peak RSS in MiB, wall seconds) of one process, from wait4's rusage."""
    log("+ " + " ".join(cmd))
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"compare.py: {' '.join(cmd)} exited with {proc.returncode}")
    return usage.ru_maxrss / 1024.0, time.perf_counter() - start  # Linux: ru_maxrss in KiB


def measure_memory(ldlm_tool: str, length: int, steps: int | None, threads: int | None) -> dict:
    if not os.access(ldlm_tool, os.X_OK):
        sys.exit(f"compare.py: no ldlm tool at {ldlm_tool} (cmake --build BUILD --target ldlm_cli)")
    out = {"length": length, "steps": steps, "threads": threads, "runs": {}}
    for p in PRECISIONS:
        cmd = [ldlm_tool, "generate", "--init-seed", "7", "--precision", p, "--length", str(length), "--ids", "--output", os.devnull]
        if steps is not None:
            cmd += ["--steps", str(steps)]
        if threads is not None:
            cmd += ["--threads", str(threads)]
        rss, seconds = run_rss(cmd, ldlm_env())
        out["runs"][p] = {"command": " ".join(cmd), "peak_rss_mib": rss, "seconds": seconds}
        log(f"ldlm generate --precision {p} --length {length}: peak RSS {rss:.1f} MiB, {seconds:.1f} s")
    out["ratio"] = out["runs"]["bf16"]["peak_rss_mib"] / out["runs"]["fp32"]["peak_rss_mib"]
    return out


def memory_markdown(mem: dict) -> list:
    fp32, bf16 = mem["runs"]["fp32"], mem["runs"]["bf16"]
    steps = f", --steps {mem['steps']}" if mem["steps"] is not None else " (default steps)"
    return [
        f"## Memory: `ldlm generate --length {mem['length']}`{steps}",
        "",
        "| precision | peak RSS MiB | wall s |",
        "|---|---:|---:|",
        f"| fp32 | {fp32['peak_rss_mib']:.1f} | {fp32['seconds']:.1f} |",
        f"| bf16 | {bf16['peak_rss_mib']:.1f} | {bf16['seconds']:.1f} |",
        "",
        f"bf16 / fp32 peak RSS: **{mem['ratio']:.3f}** (target ≤ {TARGET_RSS_RATIO}). Peak RSS is the process's "
        "ru_maxrss (wait4), as /usr/bin/time -v reports it.",
    ]


# --- report -------------------------------------------------------------------------


def fmt(v, spec, suffix=""):
    return "—" if v is None else format(v, spec) + suffix


def ratio(a, b):
    return a / b if a is not None and b is not None and b > 0 else None


def peak_of(peaks: dict, name: str, threads: int):
    e = peaks.get((name, threads))
    return e["gflops"] if e else None


def amx_ran(ctx: dict) -> bool:
    return "amx" in ctx.get("ldlm_bf16_linear", "")


def bf16_instructions_ran(ctx: dict) -> bool:
    """Whether ldlm's bf16 products ran on bf16 instructions, not on fp32 kernels."""
    linear = ctx.get("ldlm_bf16_linear", "")
    return "widened" not in linear and "rounded" not in linear


def bf16_peak_name(ctx: dict) -> str:
    """The peak of the instructions ldlm's bf16 products ran: AMX tiles or vdpbf16ps."""
    return "peak_amx_bf16" if amx_ran(ctx) else "peak_dot_bf16"


def build_rows(ldlm: dict, torch: dict, case_filter, threads_list: list) -> list:
    rows = []
    cases = []
    for (case, _, _) in ldlm["results"]:
        if case_filter(case) and case not in cases:
            cases.append(case)
    for case in cases:
        for n in threads_list:
            f, b = ldlm["results"].get((case, n, "fp32")), ldlm["results"].get((case, n, "bf16"))
            tf, tb = torch.get((case, n, "fp32")), torch.get((case, n, "bf16"))
            if not f and not b:
                continue
            pf = peak_of(ldlm["peaks"], "peak_fma_fp32", n)
            pb = peak_of(ldlm["peaks"], bf16_peak_name(ldlm["context"]), n)
            rows.append({
                "case": case, "threads": n,
                "ldlm_fp32_ms": f and f["ms"], "ldlm_bf16_ms": b and b["ms"],
                "torch_fp32_ms": tf and tf["ms"], "torch_bf16_ms": tb and tb["ms"],
                "torch_fp32_variant": tf and tf["variant"], "torch_bf16_variant": tb and tb["variant"],
                "ldlm_fp32_gflops": f and f["gflops"], "ldlm_bf16_gflops": b and b["gflops"],
                "torch_fp32_over_ldlm_fp32": ratio(tf and tf["ms"], f and f["ms"]),
                "torch_bf16_over_ldlm_bf16": ratio(tb and tb["ms"], b and b["ms"]),
                "ldlm_fp32_over_ldlm_bf16": ratio(f and f["ms"], b and b["ms"]),
                "peak_fp32_gflops": pf, "peak_bf16_gflops": pb,
                "fp32_pct_peak": ratio(f and f["gflops"], pf) and 100 * ratio(f["gflops"], pf),
                "bf16_pct_fp32_peak": ratio(b and b["gflops"], pf) and 100 * ratio(b["gflops"], pf),
                "bf16_pct_bf16_peak": ratio(b and b["gflops"], pb) and 100 * ratio(b["gflops"], pb),
                "ldlm_fp32_label": f and f["label"], "ldlm_bf16_label": b and b["label"],
                "ldlm_fp32_cpu_ms": f and f["cpu_ms"], "ldlm_bf16_cpu_ms": b and b["cpu_ms"],
                "torch_fp32_cpu_ms": tf and tf.get("cpu_ms"), "torch_bf16_cpu_ms": tb and tb.get("cpu_ms"),
            })
    return rows


def case_T(case: str) -> int:
    return int(case.split("T:")[1]) if "T:" in case else TARGET_T


def path_text(ctx: dict) -> str:
    return (f"fp32 {ctx.get('ldlm_fp32_linear', '?')} / {ctx.get('ldlm_fp32_attention', '?')}; "
            f"bf16 {ctx.get('ldlm_bf16_linear', '?')} / {ctx.get('ldlm_bf16_attention', '?')}")


def table(rows: list, ctx: dict, cpu: str, first_col: str) -> list:
    path = path_text(ctx)
    lines = [
        f"| {first_col} | threads | ldlm fp32 ms | ldlm bf16 ms | PyTorch fp32 ms | PyTorch bf16 ms | "
        "PyTorch fp32 / ldlm fp32 | PyTorch bf16 / ldlm bf16 | ldlm fp32 / ldlm bf16 | "
        "ldlm fp32 % of fp32 peak | ldlm bf16 % of bf16 peak | path (linear / attention) | CPU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        first = str(case_T(r["case"])) if first_col == "T" else r["case"]
        lines.append(
            f"| {first} | {r['threads']} | {fmt(r['ldlm_fp32_ms'], '.1f')} | {fmt(r['ldlm_bf16_ms'], '.1f')} | "
            f"{fmt(r['torch_fp32_ms'], '.1f')} | {fmt(r['torch_bf16_ms'], '.1f')} | "
            f"{fmt(r['torch_fp32_over_ldlm_fp32'], '.2f', '×')} | {fmt(r['torch_bf16_over_ldlm_bf16'], '.2f', '×')} | "
            f"{fmt(r['ldlm_fp32_over_ldlm_bf16'], '.2f', '×')} | {fmt(r['fp32_pct_peak'], '.1f')} | "
            f"{fmt(r['bf16_pct_bf16_peak'], '.1f')} | {path} | {cpu} |")
    return lines


def targets(rows: list, mem: dict | None, ctx: dict, paired: list | None = None) -> list:
    def mark(ok):
        return "—" if ok is None else ("PASS" if ok else "FAIL")

    lines = [f"## Targets (denoiser forward, B = 1, T = {TARGET_T}, ldlm as shipped)", "",
             "| target | threads | measured | result |", "|---|---:|---:|---|"]
    at = [r for r in rows if case_T(r["case"]) == TARGET_T]
    if not at:
        lines.append(f"| (T = {TARGET_T} not run: --T) | | | — |")
    for r in at:
        v = r["torch_fp32_over_ldlm_fp32"]
        lines.append(f"| fp32 ≥ {TARGET_FP32_VS_TORCH}× PyTorch fp32 best | {r['threads']} | {fmt(v, '.2f', '×')} | "
                     f"{mark(None if v is None else v >= TARGET_FP32_VS_TORCH)} |")
    note = "" if "zmm" in ctx.get("ldlm_peak_fp32_kernel", "") else " (peak not zmm: no AVX-512)"
    for r in at:
        v = r["fp32_pct_peak"]
        ok = None if v is None else v >= TARGET_FP32_PCT_PEAK
        lines.append(f"| fp32 ≥ {TARGET_FP32_PCT_PEAK:.0f}% of measured zmm FMA peak{note} | {r['threads']} | "
                     f"{fmt(v, '.1f', '%')} | {mark(ok)} |")
    for n in sorted({r["threads"] for r in at}):
        summary = paired_summary(paired or [], n)
        if summary is None:
            continue
        (v, lo, hi), (pct, pct_lo, pct_hi) = summary["ratio"], summary["pct_peak"]
        lines.append(f"| fp32 ≥ {TARGET_FP32_VS_TORCH}× PyTorch fp32 (its screened variant), median of "
                     f"{summary['rounds']} paired rounds (range {fmt(lo, '.2f')}–{fmt(hi, '.2f')}) | {n} | "
                     f"{fmt(v, '.2f', '×')} | {mark(None if v is None else v >= TARGET_FP32_VS_TORCH)} |")
        lines.append(f"| fp32 ≥ {TARGET_FP32_PCT_PEAK:.0f}% of the fp32 peak measured in the same round{note}, median "
                     f"(range {fmt(pct_lo, '.1f')}–{fmt(pct_hi, '.1f')}) | {n} | {fmt(pct, '.1f', '%')} | "
                     f"{mark(None if pct is None else pct >= TARGET_FP32_PCT_PEAK)} |")
    amx = amx_ran(ctx)
    for r in at:
        if amx:
            v, want = r["torch_bf16_over_ldlm_bf16"], TARGET_BF16_AMX_VS_TORCH.get(r["threads"])
            if want is None:
                continue
            lines.append(f"| bf16 with AMX ≥ {want}× PyTorch autocast-bf16 best | {r['threads']} | "
                         f"{fmt(v, '.2f', '×')} | {mark(None if v is None else v >= want)} |")
        elif bf16_instructions_ran(ctx):
            v = r["ldlm_fp32_over_ldlm_bf16"]
            lines.append(f"| bf16 ≥ {TARGET_BF16_VS_FP32}× ldlm fp32 (no AMX) | {r['threads']} | "
                         f"{fmt(v, '.2f', '×')} | {mark(None if v is None else v >= TARGET_BF16_VS_FP32)} |")
        else:
            v = r["ldlm_fp32_over_ldlm_bf16"]
            lines.append(f"| bf16 / ldlm fp32, no bf16 instructions (fp32 kernels; no target) | {r['threads']} | "
                         f"{fmt(v, '.2f', '×')} | — |")
    if mem:
        lines.append(f"| generate --length {mem['length']}: bf16 peak RSS ≤ {TARGET_RSS_RATIO}× fp32 | "
                     f"{mem['threads'] or 'all'} | {mem['ratio']:.3f} | {mark(mem['ratio'] <= TARGET_RSS_RATIO)} |")
    return lines


def write_markdown(path: str, doc: dict) -> None:
    meta, ctx, rows = doc["meta"], doc["ldlm_context"], doc["rows"]
    peaks = doc["peaks"]
    cpu = meta["cpu"]
    lines = [
        f"# ldlm vs PyTorch CPU: denoiser forward, fp32 and bf16 — {cpu}",
        "",
        f"{meta['date']}, {os.cpu_count()} logical CPUs, load average before the run {meta['load_average']}. "
        f"CPU features (CPUID): {ctx.get('ldlm_cpu_features', '?')}. ldlm products: {ctx.get('ldlm_products', '?')}. "
        f"PyTorch {meta['torch_version']}.",
        "",
        "Measured peak (bench_peak.cpp, GFLOP/s): " + ", ".join(
            f"{name} {n}T {fmt(peak_of(peaks, name, n), '.1f')}"
            for name in ("peak_fma_fp32", "peak_dot_bf16", "peak_amx_bf16") for n in meta["threads"]
            if name != "peak_amx_bf16" or peak_of(peaks, name, n) is not None) +
        f" (kernels: fp32 {ctx.get('ldlm_peak_fp32_kernel', '?')}, bf16 {ctx.get('ldlm_peak_bf16_kernel', '?')}, "
        f"AMX {ctx.get('ldlm_peak_amx_kernel', 'none')}). The bf16 column's peak is {bf16_peak_name(ctx)}, "
        "the instructions ldlm's bf16 products ran.",
        "",
        "Ratios > 1 mean ldlm (or ldlm bf16, in the last ratio) is faster. Rates count useful FLOPs, the same in "
        "both precisions (294·T·d² + 48·T²·d, bench/README.md); % of peak = ldlm GFLOP/s / measured peak at that "
        "thread count (bf16 also as % of the fp32 peak in the JSON). PyTorch: fp32 and "
        "torch.autocast('cpu', dtype=torch.bfloat16), each the fastest variant measured "
        "(variants and winners below). ldlm: no environment variables (LDLM_*, ONEDNN_*, DNNL_*, GLIBC_TUNABLES "
        f"removed); {meta['ldlm_repetitions']} repetition(s), median.",
        "",
        "## Denoiser forward against T",
        "",
    ]
    lines += table([r for r in rows if r["case"].startswith("denoiser_T/")], ctx, cpu, "T")
    lines += [""] + targets([r for r in rows if r["case"].startswith("denoiser_T/")], doc.get("memory"), ctx,
                            doc.get("paired"))
    if doc.get("paired"):
        lines += ["", f"## Paired rounds (fp32, T = {TARGET_T})", "",
                  "ldlm and PyTorch one after the other, the order alternating by round; each ldlm run measures "
                  "the fp32 peak in the same process.", "",
                  "| round | threads | ldlm fp32 ms | PyTorch fp32 ms | PyTorch variant | PyTorch / ldlm | "
                  "peak GFLOP/s | ldlm % of peak |", "|---:|---:|---:|---:|---|---:|---:|---:|"]
        for p in doc["paired"]:
            lines.append(f"| {p['round']} | {p['threads']} | {p['ldlm_fp32_ms']:.1f} | {p['torch_fp32_ms']:.1f} | "
                         f"{p['torch_variant']} | {fmt(p['torch_fp32_over_ldlm_fp32'], '.2f', '×')} | "
                         f"{fmt(p['peak_fp32_gflops'], '.1f')} | {fmt(p['fp32_pct_peak'], '.1f')} |")
    if doc.get("memory"):
        lines += [""] + memory_markdown(doc["memory"])
    other = [r for r in rows if not r["case"].startswith("denoiser_T/")]
    if other:
        lines += ["", "## Every case (B = 1, T = 1024)", ""] + table(other, ctx, cpu, "case")
    screened = ("Screened on `" + meta["screen_case"] + "`; the winner of each (threads, precision) ran every case."
                if len(meta["torch_variants"]) > 1 else "One variant (--torch-variants), no screening.")
    lines += ["", "## PyTorch variants", "", screened, "",
              "| variant | environment |", "|---|---|"]
    for v in meta["torch_variants"]:
        set_vars, removed = TORCH_VARIANTS[v]
        desc = ", ".join(f"`{k}={val}`" for k, val in set_vars.items()) or "as is"
        if removed:
            desc += "; unset " + ", ".join(f"`{k}`" for k in removed)
        lines.append(f"| {v} | {desc} |")
    lines += ["", "| threads | precision | winner |", "|---:|---|---|"]
    for (n, p), v in sorted(doc["torch_winners_keyed"].items()):
        lines.append(f"| {n} | {p} | {v} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write_plot_beside(markdown_path: str, rows: list, cpu: str) -> None:
    """The plot next to the markdown, same name with .png; none without matplotlib."""
    try:
        write_plot(os.path.splitext(markdown_path)[0] + ".png", rows, cpu)
    except ImportError:
        log("compare.py: no matplotlib, no plot")


def write_plot(path: str, rows: list, cpu: str) -> None:
    """PyTorch time / ldlm time per (T, threads), fp32 and bf16 bars, log scale, line at 1."""
    import math

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    rows = [r for r in rows if r["case"].startswith("denoiser_T/")]
    series = [("fp32", "torch_fp32_over_ldlm_fp32"), ("bf16 (PyTorch autocast)", "torch_bf16_over_ldlm_bf16")]
    values = [r[k] for r in rows for _, k in series if r[k]]
    if not values:
        return
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(rows) + 2), 5))
    width = 0.8 / len(series)
    for i, (label, key) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j, r in enumerate(rows) if r[key]]
        ys = [r[key] for r in rows if r[key]]
        ax.bar(xs, ys, width, label=label)
        for x, y in zip(xs, ys):
            ax.annotate(f"{y:.2f}", (x, y), ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_yscale("log")  # a ratio and its inverse sit at equal distances from 1
    lo, hi = min(values), max(values)
    ticks = [2.0 ** k for k in range(math.floor(math.log2(min(lo, 1.0))), math.ceil(math.log2(max(hi, 1.0))) + 1)]
    ax.set_yticks(ticks)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(ticks[0] / 1.1, ticks[-1] * 1.1)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"T={case_T(r['case'])}\n{r['threads']} thr" for r in rows])
    ax.set_ylabel("PyTorch time / ldlm time  (> 1: ldlm faster)")
    ax.set_title(f"Denoiser forward, B=1: ldlm vs PyTorch best ({cpu})", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- main ---------------------------------------------------------------------------


def parse_list(text: str, kind=int) -> list:
    return [kind(s) for s in text.split(",") if s]


def main_memory(argv: list) -> None:
    parser = argparse.ArgumentParser(prog="compare.py memory",
                                     description="Peak RSS of ldlm generate, fp32 against bf16.")
    parser.add_argument("--build", default=os.path.join(REPO, "build", "default"))
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=None, help="denoiser steps (default: the CLI's)")
    parser.add_argument("--threads", type=int, default=None, help="default: the CLI's (all cores)")
    args = parser.parse_args(argv)
    mem = measure_memory(os.path.join(args.build, "tools", "ldlm"), args.length, args.steps, args.threads)
    print("\n".join(memory_markdown(mem)))


def main_render(argv: list) -> None:
    """Writes the markdown (and plot) of a run again from its JSON, with this file's
    format: what a run measured stays as it was."""
    parser = argparse.ArgumentParser(prog="compare.py render",
                                     description="The markdown and plot of a compare.py run, from its JSON.")
    parser.add_argument("json", help="a .json that compare.py wrote")
    args = parser.parse_args(argv)
    with open(args.json) as f:
        doc = json.load(f)

    def threads_key(text):  # "peak_fma_fp32/threads:2" -> ("peak_fma_fp32", 2)
        name, n = text.rsplit("/threads:", 1)
        return name, int(n)

    doc["peaks"] = {threads_key(k): v for k, v in doc["peaks"].items()}
    doc["torch_winners_keyed"] = {(int(k.split("/")[0].split(":")[1]), k.split("/")[1]): v
                                  for k, v in doc["torch_winners_keyed"].items()}
    out = os.path.splitext(args.json)[0] + ".md"
    write_markdown(out, doc)
    write_plot_beside(out, doc["rows"], doc["meta"]["cpu"])
    log(f"compare.py: wrote {out} from {args.json}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "memory":
        main_memory(sys.argv[2:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "render":
        main_render(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--build", default=os.path.join(REPO, "build", "default"), help="CMake build directory")
    parser.add_argument("--out", default=None, help="markdown output (default bench/results/<cpuid brand>.md); "
                        "the JSON goes next to it")
    parser.add_argument("--T", default="128,256,512,1024", help="sequence lengths of the denoiser table")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repetitions", type=int, default=3, help="ldlm repetitions (median)")
    parser.add_argument("--min-time", type=float, default=None, help="ldlm --benchmark_min_time (seconds)")
    parser.add_argument("--torch-budget", type=float, default=2.0, help="seconds of timed PyTorch calls per case")
    parser.add_argument("--torch-min-reps", type=int, default=3)
    parser.add_argument("--torch-variants", default=None,
                        help="comma-separated, or 'all' (adds 'ambient'); one name skips the screening. Default: "
                        + ", ".join(DEFAULT_TORCH_VARIANTS_AVX512) + " on a CPU with AVX-512, else "
                        + ", ".join(DEFAULT_TORCH_VARIANTS_AVX2) + ". Variants whose instructions the CPU lacks "
                        "are left out. Known: " + ", ".join(TORCH_VARIANTS))
    parser.add_argument("--torch-bf16-T", default=None,
                        help="the T at which PyTorch autocast-bf16 runs (default: --T); where it has no bf16 "
                        "instructions a call takes minutes at T = 1024")
    parser.add_argument("--screen-T", type=int, default=256, help="T of the variant screening")
    parser.add_argument("--screen-budget", type=float, default=1.0)
    parser.add_argument("--memory-length", type=int, default=1024)
    parser.add_argument("--memory-steps", type=int, default=None, help="default: the CLI's")
    parser.add_argument("--paired-rounds", type=int, default=0,
                        help=f"after the table, this many rounds of ldlm and PyTorch fp32 at T = {TARGET_T}, "
                             "alternating, each with the peak: the fp32 targets as medians of paired ratios")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--all-cases", action="store_true", help="also every other ldlm_bench case")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: T=128, 1 repetition, short budgets, memory at --length 128 and 2 steps")
    args = parser.parse_args()
    if args.quick:
        args.T, args.repetitions, args.min_time = "128", 1, 0.01
        args.torch_budget, args.screen_budget, args.torch_min_reps = 0.2, 0.2, 1
        args.screen_T, args.memory_length, args.memory_steps = 128, 128, 2

    bench = os.path.join(args.build, "bench", "ldlm_bench")
    tool = os.path.join(args.build, "tools", "ldlm")
    if not os.access(bench, os.X_OK):
        sys.exit(f"compare.py: no ldlm_bench at {bench} (cmake --build {args.build} --target ldlm_bench)")
    if not args.no_memory and not os.access(tool, os.X_OK):
        sys.exit(f"compare.py: no ldlm tool at {tool} (cmake --build {args.build} --target ldlm_cli), or --no-memory")
    flags = proc_cpu_flags()
    if args.torch_variants is None:
        variants = list(default_variants(flags))
    elif args.torch_variants == "all":
        variants = list(TORCH_VARIANTS)
    else:
        variants = parse_list(args.torch_variants, str)
    for v in variants:
        if v not in TORCH_VARIANTS:
            sys.exit(f"compare.py: unknown --torch-variants entry {v!r}; known: {', '.join(TORCH_VARIANTS)}")
    variants = runnable_variants(variants, flags)
    if not variants:
        sys.exit("compare.py: no PyTorch variant of --torch-variants runs on this CPU")
    Ts, threads = parse_list(args.T), parse_list(args.threads)
    t_alt, n_alt = "|".join(map(str, Ts)), "|".join(map(str, threads))

    started = time.time()
    load = os.getloadavg()
    # ldlm: the cases, then the peak (registration order), in one process.
    pattern = f"^(denoiser_T/T:({t_alt})/threads:({n_alt})/|peak_[a-z0-9_]+/threads:({n_alt})/"
    pattern += f"|[a-z0-9_]+/threads:({n_alt})/bf16:" if args.all_cases else ""
    pattern += ")"
    ldlm = run_ldlm(bench, pattern, args.repetitions, args.min_time)

    others = "|^(?!denoiser_T)" if args.all_cases else ""
    torch_cases = {"fp32": f"^denoiser_T/T:({t_alt})$" + others}
    bf16_t_alt = "|".join(map(str, parse_list(args.torch_bf16_T))) if args.torch_bf16_T else t_alt
    torch_cases["bf16"] = f"^denoiser_T/T:({bf16_t_alt})$" + others
    screen_case = f"^denoiser_T/T:{args.screen_T}$"
    torch, winners, torch_runs = torch_best(variants, torch_cases, screen_case, threads, args.torch_budget,
                                            args.screen_budget, args.torch_min_reps)
    paired = []
    if args.paired_rounds > 0 and TARGET_T not in Ts:
        log(f"compare.py: --paired-rounds runs at T = {TARGET_T}, which --T leaves out: no paired rounds")
    elif args.paired_rounds > 0:
        paired = paired_rounds(bench, winners, threads, args.paired_rounds, args.torch_budget, args.torch_min_reps,
                               args.min_time)
    mem = None if args.no_memory else measure_memory(tool, args.memory_length, args.memory_steps, None)

    ctx = ldlm["context"]
    rows = build_rows(ldlm, torch, lambda c: c.startswith("denoiser_T/") and case_T(c) in Ts, threads)
    rows.sort(key=lambda r: (case_T(r["case"]), r["threads"]))
    if args.all_cases:
        rows += build_rows(ldlm, torch, lambda c: not c.startswith("denoiser_T"), threads)
    torch_version = torch_runs[0]["context"]["torch_version"] if torch_runs else "?"
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"), "cpu": cpu_name(ctx), "proc_cpu_model": proc_cpu_model(),
        "load_average": " / ".join(f"{x:.1f}" for x in load), "load_average_after": os.getloadavg(),
        "duration_s": None, "threads": threads, "T": Ts, "ldlm_repetitions": args.repetitions,
        "torch_version": torch_version, "torch_variants": variants, "screen_case": screen_case,
        "env_ldlm": {v: ldlm_env().get(v) for v in REPORTED_VARS},
        "command": " ".join(sys.argv),
    }
    doc = {"meta": meta, "rows": rows, "peaks": ldlm["peaks"], "memory": mem, "ldlm_context": ctx, "paired": paired,
           "torch_winners_keyed": winners, "torch_runs": torch_runs}
    out = args.out or os.path.join(BENCH_DIR, "results", slug(ctx.get("ldlm_cpu_brand") or proc_cpu_model()) + ".md")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    meta["duration_s"] = round(time.time() - started, 1)
    write_markdown(out, doc)
    json_doc = dict(doc, peaks={f"{k[0]}/threads:{k[1]}": v for k, v in ldlm["peaks"].items()},
                    torch_winners_keyed={f"threads:{k[0]}/{k[1]}": v for k, v in winners.items()})
    with open(os.path.splitext(out)[0] + ".json", "w") as f:
        json.dump(json_doc, f, indent=2)
        f.write("\n")
    write_plot_beside(out, rows, meta["cpu"])
    missing = [f"{r['case']}@{r['threads']}" for r in rows if r["torch_fp32_ms"] is None or r["torch_bf16_ms"] is None]
    if missing:
        log("compare.py: no PyTorch timing for " + ", ".join(missing))
    with open(out) as f:
        print(f.read())
    log(f"compare.py: wrote {out} and {os.path.splitext(out)[0]}.json in {meta['duration_s']:.0f} s")


if __name__ == "__main__":
    main()
