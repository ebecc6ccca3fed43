"""The ``speclens`` command: the chat window by default, and the bench, plan, screenshot and demo subcommands.

Each subcommand lives in the module that does the work and parses its own arguments; this file only dispatches (it
imports no Qt), so that ``speclens bench`` on the engine never loads a GUI toolkit. ``speclens bench --surface
window`` is the one place where the app hands something to core: the chat window as a place to decode.
"""
from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "bench": ("core.bench", "benchmark modes on prompt sets, alternating them on the same loaded models"),
    "plan": ("core.auto.cli", "measure this machine and print the plan Auto would use"),
    "serve": ("core.serve.cli", "an OpenAI-compatible server on this engine, with Predicted Outputs"),
    "screenshot": ("app.screenshots", "render demo scenes of the real window to PNG files, offscreen"),
    "demo": ("app.demo", "play a scripted prompt in the window, for screen recording"),
    "chat": ("app.main", "open the chat window (the default)"),
}


def usage() -> str:
    lines = ["usage: speclens [SUBCOMMAND] [options]", "", "subcommands:"]
    lines += [f"  {name:<11} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "Run `speclens SUBCOMMAND --help` for the options of one."]
    return "\n".join(lines)


def _window_surface(target, draft):
    from app.window_surface import WindowSurface

    return WindowSurface(target, draft)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name = argv[0] if argv and argv[0] in SUBCOMMANDS else "chat"
    rest = argv[1:] if argv and argv[0] in SUBCOMMANDS else argv
    module = importlib.import_module(SUBCOMMANDS[name][0])
    if name == "bench":
        return int(module.main(rest, surfaces={"window": _window_surface}) or 0)
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
