"""Running a benchmark: every prompt in every mode (and on every surface), alternated, repeated.

Within one repeat the modes go prompt by prompt in an order that rotates from one prompt to the next, so a machine
that speeds up or slows down during the run affects every mode alike; each ratio is taken against the baseline of
the same prompt and repeat. A surface is where a decode runs: the bare engine, or (``speclens bench --surface
window``, injected by the app) the real chat window.

Memory drafts are isolated: every decode starts from the memory as it was before the run (so no prompt is ever
measured against its own earlier answer), except for prompts marked ``regenerate``, whose earlier answer is decoded
once, untimed, and remembered first.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, TypeVar

from core.auto import Auto, attach_memory
from core.bench.modes import HF_ASSISTED, NATIVE
from core.bench.runners import RunnerResult, earlier_sampling
from core.bench.same_drafts import SameDrafts
from core.divergence import compare_greedy
from core.drafting import Baseline
from core.engine import SpeculativeEngine
from core.events import GenerationResult
from core.sampling import SamplingParams

Log = Callable[[str], None]
T = TypeVar("T")


class Surface(Protocol):
    """Where a decode runs; ``decode`` returns the engine's GenerationResult."""

    name: str

    def decode(self, engine: SpeculativeEngine, messages: list[dict], prompt_ids: list[int],
               max_new_tokens: int) -> GenerationResult:
        ...


class ComparedSurface(Surface, Protocol):
    """A surface other than the bare engine (``--surface``), which brings the bare engine it is compared with: the
    window decodes on the app's engine thread, so its reference must too (app.worker).

    ``call(fn)`` runs ``fn()`` on that thread and returns what it returns: the bench computes nowhere else. llama.cpp's
    OpenMP threads belong to the thread that calls it, and a second caller's pool leaves more threads than cores,
    whose barriers then sleep: measured on two cores (tools/thread_layouts.py), decoding on a worker thread after
    the main thread had decoded ran at 7.7-12.6 tok/s against 16.8-19.3 with every decode on one thread."""

    def engine_surface(self) -> Surface:
        ...

    def call(self, fn: Callable[[], T]) -> T:
        ...

    def close(self) -> None:
        """Called once the run is over."""


class EngineSurface:
    """The bare engine, as a script would call it."""

    name = "engine"

    def decode(self, engine: SpeculativeEngine, messages: list[dict], prompt_ids: list[int],
               max_new_tokens: int) -> GenerationResult:
        return engine.generate(prompt_ids, max_new_tokens)


def here(fn: Callable[[], T]) -> T:
    """``fn()`` on this thread: where the bare engine decodes."""
    return fn()


@dataclass
class BenchSetup:
    target: object
    draft: object
    strategies: dict          # mode -> strategy (None for the runners)
    runners: dict             # mode -> runner (native, hf-assisted)
    memory: object            # the SuffixMemory every memory-drafting mode shares
    sampling: SamplingParams
    max_new_tokens: int
    repeat: int
    surfaces: Sequence[Surface]
    call: Callable = here     # runs a computation where the surfaces decode (ComparedSurface.call)


def attach_memories(strategies: dict, memory) -> dict:
    """The strategies with the bench's own memory in place of the user's (Auto, Memory)."""
    return {mode: attach_memory(strategy, memory) for mode, strategy in strategies.items()}


def engine_row(result: GenerationResult, strategy) -> dict:
    s = result.stats
    row = {"new_tokens": s.new_tokens, "seconds": s.seconds, "tokens_per_s": s.overall_tokens_per_second,
           "decode_tokens_per_s": s.tokens_per_second, "time_to_first_token": s.time_to_first_token,
           "first_tokens": s.first_tokens,
           "prefill_seconds": s.prefill_seconds, "target_calls": s.target_calls, "mean_accepted": s.mean_accepted,
           "acceptance_by_depth": list(s.acceptance_by_depth), "drafted": s.drafted, "accepted": s.accepted,
           "draft_seconds": s.draft_seconds, "verify_seconds": s.verify_seconds,
           "python_ms_per_step": 1000 * s.overhead_seconds / max(s.target_calls, 1),
           "draft_ms_per_step": 1000 * s.draft_seconds / max(s.target_calls, 1)}
    if isinstance(strategy, Auto) and strategy.last_drafter is not None:
        d = strategy.last_drafter
        row["predicted_speedup"] = d.predicted_speedup
        row["choices"] = dict(d.counts)
        row["lookup_ms_per_step"] = 1000 * d.lookup_seconds / max(d._lookups, 1)
    if isinstance(strategy, SameDrafts):
        # expected accepted tokens per step of both verifiers on this run's very trees (core.bench.same_drafts)
        row["same_drafts"] = strategy.take_summary()
    return row


def runner_row(out: RunnerResult) -> dict:
    n, first = len(out.tokens), out.first_tokens
    decode = out.seconds - out.time_to_first_token
    return {"new_tokens": n, "seconds": out.seconds, "tokens_per_s": n / out.seconds if out.seconds > 0 else 0.0,
            "decode_tokens_per_s": (n - first) / decode if n > first and decode > 0 else 0.0,
            "time_to_first_token": out.time_to_first_token, "first_tokens": first, "target_calls": None,
            "mean_accepted": None, "acceptance_by_depth": [], "drafted": out.drafted, "accepted": out.accepted}


