"""`speclens bench --surface server`: fast apply, as an editor does it, over HTTP with the real ``openai`` client.

Each task is a file and an instruction ("rename X", "add type hints", ...); the answer is the whole edited file, so
most of it copies the file. Modes, alternated task by task and repeated:

* ``speclens``: SpecLens's server (Auto), the file in the prompt only;
* ``speclens:prediction``: the same, with the file as OpenAI's ``prediction`` (Predicted Outputs);
* ``llama-server``, ``llama-server:ngram`` (``--spec-default``), ``llama-server:draft``, ``llama-server:both``:
  llama.cpp's own server on the same files and threads (core.endpoints.llama_server), restarted before every timed
  run so that none copies an earlier answer or finds its prompt cached (SpecLens's server runs with ``--memory off``:
  it drafts only from the request and its prediction, and its prompt cache is emptied before every timed run).

Reported per task: decode tokens/s after the first token (the servers' own ``timings``, which both give in
llama-server's definition), the time to the whole answer on the client's clock (prefill included), and the accepted
prediction tokens; each mode over llama-server plain as the median of per-repeat ratios, the geometric mean over
tasks, for the tuning half and the held-out half apart.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from core.bench.modes import BenchError
from core.bench.prompts import PROMPT_DIR
from core.bench.report import geomean
from core.bench.run import forget_prompts, rotated
from core.endpoints.client import Endpoint, EndpointRun
from core.endpoints.llama_server import LlamaServer
from core.sampling import SamplingParams

TASKS = PROMPT_DIR / "fast_apply.jsonl"
DEFAULT_MODES = "speclens,speclens:prediction,llama-server,llama-server:ngram"
SERVER_MODES = {"llama-server": "plain", "llama-server:ngram": "ngram", "llama-server:draft": "draft",
                "llama-server:both": "both"}
OWN_MODES = ("speclens", "speclens:prediction")
REFERENCE = "llama-server"
SYSTEM = ("You are a code editor. Apply the requested change to the file and answer with the whole updated file in "
          "one fenced code block, and nothing else.")
ANSWER_ROOM = 256   # tokens an answer may have beyond the file's own length


def read_tasks(path: Path, held_out: str, fields: tuple[str, ...] = ("id", "instruction", "file"),
               limit: int = 0) -> list[dict]:
    """The tasks of a JSONL file of {"id", "language", "instruction", "file", "held_out"} (the text ``fields`` are
    required); ``held_out`` is all, only or exclude; ``limit`` > 0 keeps the first that many of those chosen."""
    if not path.is_file():
        raise BenchError(f"task file {path} does not exist")
    tasks = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BenchError(f"{path}:{n}: not JSON ({exc.msg})") from None
        if not isinstance(task, dict) or not all(isinstance(task.get(k), str) and task[k] for k in fields):
            raise BenchError(f"{path}:{n}: each line needs {', '.join(repr(k) for k in fields)} (text)")
        tasks.append({"language": "", "held_out": False, **task})
    chosen = [t for t in tasks if held_out == "all" or bool(t["held_out"]) == (held_out == "only")]
    if not chosen:
        raise BenchError(f"{path} has no tasks for --held-out {held_out}")
    return chosen[:limit] if limit > 0 else chosen


def messages(task: dict) -> list[dict]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"{task['instruction']}\n\n```{task['language']}\n{task['file']}```"}]


def prediction(task: dict) -> str:
    """What the answer is expected to be: the file as it is, in the fenced block the answer puts it in."""
    return f"```{task['language']}\n{task['file']}```"


def parse_modes(text: str, own: tuple[str, ...] = OWN_MODES) -> list[str]:
    """The modes asked for, SpecLens's ``own`` ones or llama-server's, with llama-server plain (the reference)."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in own and m not in SERVER_MODES]
    if unknown:
        raise BenchError(f"unknown mode(s) {', '.join(unknown)} here; choose from "
                         f"{', '.join(own + tuple(SERVER_MODES))}")
    if REFERENCE not in modes:
        modes.append(REFERENCE)
    return modes


def timed_row(mode: str, task: dict, repeat: int, run: EndpointRun) -> dict:
    """One timed request of ``task`` in ``mode``, as reported."""
    out = run.result
    stats = out.result.stats
    details = (out.usage or {}).get("completion_tokens_details") or {}
    return {"mode": mode, "task": task["id"], "held_out": bool(task["held_out"]), "repeat": repeat,
            "completion_tokens": (out.usage or {}).get("completion_tokens", stats.new_tokens),
            "decode_tokens_per_s": out.timings.get("predicted_per_second", stats.tokens_per_second),
            "client_decode_tokens_per_s": stats.tokens_per_second,
            "time_to_first_token": stats.time_to_first_token, "seconds_to_answer": stats.seconds,
            "cached_prompt_tokens": out.timings.get("cache_n"),
            "accepted_prediction_tokens": details.get("accepted_prediction_tokens"),
            "rejected_prediction_tokens": details.get("rejected_prediction_tokens"),
            "drafted": out.stats.drafted, "accepted": out.stats.accepted, "finish_reason": out.finish_reason,
            "text": out.result.text}


