"""llama.cpp's own server as a reference: found or explained, started on SpecLens's own files, asked for the very
prompt tokens with SpecLens's sampling, each configuration run by the bench and reported over llama-server plain and
over its best configuration.

Tests marked ``llama_server`` start the real binary (tools/build_llama_server.sh builds it; .ci/run does) on tiny
GGUF files written here."""
from __future__ import annotations

import json

import pytest
import torch

import core.bench as bench
import core.endpoints.llama_server as ls
from core.bench.report import geomean, summarise
from core.endpoints.llama_server import LlamaServer, LlamaServerError, completion_body, find_binary, spec_arguments
from core.sampling import SamplingParams
from tiny_gguf import write_tiny_gguf


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    return (write_tiny_gguf(folder / "target.gguf", seed=0, context=512),
            write_tiny_gguf(folder / "draft.gguf", seed=0, noise=0.02, context=512))


@pytest.fixture(scope="module")
def binary():
    try:
        return find_binary()
    except LlamaServerError as exc:
        pytest.skip(str(exc))


def test_a_missing_binary_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.delenv(ls.BINARY_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(ls, "BUILT_HERE", tmp_path / "nothing")
    with pytest.raises(LlamaServerError, match="build_llama_server.sh"):
        find_binary()
    not_executable = tmp_path / "llama-server"
    not_executable.write_text("#!/bin/sh\n")
    with pytest.raises(LlamaServerError, match="not an executable"):
        find_binary(not_executable)


def test_configurations_are_llama_servers_own_options():
    assert spec_arguments("plain", None) == []
    assert spec_arguments("ngram", None) == ["--spec-default"]
    assert spec_arguments("draft", "d.gguf") == ["--spec-type", "draft-simple", "-md", "d.gguf"]
    assert "ngram-mod,draft-simple" in spec_arguments("both", "d.gguf")
    with pytest.raises(LlamaServerError, match="needs the draft"):
        spec_arguments("draft", None)
    with pytest.raises(LlamaServerError, match="unknown"):
        spec_arguments("eagle", None)


def test_requests_sample_as_speclens_does():
    body = completion_body([5, 6], 32, SamplingParams(temperature=0.7, top_p=0.9, seed=3))
    assert body["prompt"] == [5, 6] and body["n_predict"] == 32 and body["seed"] == 3
    # llama-server's own defaults (top-k 40, top-p 0.95, min-p 0.05) would sample another distribution
    assert (body["temperature"], body["top_k"], body["top_p"], body["min_p"]) == (0.7, 0, 0.9, 0.0)
    assert body["samplers"] == ["min_p", "temperature", "top_k", "top_p"]
    assert body["cache_prompt"] is False and body["ignore_eos"] is False
    assert completion_body([1], 8, SamplingParams(min_tokens=8))["ignore_eos"] is True
    assert completion_body([1], 8, SamplingParams(temperature=0.5, min_p=0.1))["min_p"] == 0.1


@pytest.mark.llama_server
def test_llama_server_asked_as_speclens_samples_from_speclens_distribution(binary, tmp_path):
    """What the bench and the race ask llama-server for is SpecLens's own distribution: its probabilities after
    sampling (``post_sampling_probs``) for the first token are ``logits_to_probs`` of the same file's logits, with
    min-p, temperature, top-k and top-p; llama-server's default chain, asked for nothing, samples another."""
    import httpx

    from core.backends.llamacpp import LlamaCppBackend
    from core.sampling import logits_to_probs

    path = write_tiny_gguf(tmp_path / "flat.gguf", seed=3, context=512, weight_std=0.05)
    prompt = [5, 17, 33, 8]
    logits = LlamaCppBackend(path, n_ctx=512, n_threads=1).prefill(prompt).double()
    settings = [SamplingParams(temperature=0.7, min_p=0.5), SamplingParams(temperature=1.5, top_k=5, top_p=0.8,
                                                                           min_p=0.1),
                SamplingParams(temperature=0.5, top_p=0.9), SamplingParams(temperature=2.0, min_p=0.3)]
    with LlamaServer(path, threads=1, context=512) as server:
        def after_sampling(body: dict) -> dict[int, float]:
            # llama-server reports no probabilities with a token that is part of a character: draw again (any seed
            # reports the same distribution)
            for seed in range(50):
                answer = httpx.post(f"{server.url}/completion", timeout=60, json={
                    **body, "seed": seed, "n_probs": 20, "post_sampling_probs": True}).json()
                if answer.get("completion_probabilities"):
                    top = answer["completion_probabilities"][0]["top_probs"]
                    return {d["id"]: d["prob"] for d in top if d["prob"] > 0}
            raise AssertionError("llama-server never reported the probabilities")

        for params in settings:
            ours = logits_to_probs(logits, params)
            theirs = after_sampling(completion_body(prompt, 1, params))
            assert set(theirs) == {int(i) for i in torch.nonzero(ours)} and 1 < len(theirs) < 20, params
            assert max(abs(p - float(ours[i])) for i, p in theirs.items()) < 1e-5, params
        default = after_sampling({"prompt": prompt, "n_predict": 1, "temperature": 0.7})
        assert max(abs(p - float(logits_to_probs(logits, settings[0])[i])) for i, p in default.items()) > 1e-3


@pytest.mark.llama_server
def test_a_server_on_speclens_files_answers_the_same_prompt_tokens(binary, tiny_files):
    target, draft = tiny_files
    with LlamaServer(target, config="draft", draft=draft, threads=1, context=512) as server:
        out = server.completion([1, 2, 3], 16, SamplingParams(min_tokens=16))
        assert len(out["tokens"]) == 16                       # end-of-text ignored: exactly what was asked
        timings = out["timings"]
        assert timings["predicted_n"] == 16 and timings["prompt_n"] == 3
        assert timings["draft_n"] > 0 and 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
    assert not server.running


@pytest.mark.llama_server
def test_the_options_speclens_passes_or_exports_are_this_llama_servers_own(binary):
    import shlex
    import subprocess

    from core.auto.export import export
    from tests.test_plan_export import plan_with

    env = {"LD_LIBRARY_PATH": str(binary.parent)}
    usage = subprocess.run([str(binary), "--help"], capture_output=True, text=True, env=env, timeout=60).stdout
    exported = shlex.split(export(plan_with(1.8), "llama-server", "t.gguf", "d.gguf").command)
    options = {w for w in exported + spec_arguments("both", "d.gguf") if w.startswith("-")}
    assert options and all(option in usage for option in options), options - {o for o in options if o in usage}


@pytest.mark.llama_server
def test_a_server_that_cannot_start_says_why(binary, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(LlamaServerError, match="exited with code"):
        LlamaServer(broken, threads=1).start()


@pytest.mark.llama_server
def test_the_bench_runs_llama_servers_configurations_beside_speclens(binary, tiny_files, tmp_path, capsys):
    target, draft = tiny_files
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "the theory of the thing"}) + "\n"
                       + json.dumps({"id": "b", "prompt": "the other three", "regenerate": True}) + "\n")
    out = tmp_path / "r.json"
    modes = "baseline,llama-server,llama-server:ngram,llama-server:draft,chain:2"
    assert bench.main(["--target", str(target), "--draft", str(draft), "--modes", modes, "--prompts", str(prompts),
                       "--max-new-tokens", "12", "--repeat", "2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    runs = report["runs"]
    server_runs = [r for r in runs if r["mode"].startswith("llama-server")]
    assert len(server_runs) == 3 * 2 * 2 and all(r["new_tokens"] > 0 for r in server_runs)
    assert all(r["drafted"] > 0 for r in server_runs if r["mode"] == "llama-server:draft")
    summary = report["summary"]
    best = summary["chain:2"]["over_llama_server_best"]
    assert best["config"] in ("llama-server", "llama-server:ngram", "llama-server:draft")
    assert summary["chain:2"]["over_llama_server"]["speedup"] > 0
    table = out.with_suffix(".md").read_text()
    assert "geomean / llama-server**" in table and "llama-server's best configuration" in table
    assert summarise(runs, report["modes"]) == summary


@pytest.mark.llama_server
def test_fast_apply_times_every_server_with_nothing_cached(binary, tiny_files, tmp_path):
    target, draft = tiny_files
    tasks = tmp_path / "tasks.jsonl"
    file = "def load(path):\n    return open(path).read()\n"
    tasks.write_text("".join(json.dumps({"id": name, "instruction": "Rename load to read.", "file": file,
                                         "held_out": held}) + "\n" for name, held in (("t1", False), ("t2", True))))
    out = tmp_path / "apply.json"
    assert bench.main(["--surface", "server", "--target", str(target), "--draft", str(draft), "--prompts", str(tasks),
                       "--modes", "speclens,speclens:prediction,llama-server", "--repeat", "2",
                       "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert len(runs) == 2 * 2 * 3
    # the same prompt is sent in every mode and repeat: a server that kept it would time a shorter prefill
    assert all(r["cached_prompt_tokens"] == 0 for r in runs), [(r["mode"], r["cached_prompt_tokens"]) for r in runs]
    assert all(r["same_as_without_prediction"] for r in runs if r["mode"] == "speclens:prediction")


@pytest.mark.llama_server
def test_an_agents_edit_is_timed_on_every_server_with_the_same_prompt_and_nothing_cached(binary, tmp_path):
    from core.bench import agent
    from tests.test_serve_tools import TOOLS_TEMPLATE

    files = [write_tiny_gguf(tmp_path / f"{name}.gguf", seed=0, noise=noise, context=4096,
                             chat_template=TOOLS_TEMPLATE) for name, noise in (("target", 0.0), ("draft", 0.02))]
    tasks = tmp_path / "tasks.jsonl"
    file = "def load(path):\n    return open(path).read()\n"
    tasks.write_text("".join(json.dumps({"id": name, "language": "python", "instruction": "Rename load to read.",
                                         "file": file, "held_out": held}) + "\n"
                             for name, held in (("t1", False), ("t2", True), ("t3", True))))
    out = tmp_path / "agent.json"
    assert bench.main(["--surface", "agent", "--target", str(files[0]), "--draft", str(files[1]), "-c", "0",
                       "--prompts", str(tasks), "--limit", "2", "--modes", "speclens,llama-server:ngram",
                       "--repeat", "2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    runs, failed = report["runs"], report["failed"]
    # every request is timed, or, llama-server's alone, refused by its tool-call parser (a random model's bytes can
    # be what it cannot read) and said so
    asked = [(r["mode"], r["task"], r["repeat"]) for r in runs + failed]
    assert sorted(asked) == sorted((m, t, k) for m in ("speclens", "llama-server", "llama-server:ngram")
                                   for t in ("t1", "t2") for k in range(2))
    assert all(f["mode"] != "speclens" and ("HTTP" in f["error"] or "broke off" in f["error"]) for f in failed)
    assert all(r["cached_prompt_tokens"] == 0 for r in runs), [(r["mode"], r["cached_prompt_tokens"]) for r in runs]
    assert set(report["summary"]) == {"speclens", "llama-server", "llama-server:ngram"}
    table = out.with_suffix(".md").read_text()
    assert "A coding agent's edit" in table and ("left out of the ratios" in table) == bool(failed)
    # what both servers were asked holds the tools, the read call and the file it read
    from core.backends.llamacpp import LlamaCppBackend
    from core.memory import Memory
    from core.serve.job import ServedModels
    from core.serve.request import parse

    models = ServedModels(LlamaCppBackend(files[0], n_ctx=4096, n_threads=1), None, Memory(8, 8), "t")
    asked = parse({"messages": agent.messages({"id": "t1", "language": "python", "instruction": "Go.", "file": file}),
                   "tools": agent.TOOLS}, chat=True, context_length=4096)
    prompt = models.target.detokenize(models.prompt_ids(asked))
    assert all(word in prompt for word in ("write_file", "src/t1.py", "return open(path).read()"))


def test_an_agents_context_is_refused_where_the_model_was_trained_with_less(tiny_files, capsys):
    target, draft = tiny_files
    assert bench.main(["--surface", "agent", "--target", str(target), "--draft", str(draft)]) == 2
    assert "Choose at most 512" in capsys.readouterr().err


FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")


@pytest.mark.llama_server
@pytest.mark.parametrize("api", ["completions", "infill"])
def test_completion_at_the_cursor_types_along_every_server_from_a_cold_start(binary, tmp_path, api):
    from core.bench import cursor

    target = write_tiny_gguf(tmp_path / "target.gguf", seed=0, context=512, extra_tokens=FIM)
    draft = write_tiny_gguf(tmp_path / "draft.gguf", seed=0, noise=0.02, context=512, extra_tokens=FIM)
    tasks = tmp_path / "cursor.jsonl"
    tasks.write_text("".join(json.dumps({"id": name, "file": f"def {name}(path):\n    <CURSOR>\n\n\nprint(1)\n",
                                         "held_out": held}) + "\n" for name, held in (("t1", False), ("t2", True))))
    out = tmp_path / "cursor.json"
    assert bench.main(["--surface", "cursor", "--target", str(target), "--draft", str(draft), "--prompts", str(tasks),
                       "--modes", "speclens,llama-server:ngram", "--repeat", "2", "--api", api, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["api"] == api
    runs = report["runs"]
    assert len(runs) == 2 * 2 * 3 * cursor.STEPS and {r["step"] for r in runs} == set(range(cursor.STEPS))
    # every task starts cold on every server: nothing cached from the task or the mode before
    assert all(r["cached_prompt_tokens"] == 0 for r in runs if r["step"] == 0)
    for part in ("summary", "first", "typing"):
        assert set(report[part]) == {"speclens", "llama-server", "llama-server:ngram"}
    assert "after typing" in out.with_suffix(".md").read_text()


def test_completion_at_the_cursor_needs_fill_in_the_middle_tokens(tiny_files, tmp_path, capsys):
    target, draft = tiny_files
    assert bench.main(["--surface", "cursor", "--target", str(target), "--draft", str(draft)]) == 2
    assert "no fill-in-the-middle tokens" in capsys.readouterr().err


def test_the_best_llama_server_configuration_is_the_one_fastest_over_plain():
    # two prompts of one set, one repeat: ngram is 1.5x plain, draft 0.8x; a mode at 3.0x plain is 2.0x the best
    speeds = {"llama-server": 10.0, "llama-server:ngram": 15.0, "llama-server:draft": 8.0, "auto": 30.0}
    runs = [{"mode": m, "prompt_set": "s", "prompt_id": p, "repeat": 0, "surface": "engine",
             "decode_tokens_per_s": v, "seconds": 1.0, "time_to_first_token": 0.1, "new_tokens": 10}
            for m, v in speeds.items() for p in ("x", "y")]
    summary = summarise(runs, list(speeds))
    assert summary["auto"]["over_llama_server"]["speedup"] == pytest.approx(3.0)
    assert summary["auto"]["over_llama_server_best"]["config"] == "llama-server:ngram"
    assert summary["auto"]["over_llama_server_best"]["speedup"] == pytest.approx(2.0)
    assert summary["auto"]["over_llama_server_best"]["by_set"]["s"] == pytest.approx(geomean([2.0, 2.0]))
    assert "over_llama_server_best" not in summary["llama-server:ngram"]   # not over itself


def test_the_bench_refuses_llama_server_modes_off_llama_cpp(capsys):
    assert bench.main(["--pair", "tiny", "--modes", "llama-server"]) == 2
    assert "llama.cpp backend" in capsys.readouterr().err


@pytest.mark.llama_server
@pytest.mark.parametrize("add_bos", [False, True])
def test_speclens_builds_llama_servers_own_infill_prompt(binary, tmp_path, add_bos):
    """The same /infill request to both servers on the same file reads the same number of prompt tokens: the other
    files, the project and file names, the typed line after the prefix, in llama-server's order. (The context is
    one where llama-server's cut keeps the other files: in one under twice its batch it drops them all, where
    SpecLens keeps what fits.) A model whose tokenizer adds a begin-of-text token gets it in both, and a raw text
    completion gets it too, through /completion also where its prompt mixes text and token ids (before a text that
    opens it only). /completion answers with llama-server's fields but the prompt spelled back."""
    import httpx

    from core.backends.llamacpp import LlamaCppBackend
    from core.memory import Memory
    from core.serve.job import ServedModels
    from tests.served import serving

    names = (*FIM, "<|repo_name|>", "<|file_sep|>")
    path = write_tiny_gguf(tmp_path / "fim.gguf", seed=0, context=4096, extra_tokens=names, add_bos=add_bos)
    requests = [{"input_prefix": "def f(x):\n", "prompt": "    return ", "input_suffix": "\n\nprint(f(2))\n"},
                {"input_prefix": "", "prompt": "", "input_suffix": "",
                 "input_extra": [{"filename": "a.py", "text": "A = 1\n"}, {"text": "B = 2\n"}]},
                {"input_prefix": "x = 1\n", "input_suffix": "", "input_extra": [{"filename": "b.py", "text": "y\n"}]}]
    target = LlamaCppBackend(path, n_ctx=4096, n_threads=1)
    read, keys = {}, {}
    with serving(ServedModels(target, None, Memory(8, 8), "fim")) as (url, _), \
            LlamaServer(path, threads=1, context=4096) as server:
        for name, root in (("speclens", url), ("llama-server", server.url)):
            read[name] = [httpx.post(f"{root}/infill", json={**body, "n_predict": 0, "temperature": 0},
                                     timeout=60).json()["tokens_evaluated"] for body in requests]
            read[name].append(httpx.post(f"{root}/v1/completions", timeout=60, json={
                "prompt": "<|fim_prefix|>def f(<|fim_suffix|>)<|fim_middle|>", "max_tokens": 1, "temperature": 0,
                "model": "fim"}).json()["usage"]["prompt_tokens"])
            for prompt in ("<|fim_prefix|>def f(", [5, "<|fim_prefix|>def", 7], ["def <|fim_suffix|>", 7, "x"]):
                answer = httpx.post(f"{root}/completion", timeout=60, json={
                    "prompt": prompt, "n_predict": 1, "temperature": 0}).json()
                read[name].append(answer["tokens_evaluated"])
            keys[name] = set(answer)
    assert read["speclens"] == read["llama-server"]
    assert keys["llama-server"] - keys["speclens"] == {"prompt"} and keys["speclens"] <= keys["llama-server"]


@pytest.mark.llama_server
@pytest.mark.parametrize("add_bos", [False, True])
def test_speclens_tokenizes_detokenizes_and_renders_chats_as_llama_server(binary, tmp_path, add_bos):
    """The same /tokenize, /detokenize and /apply-template requests to both servers on the same file get the same
    answers: special-token text parsed or not, a begin-of-text token added or not (and not after an id that opens a
    mixed prompt), each token's piece (bytes where a character is split), control tokens spelled out, a chat's text;
    /props gives the same context size and chat template."""
    import httpx

    from core.backends.llamacpp import LlamaCppBackend
    from core.memory import Memory
    from core.serve.job import ServedModels
    from tests.served import serving

    path = write_tiny_gguf(tmp_path / "t.gguf", seed=0, context=512, add_bos=add_bos)
    target = LlamaCppBackend(path, n_ctx=512, n_threads=1)
    text = "the theory <|im_end|> of é日本🦙\n\tx"
    asked = [("/tokenize", body) for body in (
        {"content": text}, {"content": text, "add_special": True}, {"content": text, "parse_special": False},
        {"content": text, "with_pieces": True, "add_special": True}, {"content": [5, "the <|im_start|>", 7, "x"],
                                                                      "add_special": True},
        {"content": ["a", 5], "add_special": True}, {})]
    asked += [("/detokenize", {"tokens": ids}) for ids in ([281, 5, 200, 282], [195, 169], [195], [])]
    asked += [("/apply-template", {"messages": [{"role": "system", "content": "be <|im_end|> brief"},
                                                {"role": "user", "content": "hi é"}]})]
    answers = {}
    with serving(ServedModels(target, None, Memory(8, 8), "t")) as (url, _), \
            LlamaServer(path, threads=1, context=512) as server:
        for name, root in (("speclens", url), ("llama-server", server.url)):
            answers[name] = [httpx.post(f"{root}{where}", json=body, timeout=60).json() for where, body in asked]
            props = httpx.get(f"{root}/props", timeout=60).json()
            answers[name].append((props["default_generation_settings"]["n_ctx"], props["chat_template"]))
    assert answers["speclens"] == answers["llama-server"]


@pytest.mark.llama_server
def test_the_agents_apis_read_the_prompt_llama_server_reads(binary, tmp_path):
    """Anthropic's Messages API and the Responses API, with tools and a history of a call and its result, read into
    the same prompt tokens as llama-server's own /v1/messages and /v1/responses on the same file; count_tokens too."""
    import httpx

    from core.backends.llamacpp import LlamaCppBackend
    from core.memory import Memory
    from core.serve.job import ServedModels
    from tests.served import serving
    from tests.test_serve_tools import TOOLS_TEMPLATE, WEATHER

    path = write_tiny_gguf(tmp_path / "t.gguf", context=1024, chat_template=TOOLS_TEMPLATE)
    tool = {"name": "get_weather", "description": WEATHER["function"]["description"],
            "input_schema": WEATHER["function"]["parameters"]}
    called = {"model": "m", "max_tokens": 1, "temperature": 0, "system": "Be useful.", "tools": [tool], "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Looking."}, {
            "type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "9C"},
                                     {"type": "text", "text": "And tomorrow?"}]}]}
    plain = {"model": "m", "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}
    response = {"model": "m", "max_output_tokens": 1, "temperature": 0, "instructions": "Be useful.",
                "tools": [{"type": "function", **WEATHER["function"]}], "input": [
                    {"role": "user", "content": "Weather in Paris?"},
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
                    {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
                    {"type": "function_call_output", "call_id": "c1", "output": "9C"},
                    {"role": "user", "content": "And tomorrow?"}]}
    read = {}
    target = LlamaCppBackend(path, n_ctx=1024, n_threads=1)
    with serving(ServedModels(target, None, Memory(8, 8), "t")) as (url, _), \
            LlamaServer(path, threads=1, context=1024, extra=("--jinja",)) as server:
        for name, root in (("speclens", url), ("llama-server", server.url)):
            read[name] = []
            for body in (plain, called):
                usage = httpx.post(f"{root}/v1/messages", json=body, timeout=60).json()["usage"]
                counted = httpx.post(f"{root}/v1/messages/count_tokens", json=body, timeout=60).json()
                read[name] += [usage["input_tokens"] + usage["cache_read_input_tokens"], counted["input_tokens"]]
            read[name].append(httpx.post(f"{root}/v1/responses", json=response, timeout=60).json()["usage"][
                "input_tokens"])
    assert read["speclens"] == read["llama-server"]
