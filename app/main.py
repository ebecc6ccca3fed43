"""`speclens` (or `speclens chat`): open the chat window."""
from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from pathlib import Path

from app.settings import BACKENDS, CUSTOM_PAIR, REGISTRY_PAIRS, SettingsError, data_dir, read_settings

HISTORY_FILE = "history.sqlite3"
log = logging.getLogger(__name__)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="speclens", description="SpecLens: a local chat on speculative decoding, "
                                     "with the draft tree and acceptance shown live.")
    parser.add_argument("--pair", choices=REGISTRY_PAIRS + (CUSTOM_PAIR,),
                        help="model pair to load (default: the saved setting, else 'default')")
    parser.add_argument("--backend", choices=BACKENDS, help="inference backend (default: the saved setting)")
    parser.add_argument("--theme", choices=("light", "dark"), help="colour theme (default: the saved setting)")
    return parser.parse_args(argv)


def create_app(argv: list[str] | None = None):
    """The QApplication (created once), with the bundled fonts registered."""
    from PySide6.QtWidgets import QApplication

    from app.theme import load_fonts

    app = QApplication.instance() or QApplication(argv or ["speclens"])
    app.setApplicationName("SpecLens")
    app.setOrganizationName("SpecLens")
    load_fonts()
    return app


def open_window(settings, store, load=None, persist: bool = True):
    """The main window over a new ChatSession on ``store``, shown, with its models loading."""
    from app.main_window import MainWindow
    from app.session import ChatSession

    window = MainWindow(ChatSession(settings, store, load=load, persist=persist))
    window.show()
    window.session.load_models()
    return window


def open_history(path: Path):
    """The history store; a lock held by another SpecLens is retried as long as the user asks (Retry / Quit)."""
    from PySide6.QtWidgets import QMessageBox

    from app.chat.history import HistoryError, HistoryLockedError, HistoryStore

    while True:
        try:
            return HistoryStore(path)
        except HistoryLockedError as exc:
            answer = QMessageBox.warning(None, "SpecLens", str(exc), QMessageBox.StandardButton.Retry
                                         | QMessageBox.StandardButton.Cancel)
            if answer != QMessageBox.StandardButton.Retry:
                return None
        except (HistoryError, OSError) as exc:
            QMessageBox.critical(None, "SpecLens", f"{exc}\n\nSet SPECLENS_DATA_DIR to a usable folder to keep the "
                                                   "chat history elsewhere.")
            return None


def main(argv: list[str] | None = None) -> int:
    """Open the window on the saved settings (command-line options override them) and run until it closes."""
    logging.basicConfig(level=logging.WARNING, format="speclens: %(levelname)s %(name)s: %(message)s")
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    app = create_app()
    from PySide6.QtWidgets import QMessageBox

    try:
        folder = data_dir()
        settings, notices = read_settings(pair=args.pair, backend=args.backend, theme=args.theme)
    except SettingsError as exc:
        QMessageBox.critical(None, "SpecLens", str(exc))
        return 1
    if args.pair == "tiny" and args.backend is None:
        settings = replace(settings, backend="hf")  # the tiny pair exists only as PyTorch models
    store = open_history(folder / HISTORY_FILE)
    if store is None:
        return 1
    window = open_window(settings, store)
    for notice in notices:
        window.show_message("Settings", notice, QMessageBox.Icon.Warning)
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
