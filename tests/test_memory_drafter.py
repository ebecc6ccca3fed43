"""Drafting from memory through the real engine: exact output distributions, greedy identity with Baseline, a
chi-square test of sampled output, and what the drafter learns from verdicts (statistics, recency, notes).

Memory trees are deterministic given the context and the memory, so every node declares q one-hot; these tests are
what shows that this keeps decoding lossless for chains, trees whose root has 2-3 children, and branching below.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from core.drafting import Baseline
from core.engine import SpeculativeEngine
from core.events import Origin, StopReason
from core.memory import Memory, MemoryDrafter, MemorySnapshot, SuffixMemory
from core.memory.index import MAX_MATCH
from core.memory.stats import bucket, key
from core.merge import Merge
from core.sampling import SamplingParams
from core.tree import TokenTree
from core.verify import Verdict
from tests.exact import first_two_tokens_exact
from tests.table_backend import TableBackend, random_table
from tests.tiny_models import tiny_backend

GREEDY = SamplingParams(temperature=0.0)


@dataclass(frozen=True)
class FromSnapshot:
    """Memory drafting that starts every generation from the same memory: each run of an enumeration or of a
    chi-square test must draft from the same state, not from what earlier runs taught it."""

    strategy: Memory
    snapshot: MemorySnapshot

    @property
    def label(self) -> str:
        return self.strategy.label

    def bind(self, target, draft, sampling) -> None:
        self.strategy.bind(target, draft, sampling)

    def make_drafter(self, draft, params, rng):
        self.strategy.memory.restore(self.snapshot)
        return self.strategy.make_drafter(draft, params, rng)


def memory_with(*docs) -> SuffixMemory:
    memory = SuffixMemory("test")
    for doc in docs:
        memory.add_document(doc)
    return memory


def frozen(strategy: Memory) -> Memory | FromSnapshot:
    return FromSnapshot(strategy, strategy.memory.snapshot()) if strategy.memory is not None else strategy


# -- exact enumeration on table models ---------------------------------------------------------------------------

# (name, strategy, prompt, root children expected, nodes expected) on a vocabulary of 3
EXACT = [
    ("live-chain", Memory(2, 2, min_match=1), [0, 1, 2, 0, 1], 1, 2),
    ("root-3-children", Memory(6, 2, min_match=1).attached(memory_with([0, 1, 0, 2], [0, 1, 1, 0], [0, 1, 2, 2])),
     [2, 2, 0, 1], 3, 6),
    ("root-2-children-branching", Memory(4, 2, min_match=1).attached(memory_with([0, 1, 2, 0], [0, 1, 2, 1],
                                                                                 [0, 1, 0, 0])),
     [2, 2, 0, 1], 2, 4),
    ("live-and-remembered", Memory(4, 3, min_match=1).attached(memory_with([0, 1, 1, 0, 2])),
     [0, 1, 2, 0, 1], 2, 4),
]


@pytest.mark.parametrize("name,strategy,prompt,roots,nodes", EXACT, ids=[e[0] for e in EXACT])
@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9),
                                    SamplingParams(temperature=1.3, top_k=2)], ids=["t1", "t0.7-p0.9", "t1.3-k2"])
def test_sampled_joint_distribution_is_exact(name, strategy, prompt, roots, nodes, params) -> None:
    drafter = strategy.make_drafter(None, params, None)
    drafter.start(prompt)
    tree = drafter.draft(prompt, max_depth=8, max_nodes=8)
    assert (len(tree.children(-1)), len(tree)) == (roots, nodes), "the memory tree does not have the shape tested"
    vocab = 3
    target = TableBackend(random_table(vocab, seed=21), vocab, "target")
    got, expected = first_two_tokens_exact(target, None, frozen(strategy), params, prompt)
    assert float((got - expected).abs().max()) < 1e-9, name


# -- greedy identity on tiny float64 models ----------------------------------------------------------------------

def prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    """Random prompts, half of them repetitive so that the live text predicts itself."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        if i % 2:
            out.append([rnd.randrange(vocab) for _ in range(rnd.randint(1, 12))])
        else:
            motif = [rnd.randrange(vocab) for _ in range(rnd.randint(1, 4))]
            out.append((motif * 8)[: rnd.randint(4, 20)])
    return out


