"""`speclens bench`: decode a prompt set in several modes on the same loaded models and report the speed.

Modes alternate prompt by prompt (the order rotates from one prompt to the next), so that a machine that speeds up
or slows down during the run affects every mode alike. Speed is measured from engine timestamps over the whole
generation, prefill included (``tokens_per_s = new_tokens / seconds``), identically for every mode; the speedup of a
mode is the geometric mean over prompts of its per-prompt ratio to baseline. Greedy runs are also compared token by
token with baseline. Output: JSON (``runs`` and ``summary``) and a Markdown table (stdout and ``OUT`` with ``.md``).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Sequence

from core.adaptive import AdaptiveChain
from core.divergence import compare_greedy
from core.drafting import Baseline, Chain, Tree
from core.engine import SpeculativeEngine
from core.merge import Merge
from core.ngram import NGram
from core.planner import Auto, add_pair_arguments, open_pair
from core.sampling import SamplingParams

PROMPT_DIR = Path(__file__).resolve().parent.parent / "resources" / "prompts"
DEFAULT_PROMPTS = ("code_generation.jsonl", "code_editing.jsonl", "explanations.jsonl")
MODE_HELP = ("baseline, chain[:K], tree[:BUDGET[:DEPTH]] (Sequoia shape from the published acceptance vector), "
             "ngram[:K], merge[:K] (draft chain + n-gram), adaptive, auto, hf-assisted (transformers backend only)")
HF_ASSISTED = "hf-assisted"


class BenchError(ValueError):
    """A bad benchmark setting or prompt file."""


def _ints(mode: str, parts: Sequence[str]) -> list[int]:
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise BenchError(f"mode {mode!r}: the numbers after ':' must be integers") from None


def strategy_for(mode: str):
    """The strategy a mode name stands for (``hf-assisted`` has none: transformers runs it)."""
    name, *args = mode.split(":")
    nums = _ints(mode, args)
    try:
        if name == "baseline" and not nums:
            return Baseline()
        if name == "chain" and len(nums) <= 1:
            return Chain(*(nums or [4]))
        if name == "tree" and len(nums) <= 2:
            budget, depth = (nums + [8, 4][len(nums):])[:2]
            return Tree.sequoia(budget, depth)
        if name == "ngram" and len(nums) <= 1:
            return NGram(*(nums or [4]))
        if name == "merge" and len(nums) <= 1:
            return Merge((Chain(*(nums or [3])), NGram(4)))
        if name == "adaptive" and not nums:
            return AdaptiveChain()
        if name == "auto" and not nums:
            return Auto()
    except ValueError as exc:
        raise BenchError(f"mode {mode!r}: {exc}") from None
    raise BenchError(f"unknown mode {mode!r}; modes: {MODE_HELP}")


def read_prompts(path: Path) -> list[dict]:
    """The prompts of a JSONL file: one ``{"id": ..., "prompt": ...}`` per line."""
    if not path.is_file():
        raise BenchError(f"prompt file {path} does not exist")
    prompts = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BenchError(f"{path}:{n}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"].strip() \
                or "id" not in row:
            raise BenchError(f'{path}:{n}: each line must be {{"id": ..., "prompt": "non-empty text"}}')
        prompts.append({"id": str(row["id"]), "prompt": row["prompt"], "set": path.stem})
    if not prompts:
        raise BenchError(f"prompt file {path} holds no prompts")
    return prompts


def geomean(values: Sequence[float]) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 0.0


class HFAssisted:
    """transformers' own assisted generation (``generate(assistant_model=...)``), greedy, on the same pair."""

    def __init__(self, target, draft, pair: str) -> None:
        from core.backends.hf import HFBackend

        if not isinstance(target, HFBackend):
            raise BenchError("mode hf-assisted needs the transformers backend for the target (--backend hf)")
        self.target = target
        if isinstance(draft, HFBackend):
            self.assistant = draft.model
        else:  # the draft runs elsewhere (llama.cpp): load the same draft weights in transformers for this mode
            from core import models
            from core.assembly import assemble

            self.assistant = models.load_backend(assemble(models.PAIRS[pair].draft), "hf").model

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> dict:
        import torch

        ids = torch.tensor([prompt_ids], device=self.target.device)
        eos = sorted(self.target.eos_ids)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.target.model.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=self.assistant,
                                             do_sample=False, max_new_tokens=max_new_tokens,
                                             eos_token_id=eos or None, pad_token_id=eos[0] if eos else None)
        seconds = time.perf_counter() - t0
        tokens = [int(t) for t in out[0, len(prompt_ids):]]
        return {"tokens": tokens, "seconds": seconds}


