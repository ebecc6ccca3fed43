"""Decode speed of the default target on llama.cpp depending on which threads call it: the measurement behind the
app's single engine thread (app/worker.py). One process per layout, so that no OpenMP pool is left over:

    python tools/thread_layouts.py main 3     # load and decode on the main thread
    python tools/thread_layouts.py worker 3   # load and decode on one worker thread (the app's layout)
    python tools/thread_layouts.py split 3    # load and decode once on the main thread, then decode on a worker
    python tools/thread_layouts.py fresh 3    # as split, but a fresh thread per decode (the app's old layout)

Each prints one JSON line with the decode tokens/s of each run (Baseline, greedy, 64 tokens). Alternate the layouts
and repeat: single runs move by about 10% on a busy two-core machine.
"""
from __future__ import annotations

import json
import os
import queue
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

QUESTION = "Explain what a closure is in Python, with an example."
LAYOUTS = ("main", "worker", "split", "fresh")


def setup():
    from core.drafting import Baseline
    from core.engine import SpeculativeEngine
    from core.models import load_pair
    from core.sampling import SamplingParams

    target, _ = load_pair("default", backend="llama.cpp")
    engine = SpeculativeEngine(target, None, Baseline(), SamplingParams(temperature=0.0))
    return engine, engine.chat_ids([{"role": "user", "content": QUESTION}])


def decode(engine, ids) -> float:
    return engine.generate(ids, 64).stats.tokens_per_second


class Worker:
    """One long-lived thread that runs what it is given, as the app's engine thread does."""

    def __init__(self) -> None:
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop)
        self._thread.start()

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    def run(self, fn):
        done, out = threading.Event(), []
        self._jobs.put(lambda: (out.append(fn()), done.set()))
        done.wait()
        return out[0]

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()


def in_fresh_thread(fn):
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


def measure(layout: str, runs: int) -> list[float]:
    if layout == "main":
        engine, ids = setup()
        decode(engine, ids)
        return [decode(engine, ids) for _ in range(runs)]
    if layout == "fresh":
        engine, ids = setup()
        decode(engine, ids)
        return [in_fresh_thread(lambda: decode(engine, ids)) for _ in range(runs)]
    worker = Worker()
    try:
        if layout == "worker":
            engine, ids = worker.run(setup)
            worker.run(lambda: decode(engine, ids))
        else:
            engine, ids = setup()
            decode(engine, ids)
        return [worker.run(lambda: decode(engine, ids)) for _ in range(runs)]
    finally:
        worker.close()


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in LAYOUTS or not argv[1].isdigit() or int(argv[1]) < 1:
        print(f"usage: python tools/thread_layouts.py {{{','.join(LAYOUTS)}}} RUNS", file=sys.stderr)
        return 2
    speeds = measure(argv[0], int(argv[1]))
    print(json.dumps({"layout": argv[0], "decode_tokens_per_s": [round(x, 2) for x in speeds]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
