"""The GIL is released while ldlm computes, two Python threads on one model give the serial
results, and Ctrl-C (SIGINT -> KeyboardInterrupt) stops a sampling at the next step."""
import signal
import threading
import time

import numpy as np
import pytest

import ldlm
from parity_support import DEMO_WEIGHTS

# Long enough that an interrupt or another thread lands inside it: the demo model takes
# about 2 ms per step for one sample of 32 tokens (an AMD EPYC, 1 thread).
LONG = dict(length=32, steps=10000, threads=1)


@pytest.fixture(scope="module")
def lm():
    return ldlm.TextModel.demo()


def in_threads(work, count=2):
    results, errors = [None] * count, []

    def run(i):
        try:
            results[i] = work(i)
        except BaseException as e:  # noqa: B902: reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def test_two_threads_on_one_text_model_equal_serial(lm):
    options = [dict(seed=s, length=16, steps=6, batch=2, threads=1) for s in (1, 2)]
    serial = [lm.generate(**o) for o in options]
    assert in_threads(lambda i: lm.generate(**options[i])) == serial
    prompt = lm.tokenize("The cat sat on the mat.")
    serial_ids = [lm.continue_ids(prompt, **options[i]) for i in range(2)]
    parallel = in_threads(lambda i: lm.continue_ids(prompt, **options[i]))
    for a, b in zip(parallel, serial_ids):
        np.testing.assert_array_equal(a, b)


def test_two_threads_on_one_loaded_model_equal_serial():
    model = ldlm.load_model(str(DEMO_WEIGHTS))
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((2, 16, model.config.d_model), dtype=np.float32) for _ in range(2)]
    t = np.float32([0.3, 0.7])
    serial = [model.denoiser(x, t, x, threads=1) for x in xs]
    for a, b in zip(in_threads(lambda i: model.denoiser(xs[i], t, xs[i], threads=1)), serial):
        np.testing.assert_array_equal(a, b)


def test_gil_is_released_while_sampling(lm):
    # The main thread counts while another thread samples for ~0.3 s: holding the GIL
    # through the sampling would leave the count near zero.
    done = threading.Event()
    worker = threading.Thread(target=lambda: (lm.generate(length=32, steps=150, threads=1), done.set()))
    count = 0
    worker.start()
    while not done.is_set():
        count += 1
        time.sleep(0.001)
    worker.join()
    assert count >= 20, f"the main thread ran only {count} times while ldlm sampled"


def test_on_step_takes_the_gil_back_in_a_thread(lm):
    # Each thread's callback runs Python (it needs the GIL) while the other thread samples.
    def steps_seen(i):
        seen = []
        lm.generate(seed=i, length=8, steps=3, threads=1, on_step=lambda s: seen.append(s["texts"][0].upper()))
        return len(seen)

    assert in_threads(steps_seen) == [3, 3]


def test_ctrl_c_stops_sampling_at_the_next_step(lm):
    lm.generate(length=32, steps=2, threads=1)  # loaded and warm: the interrupt lands in the sampling
    timer = threading.Timer(0.3, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT))
    start = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        lm.generate(**LONG)
    elapsed = time.monotonic() - start
    timer.join()
    # 10000 steps take 10 s or more; stopped at the next step, the call returns right after 0.3 s.
    assert elapsed < 5, f"the sampling went on for {elapsed:.1f} s after Ctrl-C"
    # The model is still usable, and gives what it gave before.
    assert lm.generate(seed=3, length=8, steps=3) == lm.generate(seed=3, length=8, steps=3)


def test_ctrl_c_during_on_step_sampling(lm):
    timer = threading.Timer(0.3, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        lm.generate(on_step=lambda s: None, **LONG)
    timer.join()