def _ratios(runs: list[dict], mode: str, key: str, invert: bool = False) -> dict[str, list[float]]:
    """task -> per-repeat ratios of ``mode`` to llama-server plain (for times, reference / mode: higher is better)."""
    by = {(r["mode"], r["task"], r["repeat"]): r[key] for r in runs}
    out: dict[str, list[float]] = {}
    for (m, task, repeat), value in by.items():
        ref = by.get((REFERENCE, task, repeat))
        if m == mode and ref and value:
            out.setdefault(task, []).append(ref / value if invert else value / ref)
    return out


def summarise(runs: list[dict], modes: list[str]) -> dict:
    held = {r["task"]: r["held_out"] for r in runs}
    summary = {}
    for mode in modes:
        entry = {}
        for key, invert, name in (("decode_tokens_per_s", False, "decode"),
                                  ("seconds_to_answer", True, "time_to_answer")):
            per_task = {t: statistics.median(v) for t, v in _ratios(runs, mode, key, invert).items()}
            spread = statistics.median([max(v) - min(v) for v in _ratios(runs, mode, key, invert).values()] or [0])
            entry[name] = {"geomean": geomean(list(per_task.values())),
                           "tuning": geomean([v for t, v in per_task.items() if not held[t]]),
                           "held_out": geomean([v for t, v in per_task.items() if held[t]]),
                           "worst": min(per_task.values(), default=0.0), "per_task": per_task, "spread": spread}
        accepted = [r["accepted_prediction_tokens"] for r in runs if r["mode"] == mode
                    and r["accepted_prediction_tokens"] is not None]
        if accepted:
            entry["accepted_prediction_tokens"] = statistics.median(accepted)
        summary[mode] = entry
    return summary


def markdown(report: dict, what: str = "Fast apply over HTTP") -> str:
    meta, modes, runs, summary = report["meta"], report["modes"], report["runs"], report["summary"]
    lines = [f"{what}: {meta['target']} (+ {meta['draft']}), greedy, {meta['repeat']} repeat(s), "
             f"{meta['machine']}; decode tok/s after the first token (the servers' timings) and time to the whole "
             "answer (client clock, prefill included); ratios over llama-server plain", "",
             "| task | held out | " + " | ".join(f"{m} tok/s" for m in modes) + " | "
             + " | ".join(f"{m} s" for m in modes) + " | accepted prediction tokens |",
             "|---|---|" + "---:|" * (2 * len(modes) + 1)]
    tasks = list(dict.fromkeys(r["task"] for r in runs))

    def median_of(mode: str, task: str, key: str) -> float | None:
        values = [r[key] for r in runs if r["mode"] == mode and r["task"] == task and r[key] is not None]
        return statistics.median(values) if values else None

    for task in tasks:
        held = next(r["held_out"] for r in runs if r["task"] == task)
        speeds = []
        for m in modes:
            v, ratio = median_of(m, task, "decode_tokens_per_s"), summary[m]["decode"]["per_task"].get(task)
            speeds.append("-" if v is None else f"{v:.1f}" + (f" ({ratio:.2f}x)" if ratio and m != REFERENCE else ""))
        times = []
        for m in modes:
            v, ratio = median_of(m, task, "seconds_to_answer"), summary[m]["time_to_answer"]["per_task"].get(task)
            times.append("-" if v is None else f"{v:.1f}" + (f" ({ratio:.2f}x)" if ratio and m != REFERENCE else ""))
        accepted = median_of("speclens:prediction", task, "accepted_prediction_tokens")
        lines.append(f"| {task} | {'yes' if held else 'no'} | " + " | ".join(speeds + times)
                     + f" | {'-' if accepted is None else int(accepted)} |")
    halves = {bool(r["held_out"]) for r in runs}
    parts = ["geomean"] + (["tuning", "held_out"] if len(halves) == 2 else []) + ["worst"]   # a half with no task: no row
    for label, key in (("decode tok/s", "decode"), ("time to answer", "time_to_answer")):
        for part in parts:
            cells = [f"{summary[m][key][part]:.2f}x" if summary[m][key]["per_task"] else "-" for m in modes]
            lines.append(f"| **{label}: {part.replace('_', ' ')}** | | " + " | ".join(
                cells if key == "decode" else ["" for _ in modes]) + " | " + " | ".join(
                cells if key == "time_to_answer" else ["" for _ in modes]) + " | |")
    spread = ", ".join(f"{m} ±{summary[m]['decode']['spread'] / 2:.2f}" for m in modes if m != REFERENCE)
    lines += ["", f"Spread of one repeat's decode ratio (half the median range): {spread}"]
    return "\n".join(lines)


