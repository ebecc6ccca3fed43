"""History: restored after a restart, renamed, deleted, exported; a corrupt file is moved aside, not fatal."""
from __future__ import annotations

import json
import sqlite3
from dataclasses import replace

import pytest
from PySide6.QtCore import Qt

from app.chat.history import HistoryError, HistoryStore, Message
from app.main import HISTORY_FILE
from app.settings import load_settings


def test_restart_restores_conversations_and_settings(make_window, ask, qtbot, data_dir):
    window = make_window()
    window.apply_settings(replace(window.settings, strategy="tree", tree_branching="2,1"))
    result = ask(window, "Remember this conversation")
    window.system_edit.setText("Be brief.")
    window.system_edit.editingFinished.emit()
    window.close()

    restored_settings = load_settings()
    assert (restored_settings.strategy, restored_settings.tree_branching) == ("tree", "2,1")
    again = make_window(**{k: getattr(restored_settings, k) for k in ("strategy", "tree_branching")})
    assert again.conv_list.count() == 1
    item = again.conv_list.item(0)
    assert item.text() == "Remember this conversation"
    again.open_conversation(item.data(Qt.ItemDataRole.UserRole))
    assert [(m.role, m.content) for m in again.conv.messages] == [("user", "Remember this conversation"),
                                                                  ("assistant", result.text)]
    assert again.system_edit.text() == "Be brief."
    card = again.cards[-1]
    assert card.message.origins and card.message.stats["tokens"] == result.stats.new_tokens
    assert f"{result.stats.new_tokens} tokens" in card.stats_label.text()
    assert "Tree(2x1)" in again.strategy_label.text()


def test_interrupted_answer_is_restored_and_marked(make_window, data_dir):
    store = HistoryStore(data_dir / HISTORY_FILE)
    cid = store.create_conversation("cut off")
    store.add_message(cid, Message("user", "question"))
    store.add_message(cid, Message("assistant", "half an ans", complete=False))  # as a killed app leaves it
    store.close()
    window = make_window()
    window.open_conversation(cid)
    assert window.conv.messages[-1].content == "half an ans"
    assert "interrupted" in window.cards[-1].stats_label.text()


def test_corrupt_history_is_moved_aside_and_a_new_one_started(make_window, data_dir, ask, monkeypatch):
    data_dir.mkdir(parents=True)
    garbage = b"this is not an sqlite database at all\x00\x01" * 100
    (data_dir / HISTORY_FILE).write_bytes(garbage)
    shown = []
    from app.main_window import MainWindow

    original = MainWindow.show_message

    def record(self, title, text, *args):
        shown.append((title, text))
        return original(self, title, text, *args)

    monkeypatch.setattr(MainWindow, "show_message", record)  # the notice comes from the constructor
    window = make_window()
    assert len(shown) == 1
    title, text = shown[0]
    moved = [p for p in data_dir.iterdir() if ".corrupt-" in p.name]
    assert len(moved) == 1 and moved[0].read_bytes() == garbage
    assert title == "Chat history" and str(moved[0]) in text and "new, empty history" in text
    assert window.conv_list.count() == 0
    ask(window, "works again")
    with sqlite3.connect(data_dir / HISTORY_FILE) as conn:
        assert conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 2


def test_history_uses_wal_and_a_newer_schema_is_refused(tmp_path):
    store = HistoryStore(tmp_path / "h.sqlite3")
    assert store._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store._conn.execute("UPDATE meta SET value='99' WHERE key='schema'")
    store._conn.commit()
    store.close()
    reopened = HistoryStore(tmp_path / "h.sqlite3")
    assert reopened.notice is not None and "newer SpecLens" in reopened.notice
    assert reopened.conversations() == []


def test_rename_delete_and_export(make_window, ask, tmp_path):
    window = make_window()
    result = ask(window, "Export me")
    cid = window.conv.id
    window.rename_conversation(cid, "  Renamed chat  ")
    assert window.conv_list.item(0).text() == "Renamed chat"
    assert window.windowTitle() == "SpecLens — Renamed chat"
    with pytest.raises(HistoryError):
        window.store.rename(cid, "   ")

    window.export_conversation(cid, "json", tmp_path / "c.json")
    data = json.loads((tmp_path / "c.json").read_text(encoding="utf-8"))
    assert data["title"] == "Renamed chat"
    assert [(m["role"], m["content"]) for m in data["messages"]] == [("user", "Export me"),
                                                                     ("assistant", result.text)]
    assert data["messages"][1]["stats"]["tokens"] == result.stats.new_tokens
    window.export_conversation(cid, "md", tmp_path / "c.md")
    md = (tmp_path / "c.md").read_text(encoding="utf-8")
    assert md.startswith("# Renamed chat\n") and "## User\n\nExport me\n" in md and result.text in md

    window.delete_conversation(cid)
    assert window.conv is None and window.conv_list.count() == 0 and window.cards == []
    assert window.store.conversations() == []
    with pytest.raises(HistoryError):
        window.store.conversation(cid)


def test_unusable_history_folder_is_a_clear_error(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the data folder should be")
    with pytest.raises((HistoryError, OSError)) as info:
        HistoryStore(blocker / "history.sqlite3")
    assert "not-a-folder" in str(info.value)
