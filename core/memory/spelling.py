"""What a tokenizer spells: the text of a token, and the tokens of a short text, each asked once.

Memory drafts token ids, and an edit learnt on one token does not reach another token spelling the same name: a
rename of the parameter ``p`` learnt where the text wrote `` price`` for `` p`` leaves ``round(p`` as it was, for
``(p`` is another token. core.memory.substitutions reads the names a learnt edit renames from their text, and spells
the other tokens holding them anew. A tokenizer that cannot say (a scripted target without a vocabulary) spells
nothing, and no edit is carried further than its own tokens.
"""
from __future__ import annotations

from typing import Callable, Sequence


class Spelling:
    """``detokenize(ids) -> str`` and ``tokenize(text) -> ids`` of one tokenizer (a backend's own), cached."""

    def __init__(self, detokenize: Callable[[Sequence[int]], str], tokenize: Callable[[str], Sequence[int]]) -> None:
        self._detokenize, self._tokenize = detokenize, tokenize
        self._texts: dict[int, str] = {}
        self._tokens: dict[str, tuple[int, ...] | None] = {}

    @classmethod
    def of(cls, tokenizer) -> "Spelling":
        """The spelling of anything with ``detokenize`` and ``tokenize`` (a Backend)."""
        return cls(tokenizer.detokenize, tokenizer.tokenize)

    def text(self, token: int) -> str:
        """The token's text ("" when the tokenizer cannot say)."""
        text = self._texts.get(token)
        if text is None:
            try:
                text = str(self._detokenize([token]))
            except Exception:  # a token the tokenizer cannot spell is spelt as nothing
                text = ""
            self._texts[token] = text
        return text

    def texts(self, tokens: Sequence[int]) -> str:
        return "".join(self.text(t) for t in tokens)

    def tokens(self, text: str) -> tuple[int, ...] | None:
        """The tokens of ``text`` (None when the tokenizer cannot say)."""
        if text not in self._tokens:
            try:
                found = tuple(int(t) for t in self._tokenize(text))
            except Exception:  # a scripted target tokenizes nothing: nothing is spelt anew
                found = None
            self._tokens[text] = found or None
        return self._tokens[text]
