"""Measuring a machine for Auto: latencies, the verification settings that make them cheapest, a cheaper draft,
and the draft model's acceptance vector. This is the one part of the planner that runs the models.

Calibration prompts are Auto's own, never the benchmark's: a plan tuned on the prompts it is judged on would
flatter itself.
"""
from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from core.auto.costs import Latencies
from core.auto.plan import MAX_BUDGET, MAX_DEPTH, Plan, best_plan, plan_key
from core.sampling import SamplingParams
from core.sequoia import solve
from core.tree import TokenTree

log = logging.getLogger(__name__)

# up to the longest copies memory drafts: where a batch is cheap (repacked weights on an AMX Xeon verify 16 tokens for
# 3.4 plain steps) a copied file pays in calls of 64; where it is not (a Zen 3: 16 for 9-11), the plan says so
VERIFY_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
DRAFT_SIZES = (1, 2, 4, 8)
TUNING_SIZES = (1, 2, 4)
REPEATS = 5
MAX_NOISE = 0.10        # a gate above 10 % would refuse drafts that clearly pay on a merely busy machine
WIDTH = 4               # children per node when measuring the acceptance vector
CALIBRATION_TOKENS = 32
CALIBRATION_MESSAGES = (
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "Rename the variable `x` to `total` in this code and return the full code:\n\n"
    "def add_all(items):\n    x = 0\n    for item in items:\n        x += item\n    return x\n",
    "Explain in two sentences what a hash map is.",
)
Report = Callable[[str, float], None]   # (what is being measured, fraction done)


@dataclass(frozen=True)
class Timing:
    """The fastest of a few repeats (on a shared machine the slower ones measure the neighbours, not the model) and
    their relative spread."""

    seconds: float
    spread: float


def time_forward(backend, context: Sequence[int], size: int, repeats: int = REPEATS) -> Timing:
    """``forward_tree`` of a chain of ``size`` tokens after ``context``; the first call warms buffers up."""
    backend.prefill(list(context))
    filler = [int(context[i % len(context)]) for i in range(size)]
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        backend.forward_tree(TokenTree.chain(filler))
        times.append(time.perf_counter() - t0)
        backend.commit([])
    kept = times[1:]
    best = min(kept)
    return Timing(best, (statistics.median(kept) - best) / best)


def _monotone(times: dict[int, float]) -> dict[int, float]:
    # more tokens never cost less: a smaller time for a larger batch is timing noise, not a property to plan on
    out, floor = {}, 0.0
    for size in sorted(times):
        floor = max(floor, times[size])
        out[size] = floor
    return out


def profile_latencies(target, draft, context: Sequence[int], verify_sizes: Sequence[int] = VERIFY_SIZES,
                      draft_sizes: Sequence[int] = DRAFT_SIZES, repeats: int = REPEATS) -> Latencies:
    """Time the target's forward of ``n`` tokens and the draft's of ``w`` tokens after ``context`` on this machine,
    and the timing noise (the median relative spread of repeats, over the sizes plain and short-draft steps use)."""
    if len(context) < 2:
        raise ValueError("profiling needs a context of at least 2 tokens")
    verify = {n: time_forward(target, context, n, repeats) for n in verify_sizes}
    drafted = {w: time_forward(draft, context, w, repeats) for w in draft_sizes} if draft is not None else {}
    target.reset()
    if draft is not None:
        draft.reset()
    # a single call's spread jumps around (0.01 to 0.3 between two runs on an idle machine): the typical one, over
    # the sizes plain and short-draft steps use, is what a predicted gain must clear
    noise = statistics.median(t.spread for n, t in verify.items() if n <= 4)
    return Latencies(_monotone({n: t.seconds for n, t in verify.items()}),
                     _monotone({w: t.seconds for w, t in drafted.items()}), min(noise, MAX_NOISE))