def test_greedy_identical_to_baseline_with_remembered_documents() -> None:
    target = tiny_backend("qwen2", vocab=48, seed=3)
    cases = prompts(12, 48, seed=4)
    answers = {tuple(p): SpeculativeEngine(target, None, Baseline(), GREEDY).generate(p, 20).tokens for p in cases}
    # remembered: every other prompt's answer as-is, and perturbed copies (wrong continuations to reject)
    rnd = random.Random(5)
    memory = SuffixMemory("tiny")
    for i, (p, answer) in enumerate(answers.items()):
        if i % 2:
            memory.add_answer(p, answer)
        noisy = [t if rnd.random() > 0.2 else rnd.randrange(48) for t in answer]
        memory.add_document(list(p[-4:]) + noisy)
    strategies = [Memory(), Memory(16, 6, min_match=1), Memory(8, 8).attached(memory),
                  Memory(24, 6, min_match=1).attached(memory)]
    accepted = rejected = 0
    for p, answer in answers.items():
        for strategy in strategies:
            spec = SpeculativeEngine(target, None, strategy, GREEDY).generate(list(p), 20)
            assert spec.tokens == answer, f"{strategy.label} diverged on prompt {p}"
            accepted += spec.stats.accepted
            rejected += spec.stats.drafted - spec.stats.accepted
    assert accepted > 250 and rejected > 100, (accepted, rejected)


def test_greedy_identity_with_eos_inside_memory_trees() -> None:
    target = tiny_backend("qwen2", vocab=48, seed=5)
    eos_in_tree = 0
    for prompt in prompts(12, 48, seed=6):
        free = SpeculativeEngine(target, None, Baseline(), GREEDY).generate(prompt, 12).tokens
        eos = free[5]
        if eos in free[:5]:
            continue
        memory = SuffixMemory("tiny")
        memory.add_answer(prompt, free)       # remembered with the token that will be EOS, and beyond it
        target.eos_ids = frozenset({eos})
        try:
            base = SpeculativeEngine(target, None, Baseline(), GREEDY).generate(prompt, 12)
            spec = SpeculativeEngine(target, None, Memory(8, 8).attached(memory), GREEDY).generate(prompt, 12)
        finally:
            target.eos_ids = frozenset()
        assert spec.tokens == base.tokens and spec.stop_reason == StopReason.EOS == base.stop_reason
        last = spec.steps[-1]
        eos_in_tree += last.origins[-1] == Origin.DRAFT and last.tokens[-1] == eos
    assert eos_in_tree >= 3


def test_no_memory_tree_goes_on_past_a_stop_token() -> None:
    # a text copied from the prompt runs through its end of turn into the next turn: nothing after the stop can be
    # emitted, so the tree ends at it
    turn = [7, 8, 9, 3, 10, 11, 12, 13]
    prompt = turn * 2 + [7, 8]
    drafter = MemoryDrafter(budget=8, max_depth=8, min_match=1)
    drafter.start(prompt)
    assert drafter.draft(prompt, 8, 8).tokens[:4] == [9, 3, 10, 11]      # without stops the copy goes on
    drafter.start(prompt, stops={3})
    assert drafter.draft(prompt, 8, 8).tokens == [9, 3]
    # and the engine tells drafters the target's stop tokens
    target = tiny_backend("qwen2", vocab=48, seed=5)
    target.eos_ids = frozenset({3})
    try:
        first = next(SpeculativeEngine(target, None, Memory(8, 8, min_match=1), GREEDY).stream(prompt, 12))
    finally:
        target.eos_ids = frozenset()
    assert [node.token for node in first.nodes] == [9, 3]


def test_regenerate_drafts_the_earlier_answer() -> None:
    rnd = random.Random(1)
    prompt = [rnd.randrange(1000) for _ in range(200)]
    answer = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    memory = SuffixMemory("fp")
    memory.add_answer(prompt, answer)
    drafter = MemoryDrafter(memory, budget=8, max_depth=8)
    drafter.start(prompt)
    proposal = drafter.propose(prompt, max_nodes=8, max_depth=8)
    assert proposal.match == MAX_MATCH and proposal.tree.is_chain() and proposal.tree.tokens == answer[:8]
    assert proposal.expected_tokens(8) > 3
    assert drafter.draft(prompt, 8, 8).tokens == answer[:8]
    assert "match of 64 tokens" in drafter.note and "remembered" in drafter.note


