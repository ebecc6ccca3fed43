"""Auto replayed on the benchmark's recorded greedy answers at one or more machines' costs (core/bench/replay.py):
what a change to Auto's choices does, in seconds, on every kind of machine whose cost table is at hand, beside the
oracle's ceiling on the same table. Record the answers once (the default pair on llama.cpp, about 3 minutes):

    python tools/replay.py --record answers.json
    python tools/replay.py --answers answers.json --costs plan docs/bench/ceiling-zen4.json docs/bench/plan-xeon-amx.txt

A cost table is ``plan`` (this machine's cached plan), a plan or ceiling JSON (its ``latencies``) or the text
``speclens plan`` prints. Auto decides from the table and its calls cost the same table; ``--actual`` gives a table
the calls really cost instead (one measured deeper into a decode, as tools/ceiling.py does). Replays rank policies;
the bench measures them.

Every prompt starts, as in the bench, from empty memory statistics (the rates at which memory's guesses hold, which
Auto's estimates start from); in use they are learnt across sessions. ``--warm`` starts each set's prompts from the
statistics learnt by replaying every other set first (never the prompt's own set): Auto as a user who has used it
has it (``--warm-memory DIR`` writes such statistics, learnt on all the answers given, into a memory folder holding
no text, for ``speclens bench --memory DIR``). ``--knowing`` adds, beside Auto, an Auto that knows which nodes of its
own memory proposals the target accepts (core.bench.replay): how much better estimates could gain, split by a third
column, Auto with the nodes it drafted and the target rejected charged nothing: what its wrong drafts cost, and, from
there to the knowing Auto, what the copies it did not dare draft would have given.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from core.bench.prompts import DEFAULT_PROMPTS  # noqa: E402  (after the path above)
from tools.ceiling import NEW_TOKENS  # noqa: E402  (the bench's answer length, as the ceiling decodes it)

FOUR = tuple(name.removesuffix(".jsonl") for name in DEFAULT_PROMPTS)
LABELS = {"unrejected": "Auto, rejected nodes free"}
SETS = FOUR + ("held_out_2", "held_out", "held_out_3", "held_out_4", "held_out_5", "held_out_6", "held_out_7")


def record(path: Path, sets: list[str]) -> None:
    from core.backends.llamacpp import LlamaCppBackend
    from core.bench.prompts import PROMPT_DIR, read_prompts
    from core.bench.runners import earlier_sampling
    from core.drafting import Baseline
    from core.engine import SpeculativeEngine
    from core.sampling import SamplingParams
    from tools.weight_placement import model_file

    target = LlamaCppBackend(model_file("target"), n_ctx=4096)
    engine = SpeculativeEngine(target, None, Baseline())
    earlier = SpeculativeEngine(target, None, Baseline(), earlier_sampling(SamplingParams()))
    rows = []
    for name in sets:
        for p in read_prompts(PROMPT_DIR / f"{name}.jsonl"):
            ids = target.apply_chat_template(p["messages"])
            before = list(earlier.generate(ids, NEW_TOKENS).tokens) if p["regenerate"] else None
            answer = list(engine.generate(ids, NEW_TOKENS).tokens)
            rows.append({"set": name, "id": p["id"], "prompt": ids, "answer": answer, "earlier": before})
            print(f"{name}/{p['id']}: {len(answer)} tokens", flush=True)
    path.write_text(json.dumps({"vocab_size": target.vocab_size, "eos": sorted(target.eos_ids), "prompts": rows}))


def cost_table(spec: str):
    """(name, Plan) for a cost table given on the command line (see the module docstring)."""
    from core.auto.cache import load_plan
    from core.auto.costs import Latencies
    from core.auto.plan import Plan, plan_key
    from core.bench.replay import latencies_from_plan_text
    from core.sampling import SamplingParams

    if spec == "plan":
        from core import models
        from core.assembly import assemble
        from core.backends.llamacpp import LlamaCppBackend

        pair = models.PAIRS["default"]
        target, draft = (LlamaCppBackend(assemble(m), n_ctx=512) for m in (pair.target, pair.draft))
        plan = load_plan(plan_key(target, draft, SamplingParams()))
        if plan is None:
            raise SystemExit("no cached plan for the default pair here: run `speclens plan --backend llama.cpp` first")
        return "this machine's plan", Plan({}, plan.latencies)
    try:
        text = Path(spec).read_text()
        if spec.endswith(".json"):
            return Path(spec).stem, Plan({}, Latencies.from_json(json.loads(text)["latencies"]))
        return Path(spec).stem, Plan({}, latencies_from_plan_text(text))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SystemExit(f"{spec}: not a cost table ({exc!r}): give `plan`, a plan or ceiling JSON, or the text "
                         "`speclens plan` printed") from None


class Vocabulary:
    """The default pair's tokenizer alone (llama.cpp's vocabulary, no weights): what the recorded answers spell."""

    def __init__(self) -> None:
        from llama_cpp import Llama

        from core import models
        from core.assembly import assemble

        self.model = Llama(model_path=str(assemble(models.PAIRS["default"].target)), vocab_only=True, verbose=False)

    def detokenize(self, ids) -> str:
        return self.model.detokenize(list(ids)).decode("utf-8", errors="replace")

    def tokenize(self, text: str) -> list[int]:
        return self.model.tokenize(text.encode("utf-8"), add_bos=False, special=False)


def read_answers(paths: list[Path]) -> dict:
    """The recorded answers of every file, in order (one tokenizer: the same vocabulary in each)."""
    merged: dict = {"vocab_size": None, "eos": None, "prompts": []}
    for path in paths:
        try:
            data = json.loads(path.read_text())
            if not isinstance(data["vocab_size"], int) or not all(
                    isinstance(p[k], list) for p in data["prompts"] for k in ("prompt", "answer")):
                raise ValueError("a prompt or an answer is not a list of token ids")
            if merged["vocab_size"] not in (None, data["vocab_size"]):
                raise ValueError(f"a vocabulary of {data['vocab_size']} tokens, not {merged['vocab_size']}")
            if not all(isinstance(t, int) for t in data["eos"]) or merged["eos"] not in (None, data["eos"]):
                raise ValueError(f"stop tokens {data['eos']}, not {merged['eos']}")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SystemExit(f"{path}: not answers written by `tools/replay.py --record` ({exc!r})") from None
        merged["vocab_size"], merged["eos"] = data["vocab_size"], data["eos"]
        merged["prompts"] += data["prompts"]
    return merged


def replay_recorded(plan, data: dict, p: dict, actual, memory, tokenizer, knowing: bool = False):
    """core.bench.replay.replay of recorded prompt ``p`` of ``data`` (:func:`read_answers`)."""
    from core.bench.replay import replay

    return replay(plan, p["prompt"], p["answer"], data["vocab_size"], p.get("earlier"), actual, memory, knowing,
                  tokenizer, data["eos"])


def warm_statistics(plan, data: dict, own_set: str | None, actual, tokenizer=None):
    """The memory statistics learnt by replaying, in order, every prompt of ``data`` outside ``own_set``."""
    from core.memory import SuffixMemory

    learner = SuffixMemory("scripted")
    for p in data["prompts"]:
        if p["set"] != own_set:
            replay_recorded(plan, data, p, actual, learner, tokenizer)
            learner = SuffixMemory("scripted", stats=learner.stats)     # the statistics go on, the text does not
    return learner.stats


def write_warm_memory(folder: Path, data: dict, plan) -> None:
    """The statistics a user's Auto would have learnt on these answers, in a memory folder holding no text."""
    from core import models
    from core.assembly import assemble
    from core.backends.llamacpp import LlamaCppBackend
    from core.memory.store import memory_path, write_stats

    target = LlamaCppBackend(assemble(models.PAIRS["default"].target), n_ctx=512)
    if memory_path(folder, target.fingerprint()).exists():
        raise SystemExit(f"{folder} already holds a memory of texts: give an empty or new folder")
    write_stats(folder, target.fingerprint(), warm_statistics(plan, data, None, None))
    print(f"{folder}: statistics learnt on {len(data['prompts'])} answers")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", type=Path, help="decode the answers and write them here")
    parser.add_argument("--sets", nargs="+", help="the prompt sets to record (default: all the bench's), or to replay "
                                                  "(default: every set in the answers)")
    parser.add_argument("--answers", type=Path, nargs="+", help="the recorded answers to replay (one or more files)")
    parser.add_argument("--costs", nargs="+", default=["plan"])
    parser.add_argument("--actual", help="the cost table calls really cost (default: each --costs table)")
    parser.add_argument("--prompts", action="store_true", help="a line per prompt")
    parser.add_argument("--warm", action="store_true",
                        help="each set starts from the memory statistics learnt by replaying the other sets")
    parser.add_argument("--knowing", action="store_true",
                        help="also replay an Auto that knows which of its memory nodes the target accepts")
    parser.add_argument("--no-spelling", action="store_true",
                        help="replay without the tokenizer: renames stay on the tokens they were learnt on")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--warm-memory", type=Path, metavar="DIR",
                        help="write the statistics learnt on all the answers (at the first --costs table) into an "
                             "otherwise empty memory folder for the default pair, for `speclens bench --memory DIR`")
    args = parser.parse_args(argv)
    if args.record:
        record(args.record, args.sets or list(SETS))
        return
    if not args.answers:
        parser.error("give --answers (or --record)")
    data = read_answers(args.answers)
    if args.sets:
        data["prompts"] = [p for p in data["prompts"] if p["set"] in args.sets]
    if args.warm_memory:
        write_warm_memory(args.warm_memory, data, cost_table(args.costs[0])[1])
        return

    from core.bench.ceiling import ceiling, copy_lengths
    from core.bench.report import geomean
    from core.memory import SuffixMemory

    actual = cost_table(args.actual)[1].latencies if args.actual else None
    tokenizer = None if args.no_spelling else Vocabulary()
    columns = ("auto", "unrejected", "knowing", "ceiling") if args.knowing else ("auto", "ceiling")
    out = {}
    for spec in args.costs:
        name, plan = cost_table(spec)
        truth = actual or plan.latencies
        rows = []
        names = dict.fromkeys(p["set"] for p in data["prompts"])
        warm = {s: warm_statistics(plan, data, s, actual, tokenizer) for s in names} if args.warm else {}

        def memory(p):
            return SuffixMemory("scripted", stats=warm[p["set"]].copy()) if args.warm else None

        for p in data["prompts"]:
            r = replay_recorded(plan, data, p, actual, memory(p), tokenizer)
            known = p["prompt"] + (p.get("earlier") or [])
            top, _ = ceiling(copy_lengths(known, p["answer"]), truth.verify_cost, truth.widest)
            rows.append({"set": p["set"], "id": p["id"], "auto": r.speedup, "predicted": r.predicted,
                         "ceiling": top, "memory_steps": r.drafted_steps, "calls": r.calls,
                         "unrejected": r.unrejected})
            if args.knowing:
                rows[-1]["knowing"] = replay_recorded(plan, data, p, actual, memory(p), tokenizer, knowing=True).speedup
            if args.prompts:
                knew = f", knowing {rows[-1]['knowing']:.2f}x" if args.knowing else ""
                print(f"  {p['set']:16s} {p['id']:20s} Auto {r.speedup:.2f}x (predicted {r.predicted:.2f}x, "
                      f"{r.drafted_steps} memory steps of {r.calls}){knew}, ceiling {top:.2f}x")
        groups = {s: [r for r in rows if r["set"] == s] for s in dict.fromkeys(r["set"] for r in rows)}
        groups["four sets"] = [r for r in rows if r["set"] in FOUR]
        sets = {s: {c: geomean([r[c] for r in g]) for c in columns} for s, g in groups.items() if g}
        ratios = " ".join(f"{n}:{t:.2f}" for n, t in truth.ratios().items())
        print(f"{name} (t(n)/t(1) {ratios}){', warm statistics' if args.warm else ''}:")
        for s, v in sets.items():
            print(f"  {s:16s} " + "   ".join(f"{LABELS.get(c, c.capitalize())} {v[c]:.3f}x" for c in columns))
        out[name] = {"sets": sets, "prompts": rows}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
