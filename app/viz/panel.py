"""The right-hand live panel of the main window (interface fixed; contents are built by the visualisation work)."""
from __future__ import annotations

from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from core.events import GenerationResult, StepEvent


class VizPanel(QWidget):
    """Receives the engine's events for the answer being generated and shows them live."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        self._label = QLabel("Live view")
        layout.addWidget(self._label)

    def on_generation_started(self, strategy_label: str) -> None:
        """A new answer starts: clear the previous one's data."""

    def on_step(self, event: StepEvent) -> None:
        """One verification step of the current answer."""

    def on_finished(self, result: GenerationResult) -> None:
        """The answer ended (EOS, limit, cancel)."""
