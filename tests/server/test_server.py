#!/usr/bin/env python3
"""The `ldlm serve` tests (docs/server.md), run by CTest: each case starts the real
server on a free loopback port (--port 0; it prints the port), talks to it with the
standard library's http.client and stops it. No third-party module.

usage: test_server.py LDLM_BINARY CASE   (CASE: endpoints, streaming, batching, window,
                                          limits, disconnect, drain)

Every wait is bounded in count and in time (TIME_SCALE stretches the bounds, for the
sanitizer builds)."""

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

LDLM = sys.argv[1] if len(sys.argv) > 1 else "ldlm"
TIME_SCALE = float(os.environ.get("LDLM_TEST_TIME_SCALE", "1"))
PROMPT = "The <|mask|> sat on the <|mask|>."
# A request that keeps the worker busy for a while: 1000 steps, each taken 3 times
# (RePaint), about 3000 denoiser calls (1.5 s on 2 cores of an AMD EPYC).
HOLD = {"text": "Hold <|mask|> on.", "steps": 1000, "resample": 2}


class Server:
    """`ldlm serve --port 0 ARGS`, with its port read from stderr."""

    def __init__(self, *args):
        self.proc = subprocess.Popen([LDLM, "serve", "--port", "0", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.log = []
        self.port = None
        self.first_health = None
        deadline = time.monotonic() + 30 * TIME_SCALE
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.proc.kill()
            raise AssertionError("no 'listening on' line; stderr: " + "".join(self.log))
        # The model loads after the socket is bound: the first probe may see it loading.
        self.first_health = self.request("GET", "/health")
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        for _ in range(int(300 * TIME_SCALE)):
            if self.request("GET", "/health")[0] == 200:
                return
            time.sleep(0.1)
        raise AssertionError("the model did not load; stderr: " + "".join(self.log))

    def _drain_stderr(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def connection(self, timeout=60):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout * TIME_SCALE)

    def request(self, method, path, body=None, headers=None, raw=None):
        """(status, headers, parsed JSON or text) of one request on a new connection."""
        conn = self.connection()
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        h = {"Content-Type": "application/json"} if data is not None else {}
        h.update(headers or {})
        conn.request(method, path, body=data, headers=h)
        res = conn.getresponse()
        text = res.read().decode("utf-8")
        conn.close()
        ctype = res.getheader("Content-Type", "")
        return res.status, dict(res.getheaders()), json.loads(text) if ctype.startswith("application/json") else text

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def metric(self, name):
        """The value of one sample line of /metrics, e.g. 'ldlm_batch_size_count'."""
        status, _, text = self.request("GET", "/metrics")
        assert status == 200, status
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        raise AssertionError("no metric " + name + " in:\n" + text)

    def stop(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=60 * TIME_SCALE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("the server did not stop within 60 s of " + str(sig))


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def expect_error(response, status, *fragments, field=None):
    got, headers, body = response
    check(got == status, f"expected {status}, got {got}: {body}")
    check(isinstance(body, dict) and "error" in body, f"{status}: no JSON error body: {body!r}")
    message = body["error"]["message"]
    for fragment in fragments:
        check(fragment in message, f"{status}: the message {message!r} does not say {fragment!r}")
    if field is not None:
        check(body["error"]["field"] == field, f"{status}: field {body['error']['field']!r}, expected {field!r}")
    return headers


def read_events(res, limit=10000):
    """The data of each SSE event of a response, up to [DONE]."""
    events = []
    for _ in range(limit):
        line = res.readline().decode("utf-8")
        if not line:
            break
        line = line.rstrip("\n")
        if not line:
            continue
        check(line.startswith("data: "), f"not an SSE data line: {line!r}")
        data = line[len("data: "):]
        if data == "[DONE]":
            events.append(data)
            break
        events.append(json.loads(data))
    return events


def check_kept_alive(s):
    """One kept-alive connection carries many requests, each answered at once: httplib's
    default closes it after 5 (every client then reconnects, into a listen backlog of 5),
    and without TCP_NODELAY an answer's body waits for the client's delayed ACK of its
    header (about 40 ms)."""
    conn = s.connection()
    latencies = []
    for k in range(12):
        started = time.monotonic()
        conn.request("POST", "/tokenize", body=json.dumps({"text": f"Hello {k}"}),
                     headers={"Content-Type": "application/json"})
        res = conn.getresponse()
        res.read()
        latencies.append(time.monotonic() - started)
        check(res.status == 200, f"/tokenize {k}: {res.status}")
        check(res.getheader("Connection", "").lower() != "close", f"the server closed the connection after {k + 1} requests")
    conn.close()
    median_ms = 1000 * sorted(latencies)[len(latencies) // 2]
    print(f"/tokenize on one kept-alive connection: median {median_ms:.1f} ms, worst {1000 * max(latencies):.1f} ms")
    check(median_ms < 25, f"/tokenize took {median_ms:.1f} ms (median of 12; expected < 25 ms, about 40 ms is Nagle's "
          "algorithm waiting for a delayed ACK)")


def case_endpoints():
    s = Server("--threads", "2")
    try:
        if s.first_health[0] == 503:
            check(s.first_health[2] == {"status": "loading"}, f"503 body {s.first_health[2]}")
            print("health: 503 {'status': 'loading'} seen before the model was ready")
        else:
            print("health: the model was ready before the first probe (loading not observed)")
        check(s.request("GET", "/health")[2] == {"status": "ok"}, "health")

        status, _, models = s.request("GET", "/v1/models")
        check(status == 200 and models["object"] == "list", f"models: {models}")
        model = models["data"][0]
        check(model["id"] == "ldlm-demo" and model["object"] == "model" and model["owned_by"] == "ldlm", str(model))
        info = model["ldlm"]
        for key in ("samplers", "schedules", "methods", "max_positions", "default_steps", "max_length", "max_batch"):
            check(key in info, f"/v1/models lacks ldlm.{key}")
        check("dpmpp-3m" in info["samplers"] and info["default_steps"] == 10, str(info))

        status, _, infill = s.post("/infill", {"text": PROMPT, "n": 2, "seed": 3, "steps": 4})
        check(status == 200, f"infill: {status} {infill}")
        check(infill["object"] == "ldlm.infill" and infill["model"] == "ldlm-demo", str(infill))
        check(len(infill["texts"]) == 2 and len(infill["ids"]) == 2, str(infill))
        for text in infill["texts"]:
            check(text.startswith("The") and " sat on the" in text and "<|mask|>" not in text, text)
        check(infill["usage"]["completion_tokens"] == 4, str(infill["usage"]))
        again = s.post("/infill", {"text": PROMPT, "n": 2, "seed": 3, "steps": 4})[2]
        check(again["texts"] == infill["texts"], "the same request must give the same texts")

        status, _, tok = s.post("/tokenize", {"text": "Hello world"})
        check(status == 200 and tok == {"ids": [15496, 995]}, f"tokenize: {tok}")
        check_kept_alive(s)
        status, _, detok = s.post("/detokenize", {"ids": [15496, 995]})
        check(status == 200 and detok == {"text": "Hello world"}, f"detokenize: {detok}")

        ids = infill["ids"][0][:]
        mask = info["mask_id"]
        ids[1] = mask
        status, _, by_ids = s.post("/infill", {"ids": ids, "steps": 3})
        check(status == 200 and len(by_ids["ids"][0]) == len(ids), f"infill ids: {by_ids}")

        status, _, gen = s.post("/generate", {"prompt": "The old man", "suffix": " in the morning.", "length": 5,
                                              "sampler": "heun", "steps": 3, "n": 2})
        check(status == 200 and gen["object"] == "ldlm.generation", f"generate: {gen}")
        for text in gen["texts"]:
            check(text.startswith("The old man") and text.endswith(" in the morning."), text)

        # The target: a prompt and a suffix, and the gap between them filled.
        status, _, cmpl = s.post("/v1/completions", {"model": "ldlm-demo", "prompt": "The old man",
                                                     "suffix": " in the morning.", "max_tokens": 6, "n": 2})
        check(status == 200, f"completions: {status} {cmpl}")
        check(cmpl["object"] == "text_completion" and cmpl["id"].startswith("cmpl-"), str(cmpl))
        check(isinstance(cmpl["created"], int) and cmpl["model"] == "ldlm-demo", str(cmpl))
        check([c["index"] for c in cmpl["choices"]] == [0, 1], str(cmpl["choices"]))
        for choice in cmpl["choices"]:
            check(choice["finish_reason"] == "length" and choice["text"].strip(), str(choice))
            check("The old man" not in choice["text"], "choices[].text is the generated part only")
        check(set(cmpl["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}, str(cmpl["usage"]))
        check(cmpl["usage"]["completion_tokens"] == 12, str(cmpl["usage"]))

        status, headers, page = s.request("GET", "/")
        check(status == 200 and headers["Content-Type"].startswith("text/html") and "<html" in page, "page")
        check(s.request("GET", "/index.html")[2] == page, "/index.html is the page")
        expect_error(s.request("GET", "/../CMakeLists.txt"), 404, "no endpoint")
        expect_error(s.request("GET", "/%2e%2e/etc/passwd"), 404, "no endpoint")

        status, _, metrics = s.request("GET", "/metrics")
        for name in ("ldlm_requests_total{endpoint=\"/infill\",status=\"200\"}", "ldlm_queue_depth",
                     "ldlm_batch_size_bucket", "ldlm_denoiser_calls_total", "ldlm_request_duration_seconds_bucket"):
            check(name in metrics, f"/metrics lacks {name}")
        check(s.metric("ldlm_denoiser_calls_total") > 0, "denoiser calls counted")
    finally:
        check(s.stop() == 0, "exit status")


def case_streaming():
    s = Server("--threads", "2")
    try:
        for path, body, final_object in (
            ("/infill", {"text": PROMPT, "n": 2, "steps": 5, "stream": True}, "ldlm.infill"),
            ("/generate", {"prompt": "Once", "length": 4, "steps": 5, "stream": True}, "ldlm.generation"),
            ("/v1/completions", {"prompt": "Once", "suffix": " end.", "max_tokens": 4, "steps": 5, "n": 2,
                                 "stream": True}, "text_completion"),
        ):
            conn = s.connection()
            conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            res = conn.getresponse()
            check(res.status == 200, f"{path}: {res.status}")
            check(res.getheader("Content-Type").startswith("text/event-stream"), res.getheader("Content-Type"))
            events = read_events(res)
            conn.close()
            check(len(events) == 5 + 2 and events[-1] == "[DONE]", f"{path}: {len(events)} events: {events[-2:]}")
            for k, step in enumerate(events[:5], 1):
                check(step["step"] == k and step["steps"] == 5 and 0 <= step["t"] <= 1, f"{path} step {step}")
                check(len(step["texts"]) == body.get("n", 1), f"{path}: texts per step")
                if path == "/v1/completions":
                    check(step["object"] == "text_completion" and step["choices"][0]["finish_reason"] is None,
                          str(step))
                else:
                    check(step["object"] == "ldlm.step", str(step))
            final = events[5]
            check(final["object"] == final_object, f"{path}: final event {final}")
            # The stream's last event is the answer the same request gets without streaming.
            plain = dict(body, stream=False)
            answer = s.post(path, plain)[2]
            key = "choices" if path == "/v1/completions" else "texts"
            got = [c["text"] for c in final[key]] if key == "choices" else final[key]
            want = [c["text"] for c in answer[key]] if key == "choices" else answer[key]
            check(got == want, f"{path}: streamed {got} != plain {want}")
    finally:
        check(s.stop() == 0, "exit status")


def concurrently(s, bodies, path="/infill"):
    results = [None] * len(bodies)

    def one(i):
        results[i] = s.post(path, bodies[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120 * TIME_SCALE)
    check(all(r is not None for r in results), "a concurrent request did not finish")
    return results


def wait_for(predicate, what, seconds=30):
    deadline = time.monotonic() + seconds * TIME_SCALE
    for _ in range(10000):
        if predicate():
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    raise AssertionError("timed out waiting for " + what)


def long_request(s, path, body, results, key, headers=None):
    def run():
        results[key] = s.post(path, body, headers=headers)
    t = threading.Thread(target=run)
    t.start()
    return t


def case_batching():
    s = Server("--threads", "2", "--max-batch", "8")
    try:
        # A long request keeps the worker busy, so that the next ones wait together.
        held = {}
        blocker = long_request(s, "/infill", HOLD, held, "blocker")
        wait_for(lambda: s.metric("ldlm_running_requests") == 1, "the blocker to run")
        bodies = [{"text": PROMPT, "seed": seed, "n": n, "steps": 6, "sampler": "dpmpp-2m-sde"}
                  for seed, n in ((1, 1), (2, 2), (3, 1), (4, 1))]
        together = concurrently(s, bodies)
        blocker.join(timeout=120 * TIME_SCALE)
        check(held["blocker"][0] == 200, "blocker")
        batched = s.metric("ldlm_batch_requests_count") - s.metric('ldlm_batch_requests_bucket{le="1"}')
        check(batched >= 1, "no batch held more than one request")
        sizes = [r[2]["timings"]["batch_requests"] for r in together]
        print("requests per batch seen by the 4 requests:", sizes)
        check(max(sizes) > 1, f"the requests ran one by one: {sizes}")
        for body, (status, _, answer) in zip(bodies, together):
            check(status == 200, f"{status} {answer}")
            alone = s.post("/infill", body)[2]
            check(alone["timings"]["batch_requests"] == 1, "one by one")
            check(answer["texts"] == alone["texts"] and answer["ids"] == alone["ids"],
                  f"seed {body['seed']}: in a batch {answer['texts']}, alone {alone['texts']}")
    finally:
        check(s.stop() == 0, "exit status")


def case_window():
    """The collection window (--batch-window-ms): requests that come back within it after a
    batch share the next batch, a lone client is not delayed, and the wait is bounded."""
    window_s = 1.0 * TIME_SCALE
    s = Server("--threads", "2", "--max-batch", "4", "--batch-window-ms", str(int(window_s * 1000)))
    try:
        body = {"text": PROMPT, "steps": 3}
        # A lone client: its own request is all the window expects, so each runs at once.
        for seed in range(3):
            answer = s.post("/infill", dict(body, seed=seed))[2]
            check(answer["timings"]["queue_ms"] < 0.3 * window_s * 1000,
                  f"a lone client waited {answer['timings']['queue_ms']:.0f} ms (window {window_s * 1000:.0f} ms)")
        # A batch of four (they wait together behind a long request).
        held = {}
        blocker = long_request(s, "/infill", HOLD, held, "blocker")
        wait_for(lambda: s.metric("ldlm_running_requests") == 1, "the blocker to run")
        first = concurrently(s, [dict(body, seed=10 + k) for k in range(4)])
        blocker.join(timeout=120 * TIME_SCALE)
        check(held["blocker"][0] == 200 and [r[0] for r in first] == [200] * 4, "the first batches")
        check([r[2]["timings"]["batch_requests"] for r in first] == [4] * 4, "four waited together")
        # Its four clients come back one after another, 0.1 s apart (a loaded server sees
        # them a few ms apart): without the window the first would run alone; with it the
        # four share one batch.
        batches_before = s.metric("ldlm_batch_requests_count")
        results = [None] * 4

        def later(k):
            time.sleep(0.1 * k)
            results[k] = s.post("/infill", dict(body, seed=20 + k))

        threads = [threading.Thread(target=later, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60 * TIME_SCALE)
        check(all(r is not None and r[0] == 200 for r in results), f"the window's requests: {results}")
        sizes = [r[2]["timings"]["batch_requests"] for r in results]
        print("requests per batch seen by 4 requests 0.1 s apart:", sizes)
        check(sizes == [4] * 4, f"requests 0.1 s apart in a {window_s:.1f} s window did not share a batch: {sizes}")
        check(s.metric("ldlm_batch_requests_count") == batches_before + 1, "/metrics: one batch for the four")
        # Then one client alone: the window expects four, and waits for the other three no
        # longer than the window.
        started = time.monotonic()
        alone = [s.post("/infill", dict(body, seed=20))[2]]
        waited = time.monotonic() - started
        print(f"a lone request after a batch of four took {waited:.2f} s (window {window_s:.1f} s)")
        check(waited < 2 * window_s, f"it took {waited:.1f} s: the window ({window_s:.1f} s) is not a bound")
        alone += [s.post("/infill", dict(body, seed=20 + k))[2] for k in range(1, 4)]
        for k, ((_, _, answer), one) in enumerate(zip(results, alone)):
            check(one["timings"]["batch_requests"] == 1, "one by one")
            check(one["texts"] == answer["texts"] and one["ids"] == answer["ids"],
                  f"seed {20 + k}: in the window's batch {answer['texts']}, alone {one['texts']}")
    finally:
        check(s.stop() == 0, "exit status")


def case_limits():
    s = Server("--threads", "1", "--api-key", "sesame", "--max-body", "2000", "--max-length", "32",
               "--max-batch", "4", "--max-queue", "2")
    auth = {"Authorization": "Bearer sesame"}
    try:
        check(s.request("GET", "/health")[0] == 200, "/health needs no key")
        check(s.request("GET", "/")[0] == 200, "the page needs no key (a browser cannot send one to open it)")
        expect_error(s.post("/infill", {"text": PROMPT}), 401, "API key")
        expect_error(s.post("/infill", {"text": PROMPT}, headers={"Authorization": "Bearer sesamE"}), 401, "API key")
        expect_error(s.request("GET", "/metrics"), 401)
        check(s.request("GET", "/v1/models", headers=auth)[0] == 200, "the key opens /v1/models")

        expect_error(s.post("/infill", None, headers=auth, raw="{not json"), 400, "/infill", "not valid JSON")
        expect_error(s.post("/infill", [1], headers=auth), 400, "must be a JSON object, got an array")
        expect_error(s.post("/infill", {"text": PROMPT, "steps": "ten"}, headers=auth), 400,
                     "field 'steps' must be an integer in [1, 1000]", 'string "ten"', field="steps")
        expect_error(s.post("/infill", {"text": PROMPT, "sampler": "euler"}, headers=auth), 400,
                     "field 'sampler' must be one of: ", "dpmpp-3m", field="sampler")
        expect_error(s.post("/infill", {"txt": PROMPT}, headers=auth), 400, "unknown field 'txt'", field="txt")
        expect_error(s.post("/infill", {"n": 2}, headers=auth), 400, "'text'", "or 'ids'", field="text")
        expect_error(s.post("/infill", {"text": "no marker"}, headers=auth), 400, "no <|mask|> marker", field="text")
        expect_error(s.post("/infill", {"text": PROMPT, "n": 5}, headers=auth), 400, "--max-batch 4", field="n")
        expect_error(s.post("/generate", {"length": 33}, headers=auth), 400, "--max-length 32", field="length")
        expect_error(s.post("/v1/completions", {"prompt": "word " * 30, "max_tokens": 8}, headers=auth), 400,
                     "more than --max-length 32", field="max_tokens")
        expect_error(s.post("/detokenize", {"ids": [99999999]}, headers=auth), 400, "vocabulary size", field="ids")
        expect_error(s.request("GET", "/infill", headers=auth), 405, "use POST")
        expect_error(s.request("GET", "/nothing", headers=auth), 404, "no endpoint /nothing")
        expect_error(s.post("/infill", {"text": "x" * 3000}, headers=auth), 413, "--max-body")

        # 429: a long request runs, two wait (--max-queue 2), the next is refused.
        held = {}
        blocker = long_request(s, "/infill", HOLD, held, "blocker", auth)
        # The metrics need the key too.
        def running():
            status, _, text = s.request("GET", "/metrics", headers=auth)
            return "ldlm_running_requests 1" in text
        wait_for(running, "the blocker to run")
        waiting = [long_request(s, "/infill", {"text": PROMPT, "seed": i}, held, i, auth) for i in range(2)]
        def queued():
            status, _, text = s.request("GET", "/metrics", headers=auth)
            return "ldlm_queue_depth 2" in text
        wait_for(queued, "two requests to queue")
        headers = expect_error(s.post("/infill", {"text": PROMPT}, headers=auth), 429, "--max-queue 2")
        check(headers.get("Retry-After") == "1", f"Retry-After: {headers}")
        for t in [blocker, *waiting]:
            t.join(timeout=120 * TIME_SCALE)
        check(all(held[k][0] == 200 for k in ("blocker", 0, 1)), "the queued requests are answered")
        check(s.post("/infill", {"text": PROMPT}, headers=auth)[0] == 200, "still serving")
    finally:
        check(s.stop() == 0, "exit status")


def case_disconnect():
    s = Server("--threads", "1")
    try:
        # About 100,000 denoiser calls (RePaint 100 times per step): a minute on 2 cores,
        # unless the client's going away stops it.
        body = json.dumps(dict(HOLD, resample=100, stream=True))
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=30 * TIME_SCALE)
        sock.sendall(("POST /infill HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
        received = b""
        for _ in range(1000):
            received += sock.recv(4096)
            if b"data: " in received:
                break
        check(b"data: " in received, "no first event")
        sock.close()
        closed = time.monotonic()
        wait_for(lambda: s.metric("ldlm_requests_cancelled_total") >= 1, "the request to be cancelled", seconds=10)
        wait_for(lambda: s.metric("ldlm_running_requests") == 0, "the batch to stop", seconds=10)
        print(f"the batch stopped {time.monotonic() - closed:.2f} s after the client went away")
        status, _, answer = s.post("/infill", {"text": PROMPT, "steps": 3})
        check(status == 200 and answer["timings"]["queue_ms"] < 2000 * TIME_SCALE, f"still serving: {answer}")
        check(any("went away" in line for line in s.log), "the log says the client went away")

        # Not streamed: nothing is written until the end, so the server must look at the
        # socket itself (tools/ldlm/server/peer.hpp).
        body = json.dumps(dict(HOLD, resample=100))
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=30 * TIME_SCALE)
        sock.sendall(("POST /infill HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
        wait_for(lambda: s.metric("ldlm_running_requests") == 1, "the plain request to run", seconds=10)
        sock.close()
        closed = time.monotonic()
        wait_for(lambda: s.metric("ldlm_requests_cancelled_total") >= 2, "the plain request to be cancelled",
                 seconds=10)
        wait_for(lambda: s.metric("ldlm_running_requests") == 0, "its batch to stop", seconds=10)
        print(f"the plain batch stopped {time.monotonic() - closed:.2f} s after the client went away")
        check(any("a client went away" in line for line in s.log), "the log says the plain client went away")
        status, _, answer = s.post("/infill", {"text": PROMPT, "steps": 3})
        check(status == 200 and answer["timings"]["queue_ms"] < 2000 * TIME_SCALE, f"still serving: {answer}")

        # A client that sends its next request while the first runs (pipelining) makes the
        # socket readable, not closed: the first is still answered, then the second.
        body = json.dumps(HOLD)
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=60 * TIME_SCALE)
        sock.sendall(("POST /infill HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
        wait_for(lambda: s.metric("ldlm_running_requests") == 1, "the pipelined request to run", seconds=10)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        received = b""
        for _ in range(1000):
            chunk = sock.recv(65536)
            received += chunk
            if not chunk or received.count(b"HTTP/1.1 ") >= 2 and received.endswith(b"}"):
                break
        sock.close()
        heads = re.findall(rb"HTTP/1\.1 (\d+)", received)
        check(heads == [b"200", b"200"] and b'"texts"' in received, f"pipelined answers: {received[:300]!r}")
        check(s.metric("ldlm_requests_cancelled_total") == 2, "the pipelined request was not cancelled")
    finally:
        check(s.stop() == 0, "exit status")


def case_drain():
    s = Server("--threads", "1")
    held = {}
    blocker = long_request(s, "/infill", HOLD, held, "in flight")
    wait_for(lambda: s.metric("ldlm_running_requests") == 1, "the request to run")
    s.proc.send_signal(signal.SIGTERM)
    # No new connection once it is draining.
    def refused():
        try:
            socket.create_connection(("127.0.0.1", s.port), timeout=1).close()
            return False
        except OSError:
            return True
    wait_for(refused, "the listening socket to close", seconds=10)
    blocker.join(timeout=120 * TIME_SCALE)
    check(held.get("in flight", (None,))[0] == 200, f"the in-flight request: {held}")
    check(len(held["in flight"][2]["texts"]) == 1, "its answer")
    code = s.proc.wait(timeout=60 * TIME_SCALE)
    check(code == 0, f"exit status {code}")
    check(any("SIGTERM" in line for line in s.log), "the log names the signal")


CASES = {name[len("case_"):]: f for name, f in globals().items() if name.startswith("case_")}

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[2] not in CASES:
        sys.exit(__doc__)
    started = time.monotonic()
    CASES[sys.argv[2]]()
    print(f"{sys.argv[2]}: ok ({time.monotonic() - started:.1f} s)")
