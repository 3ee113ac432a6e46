#!/usr/bin/python3
"""Texts per second of ldlm.dask on a LocalCluster of 1 and of 2 worker processes (one
thread each), and of the same requests serially in this process, on the demo model.

    PYTHONPATH=build/default/python /usr/bin/python3 bench/dask_throughput.py \
        --rounds 5 --out bench/results/dask-<cpu>.md

The request set is fixed (REQUESTS). Both clusters start first and run the set once
to load the model in every worker; then each round times the three ways once, in an
order that rotates from round to round, so a slow minute of a shared machine falls on
each of them in turn. A time is the wall time of the whole batch, results gathered.
Last, the request time of fresh processes with and without Dask's nanny's malloc
setting, and with ldlm.dask's undoing of it (docs/dask.md).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

import ldlm.dask
from distributed import Client, LocalCluster

# 64 requests, 1 text each, every task kind, the default sampler (10 steps).
REQUESTS = ([{"task": "generate", "length": 64, "seed": s} for s in range(48)]
            + [{"task": "infill", "text": "The <|mask|> sat on the <|mask|><|mask|> by the door.", "seed": s}
               for s in range(8)]
            + [{"task": "continue", "prompt": "The old man", "length": 48, "seed": s} for s in range(8)])


def cpu_name() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return ", ".join(f"{k} {fields[k].strip()}" for k in ("Model name", "CPU family", "Model", "CPU(s)") if k in fields)


# One process: the demo model, then the mean seconds of 20 requests of 64 tokens.
MALLOC_PROBE = """
import sys, time, ldlm, ldlm.dask
if sys.argv[1] == "undo":
    ldlm.dask._undo_nanny_malloc_setting()
lm = ldlm.TextModel.demo()
lm.generate(length=64, threads=1)
t0 = time.perf_counter()
for seed in range(20):
    lm.generate(length=64, seed=seed, threads=1)
print((time.perf_counter() - t0) / 20)
"""
MALLOC_WAYS = {"plain": ({}, "keep"), "nanny's MALLOC_TRIM_THRESHOLD_=65536": ({"MALLOC_TRIM_THRESHOLD_": "65536"}, "keep"),
               "the same, then ldlm.dask's mallopt": ({"MALLOC_TRIM_THRESHOLD_": "65536"}, "undo")}


def malloc_rounds(rounds: int) -> dict:
    """Seconds per request in a fresh process, with and without the nanny's setting."""
    seconds = {name: [] for name in MALLOC_WAYS}
    for _ in range(rounds):
        for name, (env, mode) in MALLOC_WAYS.items():
            # Without the variable unless asked: starting a LocalCluster leaves it in this
            # process's os.environ (distributed 2022.12).
            base = {k: v for k, v in os.environ.items() if k != "MALLOC_TRIM_THRESHOLD_"}
            out = subprocess.run([sys.executable, "-c", MALLOC_PROBE, mode], env=dict(base, **env),
                                 capture_output=True, text=True, check=True).stdout
            seconds[name].append(float(out))
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", help="markdown file to write (default: stdout only)")
    a = ap.parse_args()

    texts = len(REQUESTS)
    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    kw = dict(threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None)
    with LocalCluster(n_workers=1, **kw) as c1, Client(c1) as one, \
         LocalCluster(n_workers=2, **kw) as c2, Client(c2) as two:
        serial = ldlm.dask.generate_serial(REQUESTS)
        assert all("text" in r for r in serial), [r for r in serial if "error" in r][:1]
        for client in (one, two):
            assert ldlm.dask.generate_many(client, REQUESTS, timeout=600) == serial, "differs from the serial run"
        ways = {"serial, this process": lambda: ldlm.dask.generate_serial(REQUESTS),
                "1 worker": lambda: ldlm.dask.generate_many(one, REQUESTS, timeout=600),
                "2 workers": lambda: ldlm.dask.generate_many(two, REQUESTS, timeout=600)}
        rates = {name: [] for name in ways}
        names = list(ways)
        for r in range(a.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                t0 = time.perf_counter()
                result = ways[name]()
                rates[name].append(texts / (time.perf_counter() - t0))
                assert result == serial, f"{name} differs from the serial run"
            print(f"round {r + 1}: " + ", ".join(f"{n} {rates[n][-1]:.1f}/s" for n in names), flush=True)
    malloc = malloc_rounds(3)
    load_after = os.getloadavg()

    median1, median2 = statistics.median(rates["1 worker"]), statistics.median(rates["2 workers"])
    paired = [b / o for o, b in zip(rates["1 worker"], rates["2 workers"])]
    lines = [
        "# ldlm.dask throughput",
        "",
        f"Texts per second of `ldlm.dask.generate_many` on the demo model (fp32), {texts} requests of one text",
        "each (48 `generate` of 64 tokens, 8 `infill` of 3 masked tokens in a 13-token text, 8 `continue`",
        "of 48 tokens; seeds 0–47 and 0–7; the default sampler, 10 steps; 1 thread per request),",
        "on a `LocalCluster` of 1 and of 2 worker processes with one thread each, and serially in the",
        "client's process (`generate_serial`, the same function without Dask). Every batch's results",
        "were checked equal to the serial run's.",
        "",
        f"- CPU: {cpu_name()} (`lscpu`); Python {platform.python_version()}, "
        f"dask/distributed {__import__('distributed').__version__}",
        f"- {started}, {a.rounds} rounds, each timing the three ways once in a rotating order",
        f"- load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after",
        "- command: `PYTHONPATH=build/default/python /usr/bin/python3 bench/dask_throughput.py "
        f"--rounds {a.rounds} --out <this file>`",
        "",
        "| | median texts/s | range | per round |",
        "|---|---|---|---|",
    ]
    for name in names:
        v = rates[name]
        lines.append(f"| {name} | {statistics.median(v):.1f} | {min(v):.1f}–{max(v):.1f} | "
                     + ", ".join(f"{x:.1f}" for x in v) + " |")
    lines += ["",
              f"2 workers / 1 worker: {median2 / median1:.2f}× (medians); paired by round "
              f"{min(paired):.2f}–{max(paired):.2f}×."]
    lines += ["",
              "The nanny's malloc setting: seconds per demo-model request of 64 tokens (mean of 20, after one",
              "untimed), each in a fresh process, 3 rounds in turn (`MALLOC_PROBE` in the script). Dask's nanny",
              "starts workers with `MALLOC_TRIM_THRESHOLD_=65536`; ldlm.dask undoes it in each worker (docs/dask.md).",
              "",
              "| process | median s/request | range |",
              "|---|---|---|"]
    for name, v in malloc.items():
        lines.append(f"| {name} | {statistics.median(v):.3f} | {min(v):.3f}–{max(v):.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
