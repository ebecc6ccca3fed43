"""`speclens bench` on the tiny pair: the JSON's field names, alternation and repeats, the summary's arithmetic,
memory isolation, the window surface, follow-up prompt sets, bad input found before the run."""
from __future__ import annotations

import gc
import json
import math
import statistics
import threading

import pytest

import core.auto.calibrate as calibrate
import core.bench as bench
from core.bench import cursor, fast_apply
from core.auto.costs import Latencies
from core.auto.plan import Plan
from core.bench.prompts import read_prompts
from core.bench.report import ratios
from core.bench.runners import LlamaServerRunner, earlier_sampling
from core.bench.run import EngineSurface, attach_memories
from core.memory import SuffixMemory
from core.sampling import Rng, SamplingParams
from tests.table_backend import TableBackend, random_table

PROMPTS = [{"id": "p1", "prompt": "Say hi."}, {"id": "p2", "prompt": "abc abc abc abc abc"}]


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "set.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


@pytest.fixture(autouse=True)
def short_calibration(monkeypatch):
    monkeypatch.setattr(calibrate, "CALIBRATION_TOKENS", 8)


def test_bench_writes_json_and_markdown(tmp_path, prompt_file, capsys) -> None:
    out = tmp_path / "out" / "bench.json"
    modes = "baseline,chain:2,tree:4:2,ngram,memory,auto"
    assert bench.main(["--pair", "tiny", "--modes", modes, "--prompts", str(prompt_file), "--max-new-tokens", "6",
                       "--repeat", "2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report) >= {"runs", "summary", "meta", "modes"}
    n_modes = len(modes.split(","))
    assert len(report["runs"]) == n_modes * len(PROMPTS) * 2
    for run in report["runs"]:
        assert {"mode", "prompt_id", "repeat", "surface", "new_tokens", "seconds", "tokens_per_s",
                "decode_tokens_per_s", "time_to_first_token", "target_calls", "mean_accepted",
                "acceptance_by_depth", "python_ms_per_step"} <= set(run)
        assert run["tokens_per_s"] == pytest.approx(run["new_tokens"] / run["seconds"])
        if run["mode"] != "baseline":
            assert run["greedy_vs_baseline"].startswith("identical")   # float64 tiny models: exact
    # modes alternate prompt by prompt, and the order rotates
    first = [r["mode"] for r in report["runs"][:n_modes]]
    second = [r["mode"] for r in report["runs"][n_modes:2 * n_modes]]
    assert sorted(first) == sorted(second) and first != second
    summary = report["summary"]
    assert set(summary) == set(modes.split(","))
    assert summary["baseline"]["speedup"] == pytest.approx(1.0)
    # a prompt's ratio is the median over repeats of the ratio within each repeat; the summary their geomean
    per_prompt = ratios(report["runs"], "chain:2", "baseline")
    assert sorted(per_prompt) == [("set", "p1"), ("set", "p2")] and all(len(v) == 2 for v in per_prompt.values())
    speeds = {(r["mode"], r["prompt_id"], r["repeat"]): r["decode_tokens_per_s"] for r in report["runs"]}
    expected = math.sqrt(math.prod(statistics.median(speeds[("chain:2", p, k)] / speeds[("baseline", p, k)]
                                                     for k in (0, 1)) for p in ("p1", "p2")))
    assert summary["chain:2"]["speedup"] == pytest.approx(expected)
    assert len(summary["chain:2"]["repeat_geomeans"]) == 2 and summary["chain:2"]["spread"] >= 0
    assert "predicted_speedup" in summary["auto"] and "python_ms_per_step" in summary["auto"]
    table = out.with_suffix(".md").read_text()
    assert "geomean / baseline" in table and "| set | p1 |" in table and "spread of one repeat" in table
    assert table.strip() in capsys.readouterr().out


def test_no_run_learns_from_another(tmp_path, capsys) -> None:
    # the same prompt twice: had the first answer been remembered, the second would draft it back from memory
    path = tmp_path / "twice.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": "Tell me about cats."}) + "\n"
                    + json.dumps({"id": "b", "prompt": "Tell me about cats."}) + "\n")
    out = tmp_path / "b.json"
    assert bench.main(["--pair", "tiny", "--modes", "memory", "--prompts", str(path), "--max-new-tokens", "12",
                       "--json", str(out)]) == 0
    runs = {r["prompt_id"]: r for r in json.loads(out.read_text())["runs"] if r["mode"] == "memory"}
    assert runs["a"]["target_calls"] == runs["b"]["target_calls"]
    assert runs["a"]["accepted"] == runs["b"]["accepted"]


