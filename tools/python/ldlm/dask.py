"""Batch generation on a Dask cluster: generation, continuation and infill requests
mapped over the workers of a `dask.distributed` client (docs/dask.md).

    from distributed import Client
    import ldlm.dask
    with Client("tcp://scheduler:8786") as client:
        results = ldlm.dask.generate_many(client, [
            {"task": "infill", "text": "The <|mask|> sat.", "seed": 1},
            {"task": "continue", "prompt": "The old man", "length": 32},
            {"task": "generate", "length": 32, "seed": 3},
        ])
    # [{"text": [...]}, {"text": [...]}, {"text": [...]}], or {"error": "..."} for a bad request

    python3 -m ldlm.dask in.jsonl out.jsonl --scheduler tcp://scheduler:8786 [--model PATH]

A request is a dict of TextModel's keyword arguments plus its `task`: "generate",
"continue" (TextModel.continue_text, with `prompt`) or "infill" (with `text`). The
answer is one dict per request, in order. A request that fails (an unknown task, a
missing text, an argument TextModel refuses) gets {"error": message} and the others go
on.

Determinism: a request's text depends on its seed, its options and its thread count.
Requests that give no `threads` run on `threads` (default 1) threads, here and in
generate_serial alike, so the cluster's output is byte-identical to a serial run in one
process. One thread per request suits Dask: each worker thread runs one request, so a
worker started with `--nthreads N` runs N requests at once on its N cores.

Each worker process loads the model once, at its first request, and keeps it (a
per-process cache, `_model`); a worker the nanny restarts loads it again. `model=None`
is the demo model built into ldlm; a path must be readable at that path on every worker.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import threading

import ldlm

# task -> (TextModel method, the request key that is its positional argument or None)
TASKS = {"generate": ("generate", None), "continue": ("continue_text", "prompt"), "infill": ("infill", "text")}

_models: dict = {}
_models_lock = threading.Lock()
# How many models this process has loaded (the tests check that each worker loads once).
_loads = 0


def _undo_nanny_malloc_setting() -> None:
    """Dask's nanny starts each worker with MALLOC_TRIM_THRESHOLD_=65536, which also stops
    glibc from raising its mmap threshold above 128 KiB: every larger temporary of a
    request is then mapped and page-faulted afresh, which made a demo-model request
    2.5-3x slower (bench/results/dask-amd-epyc-zen5.md). This sets the two thresholds
    where glibc's own adjustment takes them (mmap 32 MiB, its maximum; trim twice that)."""
    if "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: the variable means nothing there
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    libc.mallopt(m_mmap_threshold, 32 << 20)
    libc.mallopt(m_trim_threshold, 64 << 20)


def _model(model):
    """The TextModel of `model` (None: the demo model), loaded once per process."""
    global _loads
    with _models_lock:
        if model not in _models:
            if not _models:
                _undo_nanny_malloc_setting()
            _models[model] = ldlm.TextModel.demo() if model is None else ldlm.TextModel.open(model)
            _loads += 1
        return _models[model]


