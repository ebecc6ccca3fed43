"""SpecTr's k-sequential selection (core.spectr) is lossless, and compares with rule 3 on the same drafts.

Exact enumeration on one level (vocabularies of 3-5, k = 1..4 i.i.d. drafts, random P and Q, holes, Q = P, one-hot
Q, a Q that misses P's mode) and end to end through the real engine on table models; chi-square with tiny random
models (slow); greedy identity on float64 models; the expected accepted length computed without sampling noise
agrees with the enumerated one.
"""
from __future__ import annotations

import pytest
import torch

from core.backends.hf import HFBackend
from core.bench.modes import strategy_for
from core.bench.same_drafts import SameDrafts, compare_verifiers
from core.drafting import Baseline, MultiDraft, Tree, sample_children
from core.engine import SpeculativeEngine
from core.sampling import Rng, SamplingParams, greedy_token, logits_to_probs
from core.spectr import KSEQ, RULE3, expected_accepted, k_sequential, verify_spectr
from core.tiny import perturb, tiny_model
from core.tree import Proposal, TokenTree
from core.verify import verify_greedy, verify_tree
from tests.chi_square import ALPHA, N, VOCAB, chi_square_p, exact_joint, sampled_joint
from tests.exact import enumerate_outcomes, first_two_tokens_exact
from tests.table_backend import TableBackend, random_table
from tests.test_greedy_identity import GREEDY, prompts
from tests.test_verify_exact import PARAMS, PARAMS_IDS, TOL, _dist, _q_cases
from tests.tiny_models import tiny_draft_pair


def _first_token_law(p: torch.Tensor, draw, verify=verify_spectr) -> torch.Tensor:
    """The exact law of the first emitted token when ``draw(rng)`` builds the root's children."""
    def run(rng):
        tree = TokenTree()
        for tok, proposal in draw(rng):
            tree.add(tok, -1, proposal)
        verdict = verify(tree, lambda u: p, rng)
        return tree.tokens[verdict.accepted[0]] if verdict.accepted else verdict.extra

    dist = enumerate_outcomes(run)
    return torch.tensor([dist.get(t, 0.0) for t in range(len(p))], dtype=torch.float64)


def _iid(q: torch.Tensor, k: int):
    return lambda rng: sample_children(q, torch.log(q), k, "iid", SamplingParams(temperature=1.0), rng)


@pytest.mark.parametrize("vocab", [3, 4, 5])
def test_one_level_exact(vocab: int) -> None:
    gen = torch.Generator().manual_seed(100 + vocab)
    checked = 0
    for p_holes in (False, True):
        p = _dist(vocab, gen, p_holes)
        for name, q in _q_cases(p, gen):
            for k in range(1, 5 if vocab < 5 else 4):
                err = float((_first_token_law(p, _iid(q, k)) - p).abs().max())
                assert err < TOL, f"V={vocab} k={k} q={name} p_holes={p_holes}: error {err}"
                checked += 1
    assert checked >= 25


def test_independent_but_different_drafts_are_exact() -> None:
    """Candidates need only be independent: a sampled draft, a deterministic one (an n-gram's) and a draft from
    another distribution, tested in one K-SEQ round."""
    gen = torch.Generator().manual_seed(5)
    for _ in range(6):
        p, q1, q2 = (_dist(4, gen, holes) for holes in (False, False, True))

        def draw(rng):
            return [(rng.sample(q1), Proposal(q1)), (2, Proposal()), (rng.sample(q2), Proposal(q2))]

        assert float((_first_token_law(p, draw) - p).abs().max()) < TOL


