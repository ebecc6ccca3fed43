"""`speclens` (or `speclens chat`): open the chat window."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from app.settings import BACKENDS, CUSTOM_PAIR, REGISTRY_PAIRS, data_dir, load_settings

HISTORY_FILE = "history.sqlite3"


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


def main(argv: list[str] | None = None) -> int:
    """Open the window on the saved settings (command-line options override them) and run until it closes."""
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    app = create_app()
    from app.chat.history import HistoryError, HistoryStore
    from app.main_window import MainWindow

    settings = load_settings(pair=args.pair, backend=args.backend, theme=args.theme)
    if args.pair == "tiny" and args.backend is None:
        settings = replace(settings, backend="hf")  # the tiny pair exists only as PyTorch models
    try:
        store = HistoryStore(data_dir() / HISTORY_FILE)
    except (HistoryError, OSError) as exc:
        from PySide6.QtWidgets import QMessageBox

        QMessageBox.critical(None, "SpecLens", f"{exc}\n\nSet SPECLENS_DATA_DIR to a writable folder.")
        return 1
    window = MainWindow(settings, store)
    window.show()
    window.load_models()
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
