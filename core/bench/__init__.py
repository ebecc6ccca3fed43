"""`speclens bench`: decode prompt sets in several modes on the same loaded models and report the speed.

Modes alternate prompt by prompt and repeat (``--repeat``); every mode is reported over ``baseline`` (SpecLens's own
plain loop) and over ``native`` (llama-cpp-python's) when that mode runs. ``--surface window`` (the app adds it)
decodes each prompt through the real chat window as well as through the bare engine and reports the window's cost.
Output: JSON (``meta``, ``modes``, ``runs``, ``summary``) and a Markdown table (stdout and ``OUT`` with ``.md``).
See core.bench.run and core.bench.report for how runs are alternated and ratios taken.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Callable

from core.backends.kquant_kernels import llama_cpp_build
from core.bench.modes import (
    ENDPOINT, HF_ASSISTED, LLAMA_SERVER_MODES, MODE_HELP, NATIVE, BenchError, needs_draft_model, parse_modes,
    runner_of, strategy_for,
)
from core.bench import agent, cursor, fast_apply
from core.bench.prompts import DEFAULT_PROMPTS, PROMPT_DIR, read_prompts
from core.bench.report import geomean, markdown, summarise
from core.bench.run import (
    BenchSetup, ComparedSurface, EngineSurface, attach_memories, here, run_bench, stderr_log,
)
from core.bench.runners import EndpointRunner, HFAssisted, LlamaServerRunner, NativeRunner
from core.bench.same_drafts import scored
from core.cli_args import add_pair_arguments, open_pair
from core.sampling import SamplingParams

__all__ = ["DEFAULT_PROMPTS", "PROMPT_DIR", "BenchError", "geomean", "main", "read_prompts", "strategy_for"]

HTTP_WORKLOADS = {"server": fast_apply, "cursor": cursor, "agent": agent}   # --surface: requests over HTTP
SurfaceFactory = Callable[[object, object], ComparedSurface]   # (target, draft) -> the surface to measure


def _parser(surfaces: dict[str, SurfaceFactory]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="speclens bench", description=__doc__.split("\n\n")[0])
    add_pair_arguments(parser)
    parser.add_argument("--modes", default=None, help=f"comma-separated: {MODE_HELP} (default baseline,auto); with "
                        f"--surface server: {', '.join(fast_apply.OWN_MODES + tuple(fast_apply.SERVER_MODES))} "
                        f"(default {fast_apply.DEFAULT_MODES}); with --surface cursor: "
                        f"{', '.join(cursor.OWN_MODES + tuple(fast_apply.SERVER_MODES))} (default {cursor.DEFAULT_MODES})"
                        f"; with --surface agent: the same (default {agent.DEFAULT_MODES})")
    parser.add_argument("--prompts", action="append", default=None,
                        help="a JSONL prompt file (repeatable); default: every set in resources/prompts")
    parser.add_argument("--limit", type=int, default=0,
                        help="use only the first N prompts of each file (HTTP surfaces: the first N tasks chosen by "
                             "--held-out)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--repeat", type=int, default=1, help="repeat every run N times (ratios: median of repeats)")
    parser.add_argument("--seed", type=int, default=0, help="seed of sampled runs")
    parser.add_argument("--memory", default="", help="folder of the memory of earlier texts to draft from (read, "
                        "never written); default: an empty memory, so that results do not depend on your history")
    parser.add_argument("--surface", default="engine", choices=("engine", *HTTP_WORKLOADS, *surfaces),
                        help="engine: the bare engine; window: also through the real chat window (offscreen); "
                        "server: fast apply over HTTP (core.bench.fast_apply) against llama-server; cursor: completion "
                        "at the cursor while the user types, over HTTP (core.bench.cursor) against llama-server; "
                        "agent: a coding agent's edit with tools, over HTTP (core.bench.agent) against llama-server")
    parser.add_argument("--held-out", default="all", choices=("all", "only", "exclude"),
                        help="with --surface server, cursor or agent: all tasks, only the held-out half, or only the "
                        "tuning half")
    parser.add_argument("--api", default="completions", choices=cursor.APIS,
                        help="with --surface cursor: OpenAI's /v1/completions with the model's fill-in-the-middle "
                        "prompt (default), or llama-server's own /infill, as the editor plugins for local models ask")
    parser.add_argument("-c", "--ctx-size", type=int, default=None, metavar="N",
                        help=f"with --surface server, cursor or agent: tokens a prompt and its answer may fill on every "
                        f"server (default: 4096, or less where the model was trained with less; {agent.CONTEXT} for "
                        "agent; 0: all it was trained with)")
    parser.add_argument("--json", dest="out", default=None, help="write the JSON here (and the table next to it, .md)")
    parser.add_argument("--ballast-gb", type=float, default=0.0, metavar="GB",
                        help="touch and hold this much memory before any model loads, so that every engine's weights "
                        "(SpecLens's and the llama-server references', loaded later) land in the same kind of memory: "
                        "on some virtual machines the first gigabyte or two a process takes decodes about 10%% slower "
                        "(docs/BENCHMARK.md)")
    parser.add_argument("--llama-server", default=None, metavar="PATH",
                        help="llama.cpp's llama-server binary for the llama-server modes (default: "
                        "$SPECLENS_LLAMA_SERVER, then PATH, then where tools/build_llama_server.sh puts it)")
    return parser


def _check_writable(out: Path) -> None:
    """Fail before a long run, not after it, when the report cannot be written."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out.parent, prefix=".speclens-bench-"):
            pass
    except OSError as exc:
        raise BenchError(f"cannot write the report to {out}: {exc}") from None


