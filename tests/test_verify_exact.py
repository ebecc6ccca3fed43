"""Exact enumeration: the verifier's output distribution equals the target's, to 1e-9, for every mode.

Part 1 runs the real child sampler and verifier on one level with explicit P and Q (vocabularies of 3-6, k = 1..V,
holes in Q's support, Q = P, one-hot Q). Part 2 runs the real engine end to end on table models, through every
random path, and compares the joint distribution of the first two tokens with the target's own.
"""
from __future__ import annotations

import itertools

import pytest
import torch

from core.drafting import Chain, MultiDraft, Tree, sample_children
from core.sampling import SamplingParams, logits_to_probs, token_probability
from core.tree import TokenTree
from core.verify import verify_tree
from tests.exact import enumerate_outcomes, first_two_tokens_exact
from tests.table_backend import TableBackend, random_table

TOL = 1e-9


def _dist(vocab: int, gen: torch.Generator, holes: bool) -> torch.Tensor:
    p = torch.rand(vocab, generator=gen, dtype=torch.float64)
    if holes:
        p[torch.randperm(vocab, generator=gen)[: vocab // 2]] = 0.0
    return p / p.sum()


def _q_cases(p: torch.Tensor, gen: torch.Generator):
    vocab = len(p)
    one_hot = torch.zeros(vocab, dtype=torch.float64)
    one_hot[int(torch.randint(vocab, (1,), generator=gen))] = 1.0
    yield "random", _dist(vocab, gen, holes=False)
    yield "holes", _dist(vocab, gen, holes=True)
    yield "q=p", p.clone()
    yield "one-hot", one_hot
    # a draft whose support misses the target's mode entirely
    disjoint = p.clone()
    disjoint[int(torch.argmax(p))] = 0.0
    yield "misses-mode", disjoint / disjoint.sum() if disjoint.sum() > 0 else one_hot


def _one_level_distribution(p: torch.Tensor, q: torch.Tensor, k: int, mode: str, params: SamplingParams,
                            target_prob=None):
    vocab = len(p)

    def run(rng):
        tree = TokenTree()
        for tok, proposal in sample_children(q, torch.log(q), k, mode, params, rng):
            tree.add(tok, -1, proposal)
        verdict = verify_tree(tree, lambda u: p, rng, (), target_prob)
        first = tree.tokens[verdict.accepted[0]] if verdict.accepted else verdict.extra
        return first

    dist = enumerate_outcomes(run)
    return torch.tensor([dist.get(t, 0.0) for t in range(vocab)], dtype=torch.float64)


@pytest.mark.parametrize("quick", [False, True], ids=["built", "read"])
@pytest.mark.parametrize("vocab", [3, 4, 5, 6])
@pytest.mark.parametrize("mode", ["iid", "without_replacement", "top_k"])
def test_one_level_exact(vocab: int, mode: str, quick: bool) -> None:
    """Also with ``target_prob`` (``read``): a deterministic first child (the top-k children) is then tested without
    the whole distribution, and the rest of the walk goes on from the residual after it."""
    gen = torch.Generator().manual_seed(vocab * 31 + len(mode))
    params = SamplingParams(temperature=1.0)
    worst = 0.0
    checked = 0
    for p_holes in (False, True):
        p = _dist(vocab, gen, p_holes)
        for name, q in _q_cases(p, gen):
            # i.i.d. children multiply paths by V^k: cap k where enumeration would take minutes
            top_k_children = vocab if mode != "iid" else min(vocab, 4)
            for k in range(1, top_k_children + 1):
                out = _one_level_distribution(p, q, k, mode, params,
                                              (lambda u, x, p=p: float(p[x])) if quick else None)
                err = float((out - p).abs().max())
                assert err < TOL, f"{mode} V={vocab} k={k} q={name} p_holes={p_holes}: error {err}"
                worst = max(worst, err)
                checked += 1
    assert checked >= 20


@pytest.mark.parametrize("vocab", [3, 5])
def test_greedy_is_exact_argmax(vocab: int) -> None:
    """With P one-hot (temperature 0) every mode emits the argmax with probability one."""
    gen = torch.Generator().manual_seed(vocab)
    params = SamplingParams(temperature=0.0)
    for _ in range(5):
        logits = torch.randn(vocab, generator=gen, dtype=torch.float64)
        p = logits_to_probs(logits, params)
        q = _dist(vocab, gen, holes=True)
        for mode, k in itertools.product(("iid", "without_replacement", "top_k"), (1, 2, vocab)):
            out = _one_level_distribution(p, q, k, mode, SamplingParams(temperature=1.0))
            assert float((out - p).abs().max()) < TOL


END_TO_END = [
    ("chain2", Chain(2)),
    ("multidraft", MultiDraft(2, 2)),
    ("tree-wor", Tree((-1, -1, 0), "without_replacement")),
    ("tree-iid", Tree((-1, -1, 0), "iid")),
    ("tree-topk", Tree((-1, -1, 0, 1), "top_k")),
]
PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_p=0.9),
    SamplingParams(temperature=1.3, top_k=2),
    SamplingParams(temperature=0.8, min_p=0.5),
]
PARAMS_IDS = ["t1", "t0.7-p0.9", "t1.3-k2", "t0.8-m0.5"]


