"""`speclens screenshot`: render named scenes of the real window to PNG files, offscreen, with the bundled fonts.

A scene is a function ``scene(ctx: SceneContext) -> QWidget`` registered in :data:`SCENES`; the returned widget is
grabbed to ``OUT/NAME.png``. ``ctx.window()`` is the real main window with the chosen pair loaded (built once and
shared by the scenes of one run); ``ctx.wait_until(predicate)`` runs the event loop until something happened.
Other modules add scenes with one line: ``SCENES["tree"] = tree_scene``.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

HISTORY_FILE = "history.sqlite3"
WINDOW_SIZE = (1440, 900)

# A stored conversation for the chat scene when the pair is the tiny one (whose live output is random text).
DEMO_QUESTION = "How do I read a large CSV file in chunks with pandas and sum one column?"
DEMO_ANSWER = """Use `read_csv` with `chunksize`: it returns an iterator of DataFrames, so only one chunk is in memory.

```python
import pandas as pd

def column_total(path: str, column: str, chunksize: int = 100_000) -> float:
    \"\"\"Sum one column of a CSV file too large to load at once.\"\"\"
    total = 0.0
    for chunk in pd.read_csv(path, usecols=[column], chunksize=chunksize):
        total += chunk[column].sum()
    return total
```

- `usecols` reads only the column you need, which is much faster.
- Pick `chunksize` so that one chunk fits comfortably in memory.
"""
LIVE_PROMPT = "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces."


class SceneError(RuntimeError):
    """A scene could not be rendered (the models did not load, an answer did not finish in time)."""


@dataclass
class SceneContext:
    """What scenes share: options of this run and the lazily built main window."""

    pair: str
    theme: str
    data_dir: Path
    timeout_s: float = 600.0
    _window: object = field(default=None, repr=False)

    def wait_until(self, predicate: Callable[[], bool], what: str) -> None:
        """Run the Qt event loop until ``predicate()`` holds; SceneError after ``timeout_s``."""
        from PySide6.QtCore import QDeadlineTimer, QEventLoop, QTimer

        deadline = QDeadlineTimer(int(self.timeout_s * 1000))
        loop = QEventLoop()
        timer = QTimer()
        timer.setInterval(20)
        timer.timeout.connect(lambda: loop.quit() if predicate() or deadline.hasExpired() else None)
        timer.start()
        if not predicate():
            loop.exec()
        timer.stop()
        if not predicate():
            raise SceneError(f"timed out after {self.timeout_s:.0f} s waiting for {what}")

    def window(self):
        """The main window, shown offscreen at a fixed size, with the pair loaded and warm, on the default
        settings (Auto) a first start has."""
        if self._window is None:
            from app.chat.history import HistoryStore
            from app.main import open_window
            from app.settings import AppSettings

            backend = "hf" if self.pair == "tiny" else "llama.cpp"
            settings = AppSettings(pair=self.pair, backend=backend, theme=self.theme, temperature=0.0,
                                   max_new_tokens=96 if self.pair == "tiny" else 200)
            errors: list[str] = []
            window = open_window(settings, HistoryStore(self.data_dir / HISTORY_FILE), persist=False)
            window.message_shown.connect(lambda title, text: errors.append(f"{title}: {text}"))
            window.resize(*WINDOW_SIZE)
            self.wait_until(lambda: window.session.is_warm or bool(errors), "the models to load and warm up")
            if errors:
                raise SceneError(errors[0])
            self._window = window
        return self._window

    def answer(self, prompt: str) -> None:
        """Send ``prompt`` in the window and wait for the whole answer."""
        window = self.window()
        results: list = []
        window.session.answer_finished.connect(lambda message, result: results.append(result))
        if not window.send(prompt):
            raise SceneError("the window did not accept the prompt")
        self.wait_until(lambda: bool(results), "the answer")
        if results[0] is None:
            raise SceneError("the answer failed")


def scene_chat(ctx: SceneContext):
    """A finished answer with code. Tiny pair: a stored conversation (restored through the real history store)
    plus one live answer of the tiny model; real pairs: a live answer to a coding question."""
    from app.chat.history import Message

    window = ctx.window()
    if ctx.pair == "tiny":
        store = window.session.store
        cid = store.create_conversation("Sum a CSV column in chunks")
        store.add_message(cid, Message("user", DEMO_QUESTION))
        store.add_message(cid, Message("assistant", DEMO_ANSWER))
        window.session.refresh_conversations()
        window.session.open_conversation(cid)
        ctx.answer("And the same for a gzip-compressed file?")
    else:
        window.session.new_chat()
        ctx.answer(LIVE_PROMPT)
    return window


def scene_settings(ctx: SceneContext):
    """The settings dialog over the window's current settings."""
    from app.settings_dialog import SettingsDialog

    window = ctx.window()
    dialog = SettingsDialog(window.settings, window)
    dialog.resize(dialog.width(), dialog.whole_height())    # all of it, whatever the screen it is rendered on
    dialog.show()
    ctx.wait_until(lambda: dialog.isVisible(), "the settings dialog")
    return dialog


