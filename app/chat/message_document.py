"""One message's rendering in a QTextDocument, grown in place while the message streams.

The source is split into Markdown blocks (app/chat/markdown_blocks.py). Finished blocks are rendered, inserted and
tinted once; each update replaces only the open part after them. The open part goes in as undoable edits, so undo
restores exactly the document the finished blocks left, and the new open part is appended to that. A message shown
whole goes through the same appends, so a streamed answer ends as the same document as the stored one.

A fenced code block is a framed box (a QTextFrame: Qt lays a frame out from the change on, where a table is laid out
whole), so an open code block goes in as two edits: the box with its complete chunks of lines, which stays while
lines are added, and the lines after them, which each update replaces. Updating a long code block then costs one
chunk of lines, not the whole block.

Origins are painted as each block goes in, by aligning the block's rendered characters with its own source: the tint
goes into the block layouts' additional formats (as a syntax highlighter does), so the document itself is not edited.
"""
from __future__ import annotations

from typing import Sequence

from PySide6.QtCore import QObject
from PySide6.QtGui import (QColor, QTextBlockFormat, QTextCharFormat, QTextCursor, QTextDocument,
                           QTextDocumentFragment, QTextFrameFormat, QTextLayout)

from app.chat.markdown_blocks import Block, split_blocks
from app.chat.origins import DRAFT, align_to_source
from app.chat.render import (CODE_CHUNK_LINES, COPY_SCHEME, code_header_html, code_lines_html, document_style,
                             text_html)
from app.theme import Theme

CODE_PADDING = 8
CODE_MARGINS = (6, 8)  # above and below a code block