def test_rho_is_the_smallest_valid_one() -> None:
    """For i.i.d. drafts rho solves 1 - (1 - beta)^k = rho * beta (the paper's rho*), and a smaller one is invalid."""
    gen = torch.Generator().manual_seed(9)
    for k in (2, 3, 4):
        p, q = _dist(6, gen, False), _dist(6, gen, False)
        sel = k_sequential(p, [(0, q)] * k)
        beta = float(torch.minimum(q, p / sel.rho).sum())
        assert 1.0 < sel.rho <= k
        assert abs((1 - (1 - beta) ** k) - sel.rho * beta) < 1e-8
        smaller = sel.rho * (1 - 1e-6)
        beta_s = float(torch.minimum(q, p / smaller).sum())
        alpha = torch.minimum(q, p / smaller) * (1 - (1 - beta_s) ** k) / beta_s
        assert float((alpha - p).max()) > 0, "a smaller rho would still be valid: not the best acceptance"


def test_one_draft_is_chain_speculative_sampling() -> None:
    gen = torch.Generator().manual_seed(3)
    p, q = _dist(5, gen, False), _dist(5, gen, True)
    for x in range(5):
        if q[x] > 0:
            sel = k_sequential(p, [(x, q)])
            assert sel.rho == 1.0
            assert abs(sel.accept[0] - min(1.0, float(p[x] / q[x]))) < 1e-15
            rest = torch.clamp(p - q, min=0)
            assert float((sel.residual - rest / rest.sum()).abs().max()) < 1e-14


def test_q_equal_p_accepts_the_first_draft() -> None:
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    sel = k_sequential(p, [(1, p), (2, p), (0, p)])
    assert sel.rho == 1.0 and sel.accept[0] == 1.0


def test_without_replacement_children_are_refused() -> None:
    q = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    tree = TokenTree()
    tree.add(0, -1, Proposal(q))
    tree.add(1, -1, Proposal(q, (0,)))
    with pytest.raises(ValueError, match="without replacement"):
        verify_spectr(tree, lambda u: q, Rng(0))


def test_multidraft_checks_its_verifier() -> None:
    with pytest.raises(ValueError, match="verifier"):
        MultiDraft(2, 2, verifier="optimal")
    assert MultiDraft(2, 2).label == "MultiDraft(2x2)"
    assert MultiDraft(2, 2, KSEQ).label == "MultiDraft(2x2, SpecTr)"


def test_broken_kseq_is_caught(monkeypatch) -> None:
    """The enumeration has teeth: K-SEQ's acceptances with rule 3's residual are detected."""
    import core.spectr as spectr

    real = spectr.k_sequential

    def broken(p, draws):
        sel = real(p, draws)
        q = draws[0][1] if draws else p
        rest = torch.clamp(p - q, min=0)
        return spectr.Selection(sel.rho, sel.accept, rest / rest.sum() if rest.sum() > 0 else p)

    monkeypatch.setattr(spectr, "k_sequential", broken)
    gen = torch.Generator().manual_seed(0)
    p, q = _dist(4, gen, False), _dist(4, gen, False)
    assert float((_first_token_law(p, _iid(q, 3)) - p).abs().max()) > 1e-3


# -- end to end through the real engine --------------------------------------------------------------------------

@pytest.mark.parametrize("params", PARAMS, ids=PARAMS_IDS)
def test_engine_two_token_joint_exact(params: SamplingParams) -> None:
    """Two sequences of two tokens: when both drew the accepted first token, both second tokens are candidates."""
    vocab = 3
    target = TableBackend(random_table(vocab, seed=1), vocab, "target")
    draft = TableBackend(random_table(vocab, seed=2, holes=0.3), vocab, "draft")
    got, expected = first_two_tokens_exact(target, draft, MultiDraft(2, 2, KSEQ), params, [0, 1])
    err = float((got - expected).abs().max())
    assert err < TOL, f"joint of the first two tokens off by {err}"


@pytest.mark.slow
def test_engine_three_drafts_exact() -> None:
    vocab = 3
    target = TableBackend(random_table(vocab, seed=3), vocab, "target")
    draft = TableBackend(random_table(vocab, seed=4), vocab, "draft")
    params = SamplingParams(temperature=1.3, top_k=2)
    got, expected = first_two_tokens_exact(target, draft, MultiDraft(3, 2, KSEQ), params, [2, 0])
    assert float((got - expected).abs().max()) < TOL


