"""The window's side of serving: the Serve switch, where it listens and what waits (status bar), the requests being
decoded shown live in the viz panel, and a "Served" list of recent requests to open, replay and keep as chats."""
from __future__ import annotations

import re
import time

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QLabel, QListWidget, QListWidgetItem, QVBoxLayout, QWidget

from app.serve_host import ServeHost
from core.serve.job import ServedRecord
from core.serve.tools import names, split_calls


_VERSION = re.compile(r"/v?\d[\w.+-]*$")


def describe(record: ServedRecord) -> str:
    """One line of the Served list: when, who (the client's agent, else its address), how much, how fast, how much of
    the prediction was used, which tools the answer called."""
    result, usage = record.finished.result, record.finished.usage
    address, _, agent = record.client.partition(" ")
    # who asked: the agent's product without its version (claude-cli, codex_cli_rs, llama.vim's curl,
    # OpenAI/Python), which says more than a loopback address and its passing port
    who = _VERSION.sub("", agent.split(" ")[0]) if agent else address
    line = (f"{time.strftime('%H:%M:%S', time.localtime(record.started_at))}  {who}\n"
            f"{result.stats.new_tokens} tok · {result.stats.tokens_per_second:.1f} tok/s")
    details = usage.get("completion_tokens_details")
    if details:
        line += f" · {details['accepted_prediction_tokens']} predicted tokens used"
    if record.request.tools:
        _, calls = split_calls(record.finished.text, names(record.request.tools))
        line += f" · called {', '.join(call.name for call in calls)}" if calls else ""
    if record.finished.finish_reason == "cancelled":
        line += " · cancelled"
    return line


class ServedList(QWidget):
    """Recent served requests, newest first; clicking one asks to open it."""

    open_requested = Signal(object)   # ServedRecord

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Sidebar")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 8)
        title = QLabel("SERVED")
        title.setObjectName("SidebarTitle")
        title.setToolTip("Requests from editors and OpenAI clients while Serve is on; click one to open it "
                         "(it is kept in the history only if you keep it)")
        layout.addWidget(title)
        self.empty = QLabel("Serve is off.")
        self.empty.setObjectName("HelpLine")
        self.empty.setWordWrap(True)
        layout.addWidget(self.empty)
        self.list = QListWidget()
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setWordWrap(True)
        self.list.itemClicked.connect(lambda item: self.open_requested.emit(item.data(Qt.ItemDataRole.UserRole)))
        layout.addWidget(self.list, 1)

    def add(self, record: ServedRecord) -> None:
        item = QListWidgetItem(describe(record))
        item.setData(Qt.ItemDataRole.UserRole, record)
        item.setToolTip(f"{record.client}\n{describe(record)}\nClick to open it like a chat (kept only if you keep it)")
        self.list.insertItem(0, item)
        self.empty.setVisible(False)

    def set_state(self, text: str) -> None:
        self.empty.setText(text)
        self.empty.setVisible(self.list.count() == 0)


class ServeControl(QObject):
    """Wires the Serve switch: starts and stops the server on the session's models, reports where it listens and
    how many wait, and feeds served requests to the live view when the chat is not answering."""

    status = Signal(str)       # the status-bar line (empty when off)
    error = Signal(str, str)   # title, text

    def __init__(self, session, viz, served: ServedList, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.session, self.viz, self.served = session, viz, served
        self.host = ServeHost(self)
        self._live = False   # the viz panel shows a served request
        monitor = self.host.monitor
        monitor.started_request.connect(self._started, Qt.ConnectionType.QueuedConnection)
        monitor.frame.connect(self._frame, Qt.ConnectionType.QueuedConnection)
        monitor.served.connect(self._served, Qt.ConnectionType.QueuedConnection)
        monitor.queue_changed.connect(self._queue, Qt.ConnectionType.QueuedConnection)

    @property
    def running(self) -> bool:
        return self.host.running

    def set_serving(self, on: bool) -> bool:
        """Switch serving on or off; False (with the reason shown) when it could not be switched on."""
        if not on:
            self.host.stop()
            self.status.emit("")
            self.served.set_state("Serve is off.")
            return True
        if self.session.backends is None:
            self.error.emit("Serve", "The models are not loaded yet: switch Serve on once they are.")
            return False
        target = self.session.backends[0]
        port = self.session.settings.serve_port
        try:
            self.host.start(self.session.backends, _model_name(target), port)
        except OSError as exc:
            self.error.emit("Serve", f"Cannot serve on port {port}: {exc}. Choose another port in Settings.")
            return False
        self._queue(0, 0)
        self.served.set_state(f"Waiting for requests at {self.host.url}")
        return True

    def _queue(self, waiting: int, running: int) -> None:
        if self.host.running:
            self.status.emit(f"Serving {self.host.url} · {running} decoding, {waiting} waiting")

    def _started(self, client: str, strategy: str) -> None:
        self._live = not self.session.busy
        if self._live:
            self.viz.on_generation_started(f"served ({client.split(' ')[0]}): {strategy}")

    def _frame(self, events: tuple) -> None:
        if self._live:
            self.viz.on_steps(events)

    def _served(self, record: ServedRecord) -> None:
        if self._live:
            self.viz.on_finished(record.finished.result)
            self._live = False
        self.served.add(record)


def _model_name(target) -> str:
    from core.serve.cli import model_name

    return model_name(target)
