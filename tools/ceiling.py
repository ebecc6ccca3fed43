"""The most lossless speculation could give on this machine for the benchmark's prompts (core/bench/ceiling.py):
the target's cost of a call on n tokens measured here, each prompt's greedy answer decoded, and per prompt the
ceiling over plain decoding of an oracle that copies whatever occurs in the text seen before, alone and with the
default pair's draft model (as Auto runs it) never wrong for the rest. A bench JSON adds what Auto reached there:

    python tools/ceiling.py --rounds 3 --json ceiling.json --bench docs/bench/llama-greedy-zen3.json

Costs are the fastest of five calls after a 300-token context, the least of ``--rounds`` rounds (a ceiling takes
the machine at its fastest). Calls of up to ``--max-call`` tokens (Auto's limit: 16), and of up to 64.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SIZES = tuple(range(1, 17)) + (24, 32, 48, 64)
NEW_TOKENS = 96


def measure(target, draft, rounds: int):
    from core.auto.calibrate import time_forward
    from core.auto.costs import Latencies
    from tools.verify_settings import CONTEXT_TEXT, CONTEXT_TOKENS

    context = target.tokenize(CONTEXT_TEXT * 20)[:CONTEXT_TOKENS]
    verify = {n: math.inf for n in SIZES}
    drafted = math.inf
    for _ in range(rounds):
        for n in SIZES:
            verify[n] = min(verify[n], time_forward(target, context, n).seconds)
        drafted = min(drafted, time_forward(draft, context, 1).seconds)
    target.reset()
    draft.reset()
    return Latencies(verify, {1: drafted})


def auto_over_native(path: Path) -> dict[str, float]:
    """Per prompt, the median over repeats of Auto's decode speed over native's in a bench JSON."""
    from core.bench.modes import NATIVE
    from core.bench.report import ratios

    runs = json.loads(path.read_text())["runs"]
    return {prompt: statistics.median(v) for (_, prompt), v in ratios(runs, "auto", NATIVE).items()}


COLUMNS = ("copies", "copies_64", "with_model", "auto_over_native")


def line(v: dict) -> str:
    auto = f", Auto / native {v['auto_over_native']:.2f}x" if v["auto_over_native"] else ""
    return (f"ceiling: copies {v['copies']:.2f}x (calls of 64: {v['copies_64']:.2f}x), with a perfect draft model "
            f"{v['with_model']:.2f}x{auto}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-call", type=int, default=16)
    parser.add_argument("--bench", type=Path, help="a bench JSON whose Auto / native per prompt is set beside")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    from core.backends.llamacpp import LlamaCppBackend
    from core.bench.ceiling import ceiling, copy_lengths
    from core.bench.report import geomean
    from core.bench.prompts import DEFAULT_PROMPTS, PROMPT_DIR, read_prompts
    from core.drafting import Baseline
    from core.engine import SpeculativeEngine
    from tools.weight_placement import model_file

    target = LlamaCppBackend(model_file("target"), n_ctx=4096)
    draft = LlamaCppBackend(model_file("draft"), n_ctx=4096)
    lat = measure(target, draft, args.rounds)
    cost, drafted = lat.verify_cost, lat.draft_cost(1)
    print("t(n)/t(1): " + " ".join(f"{n}:{r:.2f}" for n, r in lat.ratios().items()), flush=True)
    model, _ = ceiling([0] * NEW_TOKENS, cost, args.max_call, drafted)
    print(f"draft call / target call: {drafted / lat.plain:.2f}; a draft model never wrong, alone: {model:.2f}x",
          flush=True)
    measured = auto_over_native(args.bench) if args.bench else {}

    engine = SpeculativeEngine(target, None, Baseline())
    rows = []
    for name in DEFAULT_PROMPTS:
        for p in read_prompts(PROMPT_DIR / name):
            ids = target.apply_chat_template(p["messages"])
            answer = list(engine.generate(ids, NEW_TOKENS).tokens)
            known = ids + answer if p["regenerate"] else ids   # a regenerated prompt remembers its earlier answer
            lengths = copy_lengths(known, answer)
            copies, steps = ceiling(lengths, cost, args.max_call)
            row = {"set": p["set"], "id": p["id"], "tokens": len(answer), "copies": copies,
                   "copies_64": ceiling(lengths, cost, max(SIZES))[0],
                   "with_model": ceiling(lengths, cost, args.max_call, drafted)[0],
                   "copy_steps": len(steps), "copied_tokens": sum(s - 1 for s in steps),
                   "auto_over_native": measured.get(p["id"])}
            rows.append(row)
            print(f"{p['set']:16s} {p['id']:18s} {line(row)}; {row['copied_tokens']} of {len(answer)} tokens "
                  f"copied in {len(steps)} steps", flush=True)
    groups = {s: [r for r in rows if r["set"] == s] for s in dict.fromkeys(r["set"] for r in rows)}
    groups["all four sets"] = rows
    sets = {s: {key: geomean([r[key] or 0.0 for r in mine]) for key in COLUMNS} for s, mine in groups.items()}
    for s, v in sets.items():
        print(f"{s:35s} {line(v)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"latencies": lat.to_json(), "ratios": lat.ratios(), "model_alone": model,
                                         "max_call": args.max_call, "sets": sets, "prompts": rows}, indent=1))


if __name__ == "__main__":
    main()