# -- the same drafts, two verifiers --------------------------------------------------------------------------------

def _random_tree(seed: int, vocab: int) -> tuple[TokenTree, dict[int, torch.Tensor]]:
    """Three sequences of length three drawn i.i.d. from random per-prefix drafts; the target's p per node."""
    table_q, table_p = random_table(vocab, seed=seed), random_table(vocab, seed=7, holes=0.2)
    rng = Rng(seed)
    tree = TokenTree()
    for parent in MultiDraft(3, 3).parents:
        ctx = tuple(tree.tokens[j] for j in tree.path_to(parent)) if parent >= 0 else ()
        q = table_q(ctx)
        tree.add(rng.sample(q), parent, Proposal(q))
    p_of = {u: table_p(tuple(tree.tokens[j] for j in tree.path_to(u)) if u >= 0 else ()) for u in range(-1, len(tree))}
    return tree, p_of


@pytest.mark.parametrize("verifier,verify", [(RULE3, verify_tree), (KSEQ, verify_spectr)], ids=[RULE3, KSEQ])
def test_expected_accepted_matches_enumeration(verifier: str, verify) -> None:
    duplicates = 0
    for seed in range(4):
        tree, p_of = _random_tree(seed, 3)
        duplicates += len(tree.tokens[:3]) - len(set(tree.tokens[:3]))
        dist = enumerate_outcomes(lambda rng: len(verify(tree, p_of.__getitem__, rng).accepted))
        mean = sum(n * w for n, w in dist.items())
        assert abs(mean - expected_accepted(tree, p_of.__getitem__, verifier)) < 1e-12
    assert duplicates, "no two sequences shared a first token: K-SEQ's classes were not exercised"


def test_expected_accepted_on_a_chain_is_the_same_for_both() -> None:
    """One draft per node: K-SEQ is chain speculative sampling, so both rules agree."""
    gen = torch.Generator().manual_seed(2)
    q, p = _dist(4, gen, False), _dist(4, gen, False)
    tree = TokenTree()
    for tok in (0, 1, 2):
        tree.add(tok, len(tree) - 1, Proposal(q))
    values = [expected_accepted(tree, lambda u: p, v) for v in (RULE3, KSEQ)]
    assert abs(values[0] - values[1]) < 1e-15 and values[0] > 0


def test_same_drafts_scores_every_tree_under_both_rules() -> None:
    vocab = 4
    target = TableBackend(random_table(vocab, seed=8), vocab, "target")
    draft = TableBackend(random_table(vocab, seed=9), vocab, "draft")
    params = SamplingParams(temperature=1.0, seed=3)
    run = compare_verifiers(target, draft, 3, 2, params, [[0, 1], [2]], 12, verifier=KSEQ)
    assert run.label == "SameDrafts(3x2, SpecTr)" and run.summary()["steps"] == len(run.scores) > 3
    assert all(0 <= s[v] <= 2 for s in run.scores for v in (RULE3, KSEQ))
    chain = compare_verifiers(target, draft, 1, 3, params, [[0, 1]], 12)
    assert all(abs(s[RULE3] - s[KSEQ]) < 1e-12 for s in chain.scores), "one draft per node: the same rule"
    with pytest.raises(ValueError, match="temperature"):
        compare_verifiers(target, draft, 2, 2, GREEDY, [[0]], 4)
    assert isinstance(run, SameDrafts)


def test_bench_mode_names_the_verifier() -> None:
    assert strategy_for("multidraft:3:4:spectr") == MultiDraft(3, 4, KSEQ)
    assert strategy_for("multidraft:3:4") == MultiDraft(3, 4, RULE3)
    assert strategy_for("multidraft") == MultiDraft()


# -- greedy ----------------------------------------------------------------------------------------------------------

