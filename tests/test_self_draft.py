"""Self-speculation (core.self_draft): the target's first L layers draft for it, over its own weights and KV cache.

Checked against a separate model made of the same first L layers (a truncated deep copy, the oracle): the early-exit
logits, the committed keys and values it reads from the target's cache, and the q every drafted node carries. Then
the lossless promise through the real engine: the exact joint of the first two tokens (every random path enumerated,
error < 1e-9), chi-square at T = 1.0, greedy identity with Baseline on float64 Qwen2 and Llama models. Last, the
choice of L (core.auto.self_calibrate) and the bench mode.
"""
from __future__ import annotations

import copy
import json
import random
import re

import pytest
import torch

import core.drafting
from core.auto.calibrate import VERIFY_SIZES
from core.auto.costs import Latencies
from core.auto.plan import MAX_BUDGET, MAX_DEPTH, best_plan
from core.auto.self_calibrate import choose_layers, default_candidates
from core.backends.base import BackendError
from core.backends.hf import HFBackend
from core.bench.modes import BenchError, needs_draft_model, strategy_for
from core.drafting import Baseline
from core.engine import SpeculativeEngine
from core.events import Origin, StopReason
from core.sampling import Rng, SamplingParams, logits_to_probs
from core.self_draft import SOURCE, EarlyExit, SelfDraft
from core.sequoia import solve
from core.tree import Proposal, TokenTree
from tests.chi_square import ALPHA, VOCAB, chi_square_p, exact_joint, sampled_joint
from tests.exact import first_two_tokens_exact
from tests.tiny_models import tiny_model

EXACT = 1e-12   # float64: the same sums, in the same shapes
GREEDY = SamplingParams(temperature=0.0)


def first_layers(model, layers: int):
    """A separate model of ``model``'s first ``layers`` layers, final norm and head (copied weights)."""
    out = copy.deepcopy(model)
    out.get_decoder().layers = out.get_decoder().layers[:layers]
    out.config.num_hidden_layers = layers
    return out


def full_logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits[0, -1]


def err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    rnd = random.Random(seed)
    return [[rnd.randrange(vocab) for _ in range(rnd.randint(1, 12))] for _ in range(n)]


def random_tree(rnd: random.Random, n: int, vocab: int) -> TokenTree:
    tree = TokenTree()
    for i in range(n):
        tree.add(rnd.randrange(vocab), rnd.randrange(-1, i))
    return tree


# -- the early-exit view -------------------------------------------------------------------------------------------
def test_the_draft_is_the_targets_own_modules_and_cache() -> None:
    model = tiny_model(40, 1, layers=4)
    target = HFBackend(model, device="cpu")
    view = EarlyExit(target, 2)
    params = {p.data_ptr() for p in model.parameters()}
    used = {p.data_ptr() for p in view.model.parameters()}
    assert used <= params, "the early-exit model holds weights the target does not"
    layer_params = {p.data_ptr() for layer in model.get_decoder().layers[2:] for p in layer.parameters()}
    assert not used & layer_params, "the early-exit model holds the target's later layers"
    assert len(used) == len(params) - len(layer_params)
    assert view.model.get_decoder().layers[1] is model.get_decoder().layers[1]
    assert len(model.get_decoder().layers) == 4, "the target model itself must keep all its layers"
    assert view._cache.kv.data_ptr() == target.kv_cache.kv.data_ptr()
    assert view._cache.kv.shape[0] == 2 and target.kv_cache.kv.shape[0] == 4
    assert view.fingerprint() == target.fingerprint() and view.vocab_size == target.vocab_size


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("static_shapes", [False, True], ids=["exact", "fixed"])
def test_shared_cache_equals_a_separate_early_layers_model(arch: str, static_shapes: bool) -> None:
    """Drafting over the target's cache gives what a separate L-layer model with its own cache gives: the committed
    keys and values of the first L layers, the prefill logits and every tree's logits, to 1e-12; and the target's
    own logits are untouched by the draft's writes into its scratch slots."""
    vocab, layers = 40, 2
    model = tiny_model(vocab, 5, layers=4, arch=arch, context=512)
    target = HFBackend(model, device="cpu", static_shapes=static_shapes)
    plain = HFBackend(copy.deepcopy(model), device="cpu")                 # the target, with no draft beside it
    oracle = HFBackend(first_layers(model, layers), device="cpu")
    view = EarlyExit(target, layers)
    assert (view._steps is not None) == static_shapes
    rnd = random.Random(2)
    history = [rnd.randrange(vocab) for _ in range(rnd.randint(2, 20))]
    target.prefill(history)
    plain.prefill(history)
    assert err(view.prefill(history), oracle.prefill(history)) < EXACT
    for step in range(8):
        n = len(history)
        assert err(target.kv_cache.kv[:layers, :, :, :n], oracle.kv_cache.kv[:, :, :, :n]) < EXACT, f"step {step}"
        tree = random_tree(rnd, rnd.randint(1, 12), vocab)
        cut = rnd.randint(1, len(tree))   # drafted level by level: two calls
        head = tree.truncated(max_nodes=cut)
        assert err(view.forward_tree(head), oracle.forward_tree(head)) < EXACT
        if cut < len(tree):
            assert err(view.forward_tree(tree, start=cut), oracle.forward_tree(tree, start=cut)) < EXACT
        assert err(target.forward_tree(tree), plain.forward_tree(tree)) < EXACT
        path = tree.path_to(rnd.randrange(len(tree)))
        target.commit(path)
        plain.commit(path)
        view.commit(path)
        oracle.commit(path)
        history += [tree.tokens[i] for i in path]
        assert view.committed == target.committed == history