def run_engine(engine: SpeculativeEngine, prompt_ids: list[int], max_new_tokens: int) -> tuple[dict, object]:
    result = engine.generate(prompt_ids, max_new_tokens)
    s = result.stats
    row = {"new_tokens": s.new_tokens, "seconds": s.seconds, "tokens_per_s": s.overall_tokens_per_second,
           "decode_tokens_per_s": s.tokens_per_second, "time_to_first_token": s.time_to_first_token,
           "target_calls": s.target_calls, "mean_accepted": s.mean_accepted,
           "acceptance_by_depth": list(s.acceptance_by_depth), "drafted": s.drafted, "accepted": s.accepted,
           "draft_seconds": s.draft_seconds, "verify_seconds": s.verify_seconds}
    strategy = engine.strategy
    if isinstance(strategy, Auto) and strategy.last_drafter is not None:
        d = strategy.last_drafter
        row["predicted_speedup"] = d.predicted_speedup
        row["choices"] = dict(d.counts)
    return row, result


def summarise(runs: list[dict], modes: list[str]) -> dict:
    """Per mode: aggregate tokens/s and the geometric-mean speedup over prompts (plus min, max, per prompt set)."""
    base = {(r["prompt_set"], r["prompt_id"]): r["tokens_per_s"] for r in runs if r["mode"] == "baseline"}
    summary = {}
    for mode in modes:
        rows = [r for r in runs if r["mode"] == mode]
        by_prompt = [(r["prompt_set"], r["tokens_per_s"] / base[(r["prompt_set"], r["prompt_id"])]) for r in rows
                     if base.get((r["prompt_set"], r["prompt_id"]))]
        ratios = [ratio for _, ratio in by_prompt]
        entry = {"tokens_per_s": sum(r["new_tokens"] for r in rows) / max(sum(r["seconds"] for r in rows), 1e-12)}
        if ratios:
            entry.update(speedup=geomean(ratios), min_speedup=min(ratios), max_speedup=max(ratios))
            entry["by_set"] = {name: geomean([ratio for s, ratio in by_prompt if s == name])
                               for name in dict.fromkeys(name for name, _ in by_prompt)}
        predicted = [r["predicted_speedup"] for r in rows if "predicted_speedup" in r]
        if predicted and ratios:
            entry["predicted_speedup"] = geomean(predicted)
            entry["realised_over_predicted"] = entry["speedup"] / entry["predicted_speedup"]
        summary[mode] = entry
    return summary


