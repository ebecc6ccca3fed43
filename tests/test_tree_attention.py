"""forward_tree gives every node the logits of its own root-to-node path; commit leaves exactly that path cached."""
from __future__ import annotations

import random

import pytest
import torch

from core.tree import TokenTree
from tests.tiny_models import tiny_backend

TOL = 1e-9  # float64: tree attention and a plain forward compute the same sums


def full_logits(backend, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return backend.model(torch.tensor([ids])).logits[0, -1].double()


def random_tree(rnd: random.Random, n: int, vocab: int) -> TokenTree:
    tree = TokenTree()
    for i in range(n):
        tree.add(rnd.randrange(vocab), rnd.randrange(-1, i))
    return tree


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tree_logits_equal_path_logits(arch: str) -> None:
    backend = tiny_backend(arch, vocab=40, seed=1)
    rnd = random.Random(0)
    for trial in range(6):
        prefix = [rnd.randrange(40) for _ in range(rnd.randint(1, 10))]
        backend.prefill(prefix)
        tree = random_tree(rnd, rnd.randint(1, 12), 40)
        logits = backend.forward_tree(tree)
        for j in range(len(tree)):
            path = [tree.tokens[i] for i in tree.path_to(j)]
            err = float((logits[j].double() - full_logits(backend, prefix + path)).abs().max())
            assert err < TOL, f"node {j} of trial {trial}: {err}"
        backend.commit([])


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_incremental_levels_equal_one_call(arch: str) -> None:
    backend = tiny_backend(arch, vocab=40, seed=2)
    tree = random_tree(random.Random(1), 10, 40)
    backend.prefill([1, 2, 3])
    whole = backend.forward_tree(tree)
    backend.commit([])
    parts = [backend.forward_tree(tree.truncated(max_nodes=4)), backend.forward_tree(tree, start=4)]
    assert float((torch.cat(parts) - whole).abs().max()) < TOL


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_commit_then_next_step_equals_recompute(arch: str) -> None:
    backend = tiny_backend(arch, vocab=40, seed=3)
    rnd = random.Random(2)
    history = [5, 6, 7]
    backend.prefill(history)
    for step in range(8):
        tree = random_tree(rnd, rnd.randint(2, 10), 40)
        backend.forward_tree(tree)
        leaf = rnd.randrange(len(tree))
        path = tree.path_to(leaf)
        backend.commit(path)
        history += [tree.tokens[i] for i in path]
        assert backend.committed == history
        probe = TokenTree.chain([rnd.randrange(40)])
        got = backend.forward_tree(probe)[0].double()
        backend.commit([])
        err = float((got - full_logits(backend, history + probe.tokens)).abs().max())
        assert err < TOL, f"step {step}: cache after commit differs from a full recompute by {err}"


def test_prefill_reuses_common_prefix() -> None:
    backend = tiny_backend("qwen2", vocab=40, seed=4)
    backend.prefill([1, 2, 3, 4, 5])
    last = backend.prefill([1, 2, 3, 9])
    assert backend.committed == [1, 2, 3, 9]
    assert float((last.double() - full_logits(backend, [1, 2, 3, 9])).abs().max()) < TOL
