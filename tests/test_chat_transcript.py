"""The transcript widget: long chats stay cheap (few live cards), streaming, actions, notices, themes."""
from __future__ import annotations

import time

import pytest
from PySide6.QtCore import QCoreApplication, QEvent, Qt, QUrl
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QTextBrowser

from app.chat import transcript as transcript_module
from app.chat.history import Message
from app.chat.message_view import BUSY_REASON, LOADING_REASON
from app.chat.stats import format_stats
from app.chat.transcript import LIVE_LIMIT, TranscriptView
from app.theme import load_fonts, load_theme

STATS = {"tokens_per_second": 41.25, "time_to_first_token": 0.2, "seconds": 3.1, "tokens": 128, "drafted": 90,
         "accepted": 70, "rejected": 20, "mean_accepted": 2.5, "strategy": "chain k=4", "stop_reason": "eos"}
ANSWER = "Use slicing:\n\n```python\nxs = [1, 2, 3]\nprint(xs[::-1])\n```\n\nOr `reversed(xs)`:\n\n1. one\n2. two"


def answer(text: str = ANSWER, origins: str | None = None, **fields) -> Message:
    return Message("assistant", text, origins="d" * len(text) if origins is None else origins,
                   stats=fields.pop("stats", STATS), **fields)


def chat(n: int) -> list[Message]:
    return [Message("user", f"Question {i}: how do I *reverse* a list?") if i % 2 == 0 else answer()
            for i in range(n)]


@pytest.fixture
def view(qtbot):
    load_fonts()
    widget = TranscriptView(load_theme("light"), color_origins=True)
    qtbot.addWidget(widget)
    widget.resize(800, 600)
    widget.show()
    return widget


def browsers(view: TranscriptView) -> int:
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)  # cards dropped with deleteLater
    return len(view.viewport().findChildren(QTextBrowser))


def live(view: TranscriptView) -> list[int]:
    return [i for i in range(view.count()) if view.card(i) is not None]


