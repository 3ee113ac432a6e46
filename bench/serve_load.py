#!/usr/bin/env python3
"""Load figures of `ldlm serve` (issue 37, "Figures"): latency, throughput, errors and memory.

Starts two servers of the same binary on loopback, one batching (its default
--max-batch) and one with --max-batch 1, and drives both with a bounded client of
C threads (C in --clients), each sending POST /infill (no streaming) on a kept-alive
connection, one request after another, for --duration seconds. Per run it reports
p50/p95 latency, texts per second, the server's CPU time per text (user and system, all its
threads: on a shared machine the work done, where texts per second is also the share of
the CPU it got) and errors (any answer but 200 with filled texts),
and each server's RSS (VmRSS of /proc/<pid>/status) after the warm-up and after
every run, and the batching server's requests per batch in each run. The runs are
paired: in each of --rounds rounds and at each C the two servers run back to back, the
batching one first and second in turn (ABBA), so a drift of the machine's speed falls
on both; the report gives medians and ranges over the rounds.

    python3 bench/serve_load.py --ldlm build/default/tools/ldlm                  # 3 rounds of 60 s runs, 1, 4, 16 clients
    python3 bench/serve_load.py --ldlm build/default/tools/ldlm --rounds 1 --duration 5 --out /tmp/x.md   # a smoke run

Python standard library only. The client shares the CPU with the server; its own cost
per request is reported (client CPU seconds per request) so it can be weighed.
"""

import argparse
import datetime
import http.client
import json
import os
import platform
import queue
import re
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time

TEXT = "The children played in the <|mask|> after school, and then they <|mask|> home."
MASK = "<|mask|>"


def cpu_name():
    """lscpu's model name, family and model: how bench/results names a CPU."""
    fields = {}
    for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return f"{fields.get('Model name', '?')} (family {fields.get('CPU family', '?')}, model {fields.get('Model', '?')}, " \
           f"{fields.get('CPU(s)', '?')} CPUs)"


