"""The message list: one card per message with its rendered text, actions (copy, edit, regenerate) and stats."""
from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QScrollArea, QSizePolicy, QTextBrowser, QToolButton,
                               QVBoxLayout, QWidget)

from app.chat.history import Message
from app.chat.render import COPY_SCHEME, Rendered, document_style, paint_origins, render_markdown
from app.chat.stats import format_stats
from app.theme import Theme

BUSY_REASON = "Cannot do this while the model is generating: press Stop (Esc) first"


class AutoHeightBrowser(QTextBrowser):
    """A read-only rich-text view as tall as its document, so the list scrolls rather than each message."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.document().setDocumentMargin(2)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)

    def _fit(self, *_) -> None:
        self.document().setTextWidth(self.viewport().width())
        self.setFixedHeight(int(self.document().size().height()) + 4)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit()


class MessageCard(QFrame):
    """One message: role, actions, rendered source text, and the answer's stats."""

    edit_requested = Signal(object)        # Message
    regenerate_requested = Signal(object)  # Message

    def __init__(self, message: Message, theme: Theme, color_origins: bool, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.message = message
        self.theme = theme
        self.color_origins = color_origins
        self.rendered = Rendered("", ())
        self.streaming = False  # True while this answer is being generated (else an incomplete answer was cut off)
        self.setObjectName("MessageCard")
        self.setProperty("role", message.role)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 8, 14, 10)
        layout.setSpacing(4)

        header = QHBoxLayout()
        header.setSpacing(2)
        self.role_label = QLabel("You" if message.role == "user" else "Assistant")
        self.role_label.setObjectName("RoleLabel")
        header.addWidget(self.role_label)
        header.addStretch(1)
        self.copy_button = self._button("Copy", "Copy the message's text (Markdown source)", self.copy_message)
        self.edit_button = self._button("Edit", "Edit this message and resend it", self._edit)
        self.regenerate_button = self._button("Regenerate", "Discard this answer and generate a new one",
                                              self._regenerate)
        for button in (self.copy_button, self.edit_button, self.regenerate_button):
            header.addWidget(button)
        self.edit_button.setVisible(message.role == "user")
        self.regenerate_button.setVisible(False)
        layout.addLayout(header)

        self.body = AutoHeightBrowser(self)
        self.body.anchorClicked.connect(self._on_anchor)
        layout.addWidget(self.body)
        self.stats_label = QLabel()
        self.stats_label.setObjectName("StatsLabel")
        self.stats_label.setWordWrap(True)
        self.stats_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.stats_label)
        self.refresh()

    def _button(self, text: str, tip: str, slot) -> QToolButton:
        button = QToolButton(self)
        button.setObjectName("CardButton")
        button.setText(text)
        button.setToolTip(tip)
        button.setCursor(Qt.CursorShape.PointingHandCursor)
        button.clicked.connect(slot)
        return button

    def refresh(self) -> None:
        """Render the message's current source text (and origins, stats) again."""
        msg = self.message
        self.rendered = render_markdown(msg.content, self.theme)
        doc = self.body.document()
        doc.setDefaultStyleSheet(document_style(self.theme))
        self.body.setHtml(self.rendered.html)
        if self.color_origins and msg.role == "assistant" and msg.origins:
            paint_origins(doc, msg.content, msg.origins, self.theme["draft_tint"])
        status = format_stats(msg.stats) if msg.stats else ""
        if not msg.complete:
            note = "generating…" if self.streaming else "interrupted: the app closed before this answer finished"
            status = f"{status}  ·  {note}" if status else note
        self.stats_label.setText(status)
        self.stats_label.setVisible(bool(status))

    def set_theme(self, theme: Theme, color_origins: bool) -> None:
        self.theme = theme
        self.color_origins = color_origins
        self.refresh()

    def set_actions(self, busy: bool, last_answer: bool) -> None:
        """Enable edit/regenerate when they can act; say why when they cannot."""
        self.regenerate_button.setVisible(self.message.role == "assistant" and last_answer)
        for button, tip in ((self.edit_button, "Edit this message and resend it"),
                            (self.regenerate_button, "Discard this answer and generate a new one")):
            button.setEnabled(not busy)
            button.setToolTip(BUSY_REASON if busy else tip)

    def copy_message(self) -> None:
        """Put the message's source text on the clipboard."""
        QGuiApplication.clipboard().setText(self.message.content)

    def copy_code(self, index: int) -> None:
        """Put the source of code block ``index`` on the clipboard."""
        QGuiApplication.clipboard().setText(self.rendered.code_blocks[index])

    def _on_anchor(self, url) -> None:
        if url.scheme() == COPY_SCHEME:
            self.copy_code(int(url.path()))
        elif url.scheme() in ("http", "https"):
            QDesktopServices.openUrl(url)

    def _edit(self) -> None:
        self.edit_requested.emit(self.message)

    def _regenerate(self) -> None:
        self.regenerate_requested.emit(self.message)


class MessageList(QScrollArea):
    """The scrolling column of message cards; follows the end while an answer streams if the user is there."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("MessageList")
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        inner = QWidget()
        inner.setObjectName("ChatArea")
        self._layout = QVBoxLayout(inner)
        self._layout.setContentsMargins(18, 14, 18, 14)
        self._layout.setSpacing(10)
        self.hint = QLabel("Ask anything. Enter sends, Shift+Enter adds a line.\n"
                           "Accepted draft tokens are highlighted as the answer streams.")
        self.hint.setObjectName("EmptyHint")
        self.hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.hint.setContentsMargins(0, 120, 0, 0)
        self._layout.addWidget(self.hint)
        self._layout.addStretch(1)
        self.setWidget(inner)
        self.cards: list[MessageCard] = []
        self._follow = True
        self.verticalScrollBar().rangeChanged.connect(self._on_range)
        self.verticalScrollBar().valueChanged.connect(self._on_scroll)

    def add(self, card: MessageCard) -> MessageCard:
        self._layout.insertWidget(self._layout.count() - 1, card)
        self.cards.append(card)
        self.hint.setVisible(False)
        self._follow = True
        return card

    def clear(self) -> None:
        for card in self.cards:
            card.setParent(None)
            card.deleteLater()
        self.cards = []
        self.hint.setVisible(True)

    def remove_from(self, index: int) -> None:
        """Remove the cards from ``index`` on."""
        for card in self.cards[index:]:
            card.setParent(None)
            card.deleteLater()
        self.cards = self.cards[:index]
        self.hint.setVisible(not self.cards)

    def _on_scroll(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._follow = value >= bar.maximum() - 8

    def _on_range(self, _lo: int, hi: int) -> None:
        if self._follow:
            QTimer.singleShot(0, lambda: self.verticalScrollBar().setValue(self.verticalScrollBar().maximum()))
