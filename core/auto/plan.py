"""Auto's plan: what was measured on this machine for one pair, the tree chosen for it, and how it is reported.

The plan holds the cost model (core.auto.costs), the draft model's acceptance vector and the Sequoia tree that pays
best under those costs (:func:`best_plan`, the hardware-aware half of Sequoia), the llama.cpp context settings that
made verification cheapest, and what re-quantising the draft model did. It is plain data: saved as JSON, validated
when read back (a damaged cache file is measured again, never trusted), and shown by ``speclens plan`` and, as a
PlanEvent, by the planner view.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from core.auto.costs import Latencies
from core.events import PlanEvent
from core.sampling import SamplingParams
from core.sequoia import SequoiaTable, check_acceptance, solve, tree_value
from core.tree import depths_of, shape_from_parents

PLAN_VERSION = 4         # 4: calls of up to 64 tokens are timed (memory drafts as wide as they pay)
MAX_BUDGET = 16         # tokens per target call the planner considers (root included)
MAX_DEPTH = 6
MIN_GAIN = 0.03         # a draft must be predicted to beat plain decoding by at least this much (and the noise)


def backend_threads(backend) -> int:
    """Threads the backend computes with (llama.cpp's setting, else torch's)."""
    threads = getattr(backend, "n_threads", None)
    if threads:
        return int(threads)
    import torch

    return torch.get_num_threads()


def plan_key(target, draft, sampling: SamplingParams) -> dict:
    """What a plan depends on: the models, their backends, builds and devices, the threads, greedy or sampled
    decoding. A backend's ``build`` names kernels that change what a call costs (a rebuilt llama.cpp is measured
    again, not planned with the old one's costs)."""
    key = {"target": target.name, "target_backend": type(target).__name__, "target_device": target.device,
           "threads": backend_threads(target), "greedy": sampling.greedy}
    if getattr(target, "build", None):
        key["target_build"] = target.build
    if draft is not None:
        key.update(draft=draft.name, draft_backend=type(draft).__name__, draft_device=draft.device,
                   draft_threads=backend_threads(draft))
        if getattr(draft, "build", None):
            key["draft_build"] = draft.build
    return key


@dataclass(frozen=True)
class TreePlan:
    """A Sequoia tree chosen for this machine: its shape and the prediction behind it."""

    budget: int                 # tokens per target call, root included
    depth: int
    parents: tuple[int, ...]
    expected_tokens: float      # c(n, d): tokens emitted per target call
    step_seconds: float         # predicted seconds per step (draft + verify)
    speedup: float              # expected_tokens * plain / step_seconds

    def to_json(self) -> dict:
        return {"budget": self.budget, "depth": self.depth, "parents": list(self.parents),
                "expected_tokens": self.expected_tokens, "step_seconds": self.step_seconds, "speedup": self.speedup}

    @classmethod
    def from_json(cls, data: dict) -> "TreePlan":
        parents = tuple(shape_from_parents(data["parents"]))   # raises on out-of-range parents
        plan = cls(int(data["budget"]), int(data["depth"]), parents, float(data["expected_tokens"]),
                   float(data["step_seconds"]), float(data["speedup"]))
        if plan.budget != len(parents) + 1 or plan.depth != max(depths_of(parents)):
            raise ValueError("the tree's budget or depth does not match its shape")
        if not all(math.isfinite(v) and v > 0 for v in (plan.expected_tokens, plan.step_seconds, plan.speedup)):
            raise ValueError("the tree's prediction holds a non-positive or non-finite number")
        return plan


def best_plan(table: SequoiaTable, latencies: Latencies, budgets: Sequence[int] | None = None,
              depths: Sequence[int] | None = None) -> TreePlan:
    """The (n, d) with the largest predicted speedup c(n, d) * t_plain / cost(tree(n, d))."""
    budgets = budgets or range(2, table.max_nodes + 1)
    depths = depths or range(1, table.max_depth + 1)
    best: TreePlan | None = None
    for n in budgets:
        for d in depths:
            parents = table.parents(n, d)
            if not parents:
                continue
            cost = latencies.tree_cost(parents)
            value = tree_value(parents, table.acceptance)
            plan = TreePlan(len(parents) + 1, max(depths_of(parents)), parents, value, cost,
                            value * latencies.plain / cost)
            if best is None or plan.speedup > best.speedup + 1e-12:
                best = plan
    if best is None:
        raise ValueError("no tree fits the budgets and depths given")
    return best