def test_the_draft_refuses_what_the_target_does_not_hold() -> None:
    target = HFBackend(tiny_model(40, 2, layers=3), device="cpu")
    view = EarlyExit(target, 1)
    target.prefill([1, 2, 3])
    with pytest.raises(BackendError, match="prefill the target first"):
        view.prefill([1, 2])
    view.forward_tree(TokenTree.chain([4, 5]))
    with pytest.raises(BackendError, match="did not commit"):
        view.commit([0, 1])   # the target has not committed these tokens
    view.commit([])
    target.forward_tree(TokenTree.chain([6]))
    with pytest.raises(BackendError, match="has not committed"):
        view.forward_tree(TokenTree.chain([7]))   # would overwrite the target's own tree
    target.commit([0])
    view.forward_tree(TokenTree.chain([7]))
    target.forward_tree(TokenTree.chain([7]))
    target.commit([0])
    with pytest.raises(BackendError, match="committed tokens since"):
        view.forward_tree(TokenTree.chain([7, 8]), start=1)
    assert target.committed == [1, 2, 3, 6, 7]
    with pytest.raises(ValueError, match=r"1\.\.2"):
        EarlyExit(target, 3)
    with pytest.raises(ValueError, match="layers must be a positive integer"):
        SelfDraft(0)
    with pytest.raises(ValueError, match="bind it to the target first"):
        SelfDraft(1).make_drafter(None, GREEDY, Rng(0))


def test_a_llama_cpp_target_is_refused_clearly(tmp_path) -> None:
    from core.backends.llamacpp import LlamaCppBackend
    from tests.tiny_gguf import write_tiny_gguf

    target = LlamaCppBackend(write_tiny_gguf(tmp_path / "target.gguf", seed=0), n_ctx=64, n_threads=1)
    engine = SpeculativeEngine(target, None, SelfDraft(1), GREEDY)
    with pytest.raises(ValueError, match="needs the transformers backend.*LlamaCppBackend.*llama.cpp gives no "
                                         "access to intermediate layers"):
        engine.generate([1, 2, 3], 4)
    assert len(SpeculativeEngine(target, None, Baseline(), GREEDY).generate([1, 2, 3], 2).tokens) == 2


