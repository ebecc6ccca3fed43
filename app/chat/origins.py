"""Where each character of an answer came from (accepted draft token, or the target's own), and where each
character of a rendered message comes from in its source, so that the tint of draft tokens survives Markdown.

Codes: "d" an accepted draft token, "t" a target token, " " unknown; one per character of a message's source.
"""
from __future__ import annotations

from core.events import Origin, StepEvent

DRAFT, TARGET, UNKNOWN = "d", "t", " "
ORIGIN_CODE = {Origin.DRAFT: DRAFT, Origin.CORRECTION: TARGET, Origin.BONUS: TARGET}
_LOOKAHEAD = 40  # markdown syntax hidden between two visible characters is shorter than this (fences, emphasis)
_RESYNC = 400    # at most this much hidden text (a link's address) before the next visible character
_SYNTAX = set("`*_~#>|[]()-:!.0123456789")  # characters Markdown may hide (markers, list numbers, table rules)


def origin_codes(event: StepEvent, start: int, end: int) -> str:
    """One origin code per character ``start..end`` of the answer (the text this step added), from the step's
    character spans."""
    codes = [UNKNOWN] * (end - start)
    for (a, b), origin in zip(event.spans, event.origins):
        for i in range(max(a, start), min(b, end)):
            codes[i - start] = ORIGIN_CODE[origin]
    return "".join(codes)


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