def test_regeneration_prompts_draft_their_earlier_answer(tmp_path, capsys) -> None:
    path = tmp_path / "regen.jsonl"
    path.write_text(json.dumps({"id": "r", "prompt": "Tell me about cats.", "regenerate": True}) + "\n")
    out = tmp_path / "r.json"
    assert bench.main(["--pair", "tiny", "--modes", "memory", "--prompts", str(path), "--max-new-tokens", "24",
                       "--json", str(out)]) == 0
    runs = {r["mode"]: r for r in json.loads(out.read_text())["runs"]}
    assert runs["memory"]["accepted"] >= runs["memory"]["new_tokens"] // 2
    assert runs["memory"]["greedy_vs_baseline"].startswith("identical")
    assert "remembered an earlier answer" in capsys.readouterr().err


def test_follow_up_sets_send_the_whole_conversation(tmp_path) -> None:
    path = tmp_path / "follow.jsonl"
    path.write_text(json.dumps({"id": "f", "messages": [
        {"role": "user", "content": "Write hi."}, {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "Now twice."}]}) + "\n")
    rows = read_prompts(path)
    assert [m["role"] for m in rows[0]["messages"]] == ["user", "assistant", "user"]
    assert bench.main(["--pair", "tiny", "--modes", "baseline", "--prompts", str(path), "--max-new-tokens", "4"]) == 0


