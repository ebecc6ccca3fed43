"""Auto's plan as another engine's speculative configuration, for a user who moves the same pair to a server.

Each engine takes a different part of the plan. vLLM's draft-model method drafts a chain: it gets the plan tree's
depth as ``num_speculative_tokens`` (its ``speculative_token_tree`` applies to EAGLE-style heads only, so the tree
itself is not passed). SGLang's standalone drafter grows a top-k tree and verifies the best ``num_draft_tokens`` of
it, which carries the plan's depth, widest branching and budget. llama-server drafts a chain of at most
``--spec-draft-n-max`` tokens. What an engine cannot take is said beside the configuration, never dropped silently."""
from __future__ import annotations

import json
import shlex
from collections import Counter
from dataclasses import dataclass

from core.auto.plan import Plan

ENGINES = ("vllm", "sglang", "llama-server")


class ExportError(ValueError):
    pass


@dataclass(frozen=True)
class Exported:
    engine: str
    command: str     # a shell command line that starts the engine with the plan
    notes: tuple[str, ...]

    def text(self) -> str:
        return "\n".join([self.command, *(f"# {note}" for note in self.notes)])


def widest_branching(parents: tuple[int, ...]) -> int:
    """The most children any node of the tree has (the root is node 0; ``parents[i]`` is node i+1's parent)."""
    return max(Counter(parents).values(), default=1)


def export(plan: Plan, engine: str, target: str, draft: str) -> Exported:
    """``plan`` as ``engine``'s command line serving ``target`` with ``draft`` (model ids or paths that engine loads)."""
    if engine not in ENGINES:
        raise ExportError(f"unknown engine {engine!r}: one of {', '.join(ENGINES)}")
    tree = plan.tree
    if tree is None:
        raise ExportError("this plan has no draft-model tree (it was measured without a draft model): "
                          "nothing to export; measure with the draft (speclens plan without --no-draft)")
    notes = [f"Sequoia tree of {tree.budget} tokens, depth {tree.depth}, predicted {tree.speedup:.2f}x "
             f"on the machine that measured it"]
    if not plan.tree_pays():
        notes.append("the plan predicts that drafting with this model does NOT pay on the machine that measured "
                     "it; measure on the serving machine (speclens plan --device cuda there) before using this")
    if engine == "vllm":
        config = {"method": "draft_model", "model": draft, "num_speculative_tokens": tree.depth}
        command = ["vllm", "serve", target, "--speculative-config", json.dumps(config, separators=(",", ":"))]
        if tree.budget - 1 > tree.depth:
            notes.append(f"vLLM's draft-model method drafts a chain: the tree's depth {tree.depth} is used, its "
                         f"{tree.budget - 1 - tree.depth} side branches are not (vLLM takes trees for EAGLE heads only)")
    elif engine == "sglang":
        command = ["python", "-m", "sglang.launch_server", "--model-path", target,
                   "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", draft,
                   "--speculative-num-steps", str(tree.depth),
                   "--speculative-eagle-topk", str(widest_branching(tree.parents)),
                   "--speculative-num-draft-tokens", str(tree.budget)]
        notes.append("SGLang picks its tree by draft scores each step: the plan's budget, depth and widest branching "
                     "are its bounds, not its exact shape")
    else:
        command = ["llama-server", "-m", target, "-md", draft, "--spec-type", "draft-simple",
                   "--spec-draft-n-max", str(tree.depth)]
        if tree.budget - 1 > tree.depth:
            notes.append(f"llama-server drafts a chain: the tree's depth {tree.depth} is used, its side branches are not")
    return Exported(engine, shlex.join(command), tuple(notes))
