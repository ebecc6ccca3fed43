"""Message rendering: Markdown blocks, incremental rendering of a streaming answer, code blocks, the origin tint."""
from __future__ import annotations

from collections import Counter

import pytest
from PySide6.QtGui import QTextDocument

from app.chat import message_document, render
from app.chat.markdown_blocks import split_blocks
from app.chat.message_document import MessageDocument, tinted_text
from app.chat.origins import DRAFT, align_to_source
from app.chat.render import (CODE_CHUNK_LINES, code_header_html, code_lines_html, document_style, highlight_code,
                             text_html)
from app.theme import load_theme

# Sources with every kind of block, each ending somewhere a stream can stop: in prose, in an unclosed fence, in a list.
SOURCES = [
    'Here is **the** answer:\n\n```python\ndef is_palindrome(s):\n    # Normalize the string\n'
    '    normalized = s.replace(" ", "").lower()\n    return normalized == normalized[::-1]\n```\n\n'
    'The function `is_palindrome` takes a [string](http://example.com/a/rather/long/path/to/docs) `s`.\n\n'
    '1. one\n2. two *three*\n',
    "# Plan\nSteps:\n1. Install:\n   ```bash\n   pip install speclens\n   ```\n2. Run it\n\n"
    "| model | tok/s |\n|---|---|\n| draft | **90** |\n| target | 30 |\n\n> a quote\n\n---\nDone ~~now~~.",
    "Intro *emphasis* and __strong__ text\nwith a lazy line.\n\n- a\n- b\n\n  continued\n\nTitle\n===\n"
    "    indented code\n\nUnclosed:\n```js\nlet x = 1;\n``",
    "Use <b>tags</b> & entities &amp; literally.\n\n```\nplain\n```",
    # a code block longer than two chunks, with a string across a chunk boundary
    "Code:\n\n```python\n" + "\n".join(f"x{i} = {i}" for i in range(30)) + '\ndoc = """one\ntwo\nthree\n"""\n'
    + "\n".join(f"y{i} = x{i}" for i in range(40)) + "\n```\nAfter.",
]


@pytest.fixture(scope="module")
def theme():
    return load_theme("light")


