"""How long memory drafting takes per decode step: ``python -m core.memory.speed [corpus_tokens]``.

The text is this Python installation's own source files, split into words and numbered (a stand-in for a tokenizer
on text that repeats itself as code and prose do). A remembered corpus of ``corpus_tokens`` (default 1M) is indexed;
then a live context of 4,096 tokens from other files is decoded step by step (1-4 tokens appended per step), timing
:meth:`MemoryDrafter.propose` at every step. Also timed: indexing the corpus, remembering one more answer, saving and
opening the memory file.
"""
from __future__ import annotations

import re
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

from core.memory.documents import MemoryState, SuffixMemory
from core.memory.drafter import MemoryDrafter
from core.memory.index import CorpusIndex
from core.memory import store
from core.memory.store import open_memory

LIVE_TOKENS = 4096
VOCAB = 50_000


def source_documents(total: int) -> list[np.ndarray]:
    """Numbered words of the standard library's and site-packages' .py files, one document per file."""
    vocab: dict[str, int] = {}
    docs, count = [], 0
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])]
    for path in sorted(p for root in roots for p in root.rglob("*.py")):
        try:
            words = re.findall(r"\w+|[^\w\s]|\n", path.read_text(encoding="utf-8", errors="ignore"))
        except OSError:
            continue
        if len(words) < 50:
            continue
        docs.append(np.array([vocab.setdefault(w, len(vocab)) % VOCAB for w in words], np.int32))
        count += len(words)
        if count >= total:
            break
    return docs


def percentiles(seconds: list[float]) -> str:
    us = np.array(seconds) * 1e6
    return f"median {np.median(us):.0f} us, p90 {np.percentile(us, 90):.0f} us, max {us.max():.0f} us"


def main(corpus_tokens: int = 1_000_000) -> None:
    docs = source_documents(corpus_tokens + 2 * LIVE_TOKENS)
    split = len(docs)
    while sum(len(d) for d in docs[split:]) < LIVE_TOKENS + 100:   # the last files are the live text
        split -= 1
    live_doc, remembered = np.concatenate(docs[split:]), docs[:split]
    t0 = time.perf_counter()
    index = CorpusIndex.built(remembered)
    t1 = time.perf_counter()
    n = len(remembered)
    state = MemoryState(index, np.arange(n), np.arange(n), (None,) * n, ("file",) * n, n, n)
    memory = SuffixMemory("speed", max_bytes=256 * 2**20, state=state)
    ref = np.arange(1000)
    t = time.perf_counter()
    for _ in range(10_000):
        ref.sum()
    print(f"this machine: numpy sum of 1,000 ints {(time.perf_counter() - t) * 100:.2f} us (a reference)")
    print(f"corpus: {memory.tokens:,} tokens in {n:,} documents; indexed in {t1 - t0:.2f} s; "
          f"{memory.nbytes / 2**20:.1f} MiB, {memory.nbytes / memory.tokens:.2f} bytes per remembered token")

    for budget, depth in ((8, 8), (32, 8), (64, 16)):
        drafter = MemoryDrafter(memory, budget, depth, min_match=1)
        context = live_doc[:LIVE_TOKENS - 600].tolist()
        drafter.start(context)
        wall, cpu, matches, nodes = [], [], [], []
        rng = np.random.default_rng(0)
        while len(context) < LIVE_TOKENS:
            context += live_doc[len(context):len(context) + int(rng.integers(1, 5))].tolist()
            t, c = time.perf_counter(), time.thread_time()
            proposal = drafter.propose(context, budget, depth)
            wall.append(time.perf_counter() - t)
            cpu.append(time.thread_time() - c)
            matches.append(proposal.match)
            nodes.append(len(proposal.tree))
        print(f"propose(budget {budget}, depth {depth}), {len(wall)} steps up to a {len(context):,}-token context: "
              f"wall {percentiles(wall)}; CPU {percentiles(cpu)}; mean match {np.mean(matches):.1f}, "
              f"mean nodes {np.mean(nodes):.1f}")

    answer = live_doc[:500]
    t = time.perf_counter()
    memory.add_answer(live_doc[:64].tolist(), answer.tolist())
    print(f"remembering a 500-token answer: {(time.perf_counter() - t) * 1e3:.1f} ms")
    with tempfile.TemporaryDirectory() as folder:
        saved = open_memory("speed", folder, max_bytes=256 * 2**20)
        saved.restore(memory.snapshot())
        t = time.perf_counter()
        saved.save()
        t_save = time.perf_counter() - t
        size = sum(p.stat().st_size for p in Path(folder).iterdir())
        store._open.clear()  # forget the open memory so that it is read from disk
        t = time.perf_counter()
        reopened = open_memory("speed", folder, max_bytes=256 * 2**20)
        t_open = time.perf_counter() - t
        print(f"saving {t_save * 1e3:.0f} ms ({size / 2**20:.1f} MiB on disk), opening {t_open * 1e3:.0f} ms "
              f"({reopened.tokens:,} tokens)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
