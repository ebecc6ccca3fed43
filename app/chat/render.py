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
from PySide6.QtGui import QColor, QTextCharFormat, QTextDocument, QTextLayout

from app.theme import MONO_FONT, Theme
from core.events import Origin

DRAFT, TARGET, UNKNOWN = "d", "t", " "
ORIGIN_CODE = {Origin.DRAFT: DRAFT, Origin.CORRECTION: TARGET, Origin.BONUS: TARGET}
COPY_SCHEME = "copy-code"
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*([^\s`]*)[^\n]*$")
_LOOKAHEAD = 40  # markdown syntax hidden between two visible characters is shorter than this (fences, emphasis)
_RESYNC = 400    # at most this much hidden text (a link's address) before the next visible character
_SYNTAX = set("`*_~#>|[]()-:!.0123456789")  # characters Markdown may hide (markers, list numbers, table rules)


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


def _same(a: str, b: str) -> bool:
    return a == b or (a.isspace() and b.isspace())


def _agrees(ahead: str, source: str, k: int) -> bool:
    """Whether the visible characters ``ahead`` appear in ``source`` from ``k`` on, Markdown syntax in between."""
    pos, n = k, len(source)
    for c in ahead:
        while pos < n and not _same(c, source[pos]) and (source[pos] in _SYNTAX or source[pos].isspace()):
            pos += 1
        if pos >= n or not _same(c, source[pos]):
            return False
        pos += 1
    return True


def align_to_source(visible: str, source: str) -> list[int | None]:
    """For each character of the rendered text, the index of the source character it shows (None: rendering only).

    The rendered text is the source minus Markdown syntax. A visible character matches the next source character
    when it can; otherwise it is looked for ahead where the next few visible characters agree too, so hidden syntax
    (fences, emphasis marks, link targets) is skipped without false matches. Whitespace matches only whitespace at
    the current source position (after closing marks), because block breaks are rendering and must not swallow
    source text.
    """
    out: list[int | None] = []
    j = 0
    n = len(source)
    for i, ch in enumerate(visible):
        found = None
        if ch.isspace():
            k = j
            while k < n and source[k] in _SYNTAX:  # closing marks before the space (**, `)
                k += 1
            found = k if k < n and source[k].isspace() else None
        elif j < n and source[j] == ch:
            found = j  # in step: no syntax to skip
        else:
            # Hidden syntax: a short skip where the next visible characters agree, else (a link target) a longer
            # skip where more of them must agree.
            for window, agree in ((_LOOKAHEAD, 3), (_RESYNC, 6)):
                ahead = visible[i:i + agree]
                found = next((k for k in range(j, min(n, j + window)) if source[k] == ch and _agrees(ahead, source, k)),
                             None)
                if found is not None:
                    break
        if found is None:
            out.append(None)
            continue
        out.append(found)
        j = found + 1
    return out


def paint_origins(doc: QTextDocument, source: str, origins: str, tint: str) -> None:
    """Give every rendered character that came from an accepted draft token a ``tint`` background.

    The tint goes into each block layout's additional formats (as a syntax highlighter does), so the document itself
    is not edited, which keeps this cheap enough to repeat while an answer streams. The code blocks' copy headers are
    not message text and are left alone.
    """
    blocks = []
    visible: list[str] = []
    block = doc.begin()
    while block.isValid():
        offsets: list[int] = []
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            if frag.isValid() and not frag.charFormat().anchorHref().startswith(COPY_SCHEME):
                start = frag.position() - block.position()
                offsets.extend(range(start, start + frag.length()))
                visible.append(frag.text())
            it += 1
        offsets.append(-1)  # the block break: matches the source's newline
        visible.append("\n")
        blocks.append((block, offsets))
        block = block.next()
    mapping = iter(align_to_source("".join(visible), source))
    fmt = QTextCharFormat()
    fmt.setBackground(QColor(tint))
    for block, offsets in blocks:
        ranges: list[QTextLayout.FormatRange] = []
        for offset in offsets:
            src = next(mapping)
            if offset < 0 or src is None or src >= len(origins) or origins[src] != DRAFT:
                continue
            if ranges and ranges[-1].start + ranges[-1].length == offset:
                ranges[-1].length += 1
                continue
            r = QTextLayout.FormatRange()
            r.start, r.length, r.format = offset, 1, fmt
            ranges.append(r)
        block.layout().setFormats(ranges)
    doc.markContentsDirty(0, doc.characterCount())


def tinted_text(doc: QTextDocument) -> str:
    """The characters of ``doc`` that carry an origin tint (for tests and debugging)."""
    out = []
    block = doc.begin()
    while block.isValid():
        text = block.text()
        for r in block.layout().formats():
            out.append(text[r.start:r.start + r.length])
        block = block.next()
    return "".join(out)