@dataclass
class Plan:
    """Everything Auto decides from; see the module docstring."""

    key: dict
    latencies: Latencies
    acceptance: tuple[float, ...] | None = None   # None without a draft model
    tree: TreePlan | None = None
    calibration_steps: int = 0
    tuning: dict = field(default_factory=dict)    # {"chosen": {...}, "measured": [{"settings", "verify"}...]}
    draft_quantised: dict = field(default_factory=dict)  # {"type", "path", "ratio_before", "ratio_after", "used"}

    @property
    def gate(self) -> float:
        """The relative gain a draft must be predicted to bring: the measured timing noise, and at least MIN_GAIN."""
        return max(MIN_GAIN, self.latencies.noise)

    def table(self) -> SequoiaTable | None:
        return solve(self.acceptance, MAX_BUDGET, MAX_DEPTH) if self.acceptance else None

    def tree_pays(self) -> bool:
        return self.tree is not None and self.tree.speedup >= 1.0 + self.gate

    def to_json(self) -> dict:
        return {"version": PLAN_VERSION, "key": self.key, "latencies": self.latencies.to_json(),
                "acceptance": list(self.acceptance) if self.acceptance else None,
                "tree": None if self.tree is None else self.tree.to_json(),
                "calibration_steps": self.calibration_steps, "tuning": self.tuning,
                "draft_quantised": self.draft_quantised}

    @classmethod
    def from_json(cls, data: dict) -> "Plan":
        """The plan in ``data``; ValueError (or KeyError/TypeError) when anything in it is missing or impossible."""
        if data.get("version") != PLAN_VERSION:
            raise ValueError(f"plan version {data.get('version')!r} is not {PLAN_VERSION}")
        acceptance = check_acceptance(data["acceptance"]) if data.get("acceptance") else None
        tree = TreePlan.from_json(data["tree"]) if data.get("tree") else None
        if not isinstance(data["key"], dict):
            raise ValueError("the plan's key is not a mapping")
        return cls(data["key"], Latencies.from_json(data["latencies"]), acceptance, tree,
                   int(data.get("calibration_steps", 0)), dict(data.get("tuning") or {}),
                   dict(data.get("draft_quantised") or {}))

    def to_event(self, note: str = "") -> PlanEvent:
        """The plan as the planner view draws it."""
        lat = self.latencies
        table = self.table()
        tree = self.tree
        return PlanEvent(
            acceptance=tuple(self.acceptance or ()), best_value=tuple(tuple(r) for r in table.value) if table else (),
            verify_seconds=dict(lat.verify), plan_budget=tree.budget if tree else 1,
            plan_depth=tree.depth if tree else 0, plan_parents=tree.parents if tree else (),
            predicted_tokens=tree.expected_tokens if tree else 1.0,
            predicted_speedup=tree.speedup if tree else 1.0, draft_seconds=dict(lat.draft) or None, note=note)

    def describe(self) -> str:
        """The human-readable plan: latencies, settings, acceptance, the DP summary, the choice and its prediction."""
        lat = self.latencies
        lines = ["Measured latencies (seconds per call, fastest of a few; timing noise "
                 f"{lat.noise * 100:.1f}%):",
                 "  target forward of n tokens: " + ", ".join(
                     f"n={n}: {t * 1000:.1f} ms ({t / lat.plain:.2f}x)" for n, t in sorted(lat.verify.items()))]
        if lat.draft:
            lines.append("  draft forward of w tokens:  " + ", ".join(
                f"w={w}: {t * 1000:.1f} ms" for w, t in sorted(lat.draft.items())))
            lines.append(f"  draft / target cost of one token: {lat.draft_cost(1) / lat.plain:.2f}")
        lines += _describe_tuning(self.tuning) + _describe_quantised(self.draft_quantised)
        if self.acceptance:
            lines += ["", f"Acceptance vector (one-level trees of width {len(self.acceptance)}, "
                          f"{self.calibration_steps} calibration steps): "
                      + ", ".join(f"a{i + 1}={a:.3f}" for i, a in enumerate(self.acceptance)), "",
                      "Sequoia DP: c(n, d) = expected tokens per target call, and the predicted speedup of that tree",
                      "     n " + "".join(f"   d={d:<5}" for d in range(1, MAX_DEPTH + 1)) + "  best speedup"]
            table = self.table()
            for n in (2, 3, 4, 6, 8, 12, 16):
                shapes = [table.parents(n, d) for d in range(1, MAX_DEPTH + 1)]
                speedups = [tree_value(s, self.acceptance) * lat.plain / lat.tree_cost(s) for s in shapes if s]
                lines.append(f"  {n:4d} " + "".join(f"  {table.c(n, d):7.3f}" for d in range(1, MAX_DEPTH + 1))
                             + f"  {max(speedups, default=0):8.2f}x")
        else:
            lines += ["", "No draft model: only memory (earlier text) can draft."]
        lines += ["", "Plan:"]
        if self.tree is not None:
            verdict = "drafts with it" if self.tree_pays() else "does NOT pay: the draft model stays idle"
            lines.append(f"  Sequoia tree of {self.tree.budget} tokens (depth {self.tree.depth}, parents "
                         f"{list(self.tree.parents)}): {self.tree.expected_tokens:.2f} tokens per call in "
                         f"{self.tree.step_seconds * 1000:.1f} ms, predicted {self.tree.speedup:.2f}x -> {verdict}")
        lines.append("  memory drafts (this text, earlier conversations, earlier answers) each step when their "
                     f"predicted gain beats plain decoding by {self.gate * 100:.0f}% or more, using "
                     f"t(n)/t(1) = " + ", ".join(f"{r:.2f}" for n, r in lat.ratios().items() if n > 1))
        return "\n".join(lines)


def _describe_tuning(tuning: dict) -> list[str]:
    if not tuning.get("measured"):
        return []
    lines = ["", "Verification settings measured (t(n)/t(1) and t(1)):"]
    for row in tuning["measured"]:
        ratios = ", ".join(f"n={n}: {r:.2f}" for n, r in sorted((int(k), v) for k, v in row["ratios"].items()))
        chosen = " <- chosen" if row["settings"] == tuning.get("chosen") else ""
        lines.append(f"  {row['label']}: t(1) = {row['plain'] * 1000:.1f} ms; {ratios}{chosen}")
    return lines


def _describe_quantised(info: dict) -> list[str]:
    if not info:
        return []
    used = "used" if info.get("used") else "not used (it was not cheaper)"
    return ["", f"Draft re-quantised to {info.get('type')} in the cache: draft/target cost "
                f"{info.get('ratio_before', 0):.2f} -> {info.get('ratio_after', 0):.2f}, {used}"]