class MessageDocument:
    """The rendering of one message (``document``), updated from the message's source and origins."""

    def __init__(self, theme: Theme, tint: bool, parent: QObject | None = None) -> None:
        self.document = QTextDocument(parent)
        self.document.setDocumentMargin(2)
        self._theme = theme
        self._tint = tint
        self._reset()

    def restyle(self, theme: Theme, tint: bool) -> None:
        """Use ``theme`` and the origin tint on or off; the next ``update`` renders everything again."""
        self._theme, self._tint = theme, tint
        self._reset()

    def _reset(self) -> None:
        self.document.clear()
        self.document.setUndoRedoEnabled(False)
        self._style = document_style(self._theme)
        self.document.setDefaultStyleSheet(self._style)
        self._done = ""     # the source of the finished blocks (up to the resume point)
        self._resume = 0
        self._codes: list[str] = []       # the code of each finished code block
        self._open_codes: list[str] = []  # and of the open part's
        self._open_steps = 0    # undo steps holding the open part: its blocks, then the open code block's last lines
        self._kept: tuple | None = None  # where the first of two open steps starts, and the source it shows
        self._chunks: dict = {}  # highlighted chunks of the open code block (render.highlight_code)

    def update(self, source: str, origins: str, final: bool) -> None:
        """Show ``source`` (``origins``: one code per character). ``final``: the message will not grow any more.

        When ``source`` extends the source of the last update, only the blocks after the finished ones are rendered.
        """
        doc = self.document
        if not source.startswith(self._done) or doc.availableUndoSteps() < self._open_steps:
            self._reset()  # another text, or something cleared the undo stack: start again from nothing
        split = split_blocks(source, self._resume, final)
        finished, opened = split.blocks[:split.finished], split.blocks[split.finished:]
        self._open_codes = [block.code for block in opened if block.code is not None]
        growing = opened[-1] if opened and opened[-1].code is not None and not final else None
        kept_end = _kept_end(source, growing) if growing is not None else None
        kept = (opened[0].start, source[opened[0].start:kept_end]) if growing is not None else None
        if not finished and self._open_steps == 2 and kept == self._kept:
            doc.undo()  # only the code block's last lines changed
            self._open_steps = 1
            self._append_lines(growing, source, origins, kept_end)
            return
        for _ in range(self._open_steps):
            doc.undo()
        doc.setUndoRedoEnabled(False)  # finished blocks are never taken out; this also forgets the undone part
        self._open_steps = 0
        self._edit(lambda: self._append_all(finished, source, origins, None))
        self._codes += [block.code for block in finished if block.code is not None]
        if split.resume != self._resume:
            self._done, self._resume = source[:split.resume], split.resume
        if growing is None:
            self._chunks.clear()  # no code block is streaming: the chunks of one that was are not needed
        if opened:
            doc.setUndoRedoEnabled(True)
            self._edit(lambda: self._append_all(opened, source, origins, kept_end))
            self._open_steps, self._kept = 1, kept
            if growing is not None:
                self._append_lines(growing, source, origins, kept_end)

    def code(self, index: int) -> str:
        """The source of code block ``index`` (the N of its ``copy-code:N`` link)."""
        codes = self._codes + self._open_codes
        return codes[index]

    def _edit(self, change) -> None:
        """Make ``change`` one edit: one undo step, and the document is laid out once, after it, tint included."""
        cursor = QTextCursor(self.document)
        cursor.beginEditBlock()
        change()
        cursor.endEditBlock()

    def _append_all(self, blocks: Sequence[Block], source: str, origins: str, kept_end: int | None) -> None:
        """Append ``blocks``; with ``kept_end``, the last one is a growing code block, appended only up to there."""
        index = len(self._codes)
        for number, block in enumerate(blocks):
            end = block.end
            if block.code is None:
                first = self._insert(text_html(source[block.start:block.end]))
            elif kept_end is not None and number == len(blocks) - 1:  # growing: its complete chunks only
                end = kept_end
                first = self._insert_code(_code_lines(block, source, end), block.lang, index, self._chunks)
            else:
                first = self._insert_code(block.code, block.lang, index, None)
            index += block.code is not None
            self._paint(first, source, origins, block.start, end)

    def _append_lines(self, block: Block, source: str, origins: str, kept_end: int) -> None:
        """Append the lines of growing code ``block`` from ``kept_end`` on, into its box, as one more undo step."""
        lines = "\n".join(block.code.split("\n")[_kept_lines(block, source, kept_end):])
        if not lines:
            return  # nothing yet: the next update redoes the box
        frame = self.document.rootFrame().childFrames()[-1]

        def change() -> None:
            cursor = QTextCursor(self.document)
            cursor.setPosition(frame.lastPosition())
            first = cursor.blockNumber() + 1
            cursor.insertFragment(self._fragment(code_lines_html(lines, block.lang, self._theme)))
            self._paint(first, source, origins, kept_end, block.end)

        self._edit(change)
        self._open_steps = 2

    def _paint(self, first: int, source: str, origins: str, start: int, end: int) -> None:
        if self._tint and origins:
            paint_origins(self.document, first, source[start:end], origins[start:end], self._theme["draft_tint"])

    def _insert(self, html: str) -> int:
        """Append ``html`` after everything; returns the number of its first text block.

        An inserted fragment's first block merges into the block at the cursor and loses its own format (a
        paragraph's margins, a heading, a list item), except at the very start of the document. A table begins
        with an empty block, which can merge; any other fragment is given an empty first block to merge instead.
        """
        doc = self.document
        cursor = QTextCursor(doc)
        cursor.movePosition(QTextCursor.MoveOperation.End)
        first = 0 if doc.isEmpty() else doc.blockCount()
        if first == 0 or html.startswith("<table"):
            cursor.insertHtml(html)
        else:
            cursor.insertFragment(self._fragment(html))
        return first

    def _insert_code(self, code: str, lang: str, index: int, chunks: dict | None) -> int:
        """Append a code block's box: its header (language, Copy code) and ``code``; returns the header's block."""
        doc = self.document
        cursor = QTextCursor(doc)
        cursor.movePosition(QTextCursor.MoveOperation.End)
        at_start = doc.isEmpty()
        box = QTextFrameFormat()
        box.setBorder(1)
        box.setBorderBrush(QColor(self._theme["code_border"]))
        box.setBorderStyle(QTextFrameFormat.BorderStyle.BorderStyle_Solid)
        box.setPadding(CODE_PADDING)
        box.setBackground(QColor(self._theme["code_bg"]))
        box.setTopMargin(CODE_MARGINS[0])
        box.setBottomMargin(CODE_MARGINS[1])
        frame = cursor.insertFrame(box)
        # Qt keeps a text block after a frame (and before one that starts the document): empty, they would add a
        # blank line around the box
        collapsed = QTextBlockFormat()
        collapsed.setLineHeight(0, QTextBlockFormat.LineHeightTypes.FixedHeight.value)
        around = QTextCursor(doc)
        around.setPosition(frame.lastPosition() + 1)
        around.setBlockFormat(collapsed)
        if at_start:
            around.setPosition(0)
            around.setBlockFormat(collapsed)
        first = cursor.blockNumber()
        header = QTextBlockFormat()
        header.setBottomMargin(4)
        cursor.setBlockFormat(header)
        cursor.insertHtml(code_header_html(lang, index, self._theme))
        if code:
            cursor.insertFragment(self._fragment(code_lines_html(code, lang, self._theme, chunks)))
        return first

    def _fragment(self, html: str) -> QTextDocumentFragment:
        """``html`` as a fragment that starts with an empty block."""
        scratch = QTextDocument()
        scratch.setDefaultStyleSheet(self._style)
        scratch.setHtml(html)
        first = scratch.begin()
        block_format, char_format = first.blockFormat(), first.charFormat()
        cursor = QTextCursor(scratch)
        cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
        cursor.setBlockFormat(block_format)
        cursor.setBlockCharFormat(char_format)
        cursor.movePosition(QTextCursor.MoveOperation.Start)
        cursor.setBlockFormat(QTextBlockFormat())
        return QTextDocumentFragment(scratch)


