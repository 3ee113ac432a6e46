"""ldlm.dask on a LocalCluster of 2 worker processes (one thread each, on loopback):
the results equal a serial run in this process, a worker killed with SIGKILL in the
middle of a batch is replaced and the batch still comes back whole and identical, a bad
request fails alone, and each worker process loads the model once. Every wait is
bounded. About 20 s on 2 idle cores (35 s while other builds ran)."""
import json
import os
import signal
import threading
import time

import pytest

distributed = pytest.importorskip("distributed", reason="Debian's python3-distributed is not installed")
import ldlm.dask  # noqa: E402

# Waits: the cluster's start, one batch, a nanny's restart of a killed worker.
TIMEOUT = 60

# Small and fast (about 30 ms each on one core), every task and option kind once.
REQUESTS = (
    [{"task": "generate", "length": 16, "seed": s, "steps": 4} for s in range(6)]
    + [{"task": "generate", "length": 12, "seed": 7, "steps": 4, "batch": 2, "sampler": "ddim"},
       {"task": "infill", "text": "The <|mask|> sat on the <|mask|>.", "seed": 1, "steps": 4},
       {"task": "infill", "text": "A <|mask|><|mask|> day.", "seed": 2, "steps": 4},
       {"task": "continue", "prompt": "The old man", "length": 8, "seed": 3, "steps": 4},
       {"task": "continue", "prompt": "It was", "suffix": " end.", "length": 6, "seed": 4, "steps": 4}])

# Long enough (about 3 s of work) for a worker to be killed while the batch runs.
LONG_REQUESTS = [{"task": "generate", "length": 64, "seed": s, "steps": 10} for s in range(48)]


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as c:
        c.wait_for_workers(2, timeout=TIMEOUT)
        yield c


def first_difference(got, want):
    """The first request whose result differs, for the failure message."""
    if len(got) != len(want):
        return f"{len(got)} results for {len(want)} requests"
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return f"request {i}: got {g!r}, serial run gave {w!r}"
    return "none"


def worker_pids(client):
    return client.run(os.getpid)


def test_results_equal_serial_and_each_worker_loads_once(client):
    serial = ldlm.dask.generate_serial(REQUESTS)
    assert all("text" in r for r in serial), serial
    got = ldlm.dask.generate_many(client, REQUESTS, timeout=TIMEOUT)
    # Byte-identical, as the JSONL output would be.
    assert [json.dumps(r) for r in got] == [json.dumps(r) for r in serial], first_difference(got, serial)
    assert [len(r["text"]) for r in got] == [r.get("batch", 1) for r in REQUESTS]
    loads = client.run(lambda: ldlm.dask._loads)
    assert max(loads.values()) == 1, f"models loaded per worker process: {loads}"


def test_bad_request_fails_alone(client):
    good = [REQUESTS[0], REQUESTS[7]]
    requests = [good[0],
                {"task": "infill", "text": "no mask here", "seed": 1},
                {"task": "translate", "text": "x"},
                "generate",
                {"task": "continue", "length": 8},
                {"task": "generate", "lenght": 8},
                good[1]]
    got = ldlm.dask.generate_many(client, requests, timeout=TIMEOUT)
    assert len(got) == len(requests)
    assert [got[0], got[-1]] == ldlm.dask.generate_serial(good)
    expected = ["request 1 (infill): TextModel::infill: the text \"no mask here\" has no <|mask|>",
                "request 2: 'task' must be one of 'generate', 'continue', 'infill'; found 'translate'",
                "request 3: expected an object with a 'task', found str 'generate'",
                "request 4 (continue): missing 'prompt'",
                "request 5 (generate): bad arguments {'lenght': 8, 'threads': 1}"]
    for result, message in zip(got[1:-1], expected):
        assert set(result) == {"error"} and message in result["error"], f"expected {message!r} in {result!r}"


def test_jsonl_on_the_cluster_equals_serial(client, tmp_path):
    lines = [json.dumps(r) for r in REQUESTS[:3]] + ["{not json"] + [json.dumps(REQUESTS[8])]
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ldlm.dask.generate_jsonl(client, str(source), str(tmp_path / "dask.jsonl"), timeout=TIMEOUT)
    ldlm.dask.generate_jsonl(None, str(source), str(tmp_path / "serial.jsonl"))
    dask_bytes, serial_bytes = (tmp_path / "dask.jsonl").read_bytes(), (tmp_path / "serial.jsonl").read_bytes()
    assert dask_bytes == serial_bytes, f"dask:\n{dask_bytes.decode()}\nserial:\n{serial_bytes.decode()}"
    out = [json.loads(line) for line in dask_bytes.decode().splitlines()]
    assert len(out) == len(lines)
    assert "request 3: line 4 of" in out[3]["error"] and "is not JSON" in out[3]["error"], out[3]
    assert all("text" in r for i, r in enumerate(out) if i != 3), out


def test_killed_worker_is_replaced_and_the_batch_is_identical_and_complete(client):
    serial = ldlm.dask.generate_serial(LONG_REQUESTS)
    before = worker_pids(client)
    outcome = {}

    def run():
        try:
            outcome["results"] = ldlm.dask.generate_many(client, LONG_REQUESTS, timeout=TIMEOUT)
        except BaseException as e:  # reported by the assertion below
            outcome["error"] = e

    batch = threading.Thread(target=run, daemon=True)
    batch.start()
    # Kill a worker as soon as it holds tasks of the batch.
    victim, deadline = None, time.monotonic() + TIMEOUT
    while victim is None and time.monotonic() < deadline:
        busy = [w for w, keys in client.processing().items() if keys and w in before]
        victim = busy[0] if busy else None
        if victim is None:
            time.sleep(0.01)
    assert victim is not None, f"no worker received a task within {TIMEOUT} s"
    assert batch.is_alive(), "the batch finished before a worker could be killed: make LONG_REQUESTS longer"
    os.kill(before[victim], signal.SIGKILL)

    batch.join(TIMEOUT)
    assert not batch.is_alive(), f"the batch did not finish within {TIMEOUT} s of the kill"
    assert "error" not in outcome, f"the batch failed: {outcome.get('error')!r}"
    got = outcome["results"]
    assert got == serial, first_difference(got, serial)

    # The nanny started a new process in the killed one's place.
    client.wait_for_workers(2, timeout=TIMEOUT)
    after = worker_pids(client)
    assert len(after) == 2 and before[victim] not in after.values(), f"workers before {before}, after {after}"
