"""`speclens bench --surface agent`: a coding agent's edit, asked over HTTP as an agent asks for it, against llama.cpp's
own server.

Each fast-apply task (core.bench.fast_apply: a file and an instruction) becomes the turn an agent asks the model for
once it has read the file: a coding agent's system prompt and tools (``read_file``, ``write_file``, ``run_command``),
the user's instruction naming the file, the agent's ``read_file`` call and its result, the file. The answer is the
model's own: mostly a ``write_file`` call whose argument is the whole new file (JSON-escaped, so its copy of the
file differs from the file's text at every line break and quote), or the file in text. Both servers read the same
prompt (tests/test_llama_server.py checks the agents' prompts against llama-server's).

Modes as fast apply's: ``speclens`` (Auto; its server with ``--memory off`` and its prompt cache emptied before
every timed run) and llama-server's configurations, restarted before every timed run; alternated task by task,
repeated, greedy; reported as fast apply reports, over llama-server plain. llama-server refuses an answer its tool-call
parser cannot read (HTTP 500 mid-stream); such a request is reported as failed and left out of the ratios, while
SpecLens's answers it as text, and a failure of SpecLens's own server ends the run.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from core.bench import fast_apply
from core.endpoints.client import EndpointError, EndpointRun
from core.sampling import SamplingParams

CONTEXT = 8192      # tokens: the tools, the file read and the file written fit the longest task twice over
OWN_MODES = ("speclens",)
DEFAULT_MODES = "speclens,llama-server,llama-server:ngram"
ANSWER_ROOM = 256   # tokens an answer may have beyond the file's own length, JSON-escaped
EXTENSIONS = {"python": "py", "typescript": "ts", "javascript": "js", "go": "go", "rust": "rs"}
SYSTEM = ("You are a coding agent working in the user's repository. Use the tools to read, change and check files. "
          "To change a file, call write_file with its whole new content. Keep your messages short.")
TOOLS = [{"type": "function", "function": {
              "name": "read_file", "description": "Read a file of the repository.",
              "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
         {"type": "function", "function": {
              "name": "write_file", "description": "Replace a file of the repository with new content.",
              "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {
                  "type": "string", "description": "The whole new file."}}, "required": ["path", "content"]}}},
         {"type": "function", "function": {
              "name": "run_command", "description": "Run a shell command in the repository and return its output.",
              "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                             "required": ["command"]}}}]


def path_of(task: dict) -> str:
    return f"src/{task['id']}.{EXTENSIONS.get(task['language'], 'txt')}"


def messages(task: dict) -> list[dict]:
    """The conversation up to the turn timed: the instruction, the agent's read of the file and what it read."""
    path = path_of(task)
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"{task['instruction']} The file is {path}."},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_read", "type": "function", "function": {
                "name": "read_file", "arguments": json.dumps({"path": path})}}]},
            {"role": "tool", "tool_call_id": "call_read", "content": task["file"]}]


def parse_modes(text: str) -> list[str]:
    return fast_apply.parse_modes(text, OWN_MODES)


def run(args, target, draft, strategy, log=lambda line: print(line, file=sys.stderr, flush=True)) -> dict:
    """Every task in every mode, alternated and repeated; the report (meta, modes, runs, summary)."""
    modes = parse_modes(args.modes)
    tasks = fast_apply.read_tasks(Path(args.prompts[0]) if args.prompts else fast_apply.TASKS, args.held_out,
                                  limit=args.limit)
    greedy = SamplingParams(temperature=0.0)
    contestants = fast_apply.Contestants(modes, target, draft, strategy, args.llama_server)
    runs: list[dict] = []
    failed: list[dict] = []
    # room for the escapes a file gains inside a call's JSON arguments (newlines, quotes, backslashes)
    budgets = {task["id"]: len(target.tokenize(task["file"])) * 4 // 3 + ANSWER_ROOM for task in tasks}
    try:
        for repeat, task, mode, endpoint, engine in contestants.turns(tasks, args.repeat):
            client = EndpointRun(endpoint, engine, count_tokens=lambda text: len(target.tokenize(text)))
            where = f"  [{repeat + 1}/{args.repeat}] {task['id']} {mode}"
            try:
                for _ in client.stream(messages(task), budgets[task["id"]], greedy, tools=TOOLS):
                    pass
            except EndpointError as exc:
                if mode in OWN_MODES:
                    raise
                failed.append({"mode": mode, "task": task["id"], "repeat": repeat, "error": str(exc)})
                log(f"{where}: failed: {exc}")
                continue
            row = fast_apply.timed_row(mode, task, repeat, client)
            runs.append(row)
            log(f"{where}: {row['completion_tokens']} tokens, {row['decode_tokens_per_s']:.1f} tok/s, "
                f"{row['seconds_to_answer']:.1f} s")
    finally:
        contestants.close()
    return {"modes": modes, "runs": runs, "failed": failed, "summary": fast_apply.summarise(runs, modes)}


def markdown(report: dict) -> str:
    table = fast_apply.markdown(report, "A coding agent's edit over HTTP (tools offered, the file read by a tool call)")
    failed = [f"{f['mode']} on {f['task']} (repeat {f['repeat'] + 1}): {f['error']}" for f in report["failed"]]
    return "\n".join([table] + (["", "Failed, and left out of the ratios:"] + [f"- {line}" for line in failed]
                                 if failed else []))
