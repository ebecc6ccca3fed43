"""Writes to the chat history in order, batched, and never loses a message to a history error.

Writes are queued and run at most once a second (and at once when asked, e.g. when an answer ends), so a streaming
answer costs one SQLite transaction a second rather than one per step, and a crash loses at most the last second.
A locked history (another SpecLens window) keeps the queue and retries; a read-only one stops writing and says so
once; any other error is reported and that write dropped — the text itself stays in the window.
"""
from __future__ import annotations

import logging
from typing import Callable

from PySide6.QtCore import QObject, QTimer, Signal

from app.chat.history import (DeletedElsewhereError, HistoryError, HistoryLockedError, HistoryReadOnlyError,
                              HistoryReplacedError, HistoryStore, Message)

log = logging.getLogger(__name__)

FLUSH_MS = 1000


class HistoryWriter(QObject):
    """A queue of writes to one HistoryStore, flushed by a 1 s timer or by :meth:`flush`."""

    failed = Signal(str, str)      # title, text: for a dialog
    status = Signal(str)           # a passing line (a lock being waited for)
    deleted_elsewhere = Signal()   # the open conversation was deleted in another window
    reopened = Signal(object)      # the new HistoryStore, after another window repaired and replaced the file

    def __init__(self, store: HistoryStore, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self._queue: list[tuple[str, Callable[[], None]]] = []
        self._updates: dict[int, Message] = {}   # id(message) -> message: streaming answers, written together
        self._read_only_told = False
        self._timer = QTimer(self)
        self._timer.setInterval(FLUSH_MS)
        self._timer.timeout.connect(self.flush)

    @property
    def pending(self) -> int:
        return len(self._queue) + len(self._updates)

    def run(self, what: str, write: Callable[[], None]) -> None:
        """Queue ``write`` (named ``what`` in error messages) behind the earlier ones and try the queue now."""
        self._queue.append((what, write))
        self.flush()

    def update(self, message: Message) -> None:
        """The message's text, origins or stats changed: store it within a second."""
        self._updates[id(message)] = message
        if not self._timer.isActive():
            self._timer.start()

    def flush(self) -> bool:
        """Write everything queued, in order; True when nothing is left."""
        while self._queue:
            what, write = self._queue[0]
            if not self._attempt(what, write):
                return False
            self._queue.pop(0)
        if self._updates:
            ready = [m for m in self._updates.values() if m.id is not None]
            if ready and not self._attempt("the answer", lambda: self.store.update_messages(ready)):
                return False
            for m in ready:
                self._updates.pop(id(m), None)
        if not self.pending:
            self._timer.stop()
        return not self.pending

    def _attempt(self, what: str, write: Callable[[], None]) -> bool:
        """Run one write; False when it must wait (a lock), True when it is done with (written, or given up)."""
        if self.store.read_only:
            self._tell_read_only()
            return True
        try:
            write()
        except HistoryLockedError as exc:
            self.status.emit(f"{exc} (retrying every second)")
            self._timer.start()
            return False
        except HistoryReadOnlyError:
            self._tell_read_only()
        except HistoryReplacedError:
            self._reopen()
            return False
        except DeletedElsewhereError as exc:
            log.warning("%s: %s", what, exc)
            self.deleted_elsewhere.emit()
        except HistoryError as exc:
            log.warning("could not save %s: %s", what, exc)
            self.failed.emit("Chat history", f"Could not save {what}: {exc}\n\nThe text stays in the window; "
                                             "copy or export it to keep it.")
        return True

    def _reopen(self) -> None:
        """Another window moved the file aside and put a repaired one in its place: write to the new file."""
        try:
            self.store.close()
            self.store = HistoryStore(self.store.path)
        except HistoryError as exc:
            self.failed.emit("Chat history", f"Could not reopen the chat history: {exc}")
            return
        self.reopened.emit(self.store)
        self._timer.start()

    def _tell_read_only(self) -> None:
        if not self._read_only_told:
            self._read_only_told = True
            self.failed.emit("Chat history", f"The chat history at {self.store.path} is read-only: new messages are "
                                             "shown but not saved. Export a chat to keep it.")
