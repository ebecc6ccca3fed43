"""GPT-2's byte-level vocabulary symbols (those of Qwen, Llama 3 and most BPE tokenizers): each byte is spelled as
one printable character, so a token's symbol reads back to the exact bytes it stands for, even where a character is
split over tokens and no text can show the part."""
from __future__ import annotations

import re
from functools import lru_cache

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")    # SentencePiece's byte fallback, one byte per token


@lru_cache(maxsize=1)
def byte_symbols() -> tuple[str, ...]:
    """The symbol of each byte, in byte order: printable Latin-1 bytes stand for themselves, the rest are shifted
    past 255."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    table, extra = [], 0
    for b in range(256):
        if b in printable:
            table.append(chr(b))
        else:
            table.append(chr(256 + extra))
            extra += 1
    return tuple(table)


@lru_cache(maxsize=1)
def _byte_of() -> dict[str, int]:
    return {symbol: b for b, symbol in enumerate(byte_symbols())}


def symbol_bytes(symbol: str) -> bytes | None:
    """The bytes a vocabulary ``symbol`` spells, read as byte-level symbols or as a byte-fallback token; None where
    it is neither."""
    byte = _BYTE_TOKEN.fullmatch(symbol)
    if byte:
        return bytes([int(byte.group(1), 16)])
    table = _byte_of()
    if not all(c in table for c in symbol):
        return None
    return bytes(table[c] for c in symbol)
