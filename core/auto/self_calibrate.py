"""Choosing how many of the target's layers self-speculation drafts with (core.self_draft), by measurement.

For each candidate ``L``: the early-exit draft's acceptance vector (one-level trees of ``WIDTH`` children through the
real engine: core.auto.calibrate.estimate_acceptance), the seconds of its forward of ``w`` tokens next to the
target's forward of ``n`` tokens, and under those Sequoia's hardware-aware tree (core.auto.plan.best_plan). The ``L``
whose tree is predicted fastest wins; it pays when that prediction beats plain decoding by more than the timing noise
(and at least core.auto.plan.MIN_GAIN). From the command line: ``python -m core.auto.self_calibrate --pair default``.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Mapping, Sequence

from core.auto.calibrate import (CALIBRATION_TOKENS, WIDTH, Report, calibration_prompts, estimate_acceptance,
                                 profile_latencies)
from core.auto.costs import Latencies
from core.auto.plan import MAX_BUDGET, MAX_DEPTH, MIN_GAIN, TreePlan, best_plan
from core.sampling import SamplingParams
from core.self_draft import EarlyExit, SelfDraft, decoder_layers
from core.sequoia import solve

# the candidates tried by default, as fractions of the target's layers: below a quarter an early exit is rarely
# right, above three quarters it costs nearly a full forward
CANDIDATE_FRACTIONS = (0.25, 0.375, 0.5, 0.625, 0.75)


def default_candidates(total: int) -> tuple[int, ...]:
    """The layer counts tried for a target of ``total`` layers (each in 1..total-1)."""
    return tuple(sorted({min(max(1, round(total * f)), total - 1) for f in CANDIDATE_FRACTIONS}))


@dataclass(frozen=True)
class LayerMeasure:
    """What was measured for one candidate ``L`` and the tree that pays best under it."""

    layers: int
    acceptance: tuple[float, ...]   # a_i of the early-exit draft, one-level trees of len(acceptance) children
    steps: int                      # drafted steps the acceptance was counted over
    latencies: Latencies            # the target's forward of n tokens, this draft's of w tokens
    tree: TreePlan | None           # None when the draft was never accepted

    @property
    def speedup(self) -> float:
        """Predicted tokens per second over plain decoding (1.0: self-speculation would not draft)."""
        return self.tree.speedup if self.tree is not None else 1.0

    @property
    def draft_ratio(self) -> float:
        """The early-exit forward of one token over the target's."""
        return self.latencies.draft_cost(1) / self.latencies.plain


@dataclass(frozen=True)
class LayerChoice:
    """Every candidate's measure; the chosen ``L`` is the one with the largest predicted speedup."""

    measures: tuple[LayerMeasure, ...]
    gate: float                     # the relative gain a prediction must clear to count as a real one

    @property
    def best(self) -> LayerMeasure:
        # on a tie, fewer layers: the same speed for a cheaper draft
        return max(self.measures, key=lambda m: (m.speedup, -m.layers))

    @property
    def layers(self) -> int:
        return self.best.layers

    @property
    def pays(self) -> bool:
        return self.best.tree is not None and self.best.speedup >= 1.0 + self.gate

    def strategy(self) -> SelfDraft:
        """Self-speculation at the chosen ``L`` with its tree (a chain of 4 when no tree was worth anything)."""
        best = self.best
        return SelfDraft(best.layers, best.tree.parents) if best.tree is not None else SelfDraft(best.layers)

    def describe(self) -> str:
        lines = ["Self-speculation, per number of early layers L (acceptance a_i of one-level trees; draft cost of "
                 "one token relative to the target's; the best Sequoia tree under those and its predicted speedup):"]
        for m in self.measures:
            a = ", ".join(f"{x:.3f}" for x in m.acceptance)
            tree = (f"tree of {m.tree.budget} tokens, depth {m.tree.depth}, {m.tree.expected_tokens:.2f} tokens per "
                    f"call" if m.tree is not None else "never accepted")
            lines.append(f"  L={m.layers}: a = ({a}) over {m.steps} steps; draft cost {m.draft_ratio:.2f}; {tree}; "
                         f"speedup {m.speedup:.2f}x")
        verdict = "pays" if self.pays else f"does not clear the {self.gate * 100:.0f}% gate: plain decoding is as fast"
        lines.append(f"Chosen: L={self.layers} ({self.strategy().label}), predicted {self.best.speedup:.2f}x; "
                     f"{verdict}")
        return "\n".join(lines)


