"""The conversation list: open, start, rename, delete and export conversations (the dialogs that ask live here)."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QFileDialog, QInputDialog, QLabel, QListWidget, QListWidgetItem, QMenu, QMessageBox,
                               QPushButton, QVBoxLayout, QWidget)

from app.chat.history import Conversation

EXPORT_FILTERS = {"json": "JSON (*.json)", "md": "Markdown (*.md)"}


def ask_export_path(parent: QWidget, fmt: str) -> Path | None:
    """Ask where to export a conversation as ``fmt`` ("json" or "md"); None when cancelled."""
    path, _ = QFileDialog.getSaveFileName(parent, "Export conversation", f"conversation.{fmt}", EXPORT_FILTERS[fmt])
    return Path(path) if path else None


class ConversationSidebar(QWidget):
    """The list of stored conversations, most recent first, with a context menu and a New chat button."""

    open_requested = Signal(int)
    new_requested = Signal()
    rename_requested = Signal(int, str)
    delete_requested = Signal(int)
    export_requested = Signal(int, str, object)  # conversation id, fmt, Path

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Sidebar")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 10, 8, 8)
        title = QLabel("CONVERSATIONS")
        title.setObjectName("SidebarTitle")
        layout.addWidget(title)
        self.list = QListWidget()
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.itemClicked.connect(lambda item: self.open_requested.emit(item.data(Qt.ItemDataRole.UserRole)))
        layout.addWidget(self.list, 1)
        self.new_button = QPushButton("+  New chat")
        self.new_button.clicked.connect(self.new_requested)
        layout.addWidget(self.new_button)

    def show_conversations(self, conversations: list[Conversation], current: int | None) -> None:
        """List ``conversations`` and select the one with id ``current``."""
        self.list.clear()
        for conv in conversations:
            item = QListWidgetItem(conv.title)
            item.setData(Qt.ItemDataRole.UserRole, conv.id)
            item.setToolTip(conv.title)
            self.list.addItem(item)
            if conv.id == current:
                self.list.setCurrentItem(item)
        if current is None:
            self.list.clearSelection()

    def set_enabled_reason(self, enabled: bool, reason: str) -> None:
        """Enable the list and button, or disable them with ``reason`` as their tooltip."""
        for widget in (self.list, self.new_button):
            widget.setEnabled(enabled)
            widget.setToolTip("" if enabled else reason)

    def _menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        cid, title = item.data(Qt.ItemDataRole.UserRole), item.text()
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self._ask_rename(cid, title))
        menu.addAction("Export JSON…", lambda: self._ask_export(cid, "json"))
        menu.addAction("Export Markdown…", lambda: self._ask_export(cid, "md"))
        menu.addSeparator()
        menu.addAction("Delete…", lambda: self._ask_delete(cid, title))
        menu.exec(self.list.mapToGlobal(pos))

    def _ask_rename(self, cid: int, current: str) -> None:
        title, ok = QInputDialog.getText(self, "Rename conversation", "Title", text=current)
        if ok:
            self.rename_requested.emit(cid, title)

    def _ask_delete(self, cid: int, title: str) -> None:
        answer = QMessageBox.question(self, "Delete conversation", f"Delete “{title}” and all its messages?")
        if answer == QMessageBox.StandardButton.Yes:
            self.delete_requested.emit(cid)

    def _ask_export(self, cid: int, fmt: str) -> None:
        path = ask_export_path(self, fmt)
        if path is not None:
            self.export_requested.emit(cid, fmt, path)