def test_the_window_surface_is_measured_beside_the_engine(tmp_path, prompt_file, capsys, compute_threads) -> None:
    from app.cli import main as speclens

    out = tmp_path / "w.json"
    assert speclens(["bench", "--pair", "tiny", "--modes", "baseline,chain:2", "--prompts", str(prompt_file),
                     "--max-new-tokens", "6", "--surface", "window", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    surfaces = {(r["mode"], r["prompt_id"]): set() for r in report["runs"]}
    for r in report["runs"]:
        surfaces[(r["mode"], r["prompt_id"])].add(r["surface"])
    assert all(s == {"engine", "window"} for s in surfaces.values())
    for mode in ("baseline", "chain:2"):
        assert report["summary"][mode]["window_over_engine"] > 0
    assert "window / engine" in out.with_suffix(".md").read_text()
    # the bare engine, the window and the warm-up all on the app's engine thread
    assert len(compute_threads) == 1 and threading.get_ident() not in compute_threads
    # and the window is gone: left open, it would keep a later app.exec() in this process from returning
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    assert not [w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow) and w.isVisible()]


def test_bench_names_bad_input_before_running(tmp_path, prompt_file, capsys) -> None:
    assert bench.main(["--pair", "tiny", "--modes", "baseline,warp", "--prompts", str(prompt_file)]) == 2
    assert "unknown mode 'warp'" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "prompt": "ok"}\n{"prompt": 3}\n')
    assert bench.main(["--pair", "tiny", "--prompts", str(bad)]) == 2
    assert "bad.jsonl:2" in capsys.readouterr().err
    assert bench.main(["--pair", "tiny", "--prompts", str(tmp_path / "missing.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert bench.main(["--pair", "tiny", "--prompts", str(tmp_path)]) == 2
    assert f"{tmp_path} is a folder, not a JSONL file" in capsys.readouterr().err
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes('{"id": 1, "prompt": "café"}\n'.encode("latin-1"))
    assert bench.main(["--pair", "tiny", "--prompts", str(latin)]) == 2
    assert f"{latin} is not UTF-8" in capsys.readouterr().err
    assert bench.main(["--pair", "tiny", "--modes", "chain:x"]) == 2
    assert "integers" in capsys.readouterr().err
    assert bench.main(["--pair", "tiny", "--modes", "tree:5000:5000"]) == 2          # would take hours: refused
    assert "budget in 2..64" in capsys.readouterr().err
    blocked = tmp_path / "a-file"
    blocked.write_text("x")
    assert bench.main(["--pair", "tiny", "--prompts", str(prompt_file), "--json", str(blocked / "out.json")]) == 2
    assert "cannot write the report" in capsys.readouterr().err
    huge = tmp_path / "huge.jsonl"
    huge.write_text(json.dumps({"id": "h", "prompt": "word " * 5000}) + "\n")
    assert bench.main(["--pair", "tiny", "--prompts", str(huge), "--max-new-tokens", "4"]) == 2
    assert "does not fit in the context" in capsys.readouterr().err
    assert bench.main(["--pair", "tiny", "--modes", "native"]) == 2   # native needs llama.cpp
    assert "llama.cpp" in capsys.readouterr().err


def test_native_runs_on_the_targets_own_weights(tmp_path) -> None:
    # two copies of one file do not decode at one speed (docs/bench/aa-controls-epyc.md): the reference must read the
    # very weights the engine does, and leave them to the target when it goes
    from tiny_gguf import write_tiny_gguf

    from core.backends.llamacpp import LlamaCppBackend
    from core.bench.runners import NativeRunner
    from core.tree import TokenTree

    target = LlamaCppBackend(write_tiny_gguf(tmp_path / "tiny.gguf"), n_ctx=128, n_threads=1)
    runner = NativeRunner(target)
    assert runner.llm._model.model == target._model
    out = runner.run([1, 2, 3], 4, SamplingParams())
    runner.close()
    del runner
    gc.collect()
    # the weights are still there, and the same: the target's own greedy steps give the tokens native gave
    token, tokens = int(target.prefill([1, 2, 3]).argmax()), []
    for _ in range(4):
        tokens.append(token)
        token = int(target.forward_tree(TokenTree.chain([token]))[0].argmax())
        target.commit([0])
    assert tuple(tokens) == out.tokens


def test_bundled_prompt_sets() -> None:
    for name in bench.DEFAULT_PROMPTS:
        rows = bench.read_prompts(bench.PROMPT_DIR / name)
        assert 4 <= len(rows) <= 10
        assert len({r["id"] for r in rows}) == len(rows)
    follow = bench.read_prompts(bench.PROMPT_DIR / "follow_ups.jsonl")
    assert any(r["regenerate"] for r in follow) and any(len(r["messages"]) >= 3 for r in follow)


def test_geomean() -> None:
    assert bench.geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert bench.geomean([]) == 0.0


def test_sampled_multidraft_runs_score_both_verifiers_on_their_own_drafts(tmp_path, prompt_file, capsys) -> None:
    out = tmp_path / "md.json"
    assert bench.main(["--pair", "tiny", "--modes", "baseline,multidraft:2:2,multidraft:2:2:spectr", "--prompts",
                       str(prompt_file), "--max-new-tokens", "8", "--temperature", "1.0", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    scored = [r for r in report["runs"] if r["mode"].startswith("multidraft")]
    assert scored and all(r["same_drafts"]["steps"] > 0 for r in scored)
    for r in scored:
        # each verifier's expected accepted tokens per step lies in [0, length]
        assert all(0.0 <= r["same_drafts"][v] <= 2.0 for v in ("specinfer", "spectr"))
    summary = report["summary"]["multidraft:2:2:spectr"]["same_drafts"]
    runs = [r["same_drafts"] for r in scored if r["mode"] == "multidraft:2:2:spectr"]
    assert summary["steps"] == sum(r["steps"] for r in runs)
    assert summary["spectr"] == pytest.approx(sum(r["spectr"] * r["steps"] for r in runs) / summary["steps"])
    assert "SpecInfer / SpecTr" in out.with_suffix(".md").read_text()
    assert "same_drafts" not in report["summary"]["baseline"]


def test_auto_noresume_and_nospelling_reach_the_memory_drafter() -> None:
    modes = ("auto", "auto:noresume", "auto:nospelling")
    strategies = attach_memories({m: bench.strategy_for(m) for m in modes}, SuffixMemory("x"))
    target = TableBackend(random_table(9, seed=0), 9, "target")
    for mode, resume, spelt in zip(modes, (True, False, True), (True, True, False)):
        auto = strategies[mode]
        auto.plan = Plan({}, Latencies({1: 0.1, 2: 0.15}))
        auto.bind(target, None, SamplingParams())
        memory = auto.make_drafter(None, SamplingParams(), Rng(0)).memory
        assert memory.resume is resume and (memory.spelling is not None) is spelt
    with pytest.raises(bench.BenchError, match="integers"):
        bench.strategy_for("auto:resume")


def test_every_engine_run_starts_with_an_empty_cache(monkeypatch, prompt_file) -> None:
    # modes share the target backend, which keeps a prompt's KV for the next turn; a run finding its prompt there
    # would skip the prefill the others paid
    found = []
    decode = EngineSurface.decode

    def recording(self, engine, messages, prompt_ids, max_new_tokens):
        found.append(len(engine.target.committed))
        return decode(self, engine, messages, prompt_ids, max_new_tokens)

    monkeypatch.setattr(EngineSurface, "decode", recording)
    assert bench.main(["--pair", "tiny", "--modes", "baseline,ngram,memory", "--prompts", str(prompt_file),
                       "--max-new-tokens", "4"]) == 0
    assert len(found) == 3 * len(PROMPTS) and set(found) == {0}


def test_aa_controls_run_as_twins_of_their_reference(tmp_path, prompt_file) -> None:
    from core.bench.modes import needs_draft_model, parse_modes, runner_of
    from core.drafting import Baseline

    assert runner_of("native:again") == runner_of("native") == "native" and runner_of("baseline:again") is None
    assert runner_of("hf-assisted") == "hf-assisted" and runner_of("auto") is None
    assert isinstance(bench.strategy_for("baseline:again"), Baseline)
    assert not needs_draft_model("baseline:again") and not needs_draft_model("native:again")
    assert parse_modes("native,native:again,auto") == ["baseline", "native", "native:again", "auto"]
    with pytest.raises(bench.BenchError):
        parse_modes("auto:again")
    out = tmp_path / "aa.json"
    assert bench.main(["--pair", "tiny", "--modes", "baseline,baseline:again", "--prompts", str(prompt_file),
                       "--max-new-tokens", "5", "--repeat", "2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    twins = [r for r in report["runs"] if r["mode"] == "baseline:again"]
    assert len(twins) == len(PROMPTS) * 2 and all(r["greedy_vs_baseline"].startswith("identical") for r in twins)
    assert all(r["target_calls"] == r["new_tokens"] for r in twins)   # plain steps, like the baseline it mirrors
    assert set(report["summary"]["baseline:again"]["by_prompt"]) == {"set/p1", "set/p2"}


def test_a_regenerated_prompts_earlier_answer_is_decoded_from_an_empty_cache() -> None:
    # as every timed run is: on another prompt's cached prefix the prefill's floats differ, and a near-tie could part
    # the remembered answer from the one the runs decode
    from core.bench.run import BenchSetup, _memory_for
    from core.drafting import Baseline
    from core.engine import SpeculativeEngine

    target = TableBackend(random_table(9, seed=0), 9, "target")
    SpeculativeEngine(target, None, Baseline(), SamplingParams()).generate([1, 2, 3], 4)
    assert target.committed, "the run before leaves its tokens cached"
    cached_at_prefill = []
    prefill = target.prefill
    target.prefill = lambda ids, **kw: (cached_at_prefill.append(len(target.committed)), prefill(ids, **kw))[1]
    memory = SuffixMemory(target.fingerprint())
    setup = BenchSetup(target, None, {}, {}, memory, SamplingParams(), 4, 1, [EngineSurface()])
    _memory_for(setup, {"regenerate": True, "set": "s", "id": "r"}, [1, 2, 4], memory.snapshot(), lambda line: None)
    assert cached_at_prefill == [0]


def test_a_regenerated_prompt_is_a_new_sample_for_every_contestant() -> None:
    # the earlier answer a runner is shown (and SpecLens remembers) is drawn with another seed than the timed run:
    # with the same one a server that learns from what it served would draft the very sample it then draws
    sampled = SamplingParams(temperature=0.7, seed=5)
    assert earlier_sampling(sampled).seed == 6 and earlier_sampling(sampled).temperature == 0.7
    assert earlier_sampling(SamplingParams(temperature=0.0)) == SamplingParams(temperature=0.0)

    seeds = []

    class Server:
        def restart(self) -> None:
            pass

        def completion(self, prompt_ids, max_new_tokens, sampling):
            seeds.append(sampling.seed)
            return {"tokens": [1], "timings": {"prompt_ms": 1.0, "predicted_ms": 1.0}}

    runner = object.__new__(LlamaServerRunner)   # its server is the fake above, not a process
    runner.server, runner.learns = Server(), True
    runner.run([1, 2], 4, sampled, regenerate=True)
    assert seeds == [6, 5]


def test_limit_keeps_the_first_tasks_of_those_chosen(tmp_path) -> None:
    # `--limit N` on an HTTP surface (server, cursor, agent) runs the first N tasks of the chosen half, not all of them
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"t{i}", "instruction": "edit", "file": f"x = {i}{cursor.CURSOR}\n",
                                          "held_out": i % 2 == 1}) for i in range(6)) + "\n", encoding="utf-8")
    assert [t["id"] for t in fast_apply.read_tasks(path, "only", limit=2)] == ["t1", "t3"]
    assert [t["id"] for t in fast_apply.read_tasks(path, "all", limit=0)] == [f"t{i}" for i in range(6)]
    assert [t["id"] for t in cursor.read_tasks(path, "exclude", limit=1)] == ["t0"]