def _code_start(source: str, block: Block) -> int:
    """Where the code of fenced ``block`` starts in ``source``: after its opening line (once that is complete)."""
    newline = source.find("\n", block.start, block.end)
    return block.end if newline < 0 else newline + 1


def _kept_lines(block: Block, source: str, kept_end: int) -> int:
    """How many code lines of ``block`` come before source offset ``kept_end``."""
    return source.count("\n", _code_start(source, block), kept_end)


def _kept_end(source: str, block: Block) -> int:
    """Where the complete chunks of growing code ``block`` end in ``source``: what stays in its box while it grows.

    Only lines followed by another line count (at least one line is left to replace), in whole chunks, so that
    what stays changes once every CODE_CHUNK_LINES lines.
    """
    lines = block.code.count("\n") + 1
    keep = (lines - 1) // CODE_CHUNK_LINES * CODE_CHUNK_LINES
    end = _code_start(source, block)
    for _ in range(keep):
        end = source.index("\n", end) + 1
    return end


def _code_lines(block: Block, source: str, kept_end: int) -> str:
    """The code lines of ``block`` before source offset ``kept_end``."""
    return "\n".join(block.code.split("\n")[:_kept_lines(block, source, kept_end)])


def paint_origins(doc: QTextDocument, first: int, source: str, origins: str, tint: str) -> None:
    """Tint the characters of text blocks ``first``.. of ``doc`` (the rendering of ``source``) that came from
    accepted draft tokens.

    Call it in the edit that inserted those blocks, before the document is laid out: the layout then takes the tint
    along, where tinting laid-out text would lay it out again. The code blocks' copy headers are not message text and
    are left alone.
    """
    blocks = []
    visible: list[str] = []
    block = doc.findBlockByNumber(first)
    while block.isValid():
        head = block.begin()
        if head.atEnd() or not head.fragment().charFormat().anchorHref().startswith(COPY_SCHEME):
            blocks.append(block)
            visible.append(block.text())
            visible.append("\n")  # the block break: matches the source's newline
        block = block.next()
    mapping = align_to_source("".join(visible), source + "\n")  # the last block break ends the source too
    fmt = QTextCharFormat()
    fmt.setBackground(QColor(tint))
    at = 0
    for block in blocks:
        ranges: list[QTextLayout.FormatRange] = []
        length = block.length() - 1
        start = None
        for offset in range(length + 1):  # one past the end closes the last run
            src = mapping[at + offset] if offset < length else None
            tinted = src is not None and src < len(origins) and origins[src] == DRAFT
            if tinted and start is None:
                start = offset
            elif not tinted and start is not None:
                r = QTextLayout.FormatRange()
                r.start, r.length, r.format = start, offset - start, fmt
                ranges.append(r)
                start = None
        at += length + 1
        block.layout().setFormats(ranges)


def tinted_text(doc: QTextDocument) -> str:
    """The characters of ``doc`` that carry an origin tint."""
    out = []
    block = doc.begin()
    while block.isValid():
        text = block.text()
        for r in block.layout().formats():
            out.append(text[r.start:r.start + r.length])
        block = block.next()
    return "".join(out)
