"""Where the Markdown blocks of a message begin and end, so that a growing answer re-renders only its last block.

A block is a paragraph (a table is one), a list, a heading, a rule, a block quote, indented code or fenced code.
Splitting reads whole lines and decides a boundary from the lines up to it, never from later ones; so once the lines
that decide a boundary are complete (ended by a newline), no text appended later can move it, and the blocks before
it are final. The last line of a streaming answer is still being written: it is read as if complete only to render
the open part, and nothing it decides counts as final. After a boundary the scan starts afresh, so splitting from a
resume point gives the same blocks as splitting the whole text.

Fenced code may be indented (models put it inside list items) and then interrupts the list, as CommonMark does for a
fence less indented than the item's text; lists and tables may start right under a paragraph line, which
Python-Markdown alone would leave in the paragraph.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE = re.compile(r"^([ \t]*)(`{3,}|~{3,})[ \t]*(.*)$")
_HEADING = re.compile(r"^ {0,3}#{1,6}(?:[ \t]|$)")
_RULE = re.compile(r"^ {0,3}(?:(?:-[ \t]*){3,}|(?:\*[ \t]*){3,}|(?:_[ \t]*){3,})$")
_UNDERLINE = re.compile(r"^ {0,3}(?:=+|-+)[ \t]*$")  # a setext heading's second line
_ITEM = re.compile(r"^[ \t]*(?:[-*+]|\d{1,9}[.)])(?:[ \t]|$)")
_STARTS_LIST = re.compile(r"^ {0,3}(?:[-*+]|1[.)])[ \t]+\S")  # an item that may interrupt a paragraph (CommonMark)
_QUOTE = re.compile(r"^ {0,3}>")


@dataclass(frozen=True)
class Block:
    """One block: its source is ``source[start:end]``; fenced code also carries its code and language."""

    start: int
    end: int
    code: str | None = None  # fenced code without fences and without the fence's indentation
    lang: str = ""


@dataclass(frozen=True)
class Split:
    """The blocks from a resume point on: the first ``finished`` are final, the rest are the open part.

    ``resume`` is where the next split of a longer text may start: the start of the open part, or past the last
    complete line when nothing is open.
    """

    blocks: tuple[Block, ...]
    finished: int
    resume: int


def _fence(line: str) -> tuple[int, str, str] | None:
    """(indentation, marker, language) when ``line`` opens fenced code."""
    match = _FENCE.match(line)
    if not match or (match.group(2)[0] == "`" and "`" in match.group(3)):  # ```x``` on one line is inline code
        return None
    info = match.group(3).split()
    return len(match.group(1).expandtabs(4)), match.group(2), info[0] if info else ""


def _blank(line: str) -> bool:
    return not line.strip()


def _indented(line: str, spaces: int) -> bool:
    return line.startswith(" " * spaces) or line.startswith("\t")


class _Scanner:
    """Reads lines one at a time and closes a block as soon as a line shows that it ended."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.blocks: list[Block] = []
        self.kind: str | None = None  # "para", "list", "quote", "indented", "fence"; None between blocks
        self.start = 0                # the current block's first line
        self.end = 0                  # the end of its last line that is not blank (of any line, in a fence)
        self.after_blank = False      # a list or indented code followed by a blank line
        self.fence = ""               # the open fence's marker ("```", "~~~~"...)
        self.indent = 0               # the open fence's indentation, removed from its code lines
        self.lang = ""
        self.code_start = 0           # where the open fence's code begins
        self.closed = False           # the fence's closing line was read

    def line(self, a: int, b: int) -> None:
        """Read the line ``source[a:b]`` (without its newline)."""
        text = self.source[a:b]
        if self.kind is not None and self._continues(text, b):
            return
        self.close()
        self._begin(text, a, b)

    def _continues(self, text: str, b: int) -> bool:
        """Whether ``text`` belongs to the current block (which it may also close); False: a new block starts."""
        kind = self.kind
        if kind == "fence":
            self.end = b
            stripped = text.strip()
            if stripped.startswith(self.fence) and not stripped.strip(self.fence[0]):
                self.closed = True
                self.close()
            return True
        if _blank(text):
            if kind in ("list", "indented"):
                self.after_blank = True
            else:
                self.close()
            return True
        if _fence(text):
            return False
        if kind == "indented":
            return self._extend(_indented(text, 4), b)
        if kind == "list":
            if self.after_blank:
                return self._extend(_indented(text, 2) or bool(_ITEM.match(text)), b)
            return self._extend(not (_HEADING.match(text) or _RULE.match(text)), b)
        if kind == "quote":
            return self._extend(not (_HEADING.match(text) or _RULE.match(text)), b)
        # a paragraph: a setext underline ends it; a heading, rule, quote, list or table after prose starts a block
        if _UNDERLINE.match(text):
            self.end = b
            self.close()
            return True
        last_line = self.source[self.source.rfind("\n", 0, self.end) + 1:self.end]
        table_starts = text.lstrip().startswith("|") and not last_line.lstrip().startswith("|")
        interrupted = (_HEADING.match(text) or _RULE.match(text) or _QUOTE.match(text) or _STARTS_LIST.match(text)
                       or table_starts)
        return self._extend(not interrupted, b)

    def _extend(self, belongs: bool, b: int) -> bool:
        if belongs:
            self.end = b
            self.after_blank = False
        return belongs

    def _begin(self, text: str, a: int, b: int) -> None:
        if _blank(text):
            return
        self.start, self.end, self.after_blank = a, b, False
        fence = _fence(text)
        if fence:
            self.kind, self.closed = "fence", False
            self.indent, self.fence, self.lang = fence
            self.code_start = b + 1
        elif _HEADING.match(text) or _RULE.match(text):
            self.kind = "para"
            self.close()
        elif _ITEM.match(text):
            self.kind = "list"
        elif _QUOTE.match(text):
            self.kind = "quote"
        elif _indented(text, 4):
            self.kind = "indented"
        else:
            self.kind = "para"

    def close(self, end: int | None = None, typing: bool = False) -> None:
        """End the current block, at ``end`` if given. ``typing``: its last line is being written, so a closing fence
        that is not complete yet is not shown as code."""
        if self.kind is None:
            return
        if end is not None:
            self.end = end
        code = None
        if self.kind == "fence":
            lines = self.source[self.code_start:self.end].split("\n") if self.end >= self.code_start else [""]
            partial_fence = typing and lines[-1].strip() and not lines[-1].strip().strip(self.fence[0])
            if self.closed or partial_fence:
                lines.pop()
            code = "\n".join(_dedent(line, self.indent) for line in lines)
        self.blocks.append(Block(self.start, self.end, code, self.lang if code is not None else ""))
        self.kind = None


def _dedent(line: str, spaces: int) -> str:
    """``line`` without up to ``spaces`` columns of leading indentation."""
    i = 0
    while i < len(line) and i < spaces and line[i] == " ":
        i += 1
    return line[i:]


def split_blocks(source: str, start: int = 0, final: bool = True) -> Split:
    """The blocks of ``source`` from ``start`` (0, or the ``resume`` of an earlier split of a prefix of ``source``).

    ``final``: the text is complete, so its last line is too and every block is final. Otherwise the last line (if
    not ended by a newline) and the block it belongs to are the open part.
    """
    scanner = _Scanner(source)
    pos, n = start, len(source)
    while True:
        newline = source.find("\n", pos)
        if newline < 0:
            break
        scanner.line(pos, newline)
        pos = newline + 1
    finished = len(scanner.blocks)
    resume = scanner.start if scanner.kind is not None else pos
    if pos < n:
        scanner.line(pos, n)  # the last line, read as if complete
    if final:
        scanner.close()
        return Split(tuple(scanner.blocks), len(scanner.blocks), n)
    scanner.close(end=n, typing=True)
    return Split(tuple(scanner.blocks), finished, resume)
