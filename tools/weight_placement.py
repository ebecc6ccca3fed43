"""What the weight placement (core/backends/weight_buffers.py) does to the cost of a llama.cpp call on this CPU: the
measurement behind repacking the Q4 matrices on AMX CPUs. One process per placement, so the two never share a
machine state; alternate them and repeat:

    python tools/weight_placement.py repacked target    # the backend's placement
    python tools/weight_placement.py plain target       # every weight in plain buffers (the previous placement)
    python tools/weight_placement.py repacked draft     # the same for the draft model (as Auto runs it: Q4_0)

Each prints one JSON line: t(n), the fastest of five calls evaluating n new tokens after a 200-token context, and
t(n)/t(1).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

WIDTHS = (1, 2, 4, 8, 16)
CONTEXT_TOKENS = 200
REPEATS = 5


def model_file(role: str) -> Path:
    from core import models
    from core.assembly import assemble
    from core.quantize import requantized

    pair = models.PAIRS["default"]
    return assemble(pair.target) if role == "target" else requantized(assemble(pair.draft), "Q4_0")


def main(placement: str, role: str) -> None:
    import core.backends.llamacpp as llamacpp
    from core.backends.weight_buffers import WeightBuffers
    from core.tree import TokenTree

    if placement == "plain":
        llamacpp.weight_buffers = lambda path, gpu: WeightBuffers(use_extra_bufts=False)
    backend = llamacpp.LlamaCppBackend(model_file(role), n_ctx=1024)
    prompt = [1000 + i for i in range(CONTEXT_TOKENS)]
    backend.prefill(prompt)
    seconds = {n: float("inf") for n in WIDTHS}
    for _ in range(REPEATS):
        for n in WIDTHS:
            t0 = time.perf_counter()
            rows = backend.forward_tree(TokenTree.chain([2000 + i for i in range(n)]))
            rows[n - 1]   # the last row fetched, as a verifier reaching the end of the draft does
            seconds[n] = min(seconds[n], time.perf_counter() - t0)
            backend.commit([])
    print(json.dumps({"placement": placement, "model": role, "weights": backend.weight_buffers.describe(),
                      "ms": {n: round(s * 1000, 1) for n, s in seconds.items()},
                      "ratio": {n: round(s / seconds[1], 2) for n, s in seconds.items()}}))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("repacked", "plain") or sys.argv[2] not in ("target", "draft"):
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