def test_one_hot_target_is_the_greedy_fast_path() -> None:
    """With the target one-hot, K-SEQ returns exactly verify_greedy's verdict on the real drafter's greedy trees
    (distinct top-k first tokens, then greedy continuations), and emits the argmax with probability one on sampled
    trees with duplicates."""
    vocab = 6
    target_table, draft = random_table(vocab, seed=31), TableBackend(random_table(vocab, seed=32), vocab, "draft")
    for seed, prompt in enumerate(([1, 2], [3], [5, 5, 0])):
        drafter = MultiDraft(3, 3, KSEQ).make_drafter(draft, GREEDY, Rng(seed))
        drafter.start(prompt)
        tree = drafter.draft(prompt, max_depth=3, max_nodes=9)

        def argmax(u: int) -> int:
            ctx = prompt + [tree.tokens[j] for j in tree.path_to(u)] if u >= 0 else prompt
            return greedy_token(torch.log(target_table(tuple(ctx))))

        def one_hot(u: int) -> torch.Tensor:
            return logits_to_probs(torch.log(target_table(tuple(
                prompt + ([tree.tokens[j] for j in tree.path_to(u)] if u >= 0 else [])))), GREEDY)

        fast = verify_greedy(tree, argmax)
        slow = verify_spectr(tree, one_hot, Rng(0))
        assert (slow.accepted, slow.extra, slow.bonus) == (fast.accepted, fast.extra, fast.bonus)
    gen = torch.Generator().manual_seed(4)
    p = logits_to_probs(torch.randn(4, generator=gen, dtype=torch.float64), GREEDY)
    law = _first_token_law(p, _iid(_dist(4, gen, True), 3))
    assert float((law - p).abs().max()) < TOL


def test_greedy_identical_to_baseline() -> None:
    target, draft = tiny_draft_pair("qwen2", vocab=48, seed=3, noise=0.05)
    accepted = 0
    for prompt in prompts(10, 48, seed=17):
        base = SpeculativeEngine(target, None, Baseline(), GREEDY).generate(prompt, 16)
        for strategy in (MultiDraft(3, 3, KSEQ), MultiDraft(2, 4, KSEQ)):
            spec = SpeculativeEngine(target, draft, strategy, GREEDY).generate(prompt, 16)
            assert spec.tokens == base.tokens, f"{strategy.label} diverged on prompt {prompt}"
            accepted += spec.stats.accepted
    assert accepted > 100


def test_tree_with_iid_children_runs_under_kseq() -> None:
    """Any tree of independent drafts can be verified with K-SEQ (classes over equal token paths)."""
    vocab = 3
    target = TableBackend(random_table(vocab, seed=5), vocab, "target")
    draft = TableBackend(random_table(vocab, seed=6), vocab, "draft")

    class KSeqTree(Tree):
        def make_drafter(self, draft, params, rng):
            drafter = super().make_drafter(draft, params, rng)
            drafter.verify = verify_spectr
            return drafter

    got, expected = first_two_tokens_exact(target, draft, KSeqTree((-1, -1, 0, 1), "iid"),
                                           SamplingParams(temperature=1.3, top_k=2), [1])
    assert float((got - expected).abs().max()) < TOL


# -- chi-square with tiny random models -----------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9)],
                         ids=["t1.0", "t0.7-p0.9"])
def test_chi_square_matches_target(params: SamplingParams) -> None:
    target_model = tiny_model(VOCAB, seed=7, hidden=32, sharpness=0.5)
    draft_model = perturb(target_model, noise=0.4, seed=8)
    target, draft = HFBackend(target_model, device="cpu", name="t"), HFBackend(draft_model, device="cpu", name="d")
    counts = sampled_joint(target, draft, MultiDraft(3, 2, KSEQ), params)
    p = chi_square_p(counts, exact_joint(target, params))
    print(f"\nchi-square MultiDraft(3x2, SpecTr) T={params.temperature} top_p={params.top_p}: p = {p:.4f} (N={N})")
    assert p > ALPHA
