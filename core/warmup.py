"""Warming a freshly loaded pair before the first answer: the strategy measures (or loads) its plan, and both models
run once at the batch sizes decoding uses, so the first answer's first token comes as fast as a later one's.

Without it the first answer pays for page-faulting the weights in, allocating llama.cpp's compute buffers for each
batch shape and, for Auto on a new machine, measuring the machine.
"""
from __future__ import annotations

import threading
from typing import Callable

from core.auto import Auto
from core.tree import TokenTree

WARM_SIZES = (1, 2, 4, 8)
WARM_MESSAGE = "Hello"


def warm(target, draft, strategy, sampling, progress: Callable[[float, str], None] = lambda fraction, text: None,
         cancel: threading.Event | None = None) -> None:
    """Bind ``strategy`` (Auto measures or loads its plan) and run both models at the batch sizes decoding uses;
    ``progress(fraction, what)`` says how far it is."""
    if isinstance(strategy, Auto):
        strategy.report = lambda what, fraction: progress(0.8 * fraction, f"Measuring this machine (once): {what}")
    progress(0.0, f"Preparing {strategy.label}")
    strategy.bind(target, draft, sampling)
    prompt = target.apply_chat_template([{"role": "user", "content": WARM_MESSAGE}])
    models = [m for m in (target, draft) if m is not None]
    for i, model in enumerate(models):
        if cancel is not None and cancel.is_set():
            return
        progress(0.8 + 0.2 * i / len(models), "Warming up the models")
        model.prefill(prompt[:-1])
        for size in WARM_SIZES:
            model.forward_tree(TokenTree.chain([prompt[-1]] * size))
            model.commit([])