def _viz_scene(name: str) -> Callable[[SceneContext], object]:
    """A scene of app/viz/scenes.py, imported only when rendered (it loads the engine and pyqtgraph)."""
    return lambda ctx: getattr(importlib.import_module("app.viz.scenes"), f"scene_{name}")(ctx)


SCENES: dict[str, Callable[[SceneContext], object]] = {
    "chat": scene_chat,
    "settings": scene_settings,
    "tree": _viz_scene("tree"),
    "plots": _viz_scene("plots"),
    "race": _viz_scene("race"),
    "planner": _viz_scene("planner"),
    "learn": _viz_scene("learn"),
    "serve": _viz_scene("serve"),
    "serve-infill": _viz_scene("serve_infill"),
    "serve-tools": _viz_scene("serve_tools"),
    "race-endpoint": _viz_scene("race_endpoint"),
}


def snapshot(widget, app):
    """The widget as a user would see it: shown (offscreen), so that views which draw only while visible have
    drawn, then grabbed."""
    widget.show()
    app.processEvents()
    return widget.grab()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="speclens screenshot",
                                     description="Render scenes of the real window to DIR/NAME.png, offscreen.")
    parser.add_argument("--scene", default="", help=f"comma-separated scene names (default: all: {', '.join(SCENES)})")
    parser.add_argument("--out", required=True, type=Path, help="folder for the PNG files")
    parser.add_argument("--pair", choices=("tiny", "default"), default="default",
                        help="model pair (tiny: fast random models, for CI)")
    parser.add_argument("--theme", choices=("light", "dark"), default="light")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for models and answers")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Render the chosen scenes; returns 0, or 2 with a message on stderr when something failed."""
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    names = [n.strip() for n in args.scene.split(",") if n.strip()] or list(SCENES)
    unknown = [n for n in names if n not in SCENES]
    if unknown:
        print(f"unknown scene(s) {', '.join(unknown)}; known: {', '.join(SCENES)}", file=sys.stderr)
        return 2
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from app.main import create_app

    app = create_app()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="speclens-shots-") as tmp:
        old = os.environ.get("SPECLENS_DATA_DIR")
        os.environ["SPECLENS_DATA_DIR"] = tmp  # scenes never read or write the user's own history and settings
        ctx = SceneContext(args.pair, args.theme, Path(tmp), timeout_s=args.timeout)
        try:
            for name in names:
                widget = SCENES[name](ctx)
                path = args.out / f"{name}.png"
                if not snapshot(widget, app).save(str(path)):
                    raise SceneError(f"could not write {path}")
                print(path)
                if widget is not ctx._window:
                    widget.close()
        except Exception as exc:  # a failed scene is a message and an exit code, not a traceback
            print(f"screenshot failed: {exc}", file=sys.stderr)
            return 2
        finally:
            if ctx._window is not None:
                ctx._window.close()
            if old is None:
                os.environ.pop("SPECLENS_DATA_DIR", None)
            else:
                os.environ["SPECLENS_DATA_DIR"] = old
    return 0


if __name__ == "__main__":
    sys.exit(main())
