#!/usr/bin/env python3
"""The playground page of `ldlm serve` in a real browser.

Starts `ldlm serve` on an ephemeral loopback port, and Debian's headless Chromium
through chromedriver, driven with the W3C WebDriver protocol over HTTP (urllib and json
only). The page is used as a person would: an API key entered (it must go out as a
Bearer header), a text typed with two gaps (one typed, one from the Insert button), a
sampler picked, Run clicked; the filled text must appear with the known words kept,
after step-by-step updates. A prompt must be continued in the other mode. Then a text
without a gap must show the server's 400 plainly, and Stop must end a long run and
leave the page and the server usable.

    playground_test.py --ldlm build/default/tools/ldlm [--screenshot docs/images/playground.png]

Exit status 0: passed; 1: failed; 77: skipped (chromium or chromedriver missing; CTest's
SKIP_RETURN_CODE). Every wait is bounded; the server, chromedriver and Chromium are
killed at the end, whatever happens.
"""

import argparse
import base64
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SKIP = 77
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C key of an element reference
API_KEY = "playground-test-key"
STEPS = 20
SAMPLER = "unipc"
# What the page's text becomes: typed pieces with a gap after each but the last.
TYPED = ["The children played in the ", " after school, and then they ", " home."]
MASK = "<|mask|>"
PROMPT = "The old man"


class Failure(Exception):
    pass


def deadline_loop(seconds, what, poll=0.05):
    """Yields until `seconds` have passed, then fails naming `what` was not seen."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        yield
        time.sleep(poll)
    raise Failure(f"timed out after {seconds} s waiting for {what}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, timeout=30, headers=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


class Process:
    """A child in a process group of its own, its output collected by a thread."""

    def __init__(self, argv, name):
        self.name = name
        self.lines = queue.Queue()
        self.output = []
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, text=True, errors="replace")
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line)

    def wait_for_line(self, pattern, seconds):
        for _ in deadline_loop(seconds, f"{self.name} to print /{pattern}/"):
            if self.proc.poll() is not None and self.lines.empty():
                raise Failure(f"{self.name} exited with {self.proc.returncode}:\n{''.join(self.output)}")
            try:
                match = re.search(pattern, self.lines.get(timeout=0.2))
                if match:
                    return match
            except queue.Empty:
                pass

    def stop(self):
        """SIGTERM to the group, SIGKILL after 10 s."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # what the group left behind (Chromium's helpers)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)


class Browser:
    """A WebDriver session: just the commands this test needs."""

    def __init__(self, driver_url, profile):
        self.base = driver_url
        options = {"binary": CHROMIUM,
                   "args": ["--headless=new", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                            "--window-size=960,1180", "--force-device-scale-factor=1"]}
        value = self._call("POST", "/session", {"capabilities": {"alwaysMatch": {"goog:chromeOptions": options}}},
                           timeout=60)
        self.base += "/session/" + value["sessionId"]

    def _call(self, method, path, body=None, timeout=30):
        status, raw = http(method, self.base + path, body if body is not None or method != "POST" else {}, timeout)
        value = json.loads(raw or b"{}").get("value")
        if status != 200:
            raise Failure(f"WebDriver {method} {path}: HTTP {status}: {value}")
        return value

    def close(self):
        self._call("DELETE", "")

    def go(self, url):
        self._call("POST", "/url", {"url": url})

    def find(self, css):
        return self._call("POST", "/element", {"using": "css selector", "value": css})[ELEMENT]

    def find_all(self, css):
        return [e[ELEMENT] for e in self._call("POST", "/elements", {"using": "css selector", "value": css})]

    def click(self, css):
        self._call("POST", f"/element/{self.find(css)}/click", {})

    def clear(self, css):
        self._call("POST", f"/element/{self.find(css)}/clear", {})

    def type(self, css, text):
        self._call("POST", f"/element/{self.find(css)}/value", {"text": text})

    def text(self, css):
        return self._call("GET", f"/element/{self.find(css)}/text")

    def script(self, source, *args):
        return self._call("POST", "/execute/sync", {"script": source, "args": list(args)})

    def screenshot(self):
        return base64.b64decode(self._call("GET", "/screenshot"))

    def wait(self, source, what, seconds=60):
        """Polls a script until it returns something true, which it returns."""
        for _ in deadline_loop(seconds, what):
            value = self.script(source)
            if value:
                return value


