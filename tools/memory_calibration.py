"""How well memory's estimates match what the target accepts, two ways:

    python tools/memory_calibration.py --answers docs/bench/answers-zen4.json docs/bench/answers-h7-zen4.json
    python tools/memory_calibration.py --decode 0.7 --sets regens-stop45 code_editing --seeds 0 1 2

``--answers`` walks the benchmark's recorded greedy answers (tools/replay.py --record; no model is loaded): at every
position, the memory tree of the text so far (prompt and answer) is followed along the answer, and each node on that
path is counted, by its statistics bucket and by how many occurrences back it, as accepted while its token is the
answer's. It says whether occurrences that agree make a node surer than one (core.memory.stats.confidence).

``--decode T`` decodes the prompts with Auto on the default pair at temperature T (a regenerated prompt's earlier
answer drawn first, as the bench does, memory restored after every run) and compares, for every memory draft, the
tokens Auto predicted (with this prompt's record) with those the call emitted, by the kind of text the draft copied
and its width; and node by node, memory's estimate (before this prompt's record corrects it) with the target's
probability of the drafted token (what a deterministic draft is accepted with). Greedy answers cannot show this: a
sampled answer drifts from its earlier sample, and a greedy one does not.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from core.memory.stats import BUCKET_LABELS, EDITED, OWN, RECORDED, RESUMED, bucket  # noqa: E402  (after the path)

DEPTH = 16
NEW_TOKENS = 96
WIDTHS = ((3, "2-3"), (8, "4-8"), (16, "9-16"), (10**9, "17+"))


def by_occurrences(paths: list[Path]) -> list[str]:
    """Acceptance of the nodes on each recorded answer's path, by bucket and backing occurrences (1, 2, 3 or more)."""
    from core.memory.drafter import MemoryDrafter
    from tools.replay import read_answers

    counts: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    for p in read_answers(paths)["prompts"]:
        prompt, answer = p["prompt"], p["answer"]
        drafter = MemoryDrafter(None)
        drafter.start(prompt)
        for i in range(len(answer)):
            proposal = drafter.propose(prompt + answer[:i], DEPTH, DEPTH)
            tree, node = proposal.tree, -1
            for depth in range(min(DEPTH, len(answer) - i)):
                children = tree.children(node)
                if not children:
                    break
                node = children[0]
                a, b = proposal.blocks[node]
                held = tree.tokens[node] == answer[i + depth]
                cell = counts[(bucket(proposal.node_matches[node]), min(b - a, 3))]
                cell[0] += 1
                cell[1] += held
                if not held:
                    break
    lines = ["bucket          occurrences   nodes   accepted"]
    for (b, occurrences), (n, held) in sorted(counts.items()):
        lines.append(f"{BUCKET_LABELS[b]:<15} {occurrences if occurrences < 3 else '3+':>11} {n:7d} {held / n:10.3f}")
    return lines


def _kind(stats_key: int) -> str:
    """What a draft whose first node has this statistics key copied."""
    named = {RECORDED: "recorded", RESUMED: "resumed", EDITED: "edited"}
    return named.get(stats_key) or ("remembered" if stats_key < RESUMED else "own answer" if stats_key > OWN else
                                    "this text")


def decode(temperature: float, sets: list[str], seeds: list[int]) -> list[str]:
    """Predicted and emitted tokens of Auto's memory drafts, decoding the sets' prompts at ``temperature``."""
    from core.auto import Auto, attach_memory
    from core.bench.prompts import PROMPT_DIR, read_prompts
    from core.bench.runners import earlier_sampling
    from core.cli_args import open_pair
    from core.drafting import Baseline
    from core.engine import SpeculativeEngine
    from core.memory import open_memory
    from core.sampling import SamplingParams

    target, draft = open_pair("default", "llama.cpp")
    drafts: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    nodes: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    with tempfile.TemporaryDirectory(prefix="speclens-calibration-") as empty:
        memory = open_memory(target.fingerprint(), empty, read_only=True)
        for name in sets:
            path = Path(name) if name.endswith(".jsonl") else PROMPT_DIR / f"{name}.jsonl"
            if not path.exists():
                path = Path(__file__).resolve().parent.parent / "docs" / "bench" / f"{name}.jsonl"
            for p in read_prompts(path):
                ids = target.apply_chat_template(p["messages"])
                for seed in seeds:
                    sampling = SamplingParams(temperature=temperature, seed=seed)
                    before = memory.snapshot()
                    if p["regenerate"]:
                        earlier = SpeculativeEngine(target, None, Baseline(), earlier_sampling(sampling))
                        answer = earlier.generate(ids, NEW_TOKENS)
                        memory.add_answer(ids, answer.tokens, answer.token_probs, earlier.sampling.distribution_key)
                    auto = attach_memory(Auto(), memory)
                    predicted = 0.0
                    for event in SpeculativeEngine(target, draft, auto, sampling).stream(ids, NEW_TOKENS):
                        policy = auto.last_drafter
                        step_predicted, predicted = policy.predicted_tokens - predicted, policy.predicted_tokens
                        proposal = policy.memory.last_proposal
                        if not event.nodes or policy.choice != "memory" or proposal is None:
                            continue
                        n = len(event.nodes)
                        cell = drafts[(_kind(proposal.node_matches[0]), next(w for top, w in WIDTHS if n <= top))]
                        cell[0] += 1
                        cell[1] += step_predicted
                        cell[2] += len(event.tokens)
                        for j, info in enumerate(event.nodes):
                            if info.p is not None:
                                row = nodes[BUCKET_LABELS[bucket(proposal.node_matches[j])]]
                                row[0] += 1
                                row[1] += proposal.node_probs[j]
                                row[2] += info.p
                    memory.restore(before)
                print(f"{name}/{p['id']}", file=sys.stderr, flush=True)
    lines = ["copied from    width   drafts   predicted   emitted  (tokens a call)"]
    for (kind, width), (n, predicted, emitted) in sorted(drafts.items()):
        lines.append(f"{kind:<14} {width:>5} {n:8d} {predicted / n:11.2f} {emitted / n:9.2f}")
    lines.append("node bucket      nodes   memory's estimate   target's probability (nodes reached)")
    for label, (n, estimate, p) in sorted(nodes.items()):
        lines.append(f"{label:<16} {n:5d} {estimate / n:19.3f} {p / n:22.3f}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--answers", type=Path, nargs="+", help="recorded greedy answers (tools/replay.py --record)")
    parser.add_argument("--decode", type=float, metavar="T", help="decode with Auto at this temperature")
    parser.add_argument("--sets", nargs="+", default=["regens-stop45"], help="prompt sets (--decode)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="sampling seeds (--decode)")
    args = parser.parse_args(argv)
    if (args.answers is None) == (args.decode is None):
        parser.error("give either --answers or --decode")
    print("\n".join(by_occurrences(args.answers) if args.answers else decode(args.decode, args.sets, args.seeds)))


if __name__ == "__main__":
    main()