class Contestants:
    """The servers of the chosen modes, started when needed, each handed out with nothing cached and nothing learnt;
    SpecLens's own remembers the answers it serves (until the next hand-out) when ``remember_answers``."""

    def __init__(self, modes: list[str], target, draft, strategy, binary: str | None,
                 remember_answers: bool = False) -> None:
        self.modes, self.target, self.draft, self.binary = modes, target, draft, binary
        self.own = None
        self.servers: dict[str, LlamaServer] = {}
        if any(m not in SERVER_MODES for m in modes):
            from core.serve.background import ServerThread
            from core.serve.cli import model_name, warm_for_requests
            from core.serve.executor import JobThread
            from core.serve.job import ServedModels

            engine = JobThread()
            models = ServedModels(target, draft, strategy, model_name(target), remember_answers=remember_answers)
            engine.submit(lambda: warm_for_requests(models)).result()
            self.own = ServerThread(models, executor=engine).start()
            self.own_engine, self.own_models = engine, models
        for mode in modes:
            if mode in SERVER_MODES:
                config = SERVER_MODES[mode]
                self.servers[mode] = LlamaServer(target.path, binary=binary, config=config,
                                                 draft=getattr(draft, "path", None) if config in ("draft", "both")
                                                 else None, threads=target.n_threads, context=target.context_length)

    def endpoint(self, mode: str) -> tuple[Endpoint, str]:
        """Where ``mode`` is served, its prompt cache empty: a server that found the task's prompt cached from the
        mode before would skip the prefill the others pay, and its time to the whole answer would look shorter."""
        if mode not in SERVER_MODES:
            self.own_engine.submit(lambda: (forget_prompts(self.target, self.draft), self.own_models.forget())).result()
            return Endpoint(self.own.url, model=self.own_models.name), "speclens"
        server = self.servers[mode]
        server.restart()      # a fresh process: no cached prompt, and nothing learnt from earlier requests
        return Endpoint(server.url, model="any"), "llama.cpp"

    def turns(self, tasks: list[dict], repeats: int):
        """``(repeat, task, mode, endpoint, engine)``: every task in every mode, repeated, the modes' order rotated
        task by task (core.bench.run.rotated); each mode's endpoint handed out cold (:meth:`endpoint`) just before its
        turn."""
        for repeat in range(repeats):
            for i, task in enumerate(tasks):
                for mode in rotated(self.modes, i + repeat):
                    yield (repeat, task, mode, *self.endpoint(mode))

    def close(self) -> None:
        for server in self.servers.values():
            server.stop()
        if self.own is not None:
            self.own.stop()
            self.own_engine.close()


def run(args, target, draft, strategy, log=lambda line: print(line, file=sys.stderr, flush=True)) -> dict:
    """Every task in every mode, alternated and repeated; the report (meta, modes, runs, summary)."""
    modes = parse_modes(args.modes)
    tasks = read_tasks(Path(args.prompts[0]) if args.prompts else TASKS, args.held_out, limit=args.limit)
    greedy = SamplingParams(temperature=0.0)
    contestants = Contestants(modes, target, draft, strategy, args.llama_server)
    runs: list[dict] = []
    budgets = {task["id"]: len(target.tokenize(task["file"])) + ANSWER_ROOM for task in tasks}
    try:
        for repeat, task, mode, endpoint, engine in contestants.turns(tasks, args.repeat):
            # SpecLens's own tokenizer counts both servers' chunks alike (one model, one tokenizer)
            client = EndpointRun(endpoint, engine, count_tokens=lambda text: len(target.tokenize(text)))
            for _ in client.stream(messages(task), budgets[task["id"]], greedy,
                                   prediction=prediction(task) if mode == "speclens:prediction" else None):
                pass
            row = timed_row(mode, task, repeat, client)
            runs.append(row)
            log(f"  [{repeat + 1}/{args.repeat}] {task['id']} {mode}: {row['completion_tokens']} tokens, "
                f"{row['decode_tokens_per_s']:.1f} tok/s, {row['seconds_to_answer']:.1f} s")
    finally:
        contestants.close()
    _check_identity(runs, log)
    return {"modes": modes, "runs": runs, "summary": summarise(runs, modes)}


def _check_identity(runs: list[dict], log) -> None:
    """Greedy: SpecLens's answer is the same with and without a prediction (the lossless promise over HTTP)."""
    texts = {(r["mode"], r["task"], r["repeat"]): r["text"] for r in runs}
    for (mode, task, repeat), text in texts.items():
        if mode == "speclens:prediction" and ("speclens", task, repeat) in texts:
            same = text == texts[("speclens", task, repeat)]
            for r in runs:
                if (r["mode"], r["task"], r["repeat"]) == (mode, task, repeat):
                    r["same_as_without_prediction"] = same
            if not same:
                log(f"  {task} (repeat {repeat + 1}): the answer with a prediction differs from the one without")