# -- what the drafter learns -------------------------------------------------------------------------------------

def test_feedback_counts_every_child_of_a_reached_node() -> None:
    memory = memory_with([0, 1, 2, 3], [0, 1, 4, 5], [0, 1, 4, 6])
    drafter = MemoryDrafter(memory, budget=8, max_depth=3, min_match=1)
    drafter.start([9, 0, 1])
    tree = drafter.draft([9, 0, 1], 3, 8)
    four = next(j for j in tree.children(-1) if tree.tokens[j] == 4)
    below = {tree.tokens[j]: j for j in tree.children(four)}
    # the target took 4 then 6: 4 accepted (its sibling 2 counts as rejected, tested or not), below it 5 rejected
    verdict = Verdict(accepted=(four, below[6]), extra=0, bonus=False,
                      accept_probs={four: 1.0, below[5]: 0.0, below[6]: 1.0})
    drafter.feedback(tree, verdict)
    stats = memory.stats
    decayed = pytest.approx  # each observation decays the earlier ones of its bucket a little
    assert sum(stats.tested) == decayed(4, rel=0.01)        # 4 and 2 at match 2, 5 and 6 at match 3
    assert sum(stats.accepted) == decayed(2, rel=0.01)
    # copies of remembered documents, counted apart from matches in the text at hand
    assert stats.tested[bucket(key(2, remembered=True))] == decayed(2, rel=0.01)
    assert stats.tested[bucket(key(3, remembered=True))] == decayed(2, rel=0.01)
    assert memory.state.stamps.tolist() == [1, 4, 4]   # the documents behind the accepted 4 were just used


def test_feedback_on_a_cut_down_tree_maps_nodes_by_path() -> None:
    memory = memory_with([0, 1, 2, 3, 4], [0, 1, 5, 6, 7])
    drafter = MemoryDrafter(memory, min_match=1)
    drafter.start([0, 1])
    proposal = drafter.propose([0, 1], max_nodes=8, max_depth=3)
    first, second = proposal.tree.children(-1)
    cut = TokenTree()                                   # what a planner might keep: the two roots, reordered
    second_cut = cut.add(proposal.tree.tokens[second], -1)
    first_cut = cut.add(proposal.tree.tokens[first], -1)
    drafter.feedback(cut, Verdict(accepted=(first_cut,), extra=3, bonus=True,
                                  accept_probs={second_cut: 0.0, first_cut: 1.0}))
    assert sum(memory.stats.tested) == pytest.approx(2, rel=0.01)
    assert sum(memory.stats.accepted) == pytest.approx(1)


def test_calibration_follows_the_outcomes() -> None:
    target = tiny_backend("qwen2", vocab=48, seed=3)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    answer = SpeculativeEngine(target, None, Baseline(), GREEDY).generate(prompt, 40).tokens
    right, wrong = SuffixMemory("a"), SuffixMemory("b")
    right.add_answer(prompt, answer)
    wrong.add_answer(prompt, [(t + 1) % 48 for t in answer])
    for memory in (right, wrong):
        documents = memory.state
        before = MemoryDrafter(memory).propose(prompt, 4, 4).node_probs[0]
        for _ in range(5):
            SpeculativeEngine(target, None, Memory(4, 4).attached(memory), GREEDY).generate(prompt, 20)
            memory.restore(MemorySnapshot(documents, memory.stats))   # forget the answer, keep what was learned
        after = MemoryDrafter(memory).propose(prompt, 4, 4).node_probs[0]
        assert (after > before) if memory is right else (after < before)
    copied = key(len(prompt), remembered=True)      # the answer's copies come from the remembered document
    assert right.stats.rate(copied) > 0.7 and wrong.stats.rate(copied) < 0.3


