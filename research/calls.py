#!/usr/bin/env python3
"""Denoiser calls against agreement with a converged reference, through `ldlm generate`
(research/results/calls-demo-amd-epyc-zen5.md; issue 38 part 5).

  PYTHONPATH=tools python3 -m research.calls --ldlm build/default/tools/ldlm/ldlm \\
      --weights tools/assets/ldlm-demo/ldlm-demo.safetensors --seeds 8-31 --calls 6,10 \\
      --rows dpmpp-3m:karras:previous,unipc-3m:lambda:extrapolated --output R.json

Each cell runs `ldlm generate --length 64 --ids --quiet --threads 1 --seed S --sampler K
--steps N --schedule G --self-condition C` and scores the share of its ids equal to those
of the reference, `--sampler ode --steps 2000 --schedule karras --self-condition previous`
(Euler on the probability-flow ODE; the default grid and self-condition when the tables were
first measured) from the same seed. A row is SAMPLER:GRID:SELF_CONDITION, GRID optionally
followed by options, e.g. `karras/rho=5`. The seeds are independent, so a cell's spread is
the standard error of its per-seed mean; a row's gain over the first row is paired by seed,
and its standard error is that of the per-seed differences, which cancels the seeds'
shared difficulty. The per-seed figures go to the JSON, so tables can be recomputed.
"""
import argparse
import json
import math
import subprocess
import sys


def seed_list(text):
    seeds = []
    for field in text.split(","):
        low, _, high = field.partition("-")
        seeds.extend(range(int(low), int(high or low) + 1))
    return seeds


def generate(ldlm, weights, length, seed, extra):
    command = [ldlm, "generate", "--length", str(length), "--ids", "--quiet", "--threads", "1", "--seed", str(seed)]
    if weights:
        command += ["--weights", weights]
    done = subprocess.run(command + extra, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"research.calls: `{' '.join(command + extra)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout.split()


def row_arguments(row, steps):
    sampler, grid, self_condition = row.split(":")
    name, *options = grid.split("/")
    extra = ["--sampler", sampler, "--steps", str(steps), "--schedule", name, "--self-condition", self_condition]
    for option in options:
        key, _, value = option.partition("=")
        extra += ["--" + key, value]
    return extra


def mean_and_error(values):
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, float("nan")
    variance = sum((v - m) ** 2 for v in values) / (len(values) - 1)
    return m, math.sqrt(variance / len(values))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ldlm", required=True, help="the ldlm tool")
    ap.add_argument("--weights", default="", help="model file; default: the tool's built-in model")
    ap.add_argument("--seeds", default="8-31", help="e.g. 8-31 or 0,3,5")
    ap.add_argument("--calls", default="6,10")
    ap.add_argument("--rows", required=True, help="SAMPLER:GRID:SELF_CONDITION,...; the first is the baseline")
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--reference-steps", type=int, default=2000)
    ap.add_argument("--reference-cache", default="", help="JSON of reference ids by seed, read and extended")
    ap.add_argument("--output", required=True)
    a = ap.parse_args()

    seeds, calls, rows = seed_list(a.seeds), [int(c) for c in a.calls.split(",")], a.rows.split(",")
    cache = {}
    if a.reference_cache:
        try:
            with open(a.reference_cache) as f:
                cache = json.load(f)
        except FileNotFoundError:
            pass
    # Grid and self-condition spelled out, so that the reference stays the one of the tables whatever the
    # defaults become.
    reference_arguments = ["--sampler", "ode", "--steps", str(a.reference_steps), "--schedule", "karras",
                           "--self-condition", "previous"]
    key = lambda s: f"{a.weights}|{a.length}|{a.reference_steps}|{s}"
    for s in seeds:
        if key(s) not in cache:
            cache[key(s)] = generate(a.ldlm, a.weights, a.length, s, reference_arguments)
    if a.reference_cache:
        with open(a.reference_cache, "w") as f:
            json.dump(cache, f)

    per_seed = {}
    for row in rows:
        for n in calls:
            scores = []
            for s in seeds:
                ids, reference = generate(a.ldlm, a.weights, a.length, s, row_arguments(row, n)), cache[key(s)]
                scores.append(sum(x == y for x, y in zip(ids, reference)) / len(reference))
            per_seed[f"{row} {n}"] = scores
            m, e = mean_and_error(scores)
            print(f"{row:40s} {n:3d} calls: {m:.3f} ± {e:.3f}", file=sys.stderr, flush=True)

    lines = [f"| solver:grid:self-condition | " + " | ".join(f"{n} calls" for n in calls) + " |",
             "|---|" + "---|" * len(calls)]
    for row in rows:
        cells = []
        for n in calls:
            m, e = mean_and_error(per_seed[f"{row} {n}"])
            cell = f"{m:.3f} ± {e:.3f}"
            if row != rows[0]:
                d, de = mean_and_error([x - y for x, y in zip(per_seed[f"{row} {n}"], per_seed[f"{rows[0]} {n}"])])
                cell += f" ({d:+.3f} ± {de:.3f})"
            cells.append(cell)
        lines.append(f"| `{row}` | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    with open(a.output, "w") as f:
        json.dump({"meta": {"weights": a.weights, "seeds": seeds, "length": a.length,
                            "reference": " ".join(reference_arguments), "baseline": rows[0]},
                   "per_seed": per_seed, "table": table}, f, indent=1)


if __name__ == "__main__":
    main()