def markdown(report: dict) -> str:
    """The Markdown table: tokens/s per prompt and mode (ratio to baseline), then the summary rows."""
    modes = report["modes"]
    runs = report["runs"]
    lines = [f"{report['meta']['pair']} pair, target on {report['meta']['backend']}, draft on "
             f"{report['meta']['draft_backend']}, {report['meta']['max_new_tokens']} new tokens, temperature "
             f"{report['meta']['temperature']}, {report['meta']['machine']}", "",
             "| set | prompt | " + " | ".join(f"{m} tok/s" for m in modes) + " |",
             "|---|---|" + "---:|" * len(modes)]
    keys = list(dict.fromkeys((r["prompt_set"], r["prompt_id"]) for r in runs))
    for key in keys:
        by_mode = {r["mode"]: r for r in runs if (r["prompt_set"], r["prompt_id"]) == key}
        base = by_mode.get("baseline", {}).get("tokens_per_s")
        cells = []
        for m in modes:
            r = by_mode.get(m)
            if r is None:
                cells.append("-")
            elif base and m != "baseline":
                cells.append(f"{r['tokens_per_s']:.2f} ({r['tokens_per_s'] / base:.2f}x)")
            else:
                cells.append(f"{r['tokens_per_s']:.2f}")
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    summary = report["summary"]
    lines.append("| **all** | **geomean speedup** | " + " | ".join(
        f"**{summary[m].get('speedup', 0):.2f}x**" for m in modes) + " |")
    lines.append("| all | worst prompt | " + " | ".join(f"{summary[m].get('min_speedup', 0):.2f}x" for m in modes)
                 + " |")
    sets = list(dict.fromkeys(r["prompt_set"] for r in runs))
    for name in sets:
        lines.append(f"| {name} | geomean speedup | " + " | ".join(
            f"{summary[m].get('by_set', {}).get(name, 0):.2f}x" for m in modes) + " |")
    for m in modes:
        if "predicted_speedup" in summary[m]:
            lines += ["", f"{m}: predicted {summary[m]['predicted_speedup']:.2f}x by the planner, realised "
                          f"{summary[m]['speedup']:.2f}x ({summary[m]['realised_over_predicted'] * 100:.0f}% of the "
                          "prediction)"]
    diverged = [r for r in runs if r.get("greedy_vs_baseline", "identical").split(" ")[0] not in ("identical", "")]
    if diverged:
        lines += ["", "Greedy outputs that differ from baseline (batched kernels at near-ties, see MODELS.md):"]
        lines += [f"- {r['mode']} on {r['prompt_id']}: {r['greedy_vs_baseline']}" for r in diverged]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="speclens bench", description=__doc__.split("\n\n")[0])
    add_pair_arguments(parser)
    parser.add_argument("--modes", default="baseline,auto", help=f"comma-separated: {MODE_HELP}")
    parser.add_argument("--prompts", action="append", default=None,
                        help="a JSONL prompt file (repeatable); default: every set in resources/prompts")
    parser.add_argument("--limit", type=int, default=0, help="use only the first N prompts of each file")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--seed", type=int, default=0, help="seed of sampled runs")
    parser.add_argument("--json", dest="out", default=None, help="write the JSON here (and the table next to it, .md)")
    args = parser.parse_args(argv)
    try:
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        if not modes:
            raise BenchError("no modes given")
        if "baseline" not in modes:
            modes.insert(0, "baseline")   # every speedup is a ratio to it
        if len(set(modes)) != len(modes):
            raise BenchError(f"a mode is listed twice in {args.modes!r}")
        strategies = {m: None if m == HF_ASSISTED else strategy_for(m) for m in modes}
        if args.max_new_tokens < 1:
            raise BenchError("--max-new-tokens must be at least 1")
        files = [Path(p) for p in args.prompts] if args.prompts else [PROMPT_DIR / f for f in DEFAULT_PROMPTS]
        prompts = []
        for f in files:
            rows = read_prompts(f)
            prompts += rows[: args.limit] if args.limit > 0 else rows
        sampling = SamplingParams(temperature=args.temperature, seed=args.seed if args.temperature > 0 else None)
        if HF_ASSISTED in modes and not sampling.greedy:
            raise BenchError("hf-assisted is benchmarked greedy only: use --temperature 0")
    except (BenchError, ValueError) as exc:
        print(f"speclens bench: {exc}", file=sys.stderr)
        return 2
    try:
        target, draft = open_pair(args.pair, args.backend, args.draft_backend)
        assisted = HFAssisted(target, draft, args.pair) if HF_ASSISTED in modes else None
    except Exception as exc:  # a model that will not load: one clear line
        print(f"speclens bench: {exc}", file=sys.stderr)
        return 2
    if args.no_draft:
        draft = None
        needy = [m for m in modes if m not in ("baseline", "auto") and not m.startswith("ngram")]
        if needy:
            print(f"speclens bench: modes {', '.join(needy)} need the draft model; drop --no-draft", file=sys.stderr)
            return 2
    report = run_bench(target, draft, strategies, assisted, prompts, args.max_new_tokens, sampling)
    backend = "hf" if args.pair == "tiny" else args.backend   # the tiny pair exists in transformers only
    draft_backend = backend if args.pair == "tiny" else args.draft_backend or backend
    report["meta"].update(pair=args.pair, backend=backend, draft_backend=draft_backend,
                          command="speclens bench " + " ".join(argv if argv is not None else sys.argv[1:]))
    table = markdown(report)
    print(table)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))
        out.with_suffix(".md").write_text(table + "\n")
    return 0


