"""Auto: decide from measurements whether speculation pays on this machine, and with which drafter.

The plan is measured once per (pair, backends, device, threads, greedy or not) and cached as JSON in the user cache
folder: the target's forward time for 1..16 tokens, the draft's for a few level widths, the draft's acceptance vector
(core.sequoia) and the best Sequoia tree for those costs, and how often prompt-lookup (n-gram) tokens match the
target's own text, by match length. ``speclens plan`` prints it.

Each step, :class:`AutoDrafter` then compares what the evidence at hand predicts, in tokens per second:

* plain decoding (an empty tree: one token per target call);
* an n-gram chain of ``k`` tokens, when the text so far repeats itself: expected tokens from the acceptance measured
  for the current match length, cost ``t_verify(k + 1)``; ``k`` is chosen to maximise the ratio;
* the Sequoia tree drafted by the draft model: expected tokens ``c(n, d)`` from the acceptance vector, cost the
  measured draft and verify times of that tree.

An option is taken only when it beats plain decoding by ``MARGIN``. On a 2-core CPU where llama.cpp's batch of ``k``
tokens costs nearly ``k`` single ones this gates drafting to long n-gram matches; on a float32 transformers target
with a fast draft it picks trees. The acceptance seen while decoding updates both estimates, and the tree is
re-planned when the measured acceptance drifts from the plan's.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from core import assembly
from core.drafting import Baseline, ModelDrafter
from core.ngram import SOURCE as NGRAM_SOURCE
from core.ngram import lookup
from core.sampling import Rng, SamplingParams
from core.sequoia import (Latencies, TreePlan, best_plan, estimate_acceptance, profile_latencies, solve,
                          tree_value)
from core.tree import TokenTree, depths_of
from core.verify import Verdict

PLAN_VERSION = 1
MAX_BUDGET = 16         # tokens per target call the planner considers (root included)
MAX_DEPTH = 6
WIDTH = 4               # children per node when measuring the acceptance vector
VERIFY_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
DRAFT_SIZES = (1, 2, 4, 8)
MARGIN = 1.05           # a draft must be predicted to beat plain decoding by 5 %: a misprediction costs more
MAX_NGRAM_DRAFT = 12
DRIFT = 0.15            # re-plan the tree when the measured c(n, d) moves this far from the planned one
DRIFT_STEPS = 12        # ... judged over at least this many model-drafted steps
CALIBRATION_TOKENS = 32
CALIBRATION_MESSAGES = (
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "Rename the variable `x` to `total` in this code and return the full code:\n\n"
    "def add_all(items):\n    x = 0\n    for item in items:\n        x += item\n    return x\n",
    "Explain in two sentences what a hash map is.",
)


# -- n-gram acceptance by match length ---------------------------------------------------------------------------

@dataclass
class NGramStats:
    """Acceptance of n-gram tokens by match length (buckets 1..8+), a Beta-smoothed running estimate.

    ``rate(m)`` is the probability that a looked-up token is accepted when ``m`` tokens before it agreed with the
    earlier occurrence. Evidence decays (``DECAY`` per new observation in a bucket) so that the estimate follows the
    text being written rather than the calibration prompts.
    """

    accepted: list[float] = field(default_factory=lambda: [0.0] * NGramStats.BUCKETS)
    tested: list[float] = field(default_factory=lambda: [0.0] * NGramStats.BUCKETS)

    BUCKETS = 8
    PRIOR_MEAN = 0.3
    PRIOR_WEIGHT = 2.0
    CALIBRATION_WEIGHT = 8.0   # calibration counts are scaled down to this much evidence per bucket
    DECAY = 0.9

    @classmethod
    def bucket(cls, match: int) -> int:
        return min(max(match, 1), cls.BUCKETS) - 1

    def rate(self, match: int) -> float:
        b = self.bucket(match)
        return (self.accepted[b] + self.PRIOR_MEAN * self.PRIOR_WEIGHT) / (self.tested[b] + self.PRIOR_WEIGHT)

    def observe(self, match: int, accepted: bool) -> None:
        b = self.bucket(match)
        self.accepted[b] = self.accepted[b] * self.DECAY + float(accepted)
        self.tested[b] = self.tested[b] * self.DECAY + 1.0

    def expected_tokens(self, match: int, k: int) -> float:
        """Tokens one target call emits with ``k`` looked-up tokens: the accepted run plus the target's own."""
        total, run = 1.0, 1.0
        for i in range(k):
            run *= self.rate(match + i)
            total += run
        return total

    @classmethod
    def from_texts(cls, texts: Sequence[tuple[int, Sequence[int]]]) -> "NGramStats":
        """Replay lookup over texts the target wrote (``(prompt_length, tokens)``): at each position, the chain a
        lookup would have drafted is scored token by token against what the target really wrote."""
        acc = [0.0] * cls.BUCKETS
        tested = [0.0] * cls.BUCKETS
        for prompt_len, tokens in texts:
            for i in range(max(prompt_len, 2), len(tokens)):
                found = lookup(tokens[:i], max_len=MAX_NGRAM_DRAFT)
                for j, tok in enumerate(found.continuation if found.match else ()):
                    if i + j >= len(tokens):
                        break
                    b = cls.bucket(found.match + j)
                    tested[b] += 1
                    if tok != tokens[i + j]:
                        break
                    acc[b] += 1
        scale = [min(1.0, cls.CALIBRATION_WEIGHT / t) if t else 0.0 for t in tested]
        return cls([a * s for a, s in zip(acc, scale)], [t * s for t, s in zip(tested, scale)])