def page_state(browser):
    return browser.script("""return {status: document.getElementById('status').textContent,
        error: document.getElementById('error').textContent, model: document.getElementById('model').textContent,
        output: document.getElementById('output').innerText}""")


def set_value(browser, css, text):
    browser.clear(css)
    browser.type(css, text)


def check_filled(text):
    """The final text: no marker left, the known words in order, something in each gap."""
    if MASK in text:
        raise Failure(f"the output still holds {MASK}: {text!r}")
    at = 0
    for i, piece in enumerate(TYPED):
        known = piece.rstrip(" ") if i < len(TYPED) - 1 else piece  # the space before a gap is the gap's
        found = text.find(known, at)
        if found < 0 or (i == 0 and found != 0):
            raise Failure(f"the output lost the known text {known!r} (after position {at}): {text!r}")
        if i > 0 and found == at:
            raise Failure(f"gap {i} came back empty: {text!r}")
        at = found + len(known)


# The page's highlighting (its functions knownPieces and segments) on outputs the model
# may give: (text with markers, output, the gaps expected, or None for "not highlighted").
HIGHLIGHT_CASES = [
    ("in the <|mask|> after", "in the yard after", [" yard"]),
    ("in the <|mask|> after", "in theyard after", ["yard"]),  # the space before a gap is the gap's
    ("a <|mask|><|mask|> b", "a xy b", [" xy"]),  # adjacent gaps are one
    ("<|mask|> cat <|mask|>", "The cat sat", ["The", " sat"]),
    ("in the <|mask|> after", "in a yard after", None),  # known text changed: shown plain
]


def check_highlighting(browser):
    for text, output, expected in HIGHLIGHT_CASES:
        parts = browser.script("return segments(arguments[1], knownPieces(arguments[0], 'infill'));", text, output)
        gaps = None if parts is None else [part for part, gap in parts if gap]
        if gaps != expected or (parts is not None and "".join(part for part, _ in parts) != output):
            raise Failure(f"the page splits {output!r} (from {text!r}) into {parts}, expected the gaps {expected}")