def measure_latencies(target, views: Mapping[int, EarlyExit], context: Sequence[int]) -> dict[int, Latencies]:
    """The target's forward of n tokens (timed once) with each early-exit view's forward of w tokens after
    ``context``; each view is timed next to a fresh t(1) of the target, whose spread counts as noise too."""
    base = profile_latencies(target, None, context)
    out = {}
    for layers, view in views.items():
        own = profile_latencies(target, view, context, verify_sizes=(1,))
        out[layers] = Latencies(base.verify, own.draft, max(base.noise, own.noise))
    return out


def choose_layers(target, prompts: Sequence[Sequence[int]] | None, sampling: SamplingParams,
                  candidates: Sequence[int] | None = None, width: int = WIDTH,
                  tokens_per_prompt: int = CALIBRATION_TOKENS, latencies: Mapping[int, Latencies] | None = None,
                  report: Report | None = None) -> tuple[int, LayerChoice]:
    """``(L, report)``: the number of early layers whose self-speculation is predicted fastest on this machine.

    ``prompts`` default to Auto's calibration prompts; ``latencies`` (per candidate) replace the timing, for tests
    and for timings measured elsewhere.
    """
    report = report or (lambda what, fraction: None)
    prompts = [list(p) for p in (prompts or calibration_prompts(target))]
    candidates = tuple(candidates or default_candidates(len(decoder_layers(target.model))))
    views = {layers: EarlyExit(target, layers) for layers in candidates}   # checks the target and each L
    if latencies is None:
        report("Timing the early exits", 0.0)
        latencies = measure_latencies(target, views, prompts[0])
    missing = [layers for layers in candidates if layers not in latencies]
    if missing:
        raise ValueError(f"no latencies given for L = {missing}")
    measures = []
    for i, (layers, view) in enumerate(views.items()):
        report(f"Measuring how often the first {layers} layers are right", 0.3 + 0.7 * i / len(views))
        estimate = estimate_acceptance(target, view, prompts, sampling, width, tokens_per_prompt)
        lat = latencies[layers]
        tree = best_plan(solve(estimate.vector, MAX_BUDGET, MAX_DEPTH), lat) if sum(estimate.vector) > 0 else None
        measures.append(LayerMeasure(layers, estimate.vector, estimate.steps, lat, tree))
    gate = max(MIN_GAIN, *(latencies[layers].noise for layers in candidates))
    choice = LayerChoice(tuple(measures), gate)
    report("Choice ready", 1.0)
    return choice.layers, choice


def main(argv: list[str] | None = None) -> int:
    """Measure and print the choice for a pair's target on the transformers backend."""
    from core.cli_args import open_pair

    parser = argparse.ArgumentParser(prog="python -m core.auto.self_calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="default", help="model pair whose target drafts for itself: default or tiny")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: CUDA when present, else the CPU)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--layers", default="", help="comma-separated candidates L (default: 1/4 to 3/4 of the "
                        "target's layers)")
    parser.add_argument("--tokens", type=int, default=CALIBRATION_TOKENS,
                        help=f"tokens decoded per calibration prompt and candidate (default {CALIBRATION_TOKENS}; "
                        "fewer is quicker and rougher: a float32 1.5B target on two cores takes minutes per candidate)")
    parser.add_argument("--prompts", type=int, default=0, help="use only the first N calibration prompts (0: all)")
    args = parser.parse_args(argv)
    try:
        candidates = [int(x) for x in args.layers.split(",") if x.strip()] or None
        sampling = SamplingParams(temperature=args.temperature)
        if args.tokens < 1 or args.prompts < 0:
            raise ValueError("--tokens must be at least 1 and --prompts at least 0")
        target, _ = open_pair(args.pair, "hf", "hf", args.device)
        prompts = calibration_prompts(target)[: args.prompts or None]
        _, choice = choose_layers(target, prompts, sampling, candidates, tokens_per_prompt=args.tokens,
                                  report=lambda what, fraction: print(f"[{fraction:4.0%}] {what}", file=sys.stderr))
    except Exception as exc:   # a model that will not load, a bad candidate: one clear line
        print(f"self-calibration: {exc}", file=sys.stderr)
        return 2
    print(choice.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
