"""One message card: role, actions (copy, edit, regenerate), the rendered text and the answer's stats line."""
from __future__ import annotations

import math

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QTextBrowser, QToolButton, QVBoxLayout, QWidget

from app.chat.history import Message
from app.chat.message_document import MessageDocument, tinted_text
from app.chat.render import COPY_SCHEME
from app.chat.stats import format_stats
from app.theme import Theme

BUSY_REASON = "Cannot do this while the model is generating: press Stop (Esc) first"
LOADING_REASON = "Waiting for the models to load"
EDIT_TIP = "Edit this message and resend it"
REGENERATE_TIP = "Discard this answer and generate a new one"
MARGINS = (14, 8, 14, 10)  # left, top, right, bottom
SPACING = 4


def status_line(message: Message, streaming: bool) -> str:
    """The line under a message: an answer's stats, and a note while it streams or when it never finished."""
    status = format_stats(message.stats) if message.stats else ""
    if not message.complete:
        note = "generating…" if streaming else "interrupted: the app closed before this answer finished"
        status = f"{status}  ·  {note}" if status else note
    return status


class MessageBody(QTextBrowser):
    """The rendered text: selectable, with links; as tall as the card makes it, never scrolling on its own."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)

    def wheelEvent(self, event) -> None:
        event.ignore()  # the wheel goes on to the transcript: a message never scrolls, nor zooms (its height is fixed)


class MessageCard(QFrame):
    """Message ``index`` of a transcript. The transcript sets its geometry from ``fit``."""

    edit_requested = Signal(int)
    regenerate_requested = Signal(int)
    copied = Signal(str)

    def __init__(self, index: int, message: Message, theme: Theme, color_origins: bool,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.index = index
        self.message = message
        self.streaming = False
        self.setObjectName("MessageCard")
        self.setProperty("role", message.role)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(*MARGINS)
        layout.setSpacing(SPACING)

        self._header = QHBoxLayout()
        self._header.setSpacing(2)
        self.role_label = QLabel("You" if message.role == "user" else "Assistant")
        self.role_label.setObjectName("RoleLabel")
        self._header.addWidget(self.role_label)
        self._header.addStretch(1)
        self.copy_button = self._button("Copy", "Copy the message's text (Markdown source)", self.copy_message)
        self.edit_button = self._button("Edit", EDIT_TIP, lambda: self.edit_requested.emit(self.index))
        self.regenerate_button = self._button("Regenerate", REGENERATE_TIP,
                                              lambda: self.regenerate_requested.emit(self.index))
        for button in (self.copy_button, self.edit_button, self.regenerate_button):
            self._header.addWidget(button)
        self.edit_button.setVisible(message.role == "user")
        self.regenerate_button.setVisible(False)
        layout.addLayout(self._header)

        self.document = MessageDocument(theme, color_origins, self)
        self.body = MessageBody(self)
        self.body.setDocument(self.document.document)
        self.body.anchorClicked.connect(self._on_anchor)
        layout.addWidget(self.body)
        self.stats_label = QLabel()
        self.stats_label.setObjectName("StatsLabel")
        self.stats_label.setWordWrap(True)
        self.stats_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.stats_label.setVisible(False)
        layout.addWidget(self.stats_label)

    def _button(self, text: str, tip: str, slot) -> QToolButton:
        button = QToolButton(self)
        button.setObjectName("CardButton")
        button.setText(text)
        button.setToolTip(tip)
        button.setCursor(Qt.CursorShape.PointingHandCursor)
        button.clicked.connect(slot)
        return button

    def show_message(self, message: Message, streaming: bool) -> None:
        """Show ``message`` (a streaming answer that grew: only its open Markdown block is rendered again)."""
        self.message = message
        self.streaming = streaming
        self.document.update(message.content, message.origins, final=not streaming)
        status = status_line(message, streaming)
        self.stats_label.setText(status)
        self.stats_label.setVisible(bool(status))

    def restyle(self, theme: Theme, color_origins: bool) -> None:
        self.document.restyle(theme, color_origins)
        self.show_message(self.message, self.streaming)

    def fit(self, width: int) -> int:
        """Lay the card out ``width`` wide; returns its height."""
        if self.width() != width:
            self.resize(width, max(1, self.height()))  # a shown body lays its document out at the new width once
        self.ensurePolished()
        self.body.ensurePolished()
        border = self.contentsMargins()        # the style sheet's border around the card
        padding = self.body.contentsMargins()  # and its padding around the text
        left, top, right, bottom = MARGINS
        inner = width - border.left() - border.right() - left - right
        doc = self.document.document
        text_width = inner - padding.left() - padding.right()
        if doc.textWidth() != text_width:  # not shown yet: the body has not been resized
            doc.setTextWidth(text_width)
        body = math.ceil(doc.size().height()) + padding.top() + padding.bottom()
        self.body.setFixedHeight(body)
        height = border.top() + top + self._header.sizeHint().height() + SPACING + body + bottom + border.bottom()
        if self.stats_label.isVisibleTo(self):
            height += SPACING + self.stats_label.heightForWidth(inner)
        return height

    def set_actions(self, busy: bool, ready: bool, last: bool) -> None:
        """Enable edit and regenerate when they can act, else say why; regenerate shows on the last answer only."""
        self.regenerate_button.setVisible(self.message.role == "assistant" and last)
        reason = BUSY_REASON if busy else None if ready else LOADING_REASON
        for button, tip in ((self.edit_button, EDIT_TIP), (self.regenerate_button, REGENERATE_TIP)):
            button.setEnabled(reason is None)
            button.setToolTip(reason or tip)

    def copy_message(self) -> None:
        """Put the message's source text on the clipboard."""
        self._copy(self.message.content)

    def copy_code(self, index: int) -> None:
        """Put the source of code block ``index`` on the clipboard."""
        self._copy(self.document.code(index))

    def _copy(self, text: str) -> None:
        QGuiApplication.clipboard().setText(text)
        self.copied.emit(text)

    def _on_anchor(self, url: QUrl) -> None:
        if url.scheme() == COPY_SCHEME:
            self.copy_code(int(url.path()))
        elif url.scheme() in ("http", "https"):
            QDesktopServices.openUrl(url)

    def rendered_text(self) -> str:
        return self.document.document.toPlainText()

    def tinted_text(self) -> str:
        return tinted_text(self.document.document)
