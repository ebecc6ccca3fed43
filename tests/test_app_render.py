"""Message rendering: Markdown and code blocks, copy actions, and the token-origin overlay."""
from __future__ import annotations

import pytest
from PySide6.QtCore import QUrl
from PySide6.QtGui import QGuiApplication, QTextDocument

from app.chat.history import Message
from app.chat.render import (align_to_source, paint_origins, render_markdown, split_code_blocks,
                             step_origin_codes, tinted_text)
from app.theme import load_theme
from core.events import Origin


@pytest.fixture(scope="module")
def theme():
    return load_theme("light")


@pytest.fixture
def app(qapp):
    from app.main import create_app

    return create_app()


def test_unclosed_fence_of_a_streaming_answer_is_already_code():
    assert split_code_blocks("Here:\n```python\nx = 1\n") == [("text", "Here:", ""), ("code", "x = 1\n", "python")]
    assert split_code_blocks("a\n~~~\nb\n~~~\nc") == [("text", "a", ""), ("code", "b", ""), ("text", "c", "")]


def test_model_html_is_shown_as_text_and_code_is_highlighted(theme):
    rendered = render_markdown("Use <b>care</b> and **this**:\n\n```python\ndef f():\n    return 1\n```", theme)
    assert "&lt;b&gt;care&lt;/b&gt;" in rendered.html and "<strong>this</strong>" in rendered.html
    assert rendered.code_blocks == ("def f():\n    return 1",)
    assert 'href="copy-code:0"' in rendered.html
    assert "<span style=" in rendered.html  # pygments colours inline, which Qt rich text understands


def test_copy_message_and_copy_code_block_copy_the_source(app, qtbot, theme):
    from app.chat.message_view import MessageCard

    source = "Try:\n\n```sh\nls -la | grep '*.py'\n```\nDone **now**."
    card = MessageCard(Message("assistant", source), theme, color_origins=False)
    qtbot.addWidget(card)
    card.copy_message()
    assert QGuiApplication.clipboard().text() == source
    card.body.anchorClicked.emit(QUrl("copy-code:0"))
    assert QGuiApplication.clipboard().text() == "ls -la | grep '*.py'"


def test_step_origin_codes_follow_the_tokens():
    codes = step_origin_codes("abcd", ("ab", "c", "d"), (Origin.DRAFT, Origin.DRAFT, Origin.BONUS))
    assert codes == "dddt"
    # an end-of-sequence token has no text in the answer: skipped
    assert step_origin_codes("xy", ("x", "y", "<|im_end|>"), (Origin.DRAFT, Origin.CORRECTION,
                                                                Origin.CORRECTION)) == "dt"


def test_alignment_skips_markdown_syntax():
    source = "Say **hi** to `x`"
    visible = "Say hi to x"
    mapping = align_to_source(visible, source)
    assert "".join(source[i] for i in mapping) == visible
    assert mapping[4] == source.index("hi")


def test_accepted_draft_tokens_are_tinted_in_text_and_in_code(app, theme):
    source = "The **answer** is:\n\n```python\nprint(42)\n```"
    origins = ["t"] * len(source)
    for word in ("answer", "42"):
        start = source.index(word)
        origins[start:start + len(word)] = "d" * len(word)
    doc = QTextDocument()
    doc.setHtml(render_markdown(source, theme).html)
    paint_origins(doc, source, "".join(origins), theme["draft_tint"])
    assert tinted_text(doc) == "answer42"


def test_every_character_of_a_real_answer_keeps_its_origin(app, theme):
    # the shape of a real Qwen answer: prose, a fenced block with indentation and quotes, inline code, a link, a list
    source = ('Here is **the** answer:\n\n```python\ndef is_palindrome(s):\n    # Normalize the string\n'
              '    normalized = s.replace(" ", "").lower()\n    return normalized == normalized[::-1]\n```\n\n'
              'The function `is_palindrome` takes a [string](http://example.com/a/rather/long/path/to/docs) `s`.\n\n'
              '1. one\n2. two\n')
    doc = QTextDocument()
    doc.setHtml(render_markdown(source, theme).html)
    paint_origins(doc, source, "d" * len(source), theme["draft_tint"])

    def squeeze(text):
        return "".join(c for c in text if not c.isspace())

    visible = squeeze(doc.toPlainText()).replace("python·Copycode", "")  # the code block's header is not message
    assert squeeze(tinted_text(doc)) == visible
    # and a token in the middle of the code keeps exactly its own characters
    origins = [" "] * len(source)
    start = source.index("replace")
    origins[start:start + len("replace")] = "d" * len("replace")
    paint_origins(doc, source, "".join(origins), theme["draft_tint"])
    assert tinted_text(doc) == "replace"
