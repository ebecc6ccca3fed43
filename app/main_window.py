"""The main window: conversations on the left, the chat in the middle, the live view on the right, a status bar.

It only wires widgets to a ChatSession (app.session), which owns the conversation, the history, the models and the
live answer; the window shows what the session reports and passes on what the user asks.
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import (QApplication, QHBoxLayout, QLabel, QLineEdit, QMainWindow, QMessageBox, QProgressBar,
                               QPushButton, QSizePolicy, QSplitter, QToolBar, QVBoxLayout, QWidget)

from app.chat.history import Conversation, Message
from app.chat.message_view import BUSY_REASON, LOADING_REASON
from app.chat.prompt_edit import PromptEdit
from app.chat.sidebar import ConversationSidebar, ask_export_path
from app.chat.transcript import TranscriptView
from app.compare.compare_widget import open_race
from app.serve_panel import ServedList, ServeControl
from app.session import ChatSession
from app.settings import AppSettings, SettingsError
from app.settings_dialog import SettingsDialog
from app.theme import Theme, apply_theme
from app.viz.panel import VizPanel
from core.events import GenerationResult
from core.sampling import SamplingError

STATUS_MS = 6000
STATUS_INTERVAL_S = 0.5


class MainWindow(QMainWindow):
    """The SpecLens chat window over a :class:`ChatSession`."""

    message_shown = Signal(str, str)      # title, text of an error or notice dialog (tests and scripts watch it)

    def __init__(self, session: ChatSession) -> None:
        super().__init__()
        self.session = session
        self.theme: Theme = apply_theme(QApplication.instance(), session.settings.theme)
        self._editing: Message | None = None
        self.dialogs: list[QMessageBox] = []
        self.race = None
        self._status_at = 0.0
        self._waiting_to_close = False   # the history file is locked: closing once it is written
        self._discard_unsaved = False
        self.setWindowTitle("SpecLens")
        self.resize(1440, 880)
        self._build()
        self._connect()
        session.refresh_conversations()
        self.prompt.setFocus()
        if session.store.notice:
            self.show_message("Chat history", session.store.notice, QMessageBox.Icon.Warning)
        self._update_status()
        self._update_actions()

    @property
    def settings(self) -> AppSettings:
        return self.session.settings

    # ----------------------------------------------------------------- layout
    def _build(self) -> None:
        toolbar = QToolBar("Main", self)
        toolbar.setMovable(False)
        self.addToolBar(toolbar)
        self.new_action = self._action(toolbar, "New chat", "Ctrl+N", self.session.new_chat)
        self.settings_action = self._action(toolbar, "Settings", "Ctrl+,", self.open_settings)
        self.race_action = self._action(toolbar, "Race vs plain", "Ctrl+R", self.open_race)
        self.race_server_action = self._action(toolbar, "Race vs server", None,
                                               lambda: self.open_race(against_endpoint=True))
        self.race_server_action.setToolTip("Race the chat's strategy against the server set in Settings (llama-server, "
                                           "vLLM, SGLang, another SpecLens) on the last question")
        self.serve_action = self._action(toolbar, "Serve", None, self._toggle_serve)
        self.serve_action.setCheckable(True)
        self.serve_action.setToolTip("Answer editors and OpenAI clients with these models at "
                                     "http://127.0.0.1:PORT/v1 (port in Settings), with Predicted Outputs")
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
        self.served_list = ServedList()
        left = QSplitter(Qt.Orientation.Vertical)
        left.addWidget(self.sidebar)
        left.addWidget(self.served_list)
        left.setStretchFactor(0, 3)
        left.setStretchFactor(1, 1)
        left.setSizes([600, 200])
        chat = QWidget()
        column = QVBoxLayout(chat)
        column.setContentsMargins(0, 0, 0, 8)
        column.setSpacing(6)
        system_row = QHBoxLayout()
        system_row.setContentsMargins(16, 8, 16, 0)
        system_row.addWidget(QLabel("System prompt"))
        self.system_edit = QLineEdit()
        self.system_edit.setPlaceholderText("Optional: instructions the model follows in this chat")
        system_row.addWidget(self.system_edit, 1)
        column.addLayout(system_row)
        self.transcript = TranscriptView(self.theme, self.settings.color_origins)
        column.addWidget(self.transcript, 1)
        self.edit_banner = QLabel("Editing a sent message: Enter resends it (later messages are replaced), "
                                  "Esc cancels.")
        self.edit_banner.setObjectName("EditBanner")
        self.edit_banner.setContentsMargins(18, 0, 18, 0)
        self.edit_banner.setVisible(False)
        column.addWidget(self.edit_banner)
        self.served_banner = QWidget()
        served_row = QHBoxLayout(self.served_banner)
        served_row.setContentsMargins(18, 0, 18, 0)
        served_label = QLabel("A served request: not in your chat history. Sending a message keeps it as a chat.")
        served_label.setObjectName("EditBanner")
        self.keep_button = QPushButton("Keep in history")
        self.keep_button.clicked.connect(self.session.keep_open)
        served_row.addWidget(served_label, 1)
        served_row.addWidget(self.keep_button)
        self.served_banner.setVisible(False)
        column.addWidget(self.served_banner)
        input_row = QHBoxLayout()
        input_row.setContentsMargins(16, 0, 16, 0)
        self.prompt = PromptEdit()
        input_row.addWidget(self.prompt, 1)
        buttons = QVBoxLayout()
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("PrimaryButton")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("StopButton")
        self.stop_button.setToolTip("Stop the answer after the current step (Esc)")
        for button in (self.send_button, self.stop_button):
            button.setMinimumWidth(96)  # room for "Resend" without the layout jumping
            buttons.addWidget(button)
        buttons.addStretch(1)
        input_row.addLayout(buttons)
        column.addLayout(input_row)

        self.viz = VizPanel()
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(left)
        self.splitter.addWidget(chat)
        self.splitter.addWidget(self.viz)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 3)
        self.splitter.setStretchFactor(2, 2)
        self.splitter.setSizes([230, 690, 520])
        self.setCentralWidget(self.splitter)

        bar = self.statusBar()
        self.pair_label, self.device_label, self.strategy_label, self.speed_label = (QLabel() for _ in range(4))
        for label in (self.pair_label, self.device_label, self.strategy_label):
            bar.addWidget(label)
        self.serve_label = QLabel()
        bar.addWidget(self.serve_label)
        self.serve = ServeControl(self.session, self.viz, self.served_list, self)
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
        action.triggered.connect(lambda *_: slot())
        toolbar.addAction(action)
        return action

    def _connect(self) -> None:
        s = self.session
        self.sidebar.open_requested.connect(s.open_conversation)
        self.sidebar.new_requested.connect(s.new_chat)
        self.sidebar.rename_requested.connect(s.rename)
        self.sidebar.delete_requested.connect(s.delete)
        self.sidebar.export_requested.connect(s.export)
        self.system_edit.editingFinished.connect(lambda: s.set_system_prompt(self.system_edit.text()))
        self.prompt.submitted.connect(self.send)
        self.send_button.clicked.connect(lambda: self.send(self.prompt.toPlainText()))
        self.stop_button.clicked.connect(lambda: s.stop())
        self.transcript.edit_requested.connect(self.begin_edit)
        self.transcript.regenerate_requested.connect(lambda _: s.regenerate())
        self.transcript.copied.connect(lambda text: self.statusBar().showMessage("Copied to the clipboard", 3000))
        s.loading.connect(self._on_loading)
        s.models_ready.connect(lambda _: self._update_status())
        s.models_failed.connect(self._on_models_failed)
        s.warm.connect(self._on_warm)
        s.conversations_changed.connect(self._show_conversations)
        s.conversation_opened.connect(self._on_conversation_opened)
        s.message_added.connect(self.transcript.append)
        s.messages_removed.connect(self.transcript.remove_from)
        s.answer_started.connect(self._on_answer_started)
        s.answer_frame.connect(self._on_answer_frame)
        s.answer_finished.connect(self._on_answer_finished)
        s.busy_changed.connect(lambda _: self._update_actions())
        s.notice.connect(self.transcript.show_notice)
        s.status.connect(lambda text: self.statusBar().showMessage(text, STATUS_MS))
        s.error.connect(self.show_message)
        s.input_returned.connect(self._return_input)
        s.unkept_changed.connect(self.served_banner.setVisible)
        s.models_ready.connect(lambda _: self._serve_new_models())
        self.served_list.open_requested.connect(self.open_served)
        self.serve.status.connect(self.serve_label.setText)
        self.serve.error.connect(self.show_message)

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
    def _on_loading(self, fraction: float, text: str) -> None:
        done = fraction >= 1.0
        self.progress.setVisible(not done)
        self.progress.setRange(0, 1000)
        self.progress.setValue(int(1000 * fraction))
        self.progress_label.setText("" if done else text)
        self._update_status()
        self._update_actions()

    def _on_models_failed(self, message: str) -> None:
        self.progress.setVisible(False)
        self.progress_label.setText("")
        self._update_status()
        self._update_actions()
        self.show_message("Loading models", message)

    def _on_warm(self) -> None:
        self.progress.setVisible(False)
        self.progress_label.setText("")
        self._update_status()
        self._update_actions()

    # ----------------------------------------------------------------- conversations
    def _show_conversations(self, conversations: list[Conversation]) -> None:
        conv = self.session.conv
        self.sidebar.show_conversations(conversations, conv.id if conv is not None else None)

    def _on_conversation_opened(self, conv: Conversation | None) -> None:
        self._cancel_edit()
        self.transcript.set_messages(conv.messages if conv is not None else [])
        self.system_edit.setText(conv.system_prompt if conv is not None else "")
        self.setWindowTitle(f"SpecLens — {conv.title}" if conv is not None else "SpecLens")
        self._update_actions()

    def _ask_export(self, fmt: str) -> None:
        if self.session.conv is None:
            self.statusBar().showMessage("Nothing to export yet: send a message first", 4000)
            return
        path = ask_export_path(self, fmt)
        if path is not None:
            self.session.export(self.session.conv.id, fmt, Path(path))

    # ----------------------------------------------------------------- sending
    def send(self, text: str) -> bool:
        """Send the input box's text (or the edited message's new text)."""
        replacing, self._editing = self._editing, None
        self.edit_banner.setVisible(False)
        self.send_button.setText("Send")
        sent = self.session.send(text, replacing, self.system_edit.text())
        if sent:
            self.prompt.clear()
        elif replacing is not None:
            self._editing = replacing
        return sent

    def begin_edit(self, index: int) -> None:
        """Put a sent message back into the input box; sending replaces it and everything after it."""
        if self.session.busy:
            self.statusBar().showMessage(BUSY_REASON, 4000)
            return
        self._editing = self.session.conv.messages[index]
        self.prompt.setPlainText(self._editing.content)
        self.prompt.setFocus()
        self.edit_banner.setVisible(True)
        self.send_button.setText("Resend")

    def _cancel_edit(self) -> None:
        if self._editing is not None:
            self._editing = None
            self.prompt.clear()
        self.edit_banner.setVisible(False)
        self.send_button.setText("Send")

    def _escape(self) -> None:
        if self.session.busy:
            self.session.stop()
        elif self._editing is not None:
            self._cancel_edit()

    def _return_input(self, text: str) -> None:
        if not self.prompt.toPlainText().strip():
            self.prompt.setPlainText(text)

    # ----------------------------------------------------------------- the live answer
    def _on_answer_started(self, label: str) -> None:
        self.viz.on_generation_started(label)
        self.speed_label.setText("— tok/s")

    def _on_answer_frame(self, message: Message, events: tuple) -> None:
        self.transcript.stream(message)
        self.viz.on_steps(events)
        now = time.monotonic()
        if now - self._status_at >= STATUS_INTERVAL_S:   # a number nobody can read faster than this
            self._status_at = now
            self.speed_label.setText(f"{events[-1].stats.tokens_per_second:.1f} tok/s")

    def _on_answer_finished(self, message: Message | None, result: GenerationResult | None) -> None:
        if message is not None:
            self.transcript.finish(message)
        if result is not None:
            self.viz.on_finished(result)
            self.speed_label.setText(f"{result.stats.tokens_per_second:.1f} tok/s")
        self._update_actions()

    # ----------------------------------------------------------------- settings, theme, race
    def open_settings(self) -> SettingsDialog:
        """Open the settings dialog (non-blocking); accepted values are applied."""
        dialog = SettingsDialog(self.settings, self)
        dialog.accepted.connect(lambda: self.apply_settings(dialog.result_settings))
        dialog.accepted.connect(lambda: dialog.key_notice and self.statusBar().showMessage(dialog.key_notice, STATUS_MS))
        dialog.open()
        return dialog

    def apply_settings(self, new: AppSettings) -> None:
        old = self.settings
        self.session.apply_settings(new)
        if (new.theme, new.color_origins) != (old.theme, old.color_origins):
            self._restyle()
        self._update_status()

    def toggle_theme(self) -> None:
        self.apply_settings(replace(self.settings, theme="dark" if self.settings.theme == "light" else "light"))

    def _toggle_origins(self, checked: bool | None = None) -> None:
        checked = self.origins_action.isChecked() if checked is None else checked
        if checked != self.settings.color_origins:
            self.apply_settings(replace(self.settings, color_origins=checked))

    def _restyle(self) -> None:
        self.theme = apply_theme(QApplication.instance(), self.settings.theme)
        self.theme_action.setText(self._theme_action_text())
        self.origins_action.setChecked(self.settings.color_origins)
        self._update_legend()
        self.transcript.set_theme(self.theme, self.settings.color_origins)

    def _theme_action_text(self) -> str:
        return "Light theme" if self.settings.theme == "dark" else "Dark theme"

    def _update_legend(self) -> None:
        tint = self.theme["draft_tint"]
        self.legend.setText(f'<span style="background-color:{tint}; color:{self.theme["text"]};">&nbsp;accepted '
                            f'draft&nbsp;</span>&nbsp; plain: target token' if self.settings.color_origins else "")

    def _toggle_serve(self) -> None:
        on = self.serve_action.isChecked()
        if not self.serve.set_serving(on):
            self.serve_action.setChecked(False)

    def _serve_new_models(self) -> None:
        """Newly loaded models: a running server goes on with them."""
        if self.serve.running:
            self.serve.set_serving(False)
            self.serve_action.setChecked(self.serve.set_serving(True))

    def open_served(self, record) -> None:
        """Open a served request like a chat, and replay its decoding in the live view."""
        if self.session.open_served(record):
            result = record.finished.result
            self.viz.on_generation_started(f"served: {result.steps[-1].strategy if result.steps else ''}")
            self.viz.on_steps(result.steps)
            self.viz.on_finished(result)

    def open_race(self, against_endpoint: bool = False):
        """Race the chat's strategy against plain decoding (or the server set in Settings) on the last question (see
        app.compare)."""
        self.race = open_race(self, self.session, against_endpoint)
        return self.race

    # ----------------------------------------------------------------- status
    def _update_status(self) -> None:
        s, session = self.settings, self.session
        try:
            label = s.pair_choice().label
        except SettingsError:
            label = s.pair
        if session.backends is not None:
            target, draft = session.backends
            self.pair_label.setText(f"Pair: {label} ({target.name} + {draft.name})")
            self.device_label.setText(f"Target on {target.device}, draft on {draft.device} ({s.backend})")
        else:
            self.pair_label.setText(f"Pair: {label} (loading)")
            self.device_label.setText(f"Backend: {s.backend}")
        try:
            strategy = s.build_strategy().label
        except (SettingsError, SamplingError) as exc:
            strategy = f"invalid ({exc})"
        self.strategy_label.setText(f"Strategy: {strategy}" + ("" if session.is_warm or not session.ready
                                                               else " (warming up)"))
        if not self.speed_label.text():
            self.speed_label.setText("— tok/s")

    def _update_actions(self) -> None:
        session = self.session
        busy, ready = session.busy, session.ready
        self.send_button.setVisible(not busy)
        self.stop_button.setVisible(busy)
        self.send_button.setEnabled(ready)
        self.send_button.setToolTip("Send (Enter)" if ready else LOADING_REASON)
        self.new_action.setEnabled(not busy)
        self.race_action.setEnabled(ready and session.is_warm and not busy)  # the race decodes on these models
        self.race_server_action.setEnabled(ready and session.is_warm and not busy)
        self.sidebar.set_enabled_reason(not busy, BUSY_REASON)
        self.transcript.set_actions(busy, ready)

    # ----------------------------------------------------------------- closing
    def closeEvent(self, event) -> None:
        """End cleanly: stop the answer and any load (waiting briefly for their threads), write the history. If
        another program holds the history file, say so and close by itself once everything is written (or at once,
        if the user chooses to lose the changes)."""
        if self.race is not None:
            self.race.close()
        for box in list(self.dialogs):
            box.close()
        self.serve.set_serving(False)
        if self.session.close() or self._discard_unsaved:
            super().closeEvent(event)
            return
        event.ignore()
        self._close_once_saved()

    def _close_once_saved(self) -> None:
        writer = self.session.writer
        if self._waiting_to_close:
            return
        self._waiting_to_close = True
        box = QMessageBox(QMessageBox.Icon.Warning, "Chat history",
                          f"{writer.pending} change(s) to the chat history are not saved yet: another program holds "
                          f"{self.session.store.path}. SpecLens closes by itself as soon as they are written.",
                          QMessageBox.StandardButton.NoButton, self)
        box.addButton("Wait, then close", QMessageBox.ButtonRole.AcceptRole)
        discard = box.addButton("Close without saving them", QMessageBox.ButtonRole.DestructiveRole)
        box.buttonClicked.connect(lambda button: self._discard_and_close() if button is discard else None)
        writer.saved.connect(self.close)
        self.dialogs.append(box)
        box.open()
        self.message_shown.emit(box.windowTitle(), box.text())

    def _discard_and_close(self) -> None:
        self._discard_unsaved = True
        self.close()