def _describe(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def run_request(index: int, request, model=None, threads: int = 1) -> dict:
    """One request in this process: {"text": [str, ...]} or {"error": message}."""
    where = f"ldlm.dask: request {index}"
    if isinstance(request, _Unparsed):
        return {"error": f"{where}: {request.message}"}
    if not isinstance(request, dict):
        return {"error": f"{where}: expected an object with a 'task', found {type(request).__name__} "
                         f"{_describe(request)}"}
    task = request.get("task")
    if task not in TASKS:
        return {"error": f"{where}: 'task' must be one of {', '.join(map(repr, TASKS))}; found {_describe(task)}"}
    method, positional = TASKS[task]
    where = f"{where} ({task})"
    kwargs = {k: v for k, v in request.items() if k != "task"}
    args = []
    if positional is not None:
        if positional not in kwargs:
            return {"error": f"{where}: missing '{positional}'"}
        args.append(kwargs.pop(positional))
    if "on_step" in kwargs:
        return {"error": f"{where}: 'on_step' is not available in a batch (a callback cannot travel to a worker)"}
    kwargs.setdefault("threads", threads)
    try:
        lm = _model(model)
    except ldlm.Error as e:
        return {"error": f"{where}: cannot load the model {_describe(model)}: {e}"}
    try:
        return {"text": list(getattr(lm, method)(*args, **kwargs))}
    except ldlm.Error as e:
        return {"error": f"{where}: {e}"}
    except (TypeError, ValueError, OverflowError) as e:  # arguments the binding does not know or cannot convert
        # pybind11's message ends with the call's objects, addresses included: not
        # reproducible from one process to the next, so it is cut.
        accepted = str(e).split("\n\nInvoked with")[0]
        return {"error": f"{where}: bad arguments {_describe(kwargs)}: {accepted}"}


def generate_serial(requests, model=None, *, threads: int = 1) -> list:
    """The requests one after the other in this process: what generate_many computes."""
    return [run_request(i, r, model, threads) for i, r in enumerate(requests)]


def generate_many(client, requests, model=None, *, threads: int = 1, timeout=None) -> list:
    """The requests as tasks on `client`'s workers, one task each; their results in order.

    A worker lost in the middle (killed, out of memory) is replaced by its nanny and the
    scheduler runs its tasks again elsewhere. `timeout` (seconds, None: no limit) bounds
    the wait for the whole batch; past it, distributed's TimeoutError is raised.
    """
    from distributed import wait

    requests = list(requests)
    # pure=False: every request is computed, even two equal ones (no key is shared).
    futures = client.map(run_request, range(len(requests)), requests, model=model, threads=threads, pure=False)
    try:
        wait(futures, timeout=timeout)
        return client.gather(futures)
    finally:
        client.cancel(futures)


class _Unparsed:
    """A line of a JSONL file that is not JSON: its request fails with this message, so
    the output keeps one line per input line."""

    def __init__(self, message: str):
        self.message = message


def _read_jsonl(path: str) -> list:
    requests = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            try:
                requests.append(json.loads(line))
            except json.JSONDecodeError as e:
                requests.append(_Unparsed(f"line {number} of {path} is not JSON ({e})"))
    return requests


def _write_jsonl(path: str, results) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for result in results:
            f.write(json.dumps(result, ensure_ascii=False) + "\n")


def generate_jsonl(client, in_path: str, out_path: str, model=None, *, threads: int = 1, timeout=None) -> list:
    """Reads a JSONL file of requests (one per line), runs them on `client` (None: serially
    in this process) and writes one JSON result per line to out_path, in order."""
    requests = _read_jsonl(in_path)
    if client is None:
        results = generate_serial(requests, model, threads=threads)
    else:
        results = generate_many(client, requests, model, threads=threads, timeout=timeout)
    _write_jsonl(out_path, results)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m ldlm.dask",
        description="Run a JSONL file of ldlm requests on a Dask cluster and write one JSON result per line "
                    "(docs/dask.md).")
    parser.add_argument("input", help="JSONL file: one request per line, e.g. "
                                      '{"task": "infill", "text": "The <|mask|> sat.", "seed": 1}')
    parser.add_argument("output", help="JSONL file written: {\"text\": [...]} or {\"error\": \"...\"} per line")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--scheduler", metavar="ADDRESS", help="the scheduler, e.g. tcp://10.0.0.1:8786")
    where.add_argument("--local", metavar="N", type=int,
                       help="start a LocalCluster of N worker processes of one thread each on this machine")
    where.add_argument("--serial", action="store_true", help="no cluster: every request in this process")
    parser.add_argument("--model", metavar="PATH", default=None,
                        help="weights file every worker can read (default: the demo model)")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads per request that gives none (default 1; the text depends on it)")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="bound on the whole batch")
    a = parser.parse_args(argv)
    if a.local is not None and a.local < 1:
        parser.error(f"--local must be at least 1, got {a.local}")
    from concurrent.futures import CancelledError

    from distributed import Client, KilledWorker, LocalCluster

    try:
        if a.serial:
            results = generate_jsonl(None, a.input, a.output, a.model, threads=a.threads)
        elif a.local is not None:
            with LocalCluster(n_workers=a.local, threads_per_worker=1, processes=True, host="127.0.0.1",
                              dashboard_address=None) as cluster, Client(cluster) as client:
                results = generate_jsonl(client, a.input, a.output, a.model, threads=a.threads, timeout=a.timeout)
        else:
            with Client(a.scheduler, timeout=a.timeout or "30s") as client:
                results = generate_jsonl(client, a.input, a.output, a.model, threads=a.threads, timeout=a.timeout)
    except (OSError, CancelledError, KilledWorker) as e:  # OSError: files, connections, timeouts
        print(f"ldlm.dask: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    errors = sum("error" in r for r in results)
    print(f"ldlm.dask: {len(results)} result(s) in {a.output}, {errors} error(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    # Run through the module ldlm.dask, not this __main__: the tasks must reach the
    # workers as references to ldlm.dask's functions, which the workers import.
    from ldlm.dask import main as package_main

    sys.exit(package_main())
