"""`speclens plan --export`: the plan as vLLM's, SGLang's and llama-server's own speculative options."""
from __future__ import annotations

import json
import shlex

import pytest

from core.auto import calibrate
from core.auto.cli import main as plan_main
from core.auto.costs import Latencies
from core.auto.export import ExportError, export, widest_branching
from core.auto.plan import Plan, TreePlan

# the root has three children, node 1 two, node 4 one: 7 tokens a call, depth 3, widest branching 3
PARENTS = (0, 0, 0, 1, 1, 4)


def plan_with(speedup: float) -> Plan:
    tree = TreePlan(budget=7, depth=3, parents=PARENTS, expected_tokens=2.5, step_seconds=0.02, speedup=speedup)
    return Plan({}, Latencies({1: 0.01, 2: 0.011}, {1: 0.002}, 0.0), (0.7, 0.1), tree)


def option(command: str, name: str) -> str:
    words = shlex.split(command)
    return words[words.index(name) + 1]


def test_vllm_gets_a_chain_as_deep_as_the_tree_and_is_told_what_is_left_out():
    out = export(plan_with(1.8), "vllm", "org/target", "org/draft")
    config = json.loads(option(out.command, "--speculative-config"))
    assert config == {"method": "draft_model", "model": "org/draft", "num_speculative_tokens": 3}
    assert shlex.split(out.command)[:3] == ["vllm", "serve", "org/target"]
    assert any("3 side branches are not" in note for note in out.notes)


def test_sglang_gets_the_trees_depth_branching_and_budget():
    out = export(plan_with(1.8), "sglang", "org/target", "org/draft")
    assert option(out.command, "--speculative-algorithm") == "STANDALONE"
    assert option(out.command, "--speculative-draft-model-path") == "org/draft"
    assert (option(out.command, "--speculative-num-steps"), option(out.command, "--speculative-eagle-topk"),
            option(out.command, "--speculative-num-draft-tokens")) == ("3", "3", "7")


def test_llama_server_gets_its_own_draft_options():
    out = export(plan_with(1.8), "llama-server", "/m/t.gguf", "/m/d.gguf")
    assert option(out.command, "-md") == "/m/d.gguf" and option(out.command, "--spec-draft-n-max") == "3"


def test_widest_branching_counts_children():
    assert widest_branching(PARENTS) == 3 and widest_branching((0, 1, 2)) == 1 and widest_branching(()) == 1


def test_a_plan_that_does_not_pay_or_has_no_tree_says_so():
    assert any("does NOT pay" in note for note in export(plan_with(0.9), "sglang", "t", "d").notes)
    assert not any("does NOT pay" in note for note in export(plan_with(1.8), "sglang", "t", "d").notes)
    with pytest.raises(ExportError, match="no draft-model tree"):
        export(Plan({}, Latencies({1: 0.01}, {}, 0.0)), "vllm", "t", "d")
    with pytest.raises(ExportError, match="unknown engine"):
        export(plan_with(1.8), "tgi", "t", "d")


def test_the_plan_command_exports_with_the_names_it_is_given(capsys, monkeypatch):
    monkeypatch.setattr(calibrate, "CALIBRATION_TOKENS", 8)
    assert plan_main(["--pair", "tiny", "--export", "sglang"]) == 2      # random models have no hub id
    assert "--served-target and --served-draft" in capsys.readouterr().err
    assert plan_main(["--pair", "tiny", "--export", "sglang", "--served-target", "a/t", "--served-draft", "a/d"]) == 0
    out = capsys.readouterr().out
    assert option(out.splitlines()[0], "--model-path") == "a/t" and "Sequoia tree of" in out
