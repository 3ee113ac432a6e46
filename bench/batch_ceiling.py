#!/usr/bin/env python3
"""What batching can gain for `ldlm serve`'s load (bench/serve_load.py's request), measured on
the library alone: the time per text of TextModel.infill at batch B against batch 1, with no
server, HTTP or client in the way. The server's batching cannot beat this ratio.

    PYTHONPATH=build/default/python python3 bench/batch_ceiling.py [--batches 1,2,4,8,16] [--rounds 5]

Each round times every batch size once, in an order that reverses from round to round (so a
drift of the machine's speed falls on all sizes), after a warm-up call per size; it prints
the median and range over rounds of ms per call and ms per text, each size's speed-up
per text over batch 1, and the process's CPU time per text (all its threads: on a shared
machine the wall time of a second thread is not the work it does).
"""

import argparse
import os
import statistics
import time

import ldlm

from serve_load import TEXT


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,2,4,8,16", help="batch sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20, help="calls per size and round (timed together)")
    parser.add_argument("--threads", type=int, default=0, help="TextModel's threads; 0: every core")
    args = parser.parse_args()
    sizes = [int(b) for b in args.batches.split(",")]
    model = ldlm.TextModel.demo()
    for b in sizes:
        model.infill(TEXT, batch=b, threads=args.threads)
    per_call = {b: [] for b in sizes}
    cpu_per_call = {b: [] for b in sizes}
    for r in range(args.rounds):
        for b in (sizes if r % 2 == 0 else sizes[::-1]):
            started, cpu_started = time.perf_counter(), time.process_time()
            for k in range(args.calls):
                model.infill(TEXT, batch=b, seed=k, threads=args.threads)
            per_call[b].append(1e3 * (time.perf_counter() - started) / args.calls)
            cpu_per_call[b].append(1e3 * (time.process_time() - cpu_started) / args.calls)
    base = statistics.median(per_call[sizes[0]]) / sizes[0]
    print(f"TextModel.infill of {TEXT!r}, threads={args.threads or 'every core'}, {args.rounds} rounds "
          f"of {args.calls} calls; median [min, max]; load average {os.getloadavg()[0]:.1f}")
    print(f"| batch | ms per call | ms per text | speed-up per text over batch {sizes[0]} | CPU ms per text |")
    print("|---:|---|---|---:|---|")
    for b in sizes:
        calls, cpu = per_call[b], cpu_per_call[b]
        print(f"| {b} | {statistics.median(calls):.2f} [{min(calls):.2f}, {max(calls):.2f}] | "
              f"{statistics.median(calls) / b:.2f} [{min(calls) / b:.2f}, {max(calls) / b:.2f}] | "
              f"{base / (statistics.median(calls) / b):.2f}× | "
              f"{statistics.median(cpu) / b:.2f} [{min(cpu) / b:.2f}, {max(cpu) / b:.2f}] |")


if __name__ == "__main__":
    main()