def machine() -> str:
    """The CPU model and core count (and the GPU, if torch sees one)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    text = f"{cpu}, {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()} cores"
    import torch

    if torch.cuda.is_available():
        text += f", {torch.cuda.get_device_name(0)}"
    return text


def run_bench(target, draft, strategies: dict, assisted: HFAssisted | None, prompts: list[dict],
              max_new_tokens: int, sampling: SamplingParams) -> dict:
    """Decode every prompt in every mode, rotating the mode order from prompt to prompt."""
    modes = list(strategies)
    engines = {m: SpeculativeEngine(target, draft if m != "baseline" else None, s, sampling)
               for m, s in strategies.items() if s is not None}
    encoded = [SpeculativeEngine(target).chat_ids([{"role": "user", "content": p["prompt"]}]) for p in prompts]
    # warm-up: page the weights in and let Auto measure (or load) its plan before anything is timed
    engines["baseline"].generate(encoded[0], 2)
    for engine in engines.values():
        bind = getattr(engine.strategy, "bind", None)
        if bind is not None:
            bind(target, engine.draft, sampling)
    runs = []
    for i, (p, ids) in enumerate(zip(prompts, encoded)):
        order = modes[i % len(modes):] + modes[: i % len(modes)]
        results = {}
        for mode in order:
            if mode == HF_ASSISTED:
                out = assisted.run(ids, max_new_tokens)
                row = {"new_tokens": len(out["tokens"]), "seconds": out["seconds"],
                       "tokens_per_s": len(out["tokens"]) / out["seconds"], "target_calls": None,
                       "mean_accepted": None, "acceptance_by_depth": []}
                results[mode] = tuple(out["tokens"])
            else:
                row, result = run_engine(engines[mode], ids, max_new_tokens)
                results[mode] = result
            runs.append({"mode": mode, "prompt_id": p["id"], "prompt_set": p["set"], **row})
            print(f"  {p['set']}/{p['id']} {mode}: {row['new_tokens']} tokens, {row['tokens_per_s']:.2f} tok/s",
                  file=sys.stderr)
        if sampling.greedy:
            base = results["baseline"]
            for r in runs[-len(modes):]:
                other = results[r["mode"]]
                if r["mode"] == "baseline":
                    continue
                if isinstance(other, tuple):
                    same = other[: len(base.tokens)] == base.tokens[: len(other)]
                    r["greedy_vs_baseline"] = "identical" if same else "differs (transformers' own loop)"
                else:
                    r["greedy_vs_baseline"] = compare_greedy(base, other).describe()
    meta = {"max_new_tokens": max_new_tokens, "temperature": sampling.temperature,
            "machine": machine(),
            "target": target.name, "draft": draft.name if draft is not None else None,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    return {"meta": meta, "modes": modes, "runs": runs, "summary": summarise(runs, modes)}


if __name__ == "__main__":
    sys.exit(main())
