"""The modes `speclens bench` compares, by name: each is a strategy, or a runner outside the engine."""
from __future__ import annotations

from typing import Sequence

from core.adaptive import AdaptiveChain
from core.auto import Auto
from core.drafting import Baseline, Chain, MultiDraft, Tree
from core.memory import Memory
from core.merge import Merge
from core.ngram import NGram
from core.self_draft import SelfDraft

NATIVE = "native"            # llama-cpp-python's own generate loop on the same file and threads
HF_ASSISTED = "hf-assisted"  # transformers' own assisted generation on the same pair
LLAMA_SERVER = "llama-server"   # llama.cpp's own server on the same files and threads: plain, or with its speculation
LLAMA_SERVER_MODES = {LLAMA_SERVER: "plain", f"{LLAMA_SERVER}:ngram": "ngram", f"{LLAMA_SERVER}:draft": "draft",
                      f"{LLAMA_SERVER}:both": "both"}
RUNNERS = (NATIVE, HF_ASSISTED, *LLAMA_SERVER_MODES)
ENDPOINT = "endpoint:"       # endpoint:URL[#model]: any OpenAI-compatible server, through the openai client
# An A/A control: a second, identical baseline or native reference (the same loop on the same weights, with its own
# context for native), so its ratio to its twin is the run-to-run noise. No mode can be told from another by less
# than its controls move.
AGAIN = ":again"
MAX_TREE_BUDGET = 64         # a bench tree larger than this would take minutes per step on a CPU
MAX_TREE_DEPTH = 16
MODE_HELP = (f"baseline, {NATIVE}, chain[:K], tree[:BUDGET[:DEPTH]] (Sequoia shape from the published acceptance "
             "vector), multidraft[:K[:LENGTH[:specinfer|spectr]]] (K draft sequences, verified by rule 3 or by "
             "SpecTr's K-SEQ), ngram[:K], memory[:BUDGET], merge[:K] (draft chain + n-gram), self:L[:K] (the "
             "target's first L layers draft a chain of K; transformers backend), adaptive, auto[:noresume] (Auto "
             "without guesses of where a copy resumes after an edit, nor edits applied again), auto:nospelling "
             "(Auto without the tokenizer's spelling: a rename stays on the tokens it was learnt on), auto:noprobs (Auto "
             "estimating a remembered answer's tokens without the probabilities they were drawn with), "
             f"{HF_ASSISTED} (transformers backend only), {LLAMA_SERVER}[:ngram|:draft|:both] (llama.cpp's own server "
             "on the same files and threads: plain, its --spec-default n-gram drafts, the draft model, or both), "
             f"{ENDPOINT}URL[#MODEL] (any OpenAI-compatible server: another SpecLens, llama-server, vLLM, SGLang; "
             "timed on this machine's clock), "
             f"baseline{AGAIN}, {NATIVE}{AGAIN} and {LLAMA_SERVER}{AGAIN} (A/A controls: a second, identical "
             "reference, whose ratios show the noise floor)")


AUTO_FLAGS = {"noresume", "nospelling", "noprobs"}


class BenchError(ValueError):
    """A bad benchmark setting or prompt file."""


def _ints(mode: str, parts: Sequence[str]) -> list[int]:
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise BenchError(f"mode {mode!r}: the numbers after ':' must be integers") from None


def runner_of(mode: str) -> str | None:
    """The runner a mode runs (``native``, ``hf-assisted``, a llama-server mode; the ``:again`` twins too), or None
    for an engine mode."""
    if mode.startswith(ENDPOINT):
        return mode
    name = mode.removesuffix(AGAIN) if mode in (NATIVE + AGAIN, LLAMA_SERVER + AGAIN) else mode
    return name if name in RUNNERS else None


def strategy_for(mode: str):
    """The strategy a mode name stands for (the runners have none)."""
    if mode == "baseline" + AGAIN:
        return Baseline()
    name, *args = mode.split(":")
    verifier = args.pop() if name == "multidraft" and len(args) == 3 else None   # the one word among the numbers
    flags = set(args) if name == "auto" and set(args) <= AUTO_FLAGS else set()
    args = [a for a in args if a not in flags]
    nums = _ints(mode, args)
    try:
        if name == "baseline" and not nums:
            return Baseline()
        if name == "chain" and len(nums) <= 1:
            return Chain(*(nums or [4]))
        if name == "tree" and len(nums) <= 2:
            budget, depth = (nums + [8, 4][len(nums):])[:2]
            if not 2 <= budget <= MAX_TREE_BUDGET or not 1 <= depth <= MAX_TREE_DEPTH:
                raise BenchError(f"mode {mode!r}: a tree needs a budget in 2..{MAX_TREE_BUDGET} and a depth in "
                                 f"1..{MAX_TREE_DEPTH}")
            return Tree.sequoia(budget, depth)
        if name == "multidraft" and len(nums) <= 2:
            k, length = (nums + [2, 3][len(nums):])[:2]
            return MultiDraft(k, length, verifier or MultiDraft.verifier)
        if name == "ngram" and len(nums) <= 1:
            return NGram(*(nums or [4]))
        if name == "memory" and len(nums) <= 1:
            return Memory(*(nums or [8]))
        if name == "merge" and len(nums) <= 1:
            return Merge((Chain(*(nums or [3])), NGram(4)))
        if name == "self" and 1 <= len(nums) <= 2:
            layers, k = (nums + [4])[:2]
            return SelfDraft(layers, tuple(range(-1, k - 1)))
        if name == "adaptive" and not nums:
            return AdaptiveChain()
        if name == "auto" and not nums:
            return Auto(resume="noresume" not in flags, spell="nospelling" not in flags, probs="noprobs" not in flags)
    except BenchError:
        raise
    except ValueError as exc:
        raise BenchError(f"mode {mode!r}: {exc}") from None
    raise BenchError(f"unknown mode {mode!r}; modes: {MODE_HELP}")


def parse_modes(text: str) -> list[str]:
    """The modes of ``--modes``, baseline first (every speedup is a ratio to it), each checked."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    if not modes:
        raise BenchError("no modes given")
    if "baseline" not in modes:
        modes.insert(0, "baseline")
    if len(set(modes)) != len(modes):
        raise BenchError(f"a mode is listed twice in {text!r}")
    for mode in modes:
        if runner_of(mode) is None:
            strategy_for(mode)
    return modes


def needs_draft_model(mode: str) -> bool:
    return (mode.removesuffix(AGAIN) not in ("baseline", "auto", NATIVE, LLAMA_SERVER, f"{LLAMA_SERVER}:ngram")
            and not mode.startswith(("ngram", "memory", "self", ENDPOINT)))