def test_a_generation_starts_this_texts_statistics_afresh_and_keeps_the_remembered_ones() -> None:
    """What a match in the text at hand achieves depends on the prompt (an edit copies its source, new code echoes
    its own phrases), so each generation learns it anew; what copies of remembered texts achieve carries over."""
    memory = memory_with([7, 8, 9, 6, 5])
    drafter = MemoryDrafter(memory, min_match=1)
    context = [1, 2, 3, 4, 1, 2, 3, 7, 8, 9]          # "1 2 3" recurs in this text; "7 8 9" is remembered
    drafter.start(context)
    own = drafter.propose(context[:7], 4, 4)
    remembered = drafter.propose(context, 4, 4)
    assert own.node_matches[0] == 3 and remembered.node_matches[0] == key(3, remembered=True)
    for proposal in (own, remembered):
        memory.stats.observe(proposal.node_matches[0], True, proposal.raw_probs[0])
    this_text, earlier = bucket(own.node_matches[0]), bucket(remembered.node_matches[0])
    assert memory.stats.tested[this_text] > 0 and memory.stats.tested[earlier] > 0
    learnt = memory.stats.tested[earlier]
    MemoryDrafter(memory, min_match=1).start([1, 2, 3])     # the next generation
    assert memory.stats.tested[this_text] == 0.0 and memory.stats.tested[earlier] == learnt


def test_answers_are_remembered_and_saved_at_the_end(tmp_path, monkeypatch) -> None:
    from core.memory import store

    monkeypatch.setattr(store, "_open", {})
    target = tiny_backend("qwen2", vocab=48, seed=3)
    prompt = [3, 1, 4, 1, 5]
    memory = store.open_memory("tiny", tmp_path)
    first = SpeculativeEngine(target, None, Memory(16, 16).attached(memory), GREEDY).generate(prompt, 30)
    assert memory.documents == 1 and store.memory_path(tmp_path, "tiny").exists()
    store._open.clear()
    reopened = store.open_memory("tiny", tmp_path)
    again = SpeculativeEngine(target, None, Memory(16, 16).attached(reopened), GREEDY).generate(prompt, 30)
    assert again.tokens == first.tokens and again.stats.target_calls <= 3
    assert reopened.documents == 2 and sum(reopened.stats.accepted) > 20


def test_merge_with_memory_and_notes() -> None:
    target = tiny_backend("qwen2", vocab=48, seed=3)
    prompt = [7, 8, 9, 7, 8, 9, 7, 8]
    base = SpeculativeEngine(target, None, Baseline(), GREEDY).generate(prompt, 20)
    merged = SpeculativeEngine(target, None, Merge((Memory(4, 4, min_match=1),)), GREEDY).generate(prompt, 20)
    assert merged.tokens == base.tokens
    events = list(SpeculativeEngine(target, None, Memory(4, 4), GREEDY).stream(prompt, 10))
    assert events[0].note.startswith("memory: match of") and all(n.source == "memory" for n in events[0].nodes)


def test_strategy_validation() -> None:
    assert Memory().label == "Memory(8)" and Memory(4) == Memory(4).attached(SuffixMemory("x"))
    for bad in (dict(budget=0), dict(max_depth=65), dict(min_match=0), dict(budget=True), dict(memory="folder")):
        with pytest.raises(ValueError):
            Memory(**bad)
    drafter = Memory().make_drafter(None, GREEDY, None)
    drafter.start([1, 2, 3])
    assert len(drafter.draft([1, 2, 3], 8, 8)) == 0 and "no earlier match" in drafter.note


# -- chi-square on a tiny model ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_chi_square_first_two_tokens() -> None:
    from core.backends.hf import HFBackend
    from core.tiny import tiny_model
    from tests.chi_square import ALPHA, N, VOCAB, PROMPT, chi_square_p, exact_joint, sampled_joint

    target = HFBackend(tiny_model(VOCAB, seed=7, hidden=32, sharpness=0.5), device="cpu", name="t")
    params = SamplingParams(temperature=1.0)
    # after "1 5" the memory offers 0, 2 and 6, and below them second tokens: a root with three children
    memory = memory_with([1, 5, 0, 2, 3], [1, 5, 2, 2, 7], [1, 5, 6, 1], [1, 5, 2, 4])
    strategy = frozen(Memory(8, 3).attached(memory))
    drafter = strategy.make_drafter(None, params, None)
    drafter.start(PROMPT)
    assert len(drafter.draft(PROMPT, 3, 8).children(-1)) == 3
    p = chi_square_p(sampled_joint(target, None, strategy, params), exact_joint(target, params))
    print(f"\nchi-square memory tree T=1.0: p = {p:.4f} (N={N})")
    assert p > ALPHA
