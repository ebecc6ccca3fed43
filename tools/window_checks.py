"""Checks of the real chat window on the default pair that are measurements, not tests (issues 9 and 11).

    python tools/window_checks.py ttft        # first answer's time to first token against the second's (fresh data)
    python tools/window_checks.py stop        # Stop pressed 1 s into a 4,000-token prompt: how long until it acts
    python tools/window_checks.py long-chat   # opening a 2,000-message conversation: time and memory
    python tools/window_checks.py fifty-turns # 50 turns of 512-token answers: the turn where trimming starts
    python tools/window_checks.py history-lock  # another process holds the history's write lock for 9 s while the
                                                # user chats (tiny pair): the longest the window went unresponsive

Each prints one JSON line. They run the real window offscreen (QT_QPA_PLATFORM=offscreen) in a temporary data
folder, on the default pair (llama.cpp) with default settings (Auto), so they need the models installed.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

QUESTION = "Write a Python function that merges two sorted lists."
# as long in tokens, and not a prefix of it: the second answer must read its prompt as the first did (asking the same
# question again reuses the whole prompt from the cache, which says nothing about warmth)
OTHER_QUESTION = "Write a Python function that reverses a linked list."


def window(**settings):
    from app.chat.history import HistoryStore
    from app.main import create_app, open_window
    from app.settings import AppSettings

    create_app()
    folder = Path(tempfile.mkdtemp(prefix="speclens-check-"))
    os.environ["SPECLENS_DATA_DIR"] = str(folder)
    w = open_window(AppSettings(**settings), HistoryStore(folder / "history.sqlite3"), persist=False)
    w.resize(1440, 900)
    return w


def wait(predicate, timeout: float = 3600.0) -> float:
    from PySide6.QtCore import QEventLoop, QTimer

    t0 = time.perf_counter()
    loop = QEventLoop()
    timer = QTimer()
    timer.setInterval(5)
    timer.timeout.connect(lambda: loop.quit() if predicate() or time.perf_counter() - t0 > timeout else None)
    timer.start()
    if not predicate():
        loop.exec()
    timer.stop()
    return time.perf_counter() - t0


def ask(w, text: str):
    """Send ``text``; returns (result, seconds from send to the first text on screen)."""
    done, first = [], []

    def finished(message, result):
        done.append(result)

    def frame(message, events):
        if not first and message.content:
            first.append(time.perf_counter())

    w.session.answer_finished.connect(finished)
    w.session.answer_frame.connect(frame)
    t0 = time.perf_counter()
    assert w.send(text)
    wait(lambda: bool(done))
    w.session.answer_finished.disconnect(finished)
    w.session.answer_frame.disconnect(frame)
    return done[0], (first[0] - t0) if first else None


def ttft() -> dict:
    t0 = time.perf_counter()
    w = window()
    wait(lambda: w.session.is_warm)
    warm = time.perf_counter() - t0
    first, first_seen = ask(w, QUESTION)
    w.session.new_chat()
    second, second_seen = ask(w, OTHER_QUESTION)
    w.session.new_chat()
    again, again_seen = ask(w, QUESTION)
    return {"load_and_warm_seconds": round(warm, 2),
            "first_ttft": first.stats.time_to_first_token, "second_ttft": second.stats.time_to_first_token,
            "first_seen_after_send": first_seen, "second_seen_after_send": second_seen,
            "ratio": first.stats.time_to_first_token / second.stats.time_to_first_token,
            "same_question_again_ttft": again.stats.time_to_first_token, "same_question_again_seen": again_seen}


def stop() -> dict:
    from core.context import answer_reserve

    w = window(max_new_tokens=32)   # a short answer leaves the prompt nearly the whole context: about 4,000 tokens
    wait(lambda: w.session.is_warm)
    target = w.session.backends[0]
    # the longest prompt the chat accepts: the context less the answer's share and the template's tokens
    room = target.context_length - answer_reserve(target.context_length, w.session.settings.max_new_tokens) - 64
    sentence = "the quick brown fox jumps over the lazy dog "
    repeats = room // len(target.tokenize(sentence))
    repeats = repeats * room // len(target.tokenize(sentence * repeats))   # repeated, the sentence tokenises shorter
    words = (sentence * repeats).strip()
    tokens = len(target.tokenize(words))
    done = []
    w.session.answer_finished.connect(lambda message, result: done.append((message, result)))
    assert w.send(words)
    wait(lambda: False, 1.0)          # Stop is pressed one second into the prompt
    w.session.stop()
    acted = wait(lambda: bool(done))
    message, result = done[0]
    return {"prompt_tokens": tokens, "stop_acted_after_seconds": round(acted, 3),
            "stop_reason": result.stop_reason.value if result else None, "saved_complete": message.complete,
            "prompt_tokens_read_before_stop": len(w.session.backends[0].committed)}


def long_chat() -> dict:
    from app.chat.history import HistoryStore, Message

    w = window(pair="tiny", backend="hf")
    wait(lambda: w.session.is_warm)
    store: HistoryStore = w.session.store
    cid = store.create_conversation("long")
    for i in range(1000):
        store.add_message(cid, Message("user", f"Question {i}: how do I reverse a list in Python?"))
        store.add_message(cid, Message("assistant", f"Answer {i}:\n\n```python\nitems.reverse()\n```\n\nor "
                                                    "`reversed(items)` for an iterator. " * 2))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    w.session.open_conversation(cid)
    from PySide6.QtWidgets import QApplication

    QApplication.processEvents()
    opened = time.perf_counter() - t0
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"messages": w.transcript.count(), "open_seconds": round(opened, 3),
            "live_cards": sum(w.transcript.card(i) is not None for i in range(w.transcript.count())),
            "max_rss_growth_mb": round((rss1 - rss0) / 1024, 1)}


def fifty_turns() -> dict:
    w = window(max_new_tokens=512)
    wait(lambda: w.session.is_warm)
    notices = []
    w.session.notice.connect(lambda text: notices.append(len(w.session.conv.messages)))
    turns = []
    asks = ["Write a Python class for a bank account with deposit, withdraw and a transaction history.",
            "Add interest calculation to it and show the whole class again.",
            "Now write unit tests for it with unittest.",
            "Explain how the tests could be organised better.",
            "Rewrite the class with dataclasses and type hints; return all the code."]
    for turn in range(50):
        result, _ = ask(w, asks[turn % len(asks)] + f" (turn {turn + 1})")
        turns.append({"turn": turn + 1, "tokens": len(result.tokens), "tok_s": round(result.stats.tokens_per_second, 2),
                      "stop": result.stop_reason.value})
        print(json.dumps(turns[-1]), file=sys.stderr, flush=True)
    first_trim = (notices[0] // 2) if notices else None
    return {"turns_answered": sum(t["tokens"] > 0 for t in turns), "first_trim_at_turn": first_trim,
            "trims": len(notices), "turns": turns}


# another program holding the history file's write lock (BEGIN EXCLUSIVE) for argv[2] seconds
HOLD_LOCK = ("import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
             "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(float(sys.argv[2])); "
             "c.execute('ROLLBACK')")


def history_lock(seconds: float = 9.0) -> dict:
    from PySide6.QtCore import QTimer

    w = window(pair="tiny", backend="hf", strategy="chain", max_new_tokens=300, min_new_tokens=300)
    wait(lambda: w.session.is_warm)
    ask(w, "before the lock")
    wait(lambda: w.session.writer.pending == 0)
    gaps, last = [], [time.perf_counter()]

    def tick() -> None:   # the GUI thread's event loop: every gap between ticks is time the window did not respond
        now = time.perf_counter()
        gaps.append(now - last[0])
        last[0] = now

    timer = QTimer()
    timer.setInterval(5)
    timer.timeout.connect(tick)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(w.session.store.path), str(seconds)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    t0 = time.perf_counter()
    last[0] = t0
    timer.start()
    ask(w, "during the lock")
    ask(w, "and again")
    w.session.regenerate()
    wait(lambda: not w.session.busy)
    w.session.rename(w.session.conv.id, "renamed during the lock")
    chatted = time.perf_counter() - t0
    wait(lambda: holder.poll() is not None)
    wait(lambda: w.session.writer.pending == 0)
    timer.stop()
    written = time.perf_counter() - t0
    rows = w.session.store.conversation(w.session.conv.id).messages
    return {"lock_held_seconds": seconds, "three_answers_and_a_rename_took_seconds": round(chatted, 2),
            "all_written_after_seconds": round(written, 2),
            "longest_unresponsive_ms": round(1000 * max(gaps), 1),
            "gaps_over_100ms": sum(g > 0.1 for g in gaps), "ticks": len(gaps),
            "all_saved": [m.content for m in rows] == [m.content for m in w.session.conv.messages] and len(rows) == 6}


if __name__ == "__main__":
    check = {"ttft": ttft, "stop": stop, "long-chat": long_chat, "fifty-turns": fifty_turns,
             "history-lock": history_lock}[sys.argv[1]]
    print(json.dumps({sys.argv[1]: check()}))