# -- the plan ----------------------------------------------------------------------------------------------------

def backend_threads(backend) -> int:
    """Threads the backend computes with (llama.cpp's setting, else torch's)."""
    threads = getattr(backend, "n_threads", None)
    if threads:
        return int(threads)
    import torch

    return torch.get_num_threads()


def plan_key(target, draft, sampling: SamplingParams) -> dict:
    """What a plan depends on: the models, their backends and devices, the threads, greedy or sampled decoding."""
    key = {"target": target.name, "target_backend": type(target).__name__, "target_device": target.device,
           "threads": backend_threads(target), "greedy": sampling.greedy}
    if draft is not None:
        key.update(draft=draft.name, draft_backend=type(draft).__name__, draft_device=draft.device,
                   draft_threads=backend_threads(draft))
    return key


@dataclass
class Plan:
    """Everything Auto decides from; see the module docstring."""

    key: dict
    latencies: Latencies
    ngram: NGramStats
    acceptance: tuple[float, ...] | None = None   # None without a draft model
    tree: TreePlan | None = None
    calibration_steps: int = 0

    def table(self):
        return solve(self.acceptance, MAX_BUDGET, MAX_DEPTH) if self.acceptance else None

    def tree_pays(self) -> bool:
        return self.tree is not None and self.tree.speedup >= MARGIN

    def to_json(self) -> dict:
        tree = None if self.tree is None else {
            "budget": self.tree.budget, "depth": self.tree.depth, "parents": list(self.tree.parents),
            "expected_tokens": self.tree.expected_tokens, "step_seconds": self.tree.step_seconds,
            "speedup": self.tree.speedup}
        return {"version": PLAN_VERSION, "key": self.key, "latencies": self.latencies.to_json(),
                "ngram": {"accepted": self.ngram.accepted, "tested": self.ngram.tested},
                "acceptance": list(self.acceptance) if self.acceptance else None, "tree": tree,
                "calibration_steps": self.calibration_steps}

    @classmethod
    def from_json(cls, data: dict) -> "Plan":
        if data.get("version") != PLAN_VERSION:
            raise ValueError(f"plan version {data.get('version')!r} is not {PLAN_VERSION}")
        tree = data.get("tree")
        return cls(data["key"], Latencies.from_json(data["latencies"]),
                   NGramStats(list(data["ngram"]["accepted"]), list(data["ngram"]["tested"])),
                   tuple(data["acceptance"]) if data.get("acceptance") else None,
                   None if tree is None else TreePlan(tree["budget"], tree["depth"], tuple(tree["parents"]),
                                                      tree["expected_tokens"], tree["step_seconds"], tree["speedup"]),
                   int(data.get("calibration_steps", 0)))

    def describe(self) -> str:
        """The human-readable plan: acceptance, DP summary, latencies, the choice and its predicted speedup."""
        lat = self.latencies
        lines = ["Measured latencies (seconds per call, fastest of a few):",
                 "  target forward of n tokens: " + ", ".join(
                     f"n={n}: {t * 1000:.1f} ms ({t / lat.plain:.2f}x)" for n, t in sorted(lat.verify.items()))]
        if lat.draft:
            lines.append("  draft forward of w tokens:  " + ", ".join(
                f"w={w}: {t * 1000:.1f} ms" for w, t in sorted(lat.draft.items())))
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
            lines += ["", "No draft model: only n-gram lookup can draft."]
        lines += ["", "N-gram lookup acceptance by match length (calibration, smoothed): " + ", ".join(
            f"{m}{'+' if m == NGramStats.BUCKETS else ''}: {self.ngram.rate(m):.2f}"
            for m in range(1, NGramStats.BUCKETS + 1))]
        best_k = {m: best_ngram_k(self.ngram, lat, m, MAX_NGRAM_DRAFT) for m in (2, 4, 8)}
        lines.append("  best n-gram draft by match length: " + ", ".join(
            f"match {m}: " + (f"{k} tokens, {s:.2f}x" if s >= MARGIN else "none pays")
            for m, (k, s) in best_k.items()))
        lines += ["", "Plan:"]
        if self.tree is not None:
            verdict = "drafts with it" if self.tree_pays() else "does NOT pay: the draft model stays idle"
            lines.append(f"  Sequoia tree of {self.tree.budget} tokens (depth {self.tree.depth}, parents "
                         f"{list(self.tree.parents)}): {self.tree.expected_tokens:.2f} tokens per call in "
                         f"{self.tree.step_seconds * 1000:.1f} ms, predicted {self.tree.speedup:.2f}x -> {verdict}")
        paying = [m for m, (_, s) in best_k.items() if s >= MARGIN]
        lines.append("  n-gram lookup drafts when the text repeats itself: " + (
            f"from a match of {min(paying)} tokens on" if paying else "not at the measured acceptance"))
        if not self.tree_pays() and not paying:
            lines.append("  => plain decoding: nothing is predicted to beat it on this machine")
        return "\n".join(lines)


