"""The responses ``/v1/responses`` keeps (``store``, true unless a request says false, as OpenAI's), each with the
conversation it answered: a request that names one as its ``previous_response_id`` goes on from there without sending
it again, and ``GET``/``DELETE /v1/responses/{id}`` find it.

They are kept in memory, the latest used first to stay, within a count and a size: none outlive the server, and a
follow-up to one that was let go is refused with a clear error rather than answered without its past. A kept
conversation is a tuple of the very item dicts of the one before it, so a long chain holds its text once.
"""
from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass

from core.serve.errors import RequestError

MAX_KEPT = 1024           # responses
MAX_CHARS = 64 * 2**20    # of their own input and output items, as JSON


@dataclass(frozen=True)
class Kept:
    response: dict              # as it was answered
    items: tuple[dict, ...]     # the conversation it answered (earlier turns included), then its output
    chars: int                  # the size of what it added: its own input and its output


class ResponseStore:
    """The kept responses by id, least recently used first."""

    def __init__(self, max_kept: int = MAX_KEPT, max_chars: int = MAX_CHARS) -> None:
        self.max_kept, self.max_chars = max_kept, max_chars
        self._kept: OrderedDict[str, Kept] = OrderedDict()
        self._chars = 0

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, response: dict, earlier: tuple[dict, ...], own: tuple[dict, ...]) -> None:
        """Keeps ``response``, which answered ``own`` input items after the ``earlier`` conversation."""
        output = tuple(response["output"])
        chars = len(json.dumps(own + output, ensure_ascii=False))
        self._kept[response["id"]] = Kept(response, earlier + own + output, chars)
        self._chars += chars
        while self._kept and (len(self._kept) > self.max_kept or self._chars > self.max_chars):
            self._chars -= self._kept.popitem(last=False)[1].chars

    def find(self, response_id: str, param: str | None = None) -> Kept:
        """The kept response ``response_id``; refused as OpenAI refuses it where none is kept: a 400 on the request
        naming it as its ``param``, a 404 on its own path."""
        kept = self._kept.get(response_id)
        if kept is None:
            why = (f"SpecLens keeps its latest responses in memory until it stops ({self.max_kept} at most, "
                   f"{self.max_chars // 2**20} MiB of their text), and none that asked 'store': false; send the "
                   "conversation as 'input' instead")
            if param:
                raise RequestError(f"Previous response with id '{response_id}' not found: {why}.", param=param,
                                   code="previous_response_not_found")
            raise RequestError(f"No response with id '{response_id}' found: {why}.", 404, kind="not_found_error")
        self._kept.move_to_end(response_id)
        return kept

    def forget(self, response_id: str) -> None:
        """Lets ``response_id`` go (404 where it is not kept)."""
        self._chars -= self.find(response_id).chars
        del self._kept[response_id]
