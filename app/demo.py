"""`speclens demo`: play a scripted prompt in the real window, for screen recording.

The script: load the pair, type the prompt into the input box, send it, watch the tree grow live; then show the
plots, replay the answer's steps with the timeline slider, and race the same prompt against plain decoding.
It uses a temporary data folder, so the user's own history and settings are never touched.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

DEMO_PROMPT = "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces."
TYPE_MS = 35        # per character, so viewers can read along
PAUSE_MS = 2500     # between acts
SLIDER_MS = 180     # per step when the slider replays the answer


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="speclens demo", description="Play a scripted prompt in the window.")
    parser.add_argument("--pair", choices=("tiny", "default"), default="default",
                        help="model pair (tiny: fast random models)")
    parser.add_argument("--prompt", default=DEMO_PROMPT, help="what to type into the chat")
    parser.add_argument("--strategy", default="auto", help="the strategy setting to show (e.g. auto, chain, sequoia)")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--no-race", action="store_true", help="skip the race against plain decoding at the end")
    parser.add_argument("--quit-after", type=float, default=0.0,
                        help="close the window this many seconds after the script ends (0: stay open)")
    parser.add_argument("--speed", type=float, default=1.0, help="faster (>1) or slower pauses and typing")
    return parser.parse_args(argv)


class DemoScript:
    """The acts of the demo, each started by the previous one's signal or timer."""

    def __init__(self, window, args: argparse.Namespace, app) -> None:
        from PySide6.QtCore import QTimer

        self.window, self.args, self.app = window, args, app
        self.timer = QTimer()
        self.timer.timeout.connect(self._tick)
        self._tick_action = None
        self.race = None
        self.failed = ""
        window.session.warm.connect(self.type_prompt)
        window.session.answer_finished.connect(lambda message, result: self.after_answer(result))
        window.message_shown.connect(self._on_message)

    def _ms(self, ms: float) -> int:
        return max(1, int(ms / self.args.speed))

    def _later(self, ms: float, action) -> None:
        from PySide6.QtCore import QTimer

        QTimer.singleShot(self._ms(ms), action)

    def _repeat(self, ms: float, action) -> None:
        self._tick_action = action
        self.timer.start(self._ms(ms))

    def _tick(self) -> None:
        if self._tick_action is not None and not self._tick_action():
            self.timer.stop()

    def _on_message(self, title: str, text: str) -> None:
        self.failed = f"{title}: {text}"
        print(f"demo: {self.failed}", file=sys.stderr)
        self.finish()

    def type_prompt(self) -> None:
        """Act 1: type the prompt character by character, then send it."""
        text = self.args.prompt
        box = self.window.prompt
        box.clear()
        box.setFocus()

        def type_one() -> bool:
            done = len(box.toPlainText())
            if done < len(text):
                box.insertPlainText(text[done])
                return True
            self._later(400, lambda: self.window.send(box.toPlainText()))
            return False

        self._repeat(TYPE_MS, type_one)

    def after_answer(self, result) -> None:
        """Act 2: the plots, then the slider replaying every step of the answer."""
        if result is None:
            self.finish()
            return
        viz = self.window.viz
        self._later(PAUSE_MS, lambda: viz.tabs.setCurrentWidget(viz.plots))

        def replay() -> None:
            viz.tabs.setCurrentWidget(viz.tree)
            viz.tree.slider.setValue(0)

            def step() -> bool:
                slider = viz.tree.slider
                if slider.value() < slider.maximum():
                    slider.setValue(slider.value() + 1)
                    return True
                self._later(PAUSE_MS, self.start_race)
                return False

            self._repeat(SLIDER_MS, step)

        self._later(2 * PAUSE_MS, replay)

    def start_race(self) -> None:
        """Act 3: race the same prompt against plain decoding."""
        if self.args.no_race:
            self.finish()
            return
        self.race = self.window.open_race()
        if self.race is None:
            self.finish()
            return
        self.race.compare.raceFinished.connect(lambda _: self.finish())
        self.race.compare.failed.connect(lambda _: self.finish())

    def finish(self) -> None:
        """The script is over: close after ``--quit-after`` seconds, or leave the window to the viewer."""
        if self.args.quit_after > 0:
            self._later(self.args.quit_after * 1000 * self.args.speed, self.close_all)

    def close_all(self) -> None:
        if self.race is not None:
            self.race.close()
        self.window.close()
        self.app.quit()


def main(argv: list[str] | None = None) -> int:
    """Open the window and play the script; returns when the window closes (1 if the script hit an error)."""
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.speed <= 0:
        print("demo: --speed must be positive", file=sys.stderr)
        return 2
    from app.main import create_app

    app = create_app()
    from app.chat.history import HistoryStore
    from app.main import open_window
    from app.settings import AppSettings

    with tempfile.TemporaryDirectory(prefix="speclens-demo-") as tmp:
        old = os.environ.get("SPECLENS_DATA_DIR")
        os.environ["SPECLENS_DATA_DIR"] = tmp
        try:
            settings = AppSettings(pair=args.pair, backend="hf" if args.pair == "tiny" else "llama.cpp",
                                   strategy=args.strategy, temperature=0.0, max_new_tokens=args.max_new_tokens)
            window = open_window(settings, HistoryStore(Path(tmp) / "history.sqlite3"), persist=False)
            script = DemoScript(window, args, app)
            app.exec()
        finally:
            if old is None:
                os.environ.pop("SPECLENS_DATA_DIR", None)
            else:
                os.environ["SPECLENS_DATA_DIR"] = old
    return 1 if script.failed else 0


if __name__ == "__main__":
    sys.exit(main())
