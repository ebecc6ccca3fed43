"""How far a verification batch's logits are from one-token steps' on the default pair's target, on a real prompt:
a chain of k drafted tokens checked at every position of a greedy answer, and one-token steps after a tree step
whose taken branch is not its first. 0.0 means bit for bit (native/llama.cpp/README.md says which build gives it).

    python tools/batch_exactness.py [--task ts-rename-class] [--tokens 24] [--flash-attn on|off]

The prompt is the agent bench's turn for a fast-apply task (core.bench.agent), about 1,000 tokens: past the 512
cached tokens where stock llama.cpp sends a lone token's attention another way.
"""
from __future__ import annotations

import argparse

import torch

from core.backends.llamacpp import ContextTuning
from core.bench import agent, fast_apply
from core.models import load_pair
from core.tree import TokenTree


def steps(target, prompt: list[int], answer: list[int], n: int, chain: int = 0) -> tuple[list, dict]:
    """``n`` one-token steps through ``answer`` (greedy where it ends), from a freshly read prompt; with ``chain``, at
    every position also the logits a chain of that many of the answer's next tokens gets for its last one, checked
    on the same cache and then cut off."""
    target.reset()
    logits, out, chained = target.prefill(prompt), [], {}
    for j in range(n):
        out.append(logits.clone())
        if not answer[j:]:
            answer.append(int(torch.argmax(logits)))
        if chain and j + chain <= len(answer) - 1:
            chained[j + chain] = target.forward_tree(TokenTree.chain(answer[j:j + chain]))[-1].clone()
            target.commit([])
        logits = target.forward_tree(TokenTree.chain(answer[j:j + 1]))[-1]
        target.commit([0])
    return out, chained


def after_tree(target, prompt: list[int], answer: list[int], at: int = 4) -> list:
    """The logits of a tree step at ``at`` whose first branch is not taken, then of one-token steps after it."""
    target.reset()
    target.prefill(prompt + answer[:at])
    tree = TokenTree()
    tree.add((answer[at] + 1) % target.vocab_size, -1)
    for i, token in enumerate(answer[at:at + 3]):
        tree.add(token, i if i else -1)
    logits = target.forward_tree(tree)
    out = [logits[i + 1].clone() for i in range(3)]
    target.commit([1, 2, 3])
    last = logits[3]
    for token in answer[at + 3:-1]:
        last = target.forward_tree(TokenTree.chain([token]))[-1]
        target.commit([0])
        out.append(last.clone())
    return out


def main(args: argparse.Namespace) -> None:
    target, _ = load_pair("default", backend="llama.cpp")
    target.retune(ContextTuning(flash_attn=args.flash_attn == "on"))
    task = next(t for t in fast_apply.read_tasks(fast_apply.TASKS, "all") if t["id"] == args.task)
    prompt = target.apply_chat_template(agent.messages(task), agent.TOOLS)
    answer: list[int] = []
    single, _ = steps(target, prompt, answer, args.tokens)
    print(f"{args.task}: a prompt of {len(prompt)} tokens, flash attention {args.flash_attn}, "
          f"{len(answer)} greedy tokens")
    for k in (k for k in (2, 4, 8, 16) if k < args.tokens):      # chains that end inside the answer
        _, chained = steps(target, prompt, answer, args.tokens, chain=k)
        worst = max((got - single[j]).abs().max().item() for j, got in chained.items())
        print(f"  chain of {k:2d}: largest |logit difference| {worst:.4g} over {len(chained)} positions")
    tree = after_tree(target, prompt, answer)
    diffs = [(got - single[5 + i]).abs().max().item() for i, got in enumerate(tree)]
    print(f"  tree step (3 positions), then steps: largest |logit difference| per position "
          f"{' '.join(f'{d:.3g}' for d in diffs)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="ts-rename-class")
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--flash-attn", choices=("on", "off"), default="on")
    main(parser.parse_args())