@pytest.mark.parametrize("name,strategy", END_TO_END, ids=[n for n, _ in END_TO_END])
@pytest.mark.parametrize("params", PARAMS, ids=PARAMS_IDS)
def test_engine_two_token_joint_exact(name: str, strategy, params: SamplingParams) -> None:
    vocab = 3
    target = TableBackend(random_table(vocab, seed=1), vocab, "target")
    draft = TableBackend(random_table(vocab, seed=2, holes=0.3), vocab, "draft")
    got, expected = first_two_tokens_exact(target, draft, strategy, params, [0, 1])
    err = float((got - expected).abs().max())
    assert err < TOL, f"{name}: joint of the first two tokens off by {err}"


def test_a_wrong_read_probability_is_caught() -> None:
    """The quick test of a deterministic first child has teeth: reading P[x] wrong (its square root) is detected."""
    gen = torch.Generator().manual_seed(5)
    p = _dist(4, gen, holes=False)
    out = _one_level_distribution(p, p.clone(), 2, "top_k", SamplingParams(temperature=1.0),
                                  lambda u, x: float(p[x]) ** 0.5)
    assert float((out - p).abs().max()) > 1e-3


def test_broken_verifier_is_caught(monkeypatch) -> None:
    """The enumeration has teeth: sampling the correction from P instead of the residual is detected."""
    import core.verify as verify

    monkeypatch.setattr(verify, "residual_after_rejection", lambda residual, drawn_from: residual)
    gen = torch.Generator().manual_seed(0)
    p = _dist(4, gen, holes=False)
    q = _dist(4, gen, holes=False)
    out = _one_level_distribution(p, q, 1, "iid", SamplingParams(temperature=1.0))
    assert float((out - p).abs().max()) > 1e-3


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7),
                                    SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=1.3, top_k=3),
                                    SamplingParams(temperature=0.5, min_p=0.2), SamplingParams(temperature=0.0)],
                         ids=["t1", "t0.7", "t0.7-p0.9", "t1.3-k3", "t0.5-m0.2", "greedy"])
def test_a_read_probability_is_the_distribution_entry(params: SamplingParams) -> None:
    """``token_probability`` (what the engine gives the verifier as ``target_prob``) is the entry of the processed
    distribution, with or without filters, in float64 and in float32."""
    gen = torch.Generator().manual_seed(3)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        logits = (torch.randn(50, generator=gen, dtype=torch.float64) * 3).to(dtype)
        probs = logits_to_probs(logits, params)
        for token in range(50):
            assert abs(token_probability(logits, token, params) - float(probs[token])) < tol


def test_min_p_keeps_what_llama_cpps_min_p_keeps_whatever_the_temperature() -> None:
    """Min-p compares raw logits, as llama.cpp's sampler does before temperature in its default chain: a token is kept
    when it is at least ``min_p`` times as likely as the likeliest at temperature 1, at any temperature; a greedy
    answer is unchanged; filtered, the rest is the tempered softmax of what is kept."""
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(40, generator=gen, dtype=torch.float64) * 2
    kept = torch.softmax(logits, -1) >= 0.3 * torch.softmax(logits, -1).max()
    assert 1 < int(kept.sum()) < 40
    for temperature in (0.3, 1.0, 1.7):
        probs = logits_to_probs(logits, SamplingParams(temperature=temperature, min_p=0.3))
        assert torch.equal(probs > 0, kept)
        expected = torch.softmax(torch.where(kept, logits / temperature, torch.tensor(float("-inf"))), -1)
        assert float((probs - expected).abs().max()) < 1e-12
    greedy = SamplingParams(temperature=0.0, min_p=0.9)
    assert torch.equal(logits_to_probs(logits, greedy), logits_to_probs(logits, SamplingParams(temperature=0.0)))
    assert SamplingParams(min_p=0.3).distribution_key != SamplingParams().distribution_key
    assert "min_p" not in SamplingParams().distribution_key          # the keys of answers kept before min-p stand
