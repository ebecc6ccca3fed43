"""`speclens bench` on the tiny pair: the JSON's exact field names, the summary's arithmetic, bad input."""
from __future__ import annotations

import json
import math

import pytest

import core.bench as bench
import core.planner as planner

PROMPTS = [{"id": "p1", "prompt": "Say hi."}, {"id": "p2", "prompt": "abc abc abc abc abc"}]


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "set.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(planner, "cache_dir", lambda: tmp_path / "plans")
    monkeypatch.setattr(planner, "CALIBRATION_TOKENS", 8)


def test_bench_writes_json_and_markdown(tmp_path, prompt_file, capsys) -> None:
    out = tmp_path / "out" / "bench.json"
    modes = "baseline,chain:2,tree:4:2,ngram,auto"
    assert bench.main(["--pair", "tiny", "--modes", modes, "--prompts", str(prompt_file), "--max-new-tokens", "6",
                       "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report) >= {"runs", "summary", "meta", "modes"}
    assert len(report["runs"]) == 5 * len(PROMPTS)
    for run in report["runs"]:
        assert {"mode", "prompt_id", "new_tokens", "seconds", "tokens_per_s", "target_calls", "mean_accepted",
                "acceptance_by_depth"} <= set(run)
        assert run["tokens_per_s"] == pytest.approx(run["new_tokens"] / run["seconds"])
        if run["mode"] != "baseline":
            assert run["greedy_vs_baseline"].startswith("identical")   # float64 tiny models: exact
    assert {r["prompt_id"] for r in report["runs"]} == {"p1", "p2"}
    # modes alternate prompt by prompt, and the order rotates
    first = [r["mode"] for r in report["runs"][:5]]
    second = [r["mode"] for r in report["runs"][5:]]
    assert sorted(first) == sorted(second) and first != second
    summary = report["summary"]
    assert set(summary) == set(modes.split(","))
    assert summary["baseline"]["speedup"] == pytest.approx(1.0)
    base = {r["prompt_id"]: r["tokens_per_s"] for r in report["runs"] if r["mode"] == "baseline"}
    chain = {r["prompt_id"]: r["tokens_per_s"] for r in report["runs"] if r["mode"] == "chain:2"}
    expected = math.sqrt(chain["p1"] / base["p1"] * chain["p2"] / base["p2"])
    assert summary["chain:2"]["speedup"] == pytest.approx(expected)
    assert "predicted_speedup" in summary["auto"]
    table = out.with_suffix(".md").read_text()
    assert "geomean speedup" in table and "| set | p1 |" in table
    assert table.strip() in capsys.readouterr().out


def test_bench_names_bad_input(tmp_path, prompt_file, capsys) -> None:
    assert bench.main(["--pair", "tiny", "--modes", "baseline,warp", "--prompts", str(prompt_file)]) == 2
    assert "unknown mode 'warp'" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "prompt": "ok"}\n{"prompt": 3}\n')
    assert bench.main(["--pair", "tiny", "--prompts", str(bad)]) == 2
    assert "bad.jsonl:2" in capsys.readouterr().err
    assert bench.main(["--pair", "tiny", "--prompts", str(tmp_path / "missing.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert bench.main(["--pair", "tiny", "--modes", "chain:x"]) == 2
    assert "integers" in capsys.readouterr().err


def test_bundled_prompt_sets() -> None:
    for name in bench.DEFAULT_PROMPTS:
        rows = bench.read_prompts(bench.PROMPT_DIR / name)
        assert 4 <= len(rows) <= 6
        assert len({r["id"] for r in rows}) == len(rows)


def test_geomean() -> None:
    assert bench.geomean([2.0, 0.5]) == pytest.approx(1.0)
    assert bench.geomean([4.0]) == pytest.approx(4.0)