def best_ngram_k(stats: NGramStats, latencies: Latencies, match: int, available: int) -> tuple[int, float]:
    """The chain length with the best predicted speedup for an n-gram draft, and that speedup (1.0 for k = 0)."""
    best_k, best = 0, 1.0
    for k in range(1, available + 1):
        speedup = stats.expected_tokens(match, k) * latencies.plain / latencies.verify_cost(k + 1)
        if speedup > best:
            best_k, best = k, speedup
    return best_k, best


def calibration_prompts(target) -> list[list[int]]:
    """Chat prompts in the target's template; token-id prompts for models without a tokenizer."""
    try:
        return [target.apply_chat_template([{"role": "user", "content": m}]) for m in CALIBRATION_MESSAGES]
    except Exception:  # a tokenizer-less test model has no template: synthetic prompts still measure costs
        vocab = target.vocab_size
        return [[(7 * i + j) % vocab for j in range(12)] for i in range(1, 4)]


def measure_plan(target, draft, sampling: SamplingParams, prompts: Sequence[Sequence[int]] | None = None,
                 tokens: int = CALIBRATION_TOKENS) -> Plan:
    """Measure latencies and acceptance on this machine and choose the tree (see the module docstring)."""
    from core.engine import SpeculativeEngine

    prompts = [list(p) for p in (prompts or calibration_prompts(target))]
    latencies = profile_latencies(target, draft, prompts[0], VERIFY_SIZES, DRAFT_SIZES if draft else ())
    acceptance, tree, steps = None, None, 0
    if draft is not None:
        estimate = estimate_acceptance(target, draft, prompts, sampling, WIDTH, tokens)
        acceptance, steps, texts = estimate.vector, estimate.steps, estimate.texts
        if sum(acceptance) > 0:
            tree = best_plan(solve(acceptance, MAX_BUDGET, MAX_DEPTH), latencies)
    else:
        engine = SpeculativeEngine(target, None, Baseline(), sampling)
        texts = [(len(p), list(p) + list(engine.generate(p, tokens).tokens)) for p in prompts]
    return Plan(plan_key(target, draft, sampling), latencies, NGramStats.from_texts(texts), acceptance, tree, steps)


