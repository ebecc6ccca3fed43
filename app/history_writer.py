"""Writes to the chat history in order, on a thread of their own, and never loses a message to a history error.

The GUI thread only queues writes; one writer thread runs them, one after another, on its own connection to the file.
So neither a slow disk nor another program holding the file's write lock ever stops the window: a lock is waited for
on the writer thread (retrying every second, with a status line), and whatever was queued meanwhile is written in
order once the lock is gone. Streaming answers are batched: their text is queued at most once a second (and at once
when asked, e.g. when an answer ends), so a streaming answer costs one SQLite transaction a second rather than one per
step, and a crash loses at most the last second. A read-only history stops writing and says so once; any other error
is reported and that write dropped — the text itself stays in the window.

Writes are functions of the writer's HistoryStore, queued on the GUI thread and run on the writer thread. Ids that an
earlier queued write assigns (a new conversation's, a new message's) are read inside the later write, when it runs.
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import replace
from typing import Callable

from PySide6.QtCore import QObject, QTimer, Signal

from app.chat.history import (Conversation, DeletedElsewhereError, HistoryError, HistoryLockedError,
                              HistoryReadOnlyError, HistoryReplacedError, HistoryStore, Message)

log = logging.getLogger(__name__)

FLUSH_MS = 1000
RETRY_S = 1.0
Write = Callable[[HistoryStore], None]


class HistoryWriter(QObject):
    """A queue of writes to the history file at ``store.path``, run in order on the writer thread."""

    failed = Signal(str, str)      # title, text: for a dialog
    status = Signal(str)           # a passing line (a lock being waited for)
    deleted_elsewhere = Signal()   # the open conversation was deleted in another window
    reopened = Signal()            # another window repaired and replaced the file: the reader should reopen it too
    created = Signal(object, int)  # a Conversation written for the first time, and the id it had until then
    listed = Signal()              # a write that changes the list of conversations (a title, a deletion) is done
    saved = Signal()               # everything queued so far is written (or given up)

    def __init__(self, store: HistoryStore, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._source = store
        self._store: HistoryStore | None = None   # the writer thread's own connection, opened there
        self._updates: dict[int, Message] = {}    # id(message) -> message: streaming answers, queued together
        self._ops: deque[tuple[str, Write, bool]] = deque()
        self._running = 0                         # writes taken off the queue and not yet done with
        self._cond = threading.Condition()
        self._closing = False
        self._read_only_told = False
        self._timer = QTimer(self)
        self._timer.setInterval(FLUSH_MS)
        self._timer.timeout.connect(self.flush)
        self._thread = threading.Thread(target=self._work, name="speclens-history", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Writes not yet done with: queued, running, and answer text waiting for its next batch."""
        with self._cond:
            return len(self._ops) + self._running + len(self._updates)

    def run(self, what: str, write: Write, listed: bool = False) -> None:
        """Queue ``write`` (named ``what`` in error messages) behind the earlier ones; ``listed``: it changes the
        list of conversations, so ``listed`` is emitted once it is written."""
        with self._cond:
            self._ops.append((what, write, listed))
            self._cond.notify_all()

    def create(self, conversation: Conversation) -> None:
        """Queue the writing of a conversation that exists only in the window so far (its id a negative
        placeholder); the writes queued after it find its stored id in ``conversation.id``."""
        placeholder = conversation.id

        def write(store: HistoryStore) -> None:
            conversation.id = store.create_conversation(conversation.title, conversation.system_prompt)
            self.created.emit(conversation, placeholder)

        self.run("the new conversation", write)

    def update(self, message: Message) -> None:
        """The message's text, origins or stats changed: store it within a second."""
        self._updates[id(message)] = message
        if not self._timer.isActive():
            self._timer.start()

    def flush(self) -> None:
        """Queue the answers' latest text now (a copy: the window goes on changing them while the writer writes)."""
        self._timer.stop()
        if not self._updates:
            return
        latest = [(m, replace(m)) for m in self._updates.values()]
        self._updates.clear()

        def write(store: HistoryStore) -> None:
            copies = []
            for message, copy in latest:
                copy.id = message.id   # given by its add_message, which ran before this
                if copy.id is not None:
                    copies.append(copy)
            if copies:
                store.update_messages(copies)

        self.run("the answer", write)

    def wait(self, timeout_s: float) -> bool:
        """Queue the answers' latest text and wait up to ``timeout_s`` for everything to be written; True when it
        was."""
        self.flush()
        with self._cond:
            return self._cond.wait_for(lambda: not self._ops and not self._running, timeout_s)

    def close(self, timeout_s: float) -> bool:
        """Write what is queued (waiting up to ``timeout_s``), then stop the thread; False when writes are left (a
        lock that did not go): they are lost when the process ends, unless the caller keeps it running."""
        done = self.wait(timeout_s)
        if done:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
            self._thread.join(timeout_s)
        return done

    # -- the writer thread ---------------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._ops or self._closing)
                if not self._ops:   # closing, and nothing is left
                    break
                what, write, listed = self._ops.popleft()
                self._running = 1
            while not self._attempt(what, write):   # a lock: the same write again, after a pause
                with self._cond:
                    self._cond.wait(RETRY_S)
            if listed:
                self.listed.emit()
            with self._cond:
                self._running = 0
                idle = not self._ops
                self._cond.notify_all()
            if idle:
                self.saved.emit()
        if self._store is not None:
            self._store.close()

    def _attempt(self, what: str, write: Write) -> bool:
        """Run one write; False when it must wait (a lock, a file to reopen), True when it is done with (written, or
        given up)."""
        try:
            if self._store is None:
                self._store = self._source.alongside()
            if self._store.read_only:
                self._tell_read_only()
                return True
            write(self._store)
        except HistoryLockedError as exc:
            self.status.emit(f"{exc} (retrying every second; nothing is lost)")
            return False
        except HistoryReadOnlyError:
            self._tell_read_only()
        except HistoryReplacedError:
            self._store.close()
            self._store = None   # the next attempt opens the file now at the path
            self.reopened.emit()
            return False
        except DeletedElsewhereError as exc:
            log.warning("%s: %s", what, exc)
            self.deleted_elsewhere.emit()
        except HistoryError as exc:
            log.warning("could not save %s: %s", what, exc)
            self.failed.emit("Chat history", f"Could not save {what}: {exc}\n\nThe text stays in the window; "
                                             "copy or export it to keep it.")
        except Exception as exc:   # the writer thread outlives any bug in one write
            log.exception("could not save %s", what)
            self.failed.emit("Chat history", f"Could not save {what}: {exc}")
        return True

    def _tell_read_only(self) -> None:
        if not self._read_only_told:
            self._read_only_told = True
            self.failed.emit("Chat history", f"The chat history at {self._source.path} is read-only: new messages "
                                             "are shown but not saved. Export a chat to keep it.")
