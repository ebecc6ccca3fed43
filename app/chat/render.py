"""Message rendering: Markdown to Qt rich text with highlighted code blocks, and the token-origin overlay.

The source text of a message is never changed: rendering produces HTML plus the source of every code block (for
"copy code"). Origins are painted afterwards on the rendered document, by aligning its characters with the source,
so Markdown, code highlighting and origin colours never have to be mixed in one HTML string.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Sequence

import markdown
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound
from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor, QTextDocument

from app.theme import MONO_FONT, Theme
from core.events import Origin

DRAFT, TARGET, UNKNOWN = "d", "t", " "
ORIGIN_CODE = {Origin.DRAFT: DRAFT, Origin.CORRECTION: TARGET, Origin.BONUS: TARGET}
COPY_SCHEME = "copy-code"
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*([^\s`]*)[^\n]*$")
_LOOKAHEAD = 40  # markdown syntax hidden between two visible characters is shorter than this (fences, emphasis)


@dataclass(frozen=True)
class Rendered:
    """HTML for a QTextDocument and the source text of each code block, in order (anchor copy-code:N)."""

    html: str
    code_blocks: tuple[str, ...]


def step_origin_codes(text: str, token_texts: Sequence[str], origins: Sequence[Origin]) -> str:
    """One origin code per character of ``text`` (a step's new text) from the step's tokens and their origins.

    Tokens whose text is not found in order (an end-of-sequence token, a byte piece decoded together with the next
    token) are skipped; characters no token claims take the origin of the step's last token.
    """
    codes: list[str] = []
    pos = 0
    for piece, origin in zip(token_texts, origins):
        if piece and text.startswith(piece, pos):
            codes.append(ORIGIN_CODE[origin] * len(piece))
            pos += len(piece)
    rest = ORIGIN_CODE[origins[-1]] if origins else UNKNOWN
    codes.append(rest * (len(text) - pos))
    return "".join(codes)


def split_code_blocks(source: str) -> list[tuple[str, str, str]]:
    """Split Markdown into ("text", text, "") and ("code", code, language) parts; an unclosed fence (an answer
    still streaming) runs to the end."""
    parts: list[tuple[str, str, str]] = []
    text: list[str] = []
    lines = source.split("\n")
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            text.append(lines[i])
            i += 1
            continue
        fence, lang = match.group(1), match.group(2)
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence[0] * len(fence)):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        if text:
            parts.append(("text", "\n".join(text), ""))
            text = []
        parts.append(("code", "\n".join(body), lang))
    if text:
        parts.append(("text", "\n".join(text), ""))
    return parts


def _markdown() -> markdown.Markdown:
    md = markdown.Markdown(extensions=["tables", "sane_lists"])
    # Model output is text, not HTML: raw tags are shown literally rather than interpreted.
    md.preprocessors.deregister("html_block")
    md.inlinePatterns.deregister("html")
    return md


def _code_html(code: str, lang: str, index: int, theme: Theme) -> str:
    try:
        lexer = get_lexer_by_name(lang) if lang else TextLexer()
    except ClassNotFound:
        lexer = TextLexer()
    body = highlight(code, lexer, HtmlFormatter(nowrap=True, noclasses=True, style=theme["pygments_style"]))
    body = body.rstrip("\n")
    label = html.escape(lang or "code")
    return (
        f'<table width="100%" cellspacing="0" cellpadding="0" bgcolor="{theme["code_bg"]}" '
        f'style="margin-top: 6px; margin-bottom: 8px; border-color: {theme["code_border"]}; border-style: solid;" '
        f'border="1">'
        f'<tr><td style="padding: 5px 10px 2px 10px;">'
        f'<a href="{COPY_SCHEME}:{index}" style="color: {theme["muted"]}; text-decoration: none; font-size: 8.5pt;">'
        f'{label}&nbsp;&nbsp;·&nbsp;&nbsp;Copy code</a></td></tr>'
        f'<tr><td style="padding: 2px 10px 8px 10px;">'
        f'<pre style="font-family: \'{MONO_FONT}\'; white-space: pre-wrap; margin: 0;">{body}</pre></td></tr></table>'
    )


def render_markdown(source: str, theme: Theme) -> Rendered:
    """Rich text for ``source`` (Markdown with fenced code) in ``theme``'s colours."""
    md = _markdown()
    chunks: list[str] = []
    blocks: list[str] = []
    for kind, text, lang in split_code_blocks(source):
        if kind == "code":
            chunks.append(_code_html(text, lang, len(blocks), theme))
            blocks.append(text)
        elif text.strip():
            chunks.append(md.reset().convert(text))
    return Rendered("".join(chunks), tuple(blocks))


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


def align_to_source(visible: str, source: str) -> list[int | None]:
    """For each character of the rendered text, the index of the source character it shows (None: rendering only).

    The rendered text is the source minus Markdown syntax, so a forward scan with a short look-ahead finds each
    visible character; whitespace matches any whitespace (paragraph breaks render as U+2029).
    """
    out: list[int | None] = []
    j = 0
    n = len(source)
    for i, ch in enumerate(visible):
        space = ch.isspace()
        found = None
        for k in range(j, min(n, j + _LOOKAHEAD)):
            if source[k] == ch or (space and source[k].isspace()):
                found = k
                break
        if found is None and not space:
            # Longer hidden syntax (a link target): resynchronise on the next few visible characters.
            k = source.find(visible[i:i + 4], j)
            found = k if k >= 0 else None
        if found is None:
            out.append(None)
            continue
        out.append(found)
        j = found + 1
    return out


def paint_origins(doc: QTextDocument, source: str, origins: str, tint: str) -> None:
    """Give every rendered character that came from an accepted draft token a ``tint`` background.

    Link text (the code blocks' copy headers) is not message text and is left alone.
    """
    positions: list[int] = []
    visible: list[str] = []
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            if frag.isValid() and not frag.charFormat().isAnchor():
                text = frag.text()
                positions.extend(range(frag.position(), frag.position() + len(text)))
                visible.append(text)
            it += 1
        positions.append(-1)  # the block break: matches the source's newline
        visible.append("\n")
        block = block.next()
    mapping = align_to_source("".join(visible), source)
    fmt = QTextCharFormat()
    fmt.setBackground(QColor(tint))
    cursor = QTextCursor(doc)
    run_start = run_end = None
    for pos, src in zip(positions, mapping):
        draft = pos >= 0 and src is not None and src < len(origins) and origins[src] == DRAFT
        if draft and run_end == pos:
            run_end = pos + 1
            continue
        if run_start is not None:
            _merge(cursor, run_start, run_end, fmt)
            run_start = run_end = None
        if draft:
            run_start, run_end = pos, pos + 1
    if run_start is not None:
        _merge(cursor, run_start, run_end, fmt)


def _merge(cursor: QTextCursor, start: int, end: int, fmt: QTextCharFormat) -> None:
    cursor.setPosition(start)
    cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
    cursor.mergeCharFormat(fmt)
