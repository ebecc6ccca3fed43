"""The main window: conversations on the left, the chat in the middle, the live view on the right, a status bar.

The GUI thread only renders: models load on a QThread (ModelLoader) and the engine runs on another (EngineWorker);
both report through queued signals carrying immutable data. Every step of an answer is written to the history as it
arrives, so nothing already shown is lost if the app dies.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import shiboken6
from PySide6.QtCore import Qt, QThread, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import (QApplication, QHBoxLayout, QLabel, QLineEdit, QMainWindow, QMessageBox, QProgressBar,
                               QPushButton, QSizePolicy, QSplitter, QToolBar, QVBoxLayout, QWidget)

from app.chat.history import Conversation, HistoryError, HistoryStore, Message
from app.chat.loader import ModelLoader, load_backends
from app.chat.message_view import BUSY_REASON, MessageCard, MessageList
from app.chat.prompt_edit import PromptEdit
from app.chat.render import step_origin_codes
from app.chat.sidebar import ConversationSidebar, ask_export_path
from app.chat.stats import stats_record
from app.compare.compare_widget import race_from_window
from app.settings import AppSettings, SettingsError, save_settings
from app.settings_dialog import SettingsDialog
from app.theme import Theme, apply_theme
from app.viz.panel import VizPanel
from app.worker import EngineWorker, start_worker
from core.engine import SpeculativeEngine
from core.events import GenerationResult, StepEvent
from core.sampling import SamplingError

TITLE_CHARS = 48
RENDER_INTERVAL_MS = 60  # re-render a streaming answer at most ~16 times a second; saving happens every step


@dataclass
class _Stream:
    """The answer being generated."""

    worker: EngineWorker
    thread: QThread
    message: Message
    card: MessageCard
    strategy: str


class MainWindow(QMainWindow):
    """The SpecLens chat window. ``load`` turns a PairChoice into (target, draft) backends (off the GUI thread)."""

    models_loaded = Signal()
    answer_updated = Signal(object)       # StepEvent, after the window showed and saved it
    generation_finished = Signal(object)  # GenerationResult, or None when the engine failed
    message_shown = Signal(str, str)      # title, text of an error or notice dialog

    def __init__(self, settings: AppSettings, store: HistoryStore, load=load_backends, persist: bool = True) -> None:
        super().__init__()
        self.settings = settings
        self.store = store
        self._load = load
        self._persist = persist
        self.theme: Theme = apply_theme(QApplication.instance(), settings.theme)
        self.backends: tuple | None = None
        self.conv: Conversation | None = None
        self.cards: list[MessageCard] = []
        self._stream: _Stream | None = None
        self._loader: ModelLoader | None = None
        self._threads: set[QThread] = set()
        self._editing: Message | None = None
        self._closing = False
        self.dialogs: list[QMessageBox] = []
        self.setWindowTitle("SpecLens")
        self.resize(1440, 880)
        self._build()
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(RENDER_INTERVAL_MS)
        self._render_timer.timeout.connect(self._render_stream)
        self.refresh_conversations()
        self.prompt.setFocus()
        if store.notice:
            self.show_message("Chat history", store.notice, QMessageBox.Icon.Warning)
        self._update_status()
        self._update_actions()

    # ----------------------------------------------------------------- layout
    def _build(self) -> None:
        toolbar = QToolBar("Main", self)
        toolbar.setMovable(False)
        self.addToolBar(toolbar)
        self.new_action = self._action(toolbar, "New chat", "Ctrl+N", self.new_chat)
        self.settings_action = self._action(toolbar, "Settings", "Ctrl+,", self.open_settings)
        self.race_action = self._action(toolbar, "Race vs plain", "Ctrl+R", lambda: race_from_window(self))
        self.theme_action = self._action(toolbar, self._theme_action_text(), None, self.toggle_theme)
        self.origins_action = self._action(toolbar, "Highlight draft tokens", None, self._toggle_origins)
        self.origins_action.setCheckable(True)
        self.origins_action.setChecked(self.settings.color_origins)
        self.legend = QLabel()
        self.legend.setObjectName("Legend")
        toolbar.addWidget(self.legend)
        spacer = QWidget()
        spacer.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        toolbar.addWidget(spacer)
        self.export_json_action = self._action(toolbar, "Export JSON", None, lambda: self._ask_export("json"))
        self.export_md_action = self._action(toolbar, "Export Markdown", None, lambda: self._ask_export("md"))

        self.sidebar = ConversationSidebar()
        self.sidebar.open_requested.connect(self.open_conversation)
        self.sidebar.new_requested.connect(self.new_chat)
        self.sidebar.rename_requested.connect(self.rename_conversation)
        self.sidebar.delete_requested.connect(self.delete_conversation)
        self.sidebar.export_requested.connect(self.export_conversation)
        self.conv_list, self.new_button = self.sidebar.list, self.sidebar.new_button

        chat = QWidget()
        column = QVBoxLayout(chat)
        column.setContentsMargins(0, 0, 0, 8)
        column.setSpacing(6)
        system_row = QHBoxLayout()
        system_row.setContentsMargins(16, 8, 16, 0)
        system_row.addWidget(QLabel("System prompt"))
        self.system_edit = QLineEdit()
        self.system_edit.setPlaceholderText("Optional: instructions the model follows in this chat")
        self.system_edit.editingFinished.connect(self._system_prompt_edited)
        system_row.addWidget(self.system_edit, 1)
        column.addLayout(system_row)
        self.messages = MessageList()
        column.addWidget(self.messages, 1)
        self.edit_banner = QLabel("Editing a sent message: Enter resends it (later messages are replaced), "
                                  "Esc cancels.")
        self.edit_banner.setObjectName("EditBanner")
        self.edit_banner.setContentsMargins(18, 0, 18, 0)
        self.edit_banner.setVisible(False)
        column.addWidget(self.edit_banner)
        input_row = QHBoxLayout()
        input_row.setContentsMargins(16, 0, 16, 0)
        self.prompt = PromptEdit()
        self.prompt.submitted.connect(self.send)
        input_row.addWidget(self.prompt, 1)
        buttons = QVBoxLayout()
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("PrimaryButton")
        self.send_button.clicked.connect(lambda: self.send(self.prompt.toPlainText()))
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("StopButton")
        self.stop_button.setToolTip("Stop the answer after the current step (Esc)")
        self.stop_button.clicked.connect(self.stop)
        for button in (self.send_button, self.stop_button):
            button.setMinimumWidth(96)  # room for "Resend" without the layout jumping
            buttons.addWidget(button)
        buttons.addStretch(1)
        input_row.addLayout(buttons)
        column.addLayout(input_row)

        self.viz = VizPanel()
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(self.sidebar)
        self.splitter.addWidget(chat)
        self.splitter.addWidget(self.viz)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 3)
        self.splitter.setStretchFactor(2, 2)
        self.splitter.setSizes([230, 690, 520])
        self.setCentralWidget(self.splitter)

        bar = self.statusBar()
        self.pair_label, self.backend_label, self.device_label, self.strategy_label, self.speed_label = (
            QLabel() for _ in range(5))
        for label in (self.pair_label, self.backend_label, self.device_label, self.strategy_label):
            bar.addWidget(label)
        self.progress = QProgressBar()
        self.progress.setFixedWidth(220)
        self.progress.setVisible(False)
        self.progress_label = QLabel()
        bar.addPermanentWidget(self.progress_label)
        bar.addPermanentWidget(self.progress)
        bar.addPermanentWidget(self.speed_label)
        escape = QShortcut(QKeySequence(Qt.Key.Key_Escape), self)
        escape.setContext(Qt.ShortcutContext.WindowShortcut)
        escape.activated.connect(self._escape)
        self._update_legend()

    def _action(self, toolbar: QToolBar, text: str, shortcut: str | None, slot) -> QAction:
        action = QAction(text, self)
        if shortcut:
            action.setShortcut(QKeySequence(shortcut))
            action.setToolTip(f"{text} ({shortcut})")
        action.triggered.connect(slot)
        toolbar.addAction(action)
        return action

    # ----------------------------------------------------------------- messages to the user
    def show_message(self, title: str, text: str, icon=QMessageBox.Icon.Critical) -> QMessageBox:
        """A non-blocking dialog (errors never go into the token stream)."""
        box = QMessageBox(icon, title, text, QMessageBox.StandardButton.Ok, self)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.finished.connect(lambda _=0, b=box: self.dialogs.remove(b) if b in self.dialogs else None)
        self.dialogs.append(box)
        box.open()
        self.message_shown.emit(title, text)
        return box

    # ----------------------------------------------------------------- models
    def load_models(self) -> None:
        """Load the pair the settings name, off the GUI thread, with a progress bar; Send waits for it."""
        try:
            choice = self.settings.pair_choice()
        except SettingsError as exc:
            self.show_message("Model pair", str(exc))
            return
        if self._loader is not None:
            self._loader.cancel()
        self.backends = None
        loader = ModelLoader(choice, self._load)
        loader.progress.connect(self._on_load_progress, Qt.ConnectionType.QueuedConnection)
        loader.finished.connect(self._on_loaded, Qt.ConnectionType.QueuedConnection)
        loader.failed.connect(self._on_load_failed, Qt.ConnectionType.QueuedConnection)
        self._loader = loader
        self.progress.setRange(0, 0)
        self.progress.setVisible(True)
        self.progress_label.setText(f"Loading {choice.label}…")
        self._track(start_worker(loader, self))
        self._update_status()
        self._update_actions()

    def _on_load_progress(self, fraction: float, message: str) -> None:
        if self.sender() is not self._loader:
            return
        self.progress.setRange(0, 1000)
        self.progress.setValue(int(fraction * 1000))
        if message:
            self.progress_label.setText(message)

    def _on_loaded(self, payload) -> None:
        if self.sender() is not self._loader:
            return
        _choice, backends = payload
        self.backends = backends
        self._loader = None
        self.progress.setVisible(False)
        self.progress_label.setText("")
        self._update_status()
        self._update_actions()
        self.models_loaded.emit()

    def _on_load_failed(self, message: str) -> None:
        loader = self.sender()
        if loader is not self._loader or loader.is_cancelled:
            return
        self._loader = None
        self.progress.setVisible(False)
        self.progress_label.setText("")
        self._update_status()
        self._update_actions()
        self.show_message("Could not load the models", message)

    def _track(self, thread: QThread) -> QThread:
        self._threads.add(thread)
        thread.finished.connect(lambda t=thread: self._threads.discard(t))
        return thread

    # ----------------------------------------------------------------- conversations
    def refresh_conversations(self) -> None:
        """Rebuild the conversation list from the history, keeping the current one selected."""
        self.sidebar.show_conversations(self.store.conversations(), self.conv.id if self.conv else None)

    def new_chat(self) -> None:
        """Start an empty conversation (created in the history when the first message is sent)."""
        if self._stream is not None:
            self.statusBar().showMessage(BUSY_REASON, 4000)
            return
        self._cancel_edit()
        self.conv = None
        self._show_conversation()
        self.refresh_conversations()
        self.prompt.setFocus()

    def open_conversation(self, conversation_id: int) -> None:
        """Show a stored conversation."""
        if self._stream is not None:
            self.statusBar().showMessage(BUSY_REASON, 4000)
            return
        self._cancel_edit()
        self.conv = self.store.conversation(conversation_id)
        self._show_conversation()
        self.refresh_conversations()

    def _show_conversation(self) -> None:
        self.messages.clear()
        self.cards = []
        for message in self.conv.messages if self.conv else []:
            self._add_card(message)
        self.system_edit.setText(self.conv.system_prompt if self.conv else "")
        self._update_title()
        self._update_actions()

    def _update_title(self) -> None:
        self.setWindowTitle(f"SpecLens — {self.conv.title}" if self.conv else "SpecLens")

    def _add_card(self, message: Message) -> MessageCard:
        card = MessageCard(message, self.theme, self.settings.color_origins)
        card.edit_requested.connect(self.begin_edit)
        card.regenerate_requested.connect(self.regenerate)
        self.cards.append(self.messages.add(card))
        return card

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        """Give a conversation a new (non-empty) title."""
        try:
            self.store.rename(conversation_id, title)
        except HistoryError as exc:
            self.show_message("Rename", str(exc))
            return
        if self.conv is not None and self.conv.id == conversation_id:
            self.conv.title = title.strip()
            self._update_title()
        self.refresh_conversations()

    def delete_conversation(self, conversation_id: int) -> None:
        """Delete a conversation and its messages (not the one being answered)."""
        if self._stream is not None and self.conv is not None and self.conv.id == conversation_id:
            self.statusBar().showMessage(BUSY_REASON, 4000)
            return
        self.store.delete(conversation_id)
        if self.conv is not None and self.conv.id == conversation_id:
            self.conv = None
            self._show_conversation()
        self.refresh_conversations()

    def export_conversation(self, conversation_id: int, fmt: str, path: Path) -> None:
        """Write a conversation to ``path`` as JSON (fmt "json") or Markdown ("md")."""
        try:
            (self.store.export_json if fmt == "json" else self.store.export_markdown)(conversation_id, Path(path))
        except (OSError, HistoryError) as exc:
            self.show_message("Export", f"Could not export to {path}: {exc}")
            return
        self.statusBar().showMessage(f"Exported to {path}", 5000)

    def _ask_export(self, fmt: str) -> None:
        if self.conv is None:
            self.statusBar().showMessage("Nothing to export yet: send a message first", 4000)
            return
        path = ask_export_path(self, fmt)
        if path is not None:
            self.export_conversation(self.conv.id, fmt, path)

    def _system_prompt_edited(self) -> None:
        if self.conv is not None and self.system_edit.text() != self.conv.system_prompt:
            self.conv.system_prompt = self.system_edit.text()
            self.store.set_system_prompt(self.conv.id, self.conv.system_prompt)

    # ----------------------------------------------------------------- sending and generating
    def send(self, text: str) -> bool:
        """Send ``text`` as the user's next message (or as the edited message) and start the answer."""
        if not text.strip():
            return False
        if self._stream is not None:
            self.statusBar().showMessage("An answer is being generated: wait for it or press Esc to stop", 4000)
            return False
        if self.backends is None:
            self.statusBar().showMessage("The models are not loaded yet", 4000)
            return False
        if self.conv is None:
            first_line = text.strip().splitlines()[0]
            title = first_line[:TITLE_CHARS] + ("…" if len(first_line) > TITLE_CHARS else "")
            cid = self.store.create_conversation(title, self.system_edit.text())
            self.conv = self.store.conversation(cid)
            self._update_title()
        if self._editing is not None:
            self._truncate_from(self._editing)
            self._cancel_edit()
        message = Message("user", text)
        self.store.add_message(self.conv.id, message)
        self.conv.messages.append(message)
        self._add_card(message)
        self.prompt.clear()
        self.refresh_conversations()
        return self._start_generation()

    def regenerate(self, message: Message | None = None) -> bool:
        """Replace the last answer (``message``, or the last assistant message) with a new one."""
        if self._stream is not None or self.conv is None or self.backends is None:
            return False
        answers = [m for m in self.conv.messages if m.role == "assistant"]
        message = message or (answers[-1] if answers else None)
        if message is None or message is not self.conv.messages[-1]:
            return False
        self._truncate_from(message)
        return self._start_generation()

    def begin_edit(self, message: Message) -> None:
        """Put a sent message back into the input box; sending replaces it and everything after it."""
        if self._stream is not None:
            self.statusBar().showMessage(BUSY_REASON, 4000)
            return
        self._editing = message
        self.prompt.setPlainText(message.content)
        self.prompt.setFocus()
        self.edit_banner.setVisible(True)
        self.send_button.setText("Resend")

    def _cancel_edit(self) -> None:
        if self._editing is not None:
            self._editing = None
            self.prompt.clear()
        self.edit_banner.setVisible(False)
        self.send_button.setText("Send")

    def _truncate_from(self, message: Message) -> None:
        index = next(i for i, m in enumerate(self.conv.messages) if m is message)
        self.store.delete_messages_from(self.conv.id, message.id)
        del self.conv.messages[index:]
        self.messages.remove_from(index)
        del self.cards[index:]

    def _start_generation(self) -> bool:
        try:
            sampling = self.settings.sampling()
            strategy = self.settings.build_strategy()
        except (SamplingError, SettingsError) as exc:
            self.show_message("Settings", f"Cannot generate with these settings: {exc}")
            return False
        target, draft = self.backends
        chat = [{"role": "system", "content": self.conv.system_prompt}] if self.conv.system_prompt else []
        chat += [{"role": m.role, "content": m.content} for m in self.conv.messages]
        try:
            prompt_ids = target.apply_chat_template(chat)
        except Exception as exc:  # a template the model cannot render is a dialog, not a crash
            self.show_message("Prompt", f"Could not build the prompt: {exc}")
            return False
        answer = Message("assistant", "", complete=False)
        self.store.add_message(self.conv.id, answer)
        self.conv.messages.append(answer)
        card = self._add_card(answer)
        self.viz.set_strategy(strategy)

        def make_engine():
            return SpeculativeEngine(target, draft, strategy=strategy, sampling=sampling)

        worker = EngineWorker(make_engine, prompt_ids, self.settings.max_new_tokens)
        queued = Qt.ConnectionType.QueuedConnection
        worker.started.connect(self._on_started, queued)
        worker.step.connect(self._on_step, queued)
        worker.finished.connect(self._on_finished, queued)
        worker.failed.connect(self._on_failed, queued)
        thread = self._track(start_worker(worker, self))
        self._stream = _Stream(worker, thread, answer, card, strategy.label)
        card.streaming = True
        self.speed_label.setText("— tok/s")
        self._update_actions()
        return True

    def stop(self) -> None:
        """Stop the answer after the current step; what was generated is kept."""
        if self._stream is not None:
            self._stream.worker.cancel()

    def _escape(self) -> None:
        if self._stream is not None:
            self.stop()
        elif self._editing is not None:
            self._cancel_edit()

    def _on_started(self, label: str) -> None:
        if self._stream is None or self.sender() is not self._stream.worker:
            return
        self._stream.strategy = label
        self.viz.on_generation_started(label)

    def _live_stream(self):
        """The answer being streamed, if the signal being handled comes from its worker and the window stays open.

        A stopped or replaced answer's worker may still deliver queued signals; they must not touch the new one.
        """
        stream = self._stream
        if stream is None or self.sender() is not stream.worker or self._closing:
            return None
        return stream

    def _on_step(self, event: StepEvent) -> None:
        stream = self._live_stream()
        if stream is None:
            return
        msg = stream.message
        msg.content += event.text
        msg.origins += step_origin_codes(event.text, event.token_texts, event.origins)
        msg.stats = stats_record(event.stats, event.strategy or stream.strategy, None)
        self._save(msg)
        if not self._render_timer.isActive():
            self._render_timer.start()
        self.speed_label.setText(f"{event.stats.tokens_per_second:.1f} tok/s")
        if event.note:
            self.statusBar().showMessage(event.note, 8000)
        self.viz.on_step(event)
        self.answer_updated.emit(event)

    def _on_finished(self, result: GenerationResult) -> None:
        stream = self._live_stream()
        if stream is None:
            return
        stream.message.stats = stats_record(result.stats, stream.strategy, result.stop_reason)
        stream.message.complete = True
        self._save(stream.message)
        self.speed_label.setText(f"{result.stats.tokens_per_second:.1f} tok/s")
        self._end_stream()
        self.viz.on_finished(result)
        self.generation_finished.emit(result)

    def _on_failed(self, message: str) -> None:
        stream = self._live_stream()
        if stream is None:
            return
        if stream.message.content:
            stream.message.complete = True
            self._save(stream.message)
        else:  # nothing was generated: an empty answer is not worth keeping
            self._truncate_from(stream.message)
        self._end_stream()
        self.show_message("Generation failed", message)
        self.generation_finished.emit(None)

    def _end_stream(self) -> None:
        stream = self._stream
        self._stream = None
        self._render_timer.stop()
        if shiboken6.isValid(stream.card):
            stream.card.streaming = False
            stream.card.refresh()
        self._update_actions()

    def _render_stream(self) -> None:
        if self._stream is not None:
            self._stream.card.refresh()

    def _save(self, message: Message) -> None:
        try:
            self.store.update_message(message)
        except HistoryError as exc:
            self.statusBar().showMessage(str(exc), 8000)

    # ----------------------------------------------------------------- settings and theme
    def open_settings(self) -> SettingsDialog:
        """Open the settings dialog (non-blocking); accepted values are applied."""
        dialog = SettingsDialog(self.settings, self)
        dialog.accepted.connect(lambda: self.apply_settings(dialog.result_settings))
        dialog.open()
        return dialog

    def apply_settings(self, new: AppSettings) -> None:
        """Use ``new`` settings: persist them, restyle, and reload the models when the pair changed."""
        old = self.settings
        self.settings = new
        if self._persist:
            save_settings(new)
        if (new.theme, new.color_origins) != (old.theme, old.color_origins):
            self._restyle()
        try:
            idle = self.backends is None and self._loader is None  # nothing loaded and nothing loading
            reload = new.pair_choice() != old.pair_choice() or idle
        except SettingsError as exc:
            self.show_message("Model pair", str(exc))
            reload = False
        if reload:
            self._finish_stream_now()
            self.load_models()
        self._update_status()

    def toggle_theme(self) -> None:
        self.apply_settings(replace(self.settings, theme="dark" if self.settings.theme == "light" else "light"))

    def _toggle_origins(self, checked: bool) -> None:
        if checked != self.settings.color_origins:
            self.apply_settings(replace(self.settings, color_origins=checked))

    def _restyle(self) -> None:
        self.theme = apply_theme(QApplication.instance(), self.settings.theme)
        self.theme_action.setText(self._theme_action_text())
        self.origins_action.setChecked(self.settings.color_origins)
        self._update_legend()
        for card in self.cards:
            card.set_theme(self.theme, self.settings.color_origins)

    def _theme_action_text(self) -> str:
        return "Light theme" if self.settings.theme == "dark" else "Dark theme"

    def _update_legend(self) -> None:
        tint = self.theme["draft_tint"]
        self.legend.setText(f'<span style="background-color:{tint}; color:{self.theme["text"]};">&nbsp;accepted '
                            f'draft&nbsp;</span>&nbsp; plain: target token' if self.settings.color_origins else "")

    def _update_status(self) -> None:
        s = self.settings
        if self.backends is not None:
            target, draft = self.backends
            self.pair_label.setText(f"Pair: {s.pair_choice().label} ({target.name} + {draft.name})")
        elif self._loader is not None:
            self.pair_label.setText(f"Pair: {self._loader.choice.label} (loading)")
        else:
            self.pair_label.setText("Pair: none loaded")
        self.backend_label.setText(f"Backend: {s.backend}")
        self.device_label.setText(f"Device: {self.backends[0].device if self.backends else s.device}")
        try:
            label = s.build_strategy().label
        except (SettingsError, SamplingError) as exc:
            label = f"invalid ({exc})"
        self.strategy_label.setText(f"Strategy: {label}")
        if not self.speed_label.text():
            self.speed_label.setText("— tok/s")

    def _update_actions(self) -> None:
        busy = self._stream is not None
        ready = self.backends is not None
        self.send_button.setVisible(not busy)
        self.stop_button.setVisible(busy)
        self.send_button.setEnabled(ready)
        self.send_button.setToolTip("Send (Enter)" if ready else "Waiting for the models to load")
        self.new_action.setEnabled(not busy)
        self.race_action.setEnabled(ready and not busy)  # the race decodes on these same models
        self.sidebar.set_enabled_reason(not busy, BUSY_REASON)
        last = len(self.cards) - 1
        for i, card in enumerate(self.cards):
            card.set_actions(busy or not ready, i == last)

    # ----------------------------------------------------------------- closing
    def _finish_stream_now(self) -> None:
        """Cancel the running answer and wait for its thread (at most one step); the partial text is saved."""
        stream = self._stream
        if stream is None:
            return
        stream.worker.cancel()
        self._wait(stream.thread)
        if stream.message.stats:
            stream.message.stats = {**stream.message.stats, "stop_reason": "cancelled"}
        stream.message.complete = True
        self._save(stream.message)
        self._end_stream()

    @staticmethod
    def _wait(thread: QThread) -> None:
        # The worker's finished->quit connection is queued to this (blocked) thread, so ask the thread to quit here.
        if shiboken6.isValid(thread):
            thread.quit()
            thread.wait()

    def closeEvent(self, event) -> None:
        """End cleanly: cancel the answer and any model load, wait for their threads, close the history."""
        self._finish_stream_now()
        self._closing = True
        if self._loader is not None:
            self._loader.cancel()
        for thread in list(self._threads):
            self._wait(thread)
        self._threads.clear()
        for box in list(self.dialogs):
            box.close()
        self.store.close()
        super().closeEvent(event)
