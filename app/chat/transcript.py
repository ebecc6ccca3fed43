"""The chat transcript: a conversation's messages as cards, of which only those near the view exist.

Every message has a height: measured when its card was laid out, estimated from its text until then. The heights
give each message's place in one tall virtual column; the scroll bar moves over that column, and cards are made for
the messages within about a view's height of what is shown (at most LIVE_LIMIT) and dropped when they leave it.
When a card replaces an estimate with its real height, the message at the top of the view stays where it was, or the
view stays at the end if it was there (it then follows a streaming answer). The answer being generated keeps its
card wherever the view is, so streaming never renders more than the answer's open Markdown block.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate
from typing import Sequence

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QAbstractScrollArea, QFrame, QLabel, QWidget

from app.chat.history import Message
from app.chat.message_document import MessageDocument, tinted_text
from app.chat.message_view import MARGINS, MessageCard, status_line
from app.theme import Theme

LIVE_LIMIT = 60            # at most this many message cards exist at once
OVERSCAN = 1.0             # cards are kept this many view heights above and below the view
MARGIN_X, MARGIN_Y, SPACING = 18, 14, 10
FOLLOW_SLACK = 8           # this close to the end (pixels) counts as at the end: the view follows the answer
SCROLL_STEP = 40
SETTLE_ROUNDS = 4          # measuring new cards moves the view's contents; a few rounds find the cards it then needs
EMPTY_HINT = ("Ask anything. Enter sends, Shift+Enter adds a line.\n"
              "Accepted draft tokens are highlighted as the answer streams.")


class TranscriptView(QAbstractScrollArea):
    """The messages of one conversation; the last one may be an answer that is streaming."""

    edit_requested = Signal(int)        # index of a user message
    regenerate_requested = Signal(int)  # index of the last answer
    copied = Signal(str)                # text put on the clipboard

    def __init__(self, theme: Theme, color_origins: bool, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("MessageList")
        self.viewport().setObjectName("ChatArea")
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.verticalScrollBar().setSingleStep(SCROLL_STEP)
        self._theme = theme
        self._tint = color_origins
        self._messages: list[Message] = []
        self._heights: list[int] = []       # per message: measured, or estimated until its card is laid out
        self._tops: list[int] = [MARGIN_Y]  # per message, where its card starts; then where a next one would
        self._cards: dict[int, MessageCard] = {}
        self._streaming: int | None = None  # the answer being generated
        self._busy, self._ready = False, True
        self._follow = True                 # the view stays at the end as the contents grow
        self._adjusting = False             # scroll changes made here are not the user's
        self._again = False                 # a change came in while adjusting
        self._width = 0                     # the card width the heights are for
        self._hint = QLabel(EMPTY_HINT, self.viewport())
        self._hint.setObjectName("EmptyHint")
        self._hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._notice = QLabel(self.viewport())
        self._notice.setObjectName("TranscriptNotice")
        self._notice.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._notice.setWordWrap(True)
        self._notice.hide()
        self._style_notice()
        self.verticalScrollBar().valueChanged.connect(self._on_scrolled)

    # ------------------------------------------------------------------ the API the chat window uses
    def set_messages(self, messages: Sequence[Message]) -> None:
        """Show a conversation (in place of what is shown), scrolled to the end."""
        self._drop_cards(0)
        self._messages = list(messages)
        self._streaming = None
        self._notice.hide()
        width = self._card_width()
        self._heights = [self._estimate(m, width) for m in self._messages]
        self._retop(0)
        self._follow = True
        self._sync()

    def append(self, message: Message) -> None:
        """A new message at the end: a user message, or an empty answer about to stream."""
        self._messages.append(message)
        self._heights.append(self._estimate(message, self._card_width()))
        self._tops.append(self._tops[-1] + self._heights[-1] + SPACING)
        if message.role == "assistant" and not message.complete:
            self._streaming = len(self._messages) - 1
        self._follow = True
        self._sync()
        self._apply_actions()

    def stream(self, message: Message) -> None:
        """The last message (the answer being generated) grew: render its open block again.

        Call it at most at frame rate (app.worker paces the frames by what they cost the GUI thread).
        """
        self._update_last(message, streaming=True)

    def finish(self, message: Message) -> None:
        """The last answer ended: its final rendering and stats."""
        self._update_last(message, streaming=False)

    def remove_from(self, index: int) -> None:
        """Drop messages ``index``.. (edit and regenerate)."""
        self._drop_cards(index)
        del self._messages[index:]
        del self._heights[index:]
        del self._tops[index + 1:]
        if self._streaming is not None and self._streaming >= index:
            self._streaming = None
        self._sync()
        self._apply_actions()

    def show_notice(self, text: str) -> None:
        """A muted, centred line after the last message (not a message); set_messages clears it."""
        self._notice.setText(text)
        self._notice.setVisible(bool(text))
        self._sync()

    def set_theme(self, theme: Theme, color_origins: bool) -> None:
        """Colours and the origin tint on or off; the live cards render again."""
        self._theme, self._tint = theme, color_origins
        self._style_notice()
        width = self._card_width()
        for index, card in self._cards.items():
            card.restyle(theme, color_origins)
            self._heights[index] = card.fit(width)
        self._retop(0)
        self._sync()

    def set_actions(self, busy: bool, ready: bool) -> None:
        """Edit and regenerate act only when not generating and the models are loaded (their tooltips say why)."""
        self._busy, self._ready = busy, ready
        self._apply_actions()

    # ------------------------------------------------------------------ what tests look at
    def count(self) -> int:
        """How many messages are shown (with a card or not)."""
        return len(self._messages)

    def card(self, index: int) -> MessageCard | None:
        """The card of message ``index`` if it exists now."""
        return self._cards.get(index)

    def rendered_text(self, index: int) -> str:
        """The plain text of message ``index``'s rendering."""
        return self._document(index).toPlainText()

    def tinted_text(self, index: int) -> str:
        """The characters of message ``index``'s rendering that carry the accepted-draft tint."""
        return tinted_text(self._document(index))

    def stats_text(self, index: int) -> str:
        """The line under message ``index``."""
        return status_line(self._messages[index], index == self._streaming)

    def _document(self, index: int):
        card = self._cards.get(index)
        if card is not None:
            return card.document.document
        rendering = MessageDocument(self._theme, self._tint)  # not near the view: render it apart
        message = self._messages[index]
        rendering.update(message.content, message.origins, final=True)
        return rendering.document

    # ------------------------------------------------------------------ cards
    def _update_last(self, message: Message, streaming: bool) -> None:
        index = len(self._messages) - 1
        self._messages[index] = message
        self._streaming = index if streaming else None
        card = self._cards.get(index) or self._make_card(index)
        card.show_message(message, streaming)
        self._heights[index] = card.fit(self._card_width())
        self._retop(index)
        self._sync()

    def _make_card(self, index: int) -> MessageCard:
        message = self._messages[index]
        card = MessageCard(index, message, self._theme, self._tint, self.viewport())
        card.edit_requested.connect(self.edit_requested)
        card.regenerate_requested.connect(self.regenerate_requested)
        card.copied.connect(self.copied)
        card.set_actions(self._busy, self._ready, index == len(self._messages) - 1)
        # shown at its width before its text goes in, so that its document is laid out once
        card.setGeometry(MARGIN_X, self._tops[index] - self.verticalScrollBar().value(), self._card_width(),
                         self._heights[index])
        card.show()
        card.show_message(message, index == self._streaming)
        self._cards[index] = card
        return card

    def _drop_cards(self, first: int) -> None:
        for index in [i for i in self._cards if i >= first]:
            self._drop(index)

    def _drop(self, index: int) -> None:
        card = self._cards.pop(index)
        card.hide()
        card.deleteLater()  # not at once: the card may be in the middle of emitting (Edit clicked -> remove_from)

    def _apply_actions(self) -> None:
        last = len(self._messages) - 1
        for index, card in self._cards.items():
            card.set_actions(self._busy, self._ready, index == last)

    def _style_notice(self) -> None:
        self._notice.setStyleSheet(f"color: {self._theme['muted']}; font-size: 9pt; font-style: italic; "
                                   "background: transparent;")

    # ------------------------------------------------------------------ geometry
    def _card_width(self) -> int:
        return max(200, self.viewport().width() - 2 * MARGIN_X)

    def _estimate(self, message: Message, width: int) -> int:
        """A card's height from its text alone (wrapped lines at the average character width)."""
        metrics = self.fontMetrics()
        left, top, right, bottom = MARGINS
        per_line = max(10, (width - left - right) // max(1, metrics.averageCharWidth()))
        lines = sum(len(line) // per_line + 1 for line in message.content.split("\n"))
        chrome = top + bottom + 2 * metrics.lineSpacing() + (metrics.lineSpacing() if message.role == "assistant"
                                                              else 0)
        return chrome + lines * metrics.lineSpacing() * 4 // 3  # paragraphs have a line height of 135%

    def _retop(self, first: int) -> None:
        """Recompute where messages ``first``.. start, from their heights."""
        self._tops[first:] = accumulate((h + SPACING for h in self._heights[first:]), initial=self._tops[first])

    def _content_height(self) -> int:
        end = self._tops[-1] - (SPACING if self._messages else 0)
        if self._notice.isVisibleTo(self):
            end += SPACING + self._notice.heightForWidth(self._card_width())
        return end + MARGIN_Y

    def _anchor(self) -> tuple[int, int] | None:
        """The message at the top of the view and how far into it the view starts (None: the view is at the end)."""
        if self._follow or not self._messages:
            return None
        value = self.verticalScrollBar().value()
        index = min(len(self._messages) - 1, max(0, bisect_right(self._tops, value) - 1))
        return index, value - self._tops[index]

    def _wanted(self) -> set[int]:
        """The messages that should have a card: those within OVERSCAN views of the view, at most LIVE_LIMIT."""
        n = len(self._messages)
        if not n:
            return set()
        value, height = self.verticalScrollBar().value(), max(1, self.viewport().height())

        def between(top: float, bottom: float) -> tuple[int, int]:
            return max(0, bisect_right(self._tops, top) - 1), min(n - 1, max(0, bisect_left(self._tops, bottom) - 1))

        first, last = between(value - OVERSCAN * height, value + (1 + OVERSCAN) * height)
        if last - first + 1 > LIVE_LIMIT:
            shown_first, shown_last = between(value, value + height)
            spare = max(0, LIVE_LIMIT - (shown_last - shown_first + 1))
            first = max(first, shown_first - spare // 2)
            last = min(last, first + LIVE_LIMIT - 1)
        wanted = set(range(first, last + 1))
        if self._streaming is not None:
            wanted.add(self._streaming)
        return wanted

    def _sync(self) -> None:
        """Give the messages near the view a card (and only those), keep the view where it was, place the cards."""
        if self._adjusting:  # called back from within (the scroll bar appeared and the width changed): go again
            self._again = True
            return
        self._adjusting = True
        try:
            anchor = self._anchor()
            for _ in range(SETTLE_ROUNDS):
                self._again = False
                self._scroll_to(anchor)
                if not self._materialise(self._wanted()) and not self._again:
                    break
            self._scroll_to(anchor)
            self._place()
        finally:
            self._adjusting = False

    def _materialise(self, wanted: set[int]) -> bool:
        """Make and drop cards; True when a new card's height differed from its estimate."""
        for index in [i for i in self._cards if i not in wanted]:
            self._drop(index)
        width = self._card_width()
        changed = len(self._messages)
        for index in sorted(wanted - self._cards.keys()):
            height = self._make_card(index).fit(width)
            if height != self._heights[index]:
                self._heights[index] = height
                changed = min(changed, index)
        if changed == len(self._messages):
            return False
        self._retop(changed)
        return True

    def _scroll_to(self, anchor: tuple[int, int] | None) -> None:
        bar = self.verticalScrollBar()
        viewport = self.viewport().height()
        bar.setPageStep(viewport)
        bar.setRange(0, max(0, self._content_height() - viewport))
        bar.setValue(bar.maximum() if anchor is None else self._tops[anchor[0]] + anchor[1])

    def _place(self) -> None:
        value, width = self.verticalScrollBar().value(), self._card_width()
        for index, card in self._cards.items():
            card.setGeometry(MARGIN_X, self._tops[index] - value, width, self._heights[index])
        self._hint.setVisible(not self._messages)
        self._hint.setGeometry(0, 0, self.viewport().width(), self.viewport().height())
        if self._notice.isVisibleTo(self):
            top = self._tops[-1] - (SPACING if self._messages else 0) + SPACING - value
            self._notice.setGeometry(MARGIN_X, top, width, self._notice.heightForWidth(width))

    def _on_scrolled(self, value: int) -> None:
        if self._adjusting:
            return
        self._follow = value >= self.verticalScrollBar().maximum() - FOLLOW_SLACK
        self._sync()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        width = self._card_width()
        if width != self._width:  # a new width: every height changes
            self._width = width
            for index, message in enumerate(self._messages):
                card = self._cards.get(index)
                self._heights[index] = card.fit(width) if card is not None else self._estimate(message, width)
            self._retop(0)
        self._sync()
