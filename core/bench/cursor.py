"""`speclens bench --surface cursor`: completion at the cursor, as an editor asks for it while the user types, over
HTTP against llama.cpp's own server.

Each task is a file with the cursor in it (``<CURSOR>``). The editor asks for what goes between the text before the
cursor and the text after it: the model's fill-in-the-middle prompt (core.backends.infill) with its special tokens
spelt out, sent as a raw text completion to every server alike. The user then types the suggestion's first ``TYPED``
characters and the editor asks again, ``STEPS`` requests in all. The first request is new text; the next ones
mostly repeat the suggestion before, shifted by what was typed: SpecLens's server remembers the answers it served
(emptied before every task), and llama-server's n-gram speculation sees the tokens of the requests before (restarted
before every task).

``--api infill`` asks llama-server's own ``/infill`` instead, as the editor plugins for local models do (llama.vim,
llama.vscode): the text before the cursor's line, that line up to the cursor and the text after it, each server
building its own prompt (core.serve.native on SpecLens's).

Modes: ``speclens`` (Auto) and llama-server's configurations (core.bench.fast_apply), alternated task by task and
repeated, greedy. Each request is a row (``task@step``); each mode is reported over llama-server plain as fast apply
reports, and apart for the first requests and for the typing ones.
"""
from __future__ import annotations

import sys
from pathlib import Path

from core.bench import fast_apply
from core.bench.modes import BenchError
from core.bench.prompts import PROMPT_DIR
from core.endpoints.client import EndpointRun
from core.sampling import SamplingParams

TASKS = PROMPT_DIR / "cursor.jsonl"
CURSOR = "<CURSOR>"
STEPS = 5           # requests per task: the first, then one after each bit typed
TYPED = 12          # characters of a suggestion the user types before the editor asks again
MAX_TOKENS = 48     # a suggestion's length at most, as editors ask for a few lines
OWN_MODES = ("speclens",)
DEFAULT_MODES = "speclens,llama-server,llama-server:ngram"
APIS = ("completions", "infill")
GREEDY = SamplingParams(temperature=0.0)


def infill_spelling(target) -> tuple[str, str, str]:
    """The model's fill-in-the-middle tokens spelt as its raw prompts spell them; BenchError when it has none."""
    tokens = target.infill_tokens()
    if tokens is None:
        raise BenchError(f"{target.name} has no fill-in-the-middle tokens: it cannot complete at a cursor")
    pre, suf, mid = (target.special_name(t) or target.detokenize([t]) for t in (tokens.prefix, tokens.suffix,
                                                                                  tokens.middle))
    return pre, suf, mid


def read_tasks(path: Path, held_out: str, limit: int = 0) -> list[dict]:
    tasks = fast_apply.read_tasks(path, held_out, fields=("id", "file"), limit=limit)
    for task in tasks:
        if task["file"].count(CURSOR) != 1:
            raise BenchError(f"{path}: task {task['id']} needs one {CURSOR} in its file")
    return tasks


def parse_modes(text: str) -> list[str]:
    return fast_apply.parse_modes(text, OWN_MODES)


def run(args, target, draft, strategy, log=lambda line: print(line, file=sys.stderr, flush=True)) -> dict:
    """Every task's typing in every mode, alternated and repeated; the report (meta, modes, runs, summary)."""
    modes = parse_modes(args.modes)
    tasks = read_tasks(Path(args.prompts[0]) if args.prompts else TASKS, args.held_out, limit=args.limit)
    pre, suf, mid = infill_spelling(target)
    if args.api == "infill":
        def ask(client: EndpointRun, before: str, after: str):
            line = before.rfind("\n") + 1
            return client.stream_infill({"input_prefix": before[:line], "prompt": before[line:], "input_suffix": after},
                                        MAX_TOKENS, GREEDY)
    else:
        def ask(client: EndpointRun, before: str, after: str):
            return client.stream_text(f"{pre}{before}{suf}{after}{mid}", MAX_TOKENS, GREEDY)
    contestants = fast_apply.Contestants(modes, target, draft, strategy, args.llama_server, remember_answers=True)
    runs: list[dict] = []
    try:
        for repeat, task, mode, endpoint, engine in contestants.turns(tasks, args.repeat):
            before, after = task["file"].split(CURSOR)
            for step in range(STEPS):
                client = EndpointRun(endpoint, engine, count_tokens=lambda text: len(target.tokenize(text)))
                for _ in ask(client, before, after):
                    pass
                row = fast_apply.timed_row(mode, {**task, "id": f"{task['id']}@{step}"}, repeat, client)
                runs.append({**row, "step": step})
                before += client.result.result.text[:TYPED]
                log(f"  [{repeat + 1}/{args.repeat}] {task['id']}@{step} {mode}: {row['completion_tokens']} "
                    f"tokens, {row['decode_tokens_per_s']:.1f} tok/s, {row['seconds_to_answer']:.2f} s")
    finally:
        contestants.close()
    return {"modes": modes, "api": args.api, "runs": runs, "summary": fast_apply.summarise(runs, modes),
            "first": fast_apply.summarise([r for r in runs if r["step"] == 0], modes),
            "typing": fast_apply.summarise([r for r in runs if r["step"] > 0], modes)}


def markdown(report: dict) -> str:
    where = "/infill" if report.get("api") == "infill" else "/v1/completions"
    lines = [fast_apply.markdown(report, f"Completion at the cursor over HTTP ({where})"), "",
             "| requests | " + " | ".join(f"{m} tok/s" for m in report["modes"]) + " | "
             + " | ".join(f"{m} s" for m in report["modes"]) + " |",
             "|---|" + "---:|" * (2 * len(report["modes"]))]
    for part, label in (("first", "the first (new text)"), ("typing", f"after typing ({STEPS - 1} per task)")):
        summary = report[part]
        lines.append(f"| {label}: geomean | " + " | ".join(
            f"{summary[m][key]['geomean']:.2f}x" for key in ("decode", "time_to_answer") for m in report["modes"])
            + " |")
    return "\n".join(lines)