# -- the drafting contract -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("parents,mode", [((-1, 0, 1), "without_replacement"),
                                          ((-1, -1, 0, 1, 2), "without_replacement"), ((-1, -1, 0), "iid")])
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.6, 0.8)])
def test_each_node_carries_the_early_exit_distribution_it_was_drawn_from(parents, mode, temperature, top_p) -> None:
    vocab, layers = 24, 2
    model = tiny_model(vocab, 4, layers=4)
    target = HFBackend(model, device="cpu")
    oracle = first_layers(model, layers)
    strategy = SelfDraft(layers, parents, mode)
    params = SamplingParams(temperature=temperature, top_p=top_p)
    strategy.bind(target, None, params)
    for seed in range(4):
        prompt = [3, 1, 4, 1, 5][: 2 + seed]
        target.prefill(prompt[:-1])
        drafter = strategy.make_drafter(None, params, Rng(seed))
        drafter.start(prompt)
        tree = drafter.draft(prompt, max_depth=8, max_nodes=32)
        # without replacement, a node has no more children than its support holds (top-p can leave one)
        assert 0 < len(tree) <= len(parents) and set(tree.source) == {SOURCE}
        assert len(tree) == len(parents) or top_p < 1.0
        for j, tok in enumerate(tree.tokens):
            context = prompt + [tree.tokens[i] for i in tree.path_to(j)[:-1]]
            expected = logits_to_probs(full_logits(oracle, context), params)
            proposal = tree.proposals[j]
            assert err(proposal.dist, expected) < EXACT
            assert expected[tok] > 0, "a token outside the early exit's support was drafted"
            if mode == "without_replacement":
                assert proposal.exclude == tuple(tree.tokens[c] for c in tree.children(tree.parents[j]) if c < j)


# -- lossless through the real engine ------------------------------------------------------------------------------
class ProbedHF(HFBackend):
    """The target with its exact next-token logits for any context (a full recompute), for tests.exact."""

    def logits_for(self, ctx) -> torch.Tensor:
        return full_logits(self.model, ctx)


@pytest.fixture(scope="module")
def small_target() -> ProbedHF:
    # 4 tokens and small supports keep every random path of two steps enumerable in a few seconds
    return ProbedHF(tiny_model(4, 7, layers=2, hidden=16, sharpness=0.5), device="cpu", name="tiny-4")


EXACT_CASES = [
    pytest.param(SelfDraft(1, (-1,)), SamplingParams(temperature=1.0), marks=pytest.mark.slow),   # full support
    (SelfDraft(1, (-1,)), SamplingParams(temperature=1.0, top_k=3)),
    (SelfDraft(1, (-1, 0)), SamplingParams(temperature=1.0, top_k=2)),
    (SelfDraft(1, (-1, -1)), SamplingParams(temperature=1.0, top_k=3)),
    (SelfDraft(1, (-1, -1), "iid"), SamplingParams(temperature=0.8, top_k=2)),
    (SelfDraft(1, (-1, -1), "top_k"), SamplingParams(temperature=0.7, top_p=0.9)),
]


@pytest.mark.parametrize("strategy,params", EXACT_CASES, ids=lambda x: getattr(x, "label", None) or repr(x))
def test_exact_joint_of_the_first_two_tokens(small_target, strategy, params) -> None:
    got, expected = first_two_tokens_exact(small_target, None, strategy, params, [2])
    assert abs(float(got.sum()) - 1.0) < 1e-12
    error = float((got - expected).abs().max())
    print(f"\n{strategy.label} {params}: exact-enumeration error {error:.1e}")
    assert error < 1e-9


def test_exact_enumeration_catches_a_wrong_q(small_target, monkeypatch) -> None:
    """The same enumeration with each node declaring a q other than the one it was drawn from is far off."""
    real = core.drafting.sample_children

    def declares_wrong_q(probs, logits, count, mode, params, rng):
        children = real(probs, logits, count, mode, params, rng)
        flat = None if probs is None else torch.where(probs > 0, 1.0, 0.0).double()
        return [(tok, Proposal(flat / flat.sum(), p.exclude)) for tok, p in children]

    monkeypatch.setattr(core.drafting, "sample_children", declares_wrong_q)
    got, expected = first_two_tokens_exact(small_target, None, SelfDraft(1, (-1,)),
                                           SamplingParams(temperature=1.0, top_k=3), [2])
    assert float((got - expected).abs().max()) > 1e-3


@pytest.fixture(scope="module")
def chi_target() -> HFBackend:
    return HFBackend(tiny_model(VOCAB, 7, layers=3, hidden=32, sharpness=0.5), device="cpu", name="t")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [SelfDraft(1, (-1, 0, 1)), SelfDraft(2, (-1, -1, 0, 1), "iid")],
                         ids=lambda s: s.label)
def test_chi_square_of_the_first_two_tokens(chi_target, strategy) -> None:
    params = SamplingParams(temperature=1.0)
    p = chi_square_p(sampled_joint(chi_target, None, strategy, params), exact_joint(chi_target, params))
    print(f"\nchi-square {strategy.label} T=1.0: p = {p:.4f}")
    assert p > ALPHA