def tune_verification(target, context: Sequence[int]) -> dict:
    """For llama.cpp: time t(1), t(2), t(4) under each setting that changes speed but not what the model computes
    (flash attention on, off, or llama.cpp's choice), keep the fastest, and return what was measured. With SpecLens's
    build only flash attention on is kept: there a verification batch computes bit for bit what one-token steps
    compute (native/llama.cpp/README.md), and exactness comes before speed. Other backends: nothing."""
    from core.backends.kquant_kernels import has_grouped_attention, has_ordered_cache
    from core.backends.llamacpp import ContextTuning, LlamaCppBackend

    if not isinstance(target, LlamaCppBackend) or target.device != "cpu":
        return {}
    candidates = [ContextTuning(), ContextTuning(flash_attn=True), ContextTuning(flash_attn=False)]
    measured = []
    for tuning in candidates:
        target.retune(tuning)
        times = {n: time_forward(target, context, n).seconds for n in TUNING_SIZES}
        measured.append((tuning, times))
    eligible = [m for m in measured if m[0].flash_attn] if has_grouped_attention() and has_ordered_cache() \
        else measured
    # the plain step dominates decoding; among settings within 2% of the fastest plain step, the cheapest batches win
    fastest = min(t[1] for _, t in eligible)
    near = [(tuning, t) for tuning, t in eligible if t[1] <= fastest * 1.02]
    chosen, _ = min(near, key=lambda m: sum(m[1].values()))
    target.retune(chosen)
    target.reset()
    return {"chosen": _tuning_json(chosen),
            "measured": [{"settings": _tuning_json(tuning), "label": tuning.describe(), "plain": t[1],
                          "ratios": {str(n): s / t[1] for n, s in t.items()}} for tuning, t in measured]}


def _tuning_json(tuning) -> dict:
    return {"flash_attn": tuning.flash_attn, "n_threads_batch": tuning.n_threads_batch, "n_ubatch": tuning.n_ubatch}


def apply_tuning(target, tuning: dict) -> None:
    """Put a plan's chosen verification settings on the target (llama.cpp only)."""
    from core.backends.llamacpp import ContextTuning, LlamaCppBackend

    chosen = tuning.get("chosen")
    if chosen and isinstance(target, LlamaCppBackend):
        target.retune(ContextTuning(**chosen))


def cheaper_draft(target, draft, context: Sequence[int], kind: str = "Q4_0"):
    """Re-quantise a llama.cpp draft on the CPU to ``kind`` (once, into the cache) and time it against the original.

    Returns ``(backend or None, report)``: the re-quantised backend when it is cheaper per token by more than the
    timing noise, and what was measured (draft/target cost ratios before and after).
    """
    from core.backends.llamacpp import LlamaCppBackend
    from core.quantize import requantized

    if not isinstance(draft, LlamaCppBackend) or draft.device != "cpu" or draft.path.stem.endswith(kind.lower()):
        return None, {}
    try:
        path = requantized(draft.path, kind, draft.n_threads)
        fast = LlamaCppBackend(path, n_ctx=draft.context_length, n_threads=draft.n_threads,
                               name=f"{draft.name} ({kind})")
    except Exception as exc:  # a build without the quantize API, a full disk: keep the draft as it is
        log.warning("could not re-quantise the draft model to %s: %s", kind, exc)
        return None, {}
    plain = time_forward(target, context, 1).seconds
    before, after = time_forward(draft, context, 1), time_forward(fast, context, 1)
    target.reset()
    draft.reset()
    fast.reset()
    used = after.seconds < before.seconds * (1 - max(before.spread, after.spread, 0.02))
    report = {"type": kind, "path": str(path), "ratio_before": before.seconds / plain,
              "ratio_after": after.seconds / plain, "used": used}
    if not used:
        fast.close()
        return None, report
    return fast, report


def load_quantised(draft, info: dict):
    """The re-quantised draft a plan chose, loaded like ``draft``; None when the plan chose none or it is gone."""
    from core.backends.llamacpp import LlamaCppBackend

    if not info.get("used") or not isinstance(draft, LlamaCppBackend):
        return None
    try:
        return LlamaCppBackend(info["path"], n_ctx=draft.context_length, n_threads=draft.n_threads,
                               name=f"{draft.name} ({info.get('type')})")
    except Exception as exc:
        log.warning("the re-quantised draft %s could not be loaded (%s): using the original", info.get("path"), exc)
        return None