def _settings(args) -> tuple[list[str], list[dict], SamplingParams]:
    modes = parse_modes(args.modes or "baseline,auto")
    if args.max_new_tokens < 1:
        raise BenchError("--max-new-tokens must be at least 1")
    if args.repeat < 1:
        raise BenchError("--repeat must be at least 1")
    files = [Path(p) for p in args.prompts] if args.prompts else [PROMPT_DIR / f for f in DEFAULT_PROMPTS]
    prompts = []
    for f in files:
        rows = read_prompts(f)
        prompts += rows[: args.limit] if args.limit > 0 else rows
    sampling = SamplingParams(temperature=args.temperature, seed=args.seed if args.temperature > 0 else None)
    if HF_ASSISTED in modes and not sampling.greedy:
        raise BenchError("hf-assisted is benchmarked greedy only: use --temperature 0")
    if args.no_draft:
        needy = [m for m in modes if needs_draft_model(m)]
        if needy:
            raise BenchError(f"modes {', '.join(needy)} need the draft model; drop --no-draft")
    if args.out:
        _check_writable(Path(args.out))
    return modes, prompts, sampling


def _encoded(target, prompts: list[dict], max_new_tokens: int) -> list[list[int]]:
    encoded = []
    for p in prompts:
        ids = target.apply_chat_template(p["messages"])
        if len(ids) + max_new_tokens > target.context_length:
            raise BenchError(f"prompt {p['set']}/{p['id']} has {len(ids)} tokens: with {max_new_tokens} new ones it "
                             f"does not fit in the context of {target.context_length}")
        encoded.append(ids)
    return encoded


def main(argv: list[str] | None = None, surfaces: dict[str, SurfaceFactory] | None = None) -> int:
    """Run the benchmark; ``surfaces`` are extra places to decode (the app passes its window)."""
    surfaces = surfaces or {}
    args = _parser(surfaces).parse_args(argv)
    with _ballast(args.ballast_gb):
        return _main(args, argv, surfaces)


def _main(args, argv, surfaces: dict[str, SurfaceFactory]) -> int:
    if args.surface in HTTP_WORKLOADS:
        return _over_http(args, argv, HTTP_WORKLOADS[args.surface])
    try:
        modes, prompts, sampling = _settings(args)
    except (BenchError, ValueError) as exc:
        print(f"speclens bench: {exc}", file=sys.stderr)
        return 2
    runners: dict = {}
    try:
        target, draft = open_pair(args.pair, args.backend, args.draft_backend, args.device, args.target,
                                  args.draft)
        if args.no_draft:
            draft = None
        encoded = _encoded(target, prompts, args.max_new_tokens)
        for m in modes:
            if runner_of(m):
                runners[m] = _runner(runner_of(m), target, draft, args)
    except Exception as exc:  # a model that will not load, a prompt that cannot fit: one clear line
        _close(runners)
        print(f"speclens bench: {exc}", file=sys.stderr)
        return 2
    try:
        runs = _run(args, modes, prompts, encoded, sampling, target, draft, runners, surfaces)
    finally:
        _close(runners)
    report = {"meta": _meta(args, target, draft, sampling, argv), "modes": modes, "runs": runs,
              "summary": summarise(runs, modes)}
    table = markdown(report)
    print(table)
    if args.out:
        out = Path(args.out)
        try:
            out.write_text(json.dumps(report, indent=1))
            out.with_suffix(".md").write_text(table + "\n")
        except OSError as exc:
            print(f"speclens bench: could not write {out}: {exc}", file=sys.stderr)
            return 2
    return 0