def cache_dir() -> Path:
    """Where plans are cached: the ``plans`` folder of SpecLens's user cache."""
    return assembly.cache_dir() / "plans"


def plan_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir() / f"plan-{digest}.json"


def save_plan(plan: Plan) -> Path:
    path = plan_path(plan.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(plan.to_json(), indent=1))
    tmp.replace(path)
    return path


def load_plan(key: dict) -> Plan | None:
    """The cached plan for ``key``, or None when there is none or it is unreadable (it is then measured again)."""
    path = plan_path(key)
    try:
        plan = Plan.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return plan if plan.key == key else None


def get_plan(target, draft, sampling: SamplingParams, refresh: bool = False, cache: bool = True) -> Plan:
    """The cached plan for this pair and machine, measured (and cached) when missing or when ``refresh``."""
    key = plan_key(target, draft, sampling)
    plan = None if refresh or not cache else load_plan(key)
    if plan is None:
        plan = measure_plan(target, draft, sampling)
        if cache:
            save_plan(plan)
    return plan


# -- the strategy ------------------------------------------------------------------------------------------------

class AcceptanceTracker:
    """The acceptance vector measured online from verified trees, through per-rank hazards.

    ``h_i`` = P(child of rank i accepted | ranks before it rejected), counted at every node the verification
    reached; then ``a_i = h_i * prod_{j<i} (1 - h_j)``. The plan's vector is the prior (weight ``prior_weight``).
    """

    def __init__(self, prior: Sequence[float], prior_weight: float = 4.0) -> None:
        left = 1.0
        self.accepted, self.tested = [], []
        for a in prior:
            h = a / left if left > 1e-12 else 0.0
            self.accepted.append(h * prior_weight)
            self.tested.append(prior_weight)
            left -= a

    def observe(self, tree: TokenTree, verdict: Verdict) -> None:
        accepted = set(verdict.accepted)
        for rank_children in (tree.children(u) for u in (-1, *verdict.accepted)):
            for rank, child in enumerate(rank_children[: len(self.tested)]):
                if child not in verdict.accept_probs:
                    break
                self.tested[rank] += 1
                if child in accepted:
                    self.accepted[rank] += 1
                    break

    def vector(self) -> tuple[float, ...]:
        out, left = [], 1.0
        for a, t in zip(self.accepted, self.tested):
            h = a / t if t else 0.0
            out.append(left * h)
            left *= 1 - h
        return tuple(out)