def run_page(browser, url, screenshot):
    browser.go(url)
    browser.wait(f"return [...document.querySelectorAll('#sampler option')].some(o => o.value === '{SAMPLER}');",
                 f"#sampler to offer {SAMPLER} (from /v1/models)", 30)
    print(f"model: {page_state(browser)['model']!r}")
    check_highlighting(browser)

    # An API key entered is sent as a Bearer header (with --api-key the server protects the
    # page too, so the page is loaded from a server without one and its requests are watched).
    browser.script("""window.sent = []; const fetch = window.fetch;
        window.fetch = (url, init) => { window.sent.push([String(url), (init && init.headers) || {}]); return fetch(url, init); };""")
    browser.click("#key-field summary")
    browser.type("#api-key", API_KEY + "\ue004")  # Tab: the change event reloads the models
    sent = browser.wait("return window.sent.length && window.sent;", "the models reloaded with the key", 10)
    if sent[0][0] != "v1/models" or sent[0][1].get("Authorization") != "Bearer " + API_KEY:
        raise Failure(f"expected GET v1/models with 'Authorization: Bearer {API_KEY}', the page sent {sent}")

    # The text, typed around two gaps: the first marker typed, the second from the button.
    browser.clear("#text")
    browser.type("#text", TYPED[0] + MASK + TYPED[1])
    browser.click("#insert-mask")
    browser.type("#text", TYPED[2])
    expected = MASK.join(TYPED)
    typed = browser.script("return document.getElementById('text').value;")
    if typed != expected:
        raise Failure(f"#text holds {typed!r}, expected {expected!r}")
    set_value(browser, "#steps", str(STEPS))
    set_value(browser, "#seed", "3")
    browser.click(f"#sampler option[value='{SAMPLER}']")

    # Every redraw of the output and the status, as the page makes it.
    browser.script("""window.seen = [];
        window.watcher = new MutationObserver(() => window.seen.push({status: document.getElementById('status').textContent,
                                                     output: document.getElementById('output').innerText,
                                                     gaps: document.querySelectorAll('#output mark.gap').length}))
        window.watcher.observe(document.querySelector('main'), {childList: true, subtree: true, characterData: true});""")
    started = time.monotonic()
    browser.click("#run")
    browser.wait("const s = document.getElementById('status').textContent, e = document.getElementById('error');"
                 "return s.startsWith('Done') || !e.hidden;", "the run to finish", 120)
    state = page_state(browser)
    print(f"run: {time.monotonic() - started:.2f} s, status {state['status']!r}")
    if state["error"] or not state["status"].startswith("Done"):
        raise Failure(f"the run failed: {state}")
    final = browser.script("return [...document.querySelectorAll('#output pre.final')].map(p => p.textContent);")
    if len(final) != 1:
        raise Failure(f"expected 1 final sample in #output, found {len(final)}: {state['output']!r}")
    print(f"final text: {final[0]!r}")
    check_filled(final[0])
    filled = browser.script("return document.querySelectorAll('#output mark.gap.filled').length;")
    if filled != len(TYPED) - 1:
        raise Failure(f"expected {len(TYPED) - 1} highlighted gaps, found {filled} in {state['output']!r}")

    # The steps as drawn: a status "Step k/N" with the step's text in #output, its gaps
    # highlighted. The page draws the first step at once, then at most 30 a second, so not
    # every step; its list of every step holds each one.
    seen = browser.script("window.watcher.disconnect(); return window.seen;")
    drawn = sorted({s["status"] for s in seen
                    if s["status"].startswith("Step ") and s["output"].strip() and s["gaps"] == len(TYPED) - 1})
    history = browser.script("return [...document.querySelectorAll('#history-list li')].map(li => li.textContent);")
    print(f"redraws seen: {len(seen)}, steps drawn with their text: {drawn}, steps listed: {len(history)}")
    listed = [int(re.match(r"step (\d+)/", item).group(1)) if re.match(r"step \d+/", item) else None for item in history]
    if listed != list(range(1, STEPS + 1)) or not any(s.startswith(f"Step 1/{STEPS},") for s in drawn):
        raise Failure(f"expected steps 1..{STEPS} listed and step 1 drawn with its text and "
                      f"{len(TYPED) - 1} highlighted gaps; listed {listed}, drawn {drawn}; every redraw: {seen}")

    if screenshot:
        browser.click("#history summary")  # the steps' texts, for the picture
        image = browser.screenshot()
        browser.click("#history summary")
        os.makedirs(os.path.dirname(os.path.abspath(screenshot)), exist_ok=True)
        with open(screenshot, "wb") as out:
            out.write(image)
        print(f"screenshot: {screenshot}, {len(image)} bytes")

    # Continuing a prompt: /generate, the prompt kept and what follows it highlighted.
    browser.click("#mode-generate")
    set_value(browser, "#text", PROMPT)
    set_value(browser, "#length", "6")
    browser.click("#run")
    browser.wait("const s = document.getElementById('status').textContent, e = document.getElementById('error');"
                 "return s.startsWith('Done') || !e.hidden;", "the continuation to finish", 60)
    continued = browser.script("return [...document.querySelectorAll('#output pre.final')].map(p => p.textContent);")
    marks = browser.script("return document.querySelectorAll('#output mark.gap.filled').length;")
    print(f"continued: {continued!r}")
    if len(continued) != 1 or not continued[0].startswith(PROMPT) or len(continued[0]) == len(PROMPT) or marks != 1:
        raise Failure(f"expected {PROMPT!r} continued, with the continuation highlighted; page: {page_state(browser)}")
    browser.click("#mode-infill")

    # A text without a gap: the server's 400 is shown as it is.
    set_value(browser, "#text", "No gap here.")
    browser.click("#run")
    error = browser.wait("const e = document.getElementById('error'); return !e.hidden && e.textContent;",
                         "the page to show the server's error", 30)
    print(f"without a gap: {error!r}")
    if "400" not in error or "text" not in error:
        raise Failure(f"expected an HTTP 400 naming the field 'text', the page shows {error!r}")

    # Stop: a long run is aborted after its first step; the page is ready again.
    set_value(browser, "#text", MASK.join(TYPED))
    # The most steps the server allows (max_steps of /v1/models, which the page puts on
    # #steps): several seconds of the demo model.
    long_steps = browser.script("return document.getElementById('steps').max;")
    if not long_steps:
        raise Failure("#steps has no maximum: the page did not take max_steps from /v1/models")
    set_value(browser, "#steps", long_steps)
    set_value(browser, "#n", "4")  # 4 samples: slower steps, time for the click on a loaded machine
    browser.click("#run")
    browser.wait("return document.getElementById('status').textContent.startsWith('Step ') ||"
                 "!document.getElementById('error').hidden;", "the long run's first step", 60)
    if page_state(browser)["error"]:
        raise Failure(f"the long run failed: {page_state(browser)}")
    browser.click("#stop")
    status = browser.wait("const s = document.getElementById('status').textContent;"
                          "return s.startsWith('Stopped') && !document.getElementById('run').disabled && s;",
                          "the page to stop", 10)
    print(f"stopped: {status!r}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ldlm", required=True, help="the ldlm executable")
    parser.add_argument("--screenshot", help="write a PNG of the page after the run here")
    args = parser.parse_args()
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        print(f"SKIP: {' and '.join(missing)} not installed (Debian's chromium and chromium-driver; "
              "bash tools/install-deps.sh --browser installs them)")
        return SKIP

    profile = tempfile.mkdtemp(prefix="ldlm-playground-")
    server = driver = browser = None
    try:
        server = Process([args.ldlm, "serve", "--host", "127.0.0.1", "--port", "0"], "ldlm serve")
        url = server.wait_for_line(r"(http://127\.0\.0\.1:\d+)", 120).group(1) + "/"
        for _ in deadline_loop(60, f"{url}health to answer 200"):
            try:
                if http("GET", url + "health", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
        port = free_port()
        driver = Process([CHROMEDRIVER, f"--port={port}"], "chromedriver")
        driver_url = f"http://127.0.0.1:{port}"
        for _ in deadline_loop(30, "chromedriver to be ready"):
            try:
                if json.loads(http("GET", driver_url + "/status", timeout=5)[1])["value"]["ready"]:
                    break
            except (OSError, ValueError, KeyError):
                pass
        browser = Browser(driver_url, profile)
        run_page(browser, url, args.screenshot)
        if http("GET", url + "health", timeout=10)[0] != 200:
            raise Failure("the server stopped answering /health after the page's runs")
        print("PASS: the playground filled the gaps step by step in headless Chromium")
        return 0
    except Failure as failure:
        print(f"FAIL: {failure}")
        if browser:
            try:
                print(f"page: {page_state(browser)}")
            except Failure:
                pass
        if server:
            print("ldlm serve printed:\n" + "".join(server.output[-40:]))
        return 1
    finally:
        if browser:
            try:
                browser.close()
            except (Failure, OSError):
                pass
        for process in (driver, server):
            if process:
                process.stop()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