@dataclass(frozen=True)
class AcceptanceEstimate:
    """The acceptance vector measured with one-level trees of ``width`` children over ``steps`` target calls."""

    vector: tuple[float, ...]
    width: int
    steps: int
    counts: tuple[int, ...]   # times the child of each rank was the accepted one


def estimate_acceptance(target, draft, prompts: Sequence[Sequence[int]], sampling, width: int = WIDTH,
                        tokens_per_prompt: int = CALIBRATION_TOKENS) -> AcceptanceEstimate:
    """Decode each prompt with a one-level tree of ``width`` children and count which rank the target accepted.

    Children are the draft's top-ranked tokens at temperature 0 and samples without replacement otherwise, as in
    the trees Sequoia builds; the engine verifies them with rule 3, so ``a_i`` is exactly the quantity the DP needs.
    """
    from core.drafting import Tree
    from core.engine import SpeculativeEngine

    if not isinstance(width, int) or width < 1:
        raise ValueError(f"width must be a positive integer, got {width!r}")
    if not prompts:
        raise ValueError("estimate_acceptance needs at least one calibration prompt")
    engine = SpeculativeEngine(target, draft, Tree((-1,) * width, "without_replacement", name=f"Level({width})"),
                               sampling)
    counts = [0] * width
    steps = 0
    for prompt in prompts:
        for event in engine.stream(prompt, tokens_per_prompt):
            if not event.nodes:
                continue  # the last step of a generation drafts nothing
            steps += 1
            if event.accepted_path:
                counts[event.accepted_path[0]] += 1
    if steps == 0:
        raise ValueError("the calibration prompts produced no drafted step: give longer generations")
    return AcceptanceEstimate(tuple(c / steps for c in counts), width, steps, tuple(counts))


def calibration_prompts(target) -> list[list[int]]:
    """Chat prompts in the target's template; token-id prompts for models without a tokenizer."""
    try:
        return [target.apply_chat_template([{"role": "user", "content": m}]) for m in CALIBRATION_MESSAGES]
    except Exception:  # a tokenizer-less test model has no template: synthetic prompts still measure costs
        vocab = target.vocab_size
        return [[(7 * i + j) % vocab for j in range(12)] for i in range(1, 4)]


def measure_plan(target, draft, sampling: SamplingParams, prompts: Sequence[Sequence[int]] | None = None,
                 tokens: int = CALIBRATION_TOKENS, report: Report | None = None) -> Plan:
    """Measure this machine and choose: verification settings, latencies, the draft's acceptance and its tree."""
    report = report or (lambda what, fraction: None)
    prompts = [list(p) for p in (prompts or calibration_prompts(target))]
    key = plan_key(target, draft, sampling)
    report("Timing verification settings", 0.0)
    tuning = tune_verification(target, prompts[0])
    quantised, drafter = {}, draft
    if draft is not None:
        report("Trying a cheaper draft model", 0.2)
        fast, quantised = cheaper_draft(target, draft, prompts[0])
        drafter = fast or draft
    report("Timing the models", 0.35)
    latencies = profile_latencies(target, drafter, prompts[0], VERIFY_SIZES, DRAFT_SIZES if drafter else ())
    acceptance, tree, steps = None, None, 0
    if drafter is not None:
        report("Measuring how often the draft model is right", 0.6)
        estimate = estimate_acceptance(target, drafter, prompts, sampling, WIDTH, tokens)
        acceptance, steps = estimate.vector, estimate.steps
        if sum(acceptance) > 0:
            tree = best_plan(solve(acceptance, MAX_BUDGET, MAX_DEPTH), latencies)
        else:
            acceptance = None
    if drafter is not draft:
        drafter.close()   # Auto loads it again only if its tree pays
    report("Plan ready", 1.0)
    return Plan(key, latencies, acceptance, tree, steps, tuning, quantised)
