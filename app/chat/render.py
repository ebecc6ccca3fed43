"""Markdown blocks to Qt rich text: Markdown without raw HTML, fenced code highlighted by pygments.

The source text of a message is never changed: rendering produces HTML, and every code block keeps its source (for
"Copy code", the link ``copy-code:N`` in the block's header). How the pieces go into a document (code blocks in a
framed box) is app/chat/message_document.py's job.
"""
from __future__ import annotations

import html
from functools import cache

import markdown
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound

from app.theme import MONO_FONT, Theme

COPY_SCHEME = "copy-code"
CODE_CHUNK_LINES = 8   # a code block still streaming is highlighted in chunks of this many lines, each chunk once


@cache
def _markdown() -> markdown.Markdown:
    """One converter for the GUI thread (``reset`` between texts): building one costs more than a short block."""
    md = markdown.Markdown(extensions=["tables", "sane_lists"])
    # Model output is text, not HTML: raw tags are shown literally rather than interpreted.
    md.preprocessors.deregister("html_block")
    md.inlinePatterns.deregister("html")
    return md


@cache
def _lexer(lang: str) -> Lexer:
    try:
        return get_lexer_by_name(lang) if lang else TextLexer()
    except ClassNotFound:
        return TextLexer()


@cache
def _formatter(style: str) -> HtmlFormatter:
    return HtmlFormatter(nowrap=True, noclasses=True, style=style)  # inline colours: Qt rich text has no classes


def _highlight(code: str, lang: str, style: str) -> str:
    return highlight(code, _lexer(lang), _formatter(style)).rstrip("\n")


def highlight_code(code: str, lang: str, style: str, chunks: dict | None = None) -> str:
    """``code`` as HTML coloured by pygments.

    With ``chunks`` (a cache kept while a code block streams; for complete lines only), the code is highlighted in
    chunks of CODE_CHUNK_LINES lines, each chunk once, so that a growing block is not highlighted whole again and
    again. Each chunk starts lexing afresh: a string or comment across a chunk boundary may show in the wrong colour
    until the block is finished and highlighted whole.
    """
    if chunks is None:
        return _highlight(code, lang, style)
    lines = code.split("\n")
    parts = []
    for first in range(0, len(lines), CODE_CHUNK_LINES):
        chunk = "\n".join(lines[first:first + CODE_CHUNK_LINES])
        key = (lang, style, chunk)
        if key not in chunks:
            chunks[key] = _highlight(chunk, lang, style)
        parts.append(chunks[key])
    return "\n".join(parts)


def code_header_html(lang: str, index: int, theme: Theme) -> str:
    """The line over a code block: its language and a "Copy code" link to ``copy-code:index``."""
    label = html.escape(lang or "code")
    return (f'<a href="{COPY_SCHEME}:{index}" style="color: {theme["muted"]}; text-decoration: none; '
            f'font-size: 8.5pt;">{label}&nbsp;&nbsp;·&nbsp;&nbsp;Copy code</a>')


def code_lines_html(code: str, lang: str, theme: Theme, chunks: dict | None = None) -> str:
    """Lines of code, highlighted (``chunks``: see ``highlight_code``); no margins, so that lines added later
    continue them without a gap."""
    body = highlight_code(code, lang, theme["pygments_style"], chunks)
    return f'<pre style="font-family: \'{MONO_FONT}\'; white-space: pre-wrap; margin: 0;">{body}</pre>'


def text_html(text: str) -> str:
    """Rich text for Markdown ``text`` (one block that is not fenced code)."""
    return _markdown().reset().convert(text)


def document_style(theme: Theme) -> str:
    """The default style sheet of a message document (element styles Qt rich text understands)."""
    return (
        f"body {{ color: {theme['text']}; }}"
        f"p {{ margin-top: 3px; margin-bottom: 5px; line-height: 135%; }}"
        f"code {{ font-family: '{MONO_FONT}'; background-color: {theme['code_bg']}; }}"
        f"a {{ color: {theme['accent']}; }}"
        f"h1 {{ font-size: 15pt; }} h2 {{ font-size: 13pt; }} h3 {{ font-size: 11.5pt; }}"
        f"th {{ background-color: {theme['code_bg']}; padding: 3px 8px; }} td {{ padding: 3px 8px; }}"
    )