class AutoDrafter:
    """Chooses, every step, plain decoding, an n-gram chain or the planned tree; see the module docstring."""

    def __init__(self, plan: Plan, draft, params: SamplingParams, rng: Rng, on_replan=None) -> None:
        self.plan = plan
        self.latencies = plan.latencies
        self.params, self.rng, self.draft_backend = params, rng, draft
        self.on_replan = on_replan
        self.model: ModelDrafter | None = None
        self.tracker: AcceptanceTracker | None = None
        if draft is not None and plan.tree_pays():
            self._use_tree(plan.tree)
            self.tracker = AcceptanceTracker(plan.acceptance)
        self.note = ""
        self.choice = "plain"
        self._shadow: tuple[int, tuple[int, ...], int] | None = None   # last lookup: match, continuation, position
        self._model_steps = 0
        self.predicted_tokens = 0.0
        self.predicted_seconds = 0.0
        self.counts = {"plain": 0, "ngram": 0, "tree": 0}

    def _use_tree(self, tree: TreePlan) -> None:
        self.tree_plan = tree
        self.model = ModelDrafter(self.draft_backend, tree.parents, "without_replacement", self.params, self.rng,
                                  "draft")

    @property
    def predicted_speedup(self) -> float:
        """Tokens per second the chosen steps were predicted to reach, over plain decoding's."""
        if self.predicted_seconds <= 0:
            return 1.0
        return self.predicted_tokens / self.predicted_seconds * self.latencies.plain

    def start(self, prompt: Sequence[int]) -> None:
        if self.model is not None:
            self.model.start(prompt)

    def _score_last_lookup(self, tokens: Sequence[int]) -> None:
        """Score the previous step's lookup against the tokens the target then emitted, whatever was drafted.

        For greedy decoding a match is exactly what verification would have accepted (for sampling, an unbiased
        draw of it), so the n-gram estimate learns every step, also while decoding plainly: without that, a match
        length judged unpromising would never be tried and never corrected.
        """
        if self._shadow is None:
            return
        match, continuation, at = self._shadow
        for j, (guess, real) in enumerate(zip(continuation, tokens[at:])):
            self.plan.ngram.observe(match + j, guess == real)
            if guess != real:
                break

    def draft(self, tokens: Sequence[int], max_depth: int, max_nodes: int) -> TokenTree:
        lat = self.latencies
        plain = 1.0 / lat.plain
        options = {"plain": (1.0, lat.plain)}
        reasons = []
        self._score_last_lookup(tokens)
        found = lookup(tokens, max_len=min(MAX_NGRAM_DRAFT, max_depth, max_nodes))
        self._shadow = (found.match, found.continuation, len(tokens)) if found.match else None
        if found.match and found.continuation:
            k, _ = best_ngram_k(self.plan.ngram, lat, found.match, len(found.continuation))
            k = max(k, 1)   # to say how far from paying even one token is
            options["ngram"] = (self.plan.ngram.expected_tokens(found.match, k), lat.verify_cost(k + 1))
        else:
            reasons.append("no n-gram match in the text so far")
        if self.model is not None:
            shape = self.tree_plan.parents
            options["tree"] = (tree_value(shape, self.tracker.vector()), lat.tree_cost(shape))
        elif self.plan.tree is not None:
            reasons.append(f"the draft model's best tree is predicted at {self.plan.tree.speedup:.2f}x")
        else:
            reasons.append("no draft model")
        rate = {name: e / c for name, (e, c) in options.items()}
        choice = max(rate, key=rate.get)
        if rate[choice] < MARGIN * plain:
            if "ngram" in rate:
                reasons.append(f"n-gram match of {found.match} predicted at {rate['ngram'] / plain:.2f}x")
            if "tree" in rate:
                reasons.append(f"the tree is predicted at {rate['tree'] / plain:.2f}x with the acceptance seen")
            choice = "plain"
        self.choice = choice
        self.counts[choice] += 1
        expected, cost = options[choice]
        self.predicted_tokens += expected
        self.predicted_seconds += cost
        if choice == "plain":
            self.note = "plain decoding: nothing is predicted to beat it (" + "; ".join(reasons) + ")"
            return TokenTree()
        if choice == "ngram":
            tree = TokenTree.chain(found.continuation[:k], NGRAM_SOURCE)
            self.note = f"n-gram lookup: {k} tokens (match of {found.match}), predicted {rate[choice] / plain:.2f}x"
            return tree
        tree = self.model.draft(tokens, max_depth, max_nodes)
        shape = self.tree_plan.parents
        self.note = (f"Sequoia tree of {len(shape)} nodes, depth {max(depths_of(shape))}: "
                     f"predicted {rate[choice] / plain:.2f}x")
        return tree

    def feedback(self, tree: TokenTree, verdict: Verdict) -> None:
        # n-gram drafts are scored at the next step, from the emitted tokens (see _score_last_lookup)
        if self.choice == "tree":
            self.model.feedback(tree, verdict)
            self.tracker.observe(tree, verdict)
            self._model_steps += 1
            if self._model_steps >= DRIFT_STEPS:
                self._check_drift()

    def _check_drift(self) -> None:
        vector = self.tracker.vector()
        planned = self.tree_plan.expected_tokens
        if abs(tree_value(self.tree_plan.parents, vector) - planned) <= DRIFT * planned:
            return
        self._model_steps = 0
        new = best_plan(solve(vector, MAX_BUDGET, MAX_DEPTH), self.latencies)
        self.plan.acceptance, self.plan.tree = vector, new
        if self.on_replan is not None:
            self.on_replan(self.plan)
        if new.speedup < MARGIN:
            self.model = None     # the draft's cache simply stops following; nothing else holds it
            self.note = f"re-planned: the acceptance drifted and the best tree is now predicted at {new.speedup:.2f}x"
        elif new.parents != self.tree_plan.parents:
            self._use_tree(new)


