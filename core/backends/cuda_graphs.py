"""Forward calls in a few fixed shapes, captured once each as CUDA graphs and replayed, so a decoding step costs a
few graph launches instead of hundreds of kernel launches from Python.

A call's new tokens are padded to a power of two (``rows``) and the cache slots it reads to a power of two
(``width``); each (rows, width) shape gets its own static inputs (core.backends.static_cache.StepInputs) and, when
capturing, its own graph, captured on first use. The trees a plan uses have a handful of sizes, and the width
doubles only as the conversation grows, so few graphs are ever captured. Without capture the same fixed-shape calls
run eagerly: that is how the CPU tests check the padding and the static inputs.
"""
from __future__ import annotations

import gc
import logging
from dataclasses import dataclass
from typing import Callable

import torch

from core.backends.devices import is_out_of_memory
from core.backends.static_cache import StepInputs
from core.tree import TokenTree

log = logging.getLogger(__name__)

MAX_ROWS = 64        # the most new tokens a fixed-shape call takes; larger calls (prefill chunks) run eagerly
MIN_WIDTH = 256      # the fewest cache slots a fixed-shape call reads: short chats share one width
WARMUP_RUNS = 2      # eager runs on a side stream before a capture (torch's recipe: lazy set-up happens outside it)

Forward = Callable[[StepInputs], torch.Tensor]   # the model's logits (rows, vocab) for filled inputs


def _power_of_two(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@dataclass
class _Shape:
    inputs: StepInputs
    graph: torch.cuda.CUDAGraph | None = None
    logits: torch.Tensor | None = None   # the graph's output tensor, overwritten by every replay


class FixedShapeSteps:
    """Runs ``forward`` on fixed-shape inputs, replaying CUDA graphs when ``capture`` is set (CUDA only).

    ``max_width`` is the number of cache slots: the context plus MAX_ROWS, so that padding always has room.
    """

    def __init__(self, forward: Forward, dtype: torch.dtype, device: str, max_width: int, capture: bool) -> None:
        self._forward = forward
        self._dtype, self._device = dtype, device
        self.max_width = max_width
        self.capture = capture
        self._shapes: dict[tuple[int, int], _Shape] = {}
        self._pool = None

    def shape_for(self, count: int, start: int, prefix: int) -> tuple[int, int] | None:
        """(rows, width) of the call that evaluates ``count`` nodes from node ``start`` after ``prefix`` tokens;
        None when the call is too large for a fixed shape."""
        if count > MAX_ROWS:
            return None
        rows = _power_of_two(count)
        return rows, min(self.max_width, max(MIN_WIDTH, _power_of_two(prefix + start + rows)))

    def run(self, tree: TokenTree, start: int, prefix: int) -> torch.Tensor | None:
        """Logits of nodes ``start..n-1`` of ``tree`` (a fresh tensor), or None when no fixed shape fits the call."""
        count = len(tree) - start
        key = self.shape_for(count, start, prefix)
        if key is None:
            return None
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = _Shape(StepInputs.allocate(*key, self._dtype, self._device))
        shape.inputs.fill(tree, start, prefix)
        if self.capture and shape.graph is None:
            self._capture(shape)
        if shape.graph is None:
            return self._forward(shape.inputs)[:count]
        shape.graph.replay()
        return shape.logits[:count].clone()

    def _capture(self, shape: _Shape) -> None:
        """Record ``forward`` on ``shape``'s inputs as a CUDA graph; on failure, log and run eagerly from now on.

        The inputs already hold a real call when this runs, so the warm-up runs compute that call (writing the same
        keys and values to the same slots each time) and the replay that follows gives its logits.
        """
        # A graph that Python's cycle collector frees while another graph is being captured calls into CUDA, which
        # a capture forbids, and the capture fails: no collection runs during one.
        collecting = gc.isenabled()
        gc.disable()
        try:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()   # one memory pool shared by every shape's graph
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUP_RUNS):
                    self._forward(shape.inputs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                logits = self._forward(shape.inputs)
        except RuntimeError as exc:
            if is_out_of_memory(exc):
                raise
            log.warning("CUDA graph capture failed (%s); running forward calls eagerly", exc)
            self.capture = False
            return
        finally:
            if collecting:
                gc.enable()
        shape.graph, shape.logits = graph, logits


def evaluate(steps: "FixedShapeSteps | None", forward: Forward, tree: TokenTree, start: int, prefix: int,
             dtype: torch.dtype, device: str) -> torch.Tensor:
    """Logits of nodes ``start..`` of ``tree`` after ``prefix`` cached tokens: a fixed shape of ``steps`` when one
    fits the call, else one eager ``forward`` over freshly allocated inputs."""
    logits = steps.run(tree, start, prefix) if steps is not None else None
    if logits is None:
        inputs = StepInputs.allocate(len(tree) - start, prefix + len(tree), dtype, device)
        inputs.fill(tree, start, prefix)
        logits = forward(inputs)
    return logits