def identity(base: GenerationResult, other) -> str:
    """How a greedy run compares with the baseline of the same prompt and repeat."""
    if isinstance(other, RunnerResult):
        # a runner records no margins: the baseline's own margin at the parting token tells whether it was a tie
        other = GenerationResult(other.tokens, "", (), base.stats, base.stop_reason)
    return compare_greedy(base, other).describe()


def run_bench(setup: BenchSetup, prompts: list[dict], encoded: list[list[int]], log: Log) -> list[dict]:
    """Decode every prompt in every mode on every surface, ``setup.repeat`` times; returns the runs."""
    modes = list(setup.strategies)
    engines = {m: SpeculativeEngine(setup.target, None if isinstance(s, Baseline) else setup.draft, s, setup.sampling)
               for m, s in setup.strategies.items() if s is not None}
    setup.call(lambda: _warm_up(setup, engines, encoded[0]))
    before = setup.memory.snapshot()
    runs: list[dict] = []
    for repeat in range(setup.repeat):
        for i, (p, ids) in enumerate(zip(prompts, encoded)):
            start = _memory_for(setup, p, ids, before, log)
            results, rows = {}, []
            for mode in rotated(modes, i + repeat):
                surfaces = setup.surfaces if mode not in setup.runners else setup.surfaces[:1]
                # the surfaces alternate too, so neither always runs on a warmer machine
                for surface in (surfaces if i % 2 == 0 else list(reversed(surfaces))):
                    setup.memory.restore(start)
                    if mode in setup.runners:
                        out = setup.call(lambda: setup.runners[mode].run(
                            ids, setup.max_new_tokens, setup.sampling, regenerate=p["regenerate"],
                            messages=p["messages"]))
                        row = runner_row(out)
                    else:
                        forget_prompts(setup.target, setup.draft)
                        out = surface.decode(engines[mode], p["messages"], ids, setup.max_new_tokens)
                        row = engine_row(out, engines[mode].strategy)
                    if surface is setup.surfaces[0]:
                        results[mode] = out
                    rows.append({"mode": mode, "prompt_id": p["id"], "prompt_set": p["set"], "repeat": repeat,
                                 "surface": surface.name, **row})
                    log(f"  [{repeat + 1}/{setup.repeat}] {p['set']}/{p['id']} {mode} ({surface.name}): "
                        f"{row['new_tokens']} tokens, {row['decode_tokens_per_s']:.2f} tok/s")
            if setup.sampling.greedy:
                for r in rows:
                    if r["mode"] != "baseline" and r["surface"] == setup.surfaces[0].name:
                        r["greedy_vs_baseline"] = identity(results["baseline"], results[r["mode"]])
            runs += rows
    setup.memory.restore(before)
    return runs


def rotated(modes: list[str], k: int) -> list[str]:
    """``modes`` in the order the ``k``-th prompt runs them (the module docstring)."""
    shift = k % len(modes)
    return modes[shift:] + modes[:shift]


def forget_prompts(*backends) -> None:
    """Drop the KV the backends kept from the run before: the modes share them, and a mode that found its prompt
    cached would skip the prefill the others paid (its time to first token would look shorter)."""
    for backend in backends:
        if backend is not None:
            backend.reset()


def _warm_up(setup: BenchSetup, engines: dict, prompt: list[int]) -> None:
    """Page the weights in, and let Auto measure (or load) its plan, before anything is timed."""
    engines["baseline"].generate(prompt, 2)
    for engine in engines.values():
        engine.strategy.bind(setup.target, engine.draft, setup.sampling)
    for runner in setup.runners.values():
        runner.run(prompt, 2, setup.sampling, messages=[{"role": "user", "content": "Hello"}])


def _memory_for(setup: BenchSetup, prompt: dict, ids: list[int], before, log: Log):
    """The memory a prompt's runs start from: as before the run, plus, for a regenerated prompt, its earlier
    answer (decoded once with Baseline, untimed, sampled with another seed than the timed runs)."""
    setup.memory.restore(before)
    if not prompt["regenerate"]:
        return before
    # from an empty cache, as every timed run starts: a prefill on the prefix another prompt left cached computes other
    # floats, and a near-tie then parts the earlier answer from the one the runs decode (seen: a greedy regeneration
    # copied 81 tokens and decoded the last 15 plainly in some repeats, whichever run came before it)
    forget_prompts(setup.target)
    engine = SpeculativeEngine(setup.target, None, Baseline(), earlier_sampling(setup.sampling))
    earlier = setup.call(lambda: engine.generate(ids, setup.max_new_tokens))
    setup.memory.add_answer(ids, earlier.tokens, earlier.token_probs, engine.sampling.distribution_key)
    log(f"  {prompt['set']}/{prompt['id']}: remembered an earlier answer of {len(earlier.tokens)} tokens")
    return setup.memory.snapshot()


def stderr_log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


__all__ = ["BenchSetup", "EngineSurface", "HF_ASSISTED", "NATIVE", "Surface", "attach_memories", "here", "run_bench",
           "stderr_log"]