def _ballast(gigabytes: float):
    """``gigabytes`` of memory written page by page, held while the context lasts."""
    import contextlib
    import mmap

    if gigabytes <= 0:
        return contextlib.nullcontext()
    ballast = mmap.mmap(-1, int(gigabytes * 2**30))
    for offset in range(0, len(ballast), mmap.PAGESIZE):
        ballast[offset] = 1
    return ballast


def _over_http(args, argv, workload) -> int:
    """`--surface server`, `cursor` or `agent`: an editor's or an agent's requests over HTTP (core.bench.fast_apply,
    core.bench.cursor, core.bench.agent), each workload opening the pair with the context it needs (``CONTEXT``)."""
    args.modes = args.modes or workload.DEFAULT_MODES
    try:
        workload.parse_modes(args.modes)
        if args.out:
            _check_writable(Path(args.out))
        context = args.ctx_size if args.ctx_size is not None else getattr(workload, "CONTEXT", None)
        target, draft = open_pair(args.pair, args.backend, args.draft_backend, args.device, args.target, args.draft,
                                  context)
        report = workload.run(args, target, draft, strategy_for("auto"))
    except Exception as exc:   # a model, a server or a task file that will not do: one clear line
        print(f"speclens bench: {exc}", file=sys.stderr)
        return 2
    report["meta"] = {"target": target.name, "draft": draft.name if draft is not None else None,
                      "repeat": args.repeat, "machine": machine(), "load_average": os.getloadavg(),
                      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                      "command": "speclens bench " + " ".join(argv if argv is not None else sys.argv[1:])}
    table = workload.markdown(report)
    print(table)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
        Path(args.out).with_suffix(".md").write_text(table + "\n")
    return 0


def _close(runners: dict) -> None:
    """Runners hold processes (llama-server) and contexts: end them however the run ended."""
    for runner in runners.values():
        runner.close()


def _run(args, modes, prompts, encoded, sampling, target, draft, runners, surfaces) -> list[dict]:
    from core.memory import open_memory

    with tempfile.TemporaryDirectory(prefix="speclens-bench-memory-") as empty:
        memory = open_memory(target.fingerprint(), args.memory or empty, read_only=True)
        strategies = scored(attach_memories({m: None if m in runners else strategy_for(m) for m in modes}, memory),
                            sampling)
        chosen, call, extra = [EngineSurface()], here, None
        if args.surface != "engine":
            extra = surfaces[args.surface](target, draft)
            chosen, call = [extra.engine_surface(), extra], extra.call
        setup = BenchSetup(target, draft, strategies, runners, memory, sampling, args.max_new_tokens, args.repeat,
                           chosen, call)
        try:
            return run_bench(setup, prompts, encoded, stderr_log)
        finally:
            if extra is not None:
                extra.close()


def _runner(name: str, target, draft, args):
    if name == NATIVE:
        return NativeRunner(target)
    if name == HF_ASSISTED:
        return HFAssisted(target, draft, args.pair)
    if name.startswith(ENDPOINT):
        return EndpointRunner(name.removeprefix(ENDPOINT), target, os.environ.get("SPECLENS_ENDPOINT_KEY", ""))
    return LlamaServerRunner(target, draft, LLAMA_SERVER_MODES[name], args.llama_server)


def _meta(args, target, draft, sampling: SamplingParams, argv) -> dict:
    backend = "hf" if args.pair == "tiny" else args.backend   # the tiny pair exists in transformers only
    pair = f"custom ({Path(args.target).name} + {Path(args.draft).name})" if args.target else args.pair
    return {"pair": pair, "backend": backend,
            "draft_backend": backend if args.pair == "tiny" else args.draft_backend or backend,
            "max_new_tokens": args.max_new_tokens, "temperature": sampling.temperature, "repeat": args.repeat,
            "ballast_gb": args.ballast_gb,
            "surface": args.surface, "machine": machine(), "load_average": os.getloadavg(),
            "llama_cpp": llama_cpp_build() if "llama.cpp" in (backend, args.draft_backend) else None,
            "target": target.name, "draft": draft.name if draft is not None else None,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "speclens bench " + " ".join(argv if argv is not None else sys.argv[1:])}


def machine() -> str:
    """The CPU model and core count (and the GPU, if torch sees one)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    text = f"{cpu}, {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()} cores"
    import torch

    if torch.cuda.is_available():
        text += f", {torch.cuda.get_device_name(0)}"
    return text


if __name__ == "__main__":
    sys.exit(main())
