"""What llama.cpp's context settings do to the cost of verifying n tokens on this CPU: the measurement behind
which settings the planner times (core/auto/calibrate.py `tune_verification`). One process, the settings
alternated round by round, so that a machine that speeds up or slows down affects each alike:

    python tools/verify_settings.py                          # every setting, 3 rounds
    python tools/verify_settings.py --settings default,ub4 --rounds 5 --sizes 1,4,8

Each line is one setting in one round: t(n), the fastest of five target calls evaluating n new tokens after a
300-token context, and t(n)/t(1). Settings: default (llama.cpp's choices), fa-on / fa-off (flash attention), ubN
(micro-batch of N tokens: a longer batch is decoded in pieces).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

CONTEXT_TOKENS = 300
CONTEXT_TEXT = "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"


def tuning(name: str):
    from core.backends.llamacpp import ContextTuning

    if name == "default":
        return ContextTuning()
    if name in ("fa-on", "fa-off"):
        return ContextTuning(flash_attn=name == "fa-on")
    if name.startswith("ub") and name[2:].isdigit() and int(name[2:]) > 0:
        return ContextTuning(n_ubatch=int(name[2:]))
    raise SystemExit(f"unknown setting {name!r}: default, fa-on, fa-off or ubN")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default="default,fa-on,fa-off,ub4,ub7")
    parser.add_argument("--sizes", default="1,2,3,4,6,7,8,12,16")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    settings = {name: tuning(name) for name in args.settings.split(",")}
    sizes = sorted({int(s) for s in args.sizes.split(",")} | {1})

    from core.auto.calibrate import time_forward
    from core.backends.llamacpp import LlamaCppBackend
    from tools.weight_placement import model_file

    target = LlamaCppBackend(model_file("target"), n_ctx=1024)
    context = target.tokenize(CONTEXT_TEXT * 20)[:CONTEXT_TOKENS]
    for round_ in range(1, args.rounds + 1):
        for name, setting in settings.items():
            target.retune(setting)
            ms = {n: 1000 * time_forward(target, context, n).seconds for n in sizes}
            cells = " ".join(f"{n}:{ms[n]:.1f}ms/{ms[n] / ms[1]:.2f}" for n in sizes)
            print(f"round {round_} {name:8s} {cells}", flush=True)


if __name__ == "__main__":
    main()