def test_a_long_chat_opens_with_few_cards_and_scrolls_to_its_start(view):
    start = time.perf_counter()
    view.set_messages(chat(2000))
    opened = time.perf_counter() - start
    print(f"\n2,000 messages opened in {opened * 1000:.0f} ms with {len(live(view))} cards")
    assert view.count() == 2000
    assert 0 < len(live(view)) <= LIVE_LIMIT and browsers(view) == len(live(view))
    assert 1999 in live(view) and 0 not in live(view)  # at the end
    bar = view.verticalScrollBar()
    assert bar.value() == bar.maximum() > 0
    bar.setValue(0)
    assert 0 in live(view) and 1999 not in live(view)
    assert len(live(view)) <= LIVE_LIMIT and browsers(view) <= LIVE_LIMIT
    assert view.card(0).geometry().top() == transcript_module.MARGIN_Y  # the first card is at the top
    # going through the whole chat never keeps more than LIVE_LIMIT cards
    for value in range(0, bar.maximum(), bar.maximum() // 25):
        bar.setValue(value)
        assert 0 < len(live(view)) <= LIVE_LIMIT
    assert browsers(view) <= LIVE_LIMIT


def test_cards_are_stacked_in_order_without_overlap(view):
    view.set_messages(chat(30))
    cards = [view.card(i) for i in live(view)]
    assert len(cards) > 2
    for upper, lower in zip(cards, cards[1:]):
        assert upper.geometry().bottom() < lower.geometry().top()
    # each card is as tall as its text: the body shows the whole rendered document
    card = cards[-1]
    assert card.body.height() >= card.document.document.size().height()


def test_a_streamed_answer_ends_as_the_stored_one_shows(view, qtbot):
    view.set_messages([Message("user", "Reverse a list?")])
    live_answer = Message("assistant", "", complete=False)
    view.append(live_answer)
    assert view.card(1) is not None and "generating" in view.stats_text(1)
    for end in range(0, len(ANSWER) + 1, 3):
        live_answer.content, live_answer.origins = ANSWER[:end], "d" * end
        live_answer.stats = dict(STATS, tokens=end)
        view.stream(live_answer)
    qtbot.waitUntil(lambda: view.rendered_text(1).endswith("two"))
    assert "generating" in view.stats_text(1)
    live_answer.complete, live_answer.stats = True, STATS
    view.finish(live_answer)
    assert view.stats_text(1) == format_stats(STATS) == view.card(1).stats_label.text()

    stored = TranscriptView(load_theme("light"), color_origins=True)
    qtbot.addWidget(stored)
    stored.set_messages([Message("user", "Reverse a list?"), answer()])
    assert view.rendered_text(1) == stored.rendered_text(1)
    assert view.card(1).document.document.toHtml() == stored.card(1).document.document.toHtml()
    assert view.tinted_text(1) == stored.tinted_text(1) != ""


def test_an_answer_cut_off_shows_why(view):
    view.set_messages([Message("user", "hi"), answer("Partial", complete=False, stats=None)])
    assert view.stats_text(1) == "interrupted: the app closed before this answer finished"
    stopped = dict(STATS, stop_reason="cancelled")
    view.set_messages([Message("user", "hi"), answer("Partial", stats=stopped)])
    assert view.stats_text(1).endswith("stopped")


def test_the_streaming_answer_keeps_its_card_far_from_the_view(view, qtbot):
    view.set_messages(chat(400))
    live_answer = Message("assistant", "", complete=False)
    view.append(live_answer)
    view.verticalScrollBar().setValue(0)  # the user reads the start meanwhile
    assert 0 in live(view) and 400 in live(view) and len(live(view)) <= LIVE_LIMIT + 1
    top = view.verticalScrollBar().value()
    live_answer.content = "Growing\n\n" * 40
    view.stream(live_answer)
    qtbot.waitUntil(lambda: view.rendered_text(400).count("Growing") == 40)
    assert view.verticalScrollBar().value() == top  # the view did not move


def test_the_view_follows_a_streaming_answer_only_from_the_end(view, qtbot):
    view.set_messages(chat(6))
    live_answer = Message("assistant", "", complete=False)
    view.append(live_answer)
    bar = view.verticalScrollBar()
    for lines in range(1, 60, 6):
        live_answer.content = "line\n\n" * lines
        view.stream(live_answer)
        qtbot.waitUntil(lambda: bar.value() == bar.maximum() and view.rendered_text(6).count("line") == lines)
    bar.setValue(bar.maximum() // 2)
    held = bar.value()
    live_answer.content += "more\n\n" * 20
    view.finish(live_answer)
    assert bar.value() == held < bar.maximum()


def test_remove_from_drops_the_messages_and_their_cards(view):
    view.set_messages(chat(6))
    assert view.card(5).regenerate_button.isVisibleTo(view.card(5))
    view.remove_from(3)
    assert view.count() == 3 and live(view) == [0, 1, 2] and browsers(view) == 3
    assert view.card(1).regenerate_button.isHidden()  # the last message is a question: nothing to regenerate
    view.remove_from(2)
    assert not view.card(1).regenerate_button.isHidden()  # now the last answer can be regenerated


def test_actions_say_why_they_cannot_act(view, qtbot):
    view.set_messages(chat(4))
    user, last = view.card(2), view.card(3)
    assert not last.regenerate_button.isHidden() and view.card(1).regenerate_button.isHidden()
    assert user.edit_button.isEnabled() and last.edit_button.isHidden()
    view.set_actions(busy=True, ready=True)
    assert not user.edit_button.isEnabled() and user.edit_button.toolTip() == BUSY_REASON
    assert not last.regenerate_button.isEnabled() and last.regenerate_button.toolTip() == BUSY_REASON
    assert user.copy_button.isEnabled()
    view.set_actions(busy=False, ready=False)
    assert not user.edit_button.isEnabled() and user.edit_button.toolTip() == LOADING_REASON
    view.set_actions(busy=False, ready=True)
    with qtbot.waitSignal(view.edit_requested) as edit:
        qtbot.mouseClick(user.edit_button, Qt.MouseButton.LeftButton)
    with qtbot.waitSignal(view.regenerate_requested) as regenerate:
        qtbot.mouseClick(last.regenerate_button, Qt.MouseButton.LeftButton)
    assert (edit.args, regenerate.args) == ([2], [3])
    # cards made later (scrolled to) get the same state
    view.set_actions(busy=True, ready=True)
    view.set_messages(chat(300))
    view.verticalScrollBar().setValue(0)
    assert not view.card(0).edit_button.isEnabled()


def test_copy_message_and_copy_code_copy_the_source(view, qtbot):
    source = "Try:\n\n```sh\nls -la | grep '*.py'\n```\nDone **now**."
    view.set_messages([Message("user", "How?"), answer(source)])
    card = view.card(1)
    with qtbot.waitSignal(view.copied) as copied:
        qtbot.mouseClick(card.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == source == copied.args[0]
    with qtbot.waitSignal(view.copied) as copied:
        card.body.anchorClicked.emit(QUrl("copy-code:0"))
    assert QGuiApplication.clipboard().text() == "ls -la | grep '*.py'" == copied.args[0]


def test_a_notice_follows_the_last_message_until_another_chat_is_shown(view):
    view.set_messages(chat(4))
    view.show_notice("Earlier messages were left out to fit the model's context")
    notice = view.findChild(type(view.card(0).role_label), "TranscriptNotice")
    assert notice.isVisible() and "left out" in notice.text()
    assert notice.geometry().top() > view.card(3).geometry().bottom()
    assert notice.geometry().bottom() < view.viewport().height()  # at the end, in view
    view.set_messages(chat(2))
    assert not notice.isVisible()


def test_theme_and_tint_apply_to_the_cards(view):
    view.set_messages(chat(4))
    assert view.tinted_text(3) != ""
    view.set_theme(load_theme("dark"), color_origins=False)
    assert view.tinted_text(3) == "" and "#" in view.card(3).document.document.defaultStyleSheet()
    assert load_theme("dark")["text"] in view.card(3).document.document.defaultStyleSheet()
    view.set_theme(load_theme("light"), color_origins=True)
    assert view.tinted_text(3) == view.tinted_text(1) != ""  # also the messages without a card


def test_the_answer_line_shows_the_speed_the_window_shows() -> None:
    # 363.1502 tok/s: rounded once it reads 363.2, rounded to three places first (363.15) it would read 363.1
    from app.chat.stats import stats_record
    from core.events import GenerationStats, StopReason

    stats = GenerationStats(new_tokens=40, seconds=0.02 + 39 / 363.1502, time_to_first_token=0.02)
    line = format_stats(stats_record(stats, "Chain(4)", StopReason.EOS))
    assert line.startswith(f"{stats.tokens_per_second:.1f} tok/s") and line.startswith("363.2 tok/s")
