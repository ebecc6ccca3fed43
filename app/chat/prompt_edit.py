"""The message input: Enter sends, Shift+Enter starts a new line."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QWidget


class PromptEdit(QPlainTextEdit):
    """A plain-text box that emits ``submitted`` with its text on Enter (Shift+Enter inserts a newline)."""

    submitted = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("PromptEdit")
        self.setPlaceholderText("Message the model…  (Enter sends, Shift+Enter new line)")
        self.setTabChangesFocus(True)
        self.setFixedHeight(84)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
                event.modifiers() & Qt.KeyboardModifier.ShiftModifier):
            text = self.toPlainText()
            if text.strip():
                self.submitted.emit(text)
            return
        super().keyPressEvent(event)