class Server:
    """`ldlm serve` on an ephemeral loopback port, in a process group of its own."""

    def __init__(self, ldlm, extra, name):
        self.name = name
        self.argv = [ldlm, "serve", "--host", "127.0.0.1", "--port", "0", *extra]
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, text=True, errors="replace")
        self.output = []
        lines = queue.Queue()

        def read():
            for line in self.proc.stdout:
                self.output.append(line)
                lines.put(line)

        threading.Thread(target=read, daemon=True).start()
        end = time.monotonic() + 120
        while True:
            if time.monotonic() > end or self.proc.poll() is not None:
                raise RuntimeError(f"{name}: no listening address printed; it said:\n{''.join(self.output)}")
            try:
                match = re.search(r"http://(127\.0\.0\.1):(\d+)", lines.get(timeout=0.5))
            except queue.Empty:
                continue
            if match:
                self.host, self.port = match.group(1), int(match.group(2))
                break
        while self.get("/health")[0] != 200:
            if time.monotonic() > end:
                raise RuntimeError(f"{name}: /health never answered 200")
            time.sleep(0.2)

    def get(self, path):
        connection = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read().decode(errors="replace")
        except OSError:
            return 0, ""
        finally:
            connection.close()

    def rss_mib(self):
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise RuntimeError(f"{self.name}: no VmRSS in /proc/{self.proc.pid}/status")

    def cpu_seconds(self):
        """User and system time of the server's process so far (/proc/<pid>/stat)."""
        with open(f"/proc/{self.proc.pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def client(server, body, stop_at, results, first_seed):
    """One client: requests one after another until stop_at, on one kept-alive connection."""
    connection = None
    seed = first_seed
    while time.monotonic() < stop_at:
        if connection is None:
            connection = http.client.HTTPConnection(server.host, server.port, timeout=120)
        payload = json.dumps({**body, "seed": seed}).encode()
        seed += 1
        started = time.monotonic()
        try:
            connection.request("POST", "/infill", payload, {"Content-Type": "application/json"})
            response = connection.getresponse()
            answer = response.read()
            latency = time.monotonic() - started
            texts = json.loads(answer).get("texts") if response.status == 200 else None
            if not texts or len(texts) != body["n"] or any(MASK in text for text in texts):
                results.append((latency, 0, f"HTTP {response.status}: {answer[:200]!r}"))
            else:
                results.append((latency, len(texts), None))
        except (OSError, http.client.HTTPException, ValueError) as error:
            results.append((time.monotonic() - started, 0, f"{type(error).__name__}: {error}"))
            connection.close()
            connection = None
    if connection:
        connection.close()


def run(server, clients, seconds, body):
    """Runs `clients` clients for `seconds`; returns the figures of the requests that ended."""
    results = []
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    server_cpu_before = server.cpu_seconds()
    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(server, body, started + seconds, results, 1000000 * i))
               for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=seconds + 180)
    if any(thread.is_alive() for thread in threads):
        raise RuntimeError(f"{server.name}: a client was still waiting 180 s after the run's end")
    elapsed = time.monotonic() - started
    server_cpu = server.cpu_seconds() - server_cpu_before
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    client_cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    latencies = sorted(latency for latency, _, error in results if error is None)
    errors = [error for _, _, error in results if error is not None]

    def percentile(p):  # nearest rank
        return latencies[max(0, -(-len(latencies) * p // 100) - 1)] * 1000 if latencies else float("nan")

    texts = sum(texts for _, texts, _ in results)
    return {"server": server.name, "clients": clients, "seconds": elapsed, "requests": len(results),
            "texts_per_s": texts / elapsed, "server_cpu_ms_per_text": 1000 * server_cpu / max(1, texts),
            "p50_ms": percentile(50),
            "p95_ms": percentile(95), "errors": len(errors), "first_error": errors[0] if errors else "",
            "client_cpu_ms_per_request": 1000 * client_cpu / max(1, len(results)), "rss_mib": server.rss_mib(),
            "load": os.getloadavg()[0]}


def metric_value(server, name):
    """One sample of /metrics (e.g. ldlm_batch_requests_sum), or None."""
    status, text = server.get("/metrics")
    for line in text.splitlines() if status == 200 else []:
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


WORKER_METRICS = ("ldlm_batch_requests_sum", "ldlm_batch_requests_count", "ldlm_batch_seconds_total",
                  "ldlm_batch_window_seconds_total")


def worker_now(server):
    """The server's counters of its batches so far: requests, batches, seconds in batches and in windows."""
    return [metric_value(server, name) or 0 for name in WORKER_METRICS]


def spread(values, fmt):
    """median [min, max]"""
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ldlm", required=True, help="the ldlm executable")
    parser.add_argument("--duration", type=float, default=60, help="seconds per run (default 60)")
    parser.add_argument("--warmup", type=float, default=10, help="seconds of warm-up per server at the most clients")
    parser.add_argument("--clients", default="1,4,16", help="concurrent clients per run, comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds per client count (default 3)")
    parser.add_argument("--n", type=int, default=1, help="texts per request")
    parser.add_argument("--batching", default="", help="more options of the batching server, e.g. \"--batch-window-ms 0\"")
    parser.add_argument("--out", help="write the results as Markdown here (default: stdout only)")
    parser.add_argument("--note", default="", help="a line for the results file (e.g. what else ran on the machine)")
    args = parser.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    body = {"text": TEXT, "n": args.n, "stream": False}

    servers = []
    load_before = os.getloadavg()[0]
    try:
        servers = [Server(args.ldlm, args.batching.split(), "batching"),
                   Server(args.ldlm, ["--max-batch", "1"], "max-batch 1")]
        rss_start = {}
        for server in servers:
            print(f"{server.name}: warm-up {args.warmup:.0f} s at {max(levels)} clients", flush=True)
            warm = run(server, max(levels), args.warmup, body)
            if warm["errors"]:
                raise RuntimeError(f"{server.name}: {warm['errors']} errors in the warm-up, the first: {warm['first_error']}")
            rss_start[server.name] = server.rss_mib()
        rows = []
        for round_ in range(args.rounds):
            for position, clients in enumerate(levels):
                for server in (servers if (round_ + position) % 2 == 0 else servers[::-1]):
                    before = worker_now(server)
                    row = run(server, clients, args.duration, body)
                    requests, batches, in_batches, in_windows = (a - b for a, b in zip(worker_now(server), before))
                    row["round"] = round_ + 1
                    row["requests_per_batch"] = requests / batches if batches else float("nan")
                    row["busy_pct"] = 100 * in_batches / row["seconds"]
                    row["window_pct"] = 100 * in_windows / row["seconds"]
                    rows.append(row)
                    print(f"round {round_ + 1} {row['server']:>12} {clients:>3} clients: {row['texts_per_s']:7.2f} "
                          f"texts/s, p50 {row['p50_ms']:7.1f} ms, p95 {row['p95_ms']:7.1f} ms, "
                          f"{row['requests_per_batch']:.1f} requests/batch, worker {row['busy_pct']:.0f} % in "
                          f"batches and {row['window_pct']:.0f} % in windows, server CPU "
                          f"{row['server_cpu_ms_per_text']:.2f} ms/text, {row['errors']} errors "
                          f"{row['first_error']}, RSS {row['rss_mib']:.1f} MiB, load {row['load']:.1f}", flush=True)
    finally:
        for server in servers:
            server.stop()

    command = "python3 bench/serve_load.py " + " ".join(
        a if re.fullmatch(r"[\w./,=:-]+", a) else json.dumps(a) for a in sys.argv[1:])
    lines = [
        f"# `ldlm serve` under load: {cpu_name()}", "",
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, Linux {platform.release()}; "
        f"`{command}`", "",
        f"Each request: `POST /infill` `{json.dumps({**body, 'seed': 'k'})}` (2 gaps, {len(TEXT)} characters), "
        "the demo model, the servers' defaults otherwise"
        + (f" (the batching server also `{args.batching}`)" if args.batching else "") + ". Clients run on the same "
        "machine (a Python thread each, one request after another on a kept-alive connection). "
        f"{args.rounds} rounds of {args.duration:.0f} s runs; in each round and at each client count the two servers run "
        "back to back, the batching one first and second in turn (ABBA), so a drift of the machine's speed falls "
        f"on both. The load average (1 minute, of the whole machine: {os.cpu_count()} CPUs) shows what else ran: "
        f"{load_before:.1f} before the warm-up, {os.getloadavg()[0]:.1f} at the end.", ""]
    if args.note:
        lines += [args.note, ""]
    lines += ["Medians over the rounds [min, max]:", "",
              "| clients | server | texts/s | p50 ms | p95 ms | requests per batch | server CPU ms per text "
              "| errors (all rounds) |",
              "|---:|---|---|---|---|---|---|---:|"]
    for clients in levels:
        for server in servers:
            mine = [row for row in rows if row["clients"] == clients and row["server"] == server.name]
            lines.append(f"| {clients} | {server.name} | {spread([r['texts_per_s'] for r in mine], '.1f')} | "
                         f"{spread([r['p50_ms'] for r in mine], '.1f')} | {spread([r['p95_ms'] for r in mine], '.1f')} | "
                         f"{spread([r['requests_per_batch'] for r in mine], '.1f')} | "
                         f"{spread([r['server_cpu_ms_per_text'] for r in mine], '.2f')} | {sum(r['errors'] for r in mine)} |")
    lines += ["", "Batching against one request at a time (texts/s of the same round and client count), median "
              "[min, max] over the rounds:", ""]
    for clients in levels:
        ratios = []
        for round_ in range(1, args.rounds + 1):
            pair = {row["server"]: row["texts_per_s"] for row in rows
                    if row["clients"] == clients and row["round"] == round_}
            ratios.append(pair["batching"] / pair["max-batch 1"])
        lines.append(f"- {clients} client{'s' if clients > 1 else ''}: {spread(ratios, '.2f')}×")
    lines += ["", "RSS (MiB) after the warm-up, then after the last run:", ""]
    for server in servers:
        last = [row["rss_mib"] for row in rows if row["server"] == server.name][-1]
        lines.append(f"- {server.name}: {rss_start[server.name]:.1f} → {last:.1f}")
    lines += ["", "Every run, in the order it ran:", "",
              "| round | clients | server | requests | texts/s | p50 ms | p95 ms | requests per batch | "
              "worker % in batches | worker % in windows | server CPU ms per text | errors | RSS after MiB | "
              "client CPU ms/request | load average at the end |",
              "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['round']} | {row['clients']} | {row['server']} | {row['requests']} | "
                     f"{row['texts_per_s']:.2f} | {row['p50_ms']:.1f} | {row['p95_ms']:.1f} | "
                     f"{row['requests_per_batch']:.1f} | {row['busy_pct']:.0f} | {row['window_pct']:.0f} | "
                     f"{row['server_cpu_ms_per_text']:.2f} | {row['errors']} | "
                     f"{row['rss_mib']:.1f} | "
                     f"{row['client_cpu_ms_per_request']:.2f} | {row['load']:.1f} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        with open(args.out, "w") as out:
            out.write(report)
    return 1 if any(row["errors"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