class Auto:
    """The planner's strategy: plain decoding, n-gram chains or Sequoia trees, chosen step by step from measurements.

    The engine binds it to its models before a generation (``bind``); the plan is then loaded from the cache or
    measured. Pass ``plan=`` to decide from given measurements (tests inject latencies this way).
    """

    label = "Auto"

    def __init__(self, plan: Plan | None = None, cache: bool = True, refresh: bool = False) -> None:
        self.plan = plan
        self._fixed = plan is not None
        self.cache = cache
        self.refresh = refresh
        self.last_drafter: AutoDrafter | None = None

    def bind(self, target, draft, sampling: SamplingParams) -> None:
        """Load or measure the plan for these models (once per pair, backend, device and threads)."""
        if self._fixed or (self.plan is not None and self.plan.key == plan_key(target, draft, sampling)):
            return
        self.plan = get_plan(target, draft, sampling, refresh=self.refresh, cache=self.cache)
        self.refresh = False

    def _replanned(self, plan: Plan) -> None:
        if self.cache and not self._fixed:
            save_plan(plan)

    def make_drafter(self, draft, params: SamplingParams, rng: Rng) -> AutoDrafter:
        if self.plan is None:
            raise ValueError("Auto has no plan yet: run it through SpeculativeEngine (which binds it to the models) "
                             "or pass plan=")
        self.last_drafter = AutoDrafter(self.plan, draft, params, rng, self._replanned)
        return self.last_drafter


# -- speclens plan -----------------------------------------------------------------------------------------------

def open_pair(pair: str, backend: str, draft_backend: str | None = None):
    """(target, draft) for the command line: ``tiny`` (random, built in a second) or a registered real pair."""
    from core import models

    if pair == "tiny":   # in-process transformers models whatever the backend asked for
        backend = draft_backend = "hf"
    return models.load_pair(pair, backend=backend, draft_backend=draft_backend or backend)


def add_pair_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pair", default="default", help="model pair: default (Qwen2.5-Coder 1.5B/0.5B) or tiny")
    parser.add_argument("--backend", default="llama.cpp", choices=("llama.cpp", "hf"), help="backend of the target")
    parser.add_argument("--draft-backend", default=None, choices=("llama.cpp", "hf"),
                        help="backend of the draft model (default: the target's)")
    parser.add_argument("--no-draft", action="store_true", help="plan without the draft model (n-gram lookup only)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="speclens plan", description="Measure this machine and print Auto's plan.")
    add_pair_arguments(parser)
    parser.add_argument("--refresh", action="store_true", help="measure again even when a cached plan exists")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    args = parser.parse_args(argv)
    try:
        sampling = SamplingParams(temperature=args.temperature)
        target, draft = open_pair(args.pair, args.backend, args.draft_backend)
    except Exception as exc:  # a missing model package or a bad setting: one clear line, no traceback
        print(f"speclens plan: {exc}", file=sys.stderr)
        return 2
    if args.no_draft:
        draft = None
    cached = None if args.refresh else load_plan(plan_key(target, draft, sampling))
    plan = cached or get_plan(target, draft, sampling, refresh=True)
    if args.json:
        print(json.dumps(plan.to_json(), indent=1))
        return 0
    print(f"Pair: {target.name} ({type(target).__name__}, {target.device}, {backend_threads(target)} threads)"
          + (f" with draft {draft.name} ({type(draft).__name__}, {draft.device})" if draft is not None else ""))
    print(f"Plan {'from the cache' if cached else 'measured now'}: {plan_path(plan.key)}\n")
    print(plan.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