SHAPES = [((-1,), "without_replacement"), ((-1, 0, 1, 2), "without_replacement"),
          ((-1, -1, 0, 0, 1, 2, 2, 4), "without_replacement"), ((-1, -1, -1, 0, 1, 2, 3, 3), "top_k"),
          ((-1, 0, 1, 2, 3, 4), "iid")]


@pytest.mark.parametrize("arch,static_shapes", [("qwen2", False), ("llama", False), ("qwen2", True)])
def test_greedy_identical_to_baseline(arch: str, static_shapes: bool) -> None:
    vocab = 48
    target = HFBackend(tiny_model(vocab, 3, layers=4, arch=arch, context=512), device="cpu",
                       static_shapes=static_shapes)
    strategies = [SelfDraft(layers, *SHAPES[(2 * layers + i) % len(SHAPES)]) for layers in (1, 2, 3) for i in range(2)]
    accepted = 0
    for prompt in prompts(8, vocab, seed=11):
        base = SpeculativeEngine(target, None, Baseline(), GREEDY).generate(prompt, 16)
        for strategy in strategies:
            spec = SpeculativeEngine(target, None, strategy, GREEDY).generate(prompt, 16)
            assert spec.tokens == base.tokens, f"{strategy.label} diverged on prompt {prompt}"
            accepted += spec.stats.accepted
    assert accepted > 100, "early exits were hardly ever accepted: the test would not exercise acceptance"


def test_eos_inside_the_tree_and_short_budgets() -> None:
    vocab = 48
    target = HFBackend(tiny_model(vocab, 5, layers=3), device="cpu")
    strategies = [SelfDraft(2, (-1, 0, 1, 2, 3)), SelfDraft(2, (-1, -1, 0, 1, 2), "top_k")]
    eos_in_tree = 0
    for prompt in prompts(12, vocab, seed=12):
        free = SpeculativeEngine(target, None, Baseline(), GREEDY).generate(prompt, 10).tokens
        eos = free[4]
        if eos in free[:4]:
            continue
        target.eos_ids = frozenset({eos})
        try:
            for strategy in strategies:
                spec = SpeculativeEngine(target, None, strategy, GREEDY).generate(prompt, 10)
                assert spec.tokens == free[:5] and spec.stop_reason == StopReason.EOS, strategy.label
                eos_in_tree += spec.steps[-1].origins[-1] == Origin.DRAFT
        finally:
            target.eos_ids = frozenset()
        for budget in (1, 2):
            spec = SpeculativeEngine(target, None, strategies[0], GREEDY).generate(prompt, budget)
            assert spec.tokens == free[:budget] and spec.stop_reason == StopReason.MAX_TOKENS
    assert eos_in_tree > 0, "EOS was never accepted inside a drafted tree"


# -- choosing L ----------------------------------------------------------------------------------------------------
def injected(draft_cost: dict[int, float]) -> dict[int, Latencies]:
    """Latencies per L: a target whose forward of n tokens costs 1 + n/50, a draft costing ``draft_cost[L]`` per
    call whatever its width."""
    verify = {n: 1.0 + n / 50 for n in (1, 2, 4, 8, 16)}
    return {layers: Latencies(verify, {w: cost for w in (1, 2, 4, 8)}) for layers, cost in draft_cost.items()}


@pytest.fixture(scope="module")
def deep_target() -> HFBackend:
    return HFBackend(tiny_model(48, 9, layers=4, init_std=0.1), device="cpu", name="tiny-deep")


CALIBRATION = prompts(3, 48, seed=21)