def origins_for(source: str) -> str:
    """Accepted draft tokens and target tokens in runs, the way a real answer mixes them."""
    return "".join((DRAFT if (i // 5) % 3 else "t") for i in range(len(source)))


def one_shot(source: str, origins: str, theme, tint: bool = True) -> MessageDocument:
    rendering = MessageDocument(theme, tint)
    rendering.update(source, origins, final=True)
    return rendering


def streamed(source: str, origins: str, theme, step: int = 1) -> MessageDocument:
    """The rendering after every prefix of ``source`` (``step`` characters at a time), then the final update."""
    rendering = MessageDocument(theme, True)
    for end in range(0, len(source) + 1, step):
        rendering.update(source[:end], origins[:end], final=False)
    rendering.update(source, origins, final=True)
    return rendering


# ---------------------------------------------------------------------------------------------- blocks
def test_unclosed_fence_of_a_streaming_answer_is_already_code():
    split = split_blocks("Here:\n```python\nx = 1\n", final=False)
    assert [(b.code, b.lang) for b in split.blocks] == [(None, ""), ("x = 1\n", "python")]
    assert split.finished == 1  # the paragraph is final, the fence is open
    # a closing fence still being typed is not shown as code
    assert split_blocks("```py\nx\n``", final=False).blocks[-1].code == "x"
    assert split_blocks("```py\nx\n``", final=True).blocks[-1].code == "x\n``"


@pytest.mark.parametrize("source", SOURCES)
def test_finished_blocks_never_change_as_the_text_grows(source):
    whole = split_blocks(source, final=True).blocks
    done, resume = [], 0
    for end in range(len(source) + 1):
        prefix = split_blocks(source[:end], final=False)
        assert list(prefix.blocks[:prefix.finished]) == list(whole[:prefix.finished])
        # splitting from the resume point gives what splitting everything gives
        later = split_blocks(source[:end], resume, final=False)
        assert list(later.blocks) == list(prefix.blocks[len(done):])
        done += later.blocks[:later.finished]
        resume = later.resume
    assert done + list(split_blocks(source, resume, final=True).blocks) == list(whole)


def texts(source: str) -> list[str]:
    return [source[b.start:b.end] for b in split_blocks(source).blocks]


def test_blocks_follow_what_models_write():
    # a list or a table right under a line of prose starts its own block; an indented fence interrupts a list
    steps = "Steps:\n1. Install:\n    ```bash\n    pip install x\n    ```\n2. Run\n"
    assert texts(steps) == ["Steps:", "1. Install:", "    ```bash\n    pip install x\n    ```", "2. Run"]
    fence = split_blocks(steps).blocks[2]
    assert (fence.code, fence.lang) == ("pip install x", "bash")  # without the fence's indentation
    assert texts("Table:\n| a | b |\n|---|---|\n| 1 | 2 |") == ["Table:", "| a | b |\n|---|---|\n| 1 | 2 |"]
    # a setext underline belongs to its paragraph; three backticks with text after them are inline code
    assert texts("Title\n---\nText") == ["Title\n---", "Text"]
    assert texts("```x``` stays inline\nhere") == ["```x``` stays inline\nhere"]


# ---------------------------------------------------------------------------------------------- HTML
def test_model_html_is_shown_as_text_and_code_is_highlighted(theme):
    html = text_html("Use <b>care</b> and **this**:")
    assert "&lt;b&gt;care&lt;/b&gt;" in html and "<strong>this</strong>" in html
    assert 'href="copy-code:3"' in code_header_html("python", 3, theme)
    assert "<span style=" in code_lines_html("def f():\n    return 1", "python", theme)  # inline colours for Qt


def test_a_streaming_code_block_is_highlighted_one_chunk_at_a_time(qapp, monkeypatch):
    calls = []
    real = render._highlight
    monkeypatch.setattr(render, "_highlight", lambda code, lang, style: calls.append(code) or real(code, lang, style))
    code = "\n".join(f"x{i} = {i}" for i in range(3 * CODE_CHUNK_LINES + 5))
    chunks: dict = {}
    first = highlight_code(code, "python", "friendly", chunks)
    assert len(calls) == 4
    calls.clear()
    highlight_code(code + "\ny = 2", "python", "friendly", chunks)
    assert calls == ["\n".join(code.split("\n")[3 * CODE_CHUNK_LINES:]) + "\ny = 2"]  # the complete chunks are kept
    # chunk by chunk, the same characters (a finished block is highlighted whole)
    whole = highlight_code(code, "python", "friendly")
    assert plain_text(first) == plain_text(whole)


def plain_text(html: str) -> str:
    doc = QTextDocument()
    doc.setHtml(f"<pre>{html}</pre>")
    return doc.toPlainText()


# ---------------------------------------------------------------------------------------------- incremental
@pytest.mark.parametrize("source", SOURCES)
def test_streaming_every_prefix_ends_as_the_one_shot_rendering(qapp, theme, source):
    origins = origins_for(source)
    whole = one_shot(source, origins, theme)
    for step in (1, 7):
        grown = streamed(source, origins, theme, step)
        assert grown.document.toHtml() == whole.document.toHtml()
        assert grown.document.toPlainText() == whole.document.toPlainText()
        assert tinted_text(grown.document) == tinted_text(whole.document) != ""


PROSE = ["# Plan\nSteps:\n1. Install\n2. Run it\n\n| model | tok/s |\n|---|---|\n| draft | **90** |\n\n"
         "> a quote\n\n---\nDone ~~now~~.", SOURCES[2].split("Unclosed")[0] + "End *here*"]


@pytest.mark.parametrize("source", PROSE)
def test_text_looks_as_qt_shows_the_whole_html(qapp, theme, source):
    # appended block by block, the text must look like one setHtml of every block: same margins, lists, tables
    whole = one_shot(source, "", theme, tint=False)
    reference = QTextDocument()
    reference.setDocumentMargin(2)
    reference.setDefaultStyleSheet(document_style(theme))
    reference.setHtml("".join(text_html(source[b.start:b.end]) for b in split_blocks(source).blocks))
    assert whole.document.toHtml() == reference.toHtml()


def test_a_code_block_is_a_box_with_its_header_and_lines(qapp, theme):
    rendering = one_shot("Before\n\n```python\nx = 1\n\ny = 2\n```\nAfter", "", theme, tint=False)
    frames = rendering.document.rootFrame().childFrames()
    assert len(frames) == 1 and frames[0].frameFormat().border() == 1
    cursor = frames[0].firstCursorPosition()
    cursor.setPosition(frames[0].lastPosition(), cursor.MoveMode.KeepAnchor)
    assert cursor.selection().toPlainText() == "python  ·  Copy code\nx = 1\n\ny = 2"
    text = rendering.document.toPlainText()
    assert text.startswith("Before\n") and text.endswith("\nAfter")


def test_only_the_open_part_is_rendered_and_tinted(qapp, theme, monkeypatch):
    source = SOURCES[1] + "\n\n```python\n" + "\n".join(f"x{i} = {i}" for i in range(80)) + "\n```\nEnd."
    calls, highlighted = Counter(), []

    def spy(name):
        real = getattr(message_document, name)

        def call(*args, **kwargs):
            calls[name] += 1
            if name == "code_lines_html" and kwargs.get("chunks", args[3] if len(args) > 3 else None) is None:
                highlighted.append(args[0])  # highlighted in one piece (not from cached chunks)
            return real(*args, **kwargs)
        monkeypatch.setattr(message_document, name, call)

    for name in ("text_html", "code_header_html", "code_lines_html", "paint_origins"):
        spy(name)
    origins = origins_for(source)
    rendering = MessageDocument(theme, True)
    before = split_blocks("", final=False)
    for end in range(len(source) + 1):
        calls.clear()
        rendering.update(source[:end], origins[:end], final=False)
        now = split_blocks(source[:end], final=False)
        newly_finished, still_open = now.finished - before.finished, len(now.blocks) - now.finished
        assert calls["text_html"] + calls["code_header_html"] <= newly_finished + still_open
        # a code block being written keeps its complete chunks: only its last lines are rendered and tinted again
        assert calls["paint_origins"] <= newly_finished + still_open + 1
        before = now
    rendering.update(source, origins, final=True)
    # while it grew, the code block's lines were highlighted a chunk at a time; whole once, when it was finished
    whole = [code for code in highlighted if code.count("\n") >= CODE_CHUNK_LINES]
    assert whole == [split_blocks(source).blocks[-2].code]
    assert rendering.document.toHtml() == one_shot(source, origins, theme).document.toHtml()


def test_an_edited_text_or_a_lost_undo_step_renders_again_correctly(qapp, theme):
    source = SOURCES[0]
    origins = origins_for(source)
    rendering = MessageDocument(theme, True)
    rendering.update(source[:150], origins[:150], final=False)
    rendering.update("Something else entirely.\n\n" + source, "t" * 26 + origins, final=False)
    rendering.update(source, origins, final=False)
    rendering.document.setUndoRedoEnabled(False)  # as a widget could: the open part can no longer be undone
    rendering.update(source, origins, final=True)
    assert rendering.document.toHtml() == one_shot(source, origins, theme).document.toHtml()


def test_code_blocks_keep_their_source_for_copying(qapp, theme):
    source = "Try:\n\n```sh\nls -la | grep '*.py'\n```\nDone **now**.\n\n```\nsecond\n"
    rendering = MessageDocument(theme, False)
    rendering.update(source, "", final=False)
    assert rendering.code(0) == "ls -la | grep '*.py'" and rendering.code(1) == "second\n"
    rendering.update(source + "```", "", final=True)
    assert rendering.code(1) == "second"


# ---------------------------------------------------------------------------------------------- origins
def test_alignment_skips_markdown_syntax():
    source = "Say **hi** to `x`"
    visible = "Say hi to x"
    mapping = align_to_source(visible, source)
    assert "".join(source[i] for i in mapping) == visible
    assert mapping[4] == source.index("hi")


def test_accepted_draft_tokens_are_tinted_in_text_and_in_code(qapp, theme):
    source = "The **answer** is:\n\n```python\nprint(42)\n```"
    origins = ["t"] * len(source)
    for word in ("answer", "42"):
        start = source.index(word)
        origins[start:start + len(word)] = DRAFT * len(word)
    assert tinted_text(one_shot(source, "".join(origins), theme).document) == "answer42"
    assert tinted_text(one_shot(source, "".join(origins), theme, tint=False).document) == ""


def test_every_character_of_a_real_answer_keeps_its_origin(qapp, theme):
    source = SOURCES[0]
    rendering = one_shot(source, DRAFT * len(source), theme)

    def squeeze(text):
        return "".join(c for c in text if not c.isspace())

    visible = squeeze(rendering.document.toPlainText()).replace("python·Copycode", "")  # the header is not text
    assert squeeze(tinted_text(rendering.document)) == visible
    # and a token in the middle of the code keeps exactly its own characters
    origins = [" "] * len(source)
    start = source.index("replace")
    origins[start:start + len("replace")] = DRAFT * len("replace")
    assert tinted_text(one_shot(source, "".join(origins), theme).document) == "replace"