def test_choose_layers_follows_measured_acceptance_and_cost(deep_target) -> None:
    cheap_deep = injected({1: 2.0, 2: 2.0, 3: 1e-4})
    layers, choice = choose_layers(deep_target, CALIBRATION, GREEDY, (1, 2, 3), width=2, tokens_per_prompt=12,
                                   latencies=cheap_deep)
    for m in choice.measures:
        # the acceptance counted through SelfDraft in the engine, independently of the chooser
        counts, steps = [0, 0], 0
        for prompt in CALIBRATION:
            for event in SpeculativeEngine(deep_target, None, SelfDraft(m.layers, (-1, -1)), GREEDY).stream(prompt, 12):
                steps += bool(event.nodes)
                if event.nodes and event.accepted_path:
                    counts[event.accepted_path[0]] += 1
        assert m.steps == steps and m.acceptance == tuple(c / steps for c in counts)
        if sum(m.acceptance) > 0:
            assert m.tree == best_plan(solve(m.acceptance, MAX_BUDGET, MAX_DEPTH), m.latencies)
    assert sum(choice.measures[2].acceptance) > 0
    assert layers == 3 == choice.layers and choice.pays   # free and accepted: nothing beats it
    assert choice.measures[0].speedup < 1.0   # costs two plain steps per draft call: slower than plain decoding
    cheap_shallow = injected({1: 1e-4, 2: 2.0, 3: 2.0})
    layers, choice = choose_layers(deep_target, CALIBRATION, GREEDY, (1, 2, 3), width=2, tokens_per_prompt=12,
                                   latencies=cheap_shallow)
    assert sum(choice.measures[0].acceptance) > 0 and layers == 1
    assert choice.strategy() == SelfDraft(1, choice.best.tree.parents)
    text = choice.describe()
    assert all(f"L={m}" in text for m in (1, 2, 3)) and "Chosen: L=1" in text
    with pytest.raises(ValueError, match=r"no latencies given for L = \[3\]"):
        choose_layers(deep_target, CALIBRATION, GREEDY, (1, 3), latencies=injected({1: 1.0}))


def test_choose_layers_times_the_early_exits(deep_target) -> None:
    layers, choice = choose_layers(deep_target, CALIBRATION[:1], GREEDY, (1, 2), width=2, tokens_per_prompt=6)
    assert layers in (1, 2)
    for m in choice.measures:
        assert sorted(m.latencies.draft) == [1, 2, 4, 8] and tuple(sorted(m.latencies.verify)) == VERIFY_SIZES
        assert m.draft_ratio > 0
    assert choice.measures[0].latencies.verify == choice.measures[1].latencies.verify   # the target timed once
    assert not deep_target.holds_tree
    assert default_candidates(28) == (7, 10, 14, 18, 21) and default_candidates(2) == (1,)


def test_self_calibrate_command_measures_a_smaller_sample(capsys) -> None:
    from core.auto.self_calibrate import main

    steps = []
    for tokens in (2, 12):
        assert main(["--pair", "tiny", "--layers", "1", "--tokens", str(tokens), "--prompts", "1"]) == 0
        out = capsys.readouterr().out
        assert "Chosen: L=1" in out
        steps.append(int(re.search(r"L=1: a = \(.*\) over (\d+) steps", out).group(1)))
    # a step emits 1 to 5 tokens (one-level trees of 4): one prompt of 2 tokens takes at most 2 steps, of 12 at least 3
    assert steps[0] <= 2 < 3 <= steps[1]
    assert main(["--pair", "tiny", "--tokens", "0"]) == 2
    assert "--tokens must be at least 1" in capsys.readouterr().err


# -- the bench mode ------------------------------------------------------------------------------------------------
def test_bench_mode_parses() -> None:
    assert strategy_for("self:3") == SelfDraft(3, (-1, 0, 1, 2))
    assert strategy_for("self:3:2") == SelfDraft(3, (-1, 0))
    assert not needs_draft_model("self:3")
    for bad in ("self", "self:0", "self:2:0", "self:1:2:3", "self:x"):
        with pytest.raises(BenchError):
            strategy_for(bad)


def test_bench_runs_self_speculation_on_the_tiny_pair(tmp_path) -> None:
    import core.bench as bench

    prompts_file = tmp_path / "set.jsonl"
    prompts_file.write_text(json.dumps({"id": "p1", "prompt": "Say hi."}) + "\n")
    out = tmp_path / "bench.json"
    assert bench.main(["--pair", "tiny", "--modes", "self:1:2", "--no-draft", "--prompts", str(prompts_file),
                       "--max-new-tokens", "8", "--json", str(out)]) == 0
    runs = {r["mode"]: r for r in json.loads(out.read_text())["runs"]}
    assert set(runs) == {"baseline", "self:1:2"}
    assert runs["self:1:2"]["greedy_vs_baseline"].startswith("identical")
    assert runs["self:1:2"]["drafted"] > 0 and runs["self:1:2"]["mean_accepted"] is not None
