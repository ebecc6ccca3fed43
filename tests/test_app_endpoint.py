"""The window against another server: the chat answered through it (its speculative statistics under the answer),
the race of the chat's strategy against it, a dead server explained with nothing typed lost, and its API key kept in
the keyring (or for the session), never in settings.ini."""
from __future__ import annotations

from dataclasses import replace

import keyring
import pytest
from keyring.backend import KeyringBackend
from PySide6.QtCore import Qt

import app.secrets as secrets
from core.endpoints.llama_server import free_port
from core.memory import Memory
from core.serve.job import ServedModels
from tests.served import serving

TIMEOUT = 60_000


@pytest.fixture
def server(tiny_backends):
    with serving(ServedModels(*tiny_backends, Memory(8, 8), "tiny", remember_answers=False)) as (url, _):
        yield f"{url}/v1"


def test_the_chat_is_answered_through_an_endpoint(make_window, ask, server):
    window = make_window()
    window.apply_settings(replace(window.settings, endpoint_url=server, endpoint_model="tiny", chat_endpoint=True))
    result = ask(window, "Hello over HTTP")
    assert result.stats.new_tokens == 40 and result.text == window.session.conv.messages[-1].content
    stats = window.transcript.stats_text(1)
    assert "endpoint tiny @ 127.0.0.1" in stats and "speclens:" in stats     # the server's own statistics
    assert window.viz.tree.events == list(result.steps)


def test_a_dead_endpoint_is_explained_and_the_text_given_back(make_window, qtbot):
    window = make_window()
    window.apply_settings(replace(window.settings, endpoint_url=f"http://127.0.0.1:{free_port()}/v1",
                                  chat_endpoint=True))
    with qtbot.waitSignal(window.message_shown, timeout=TIMEOUT) as shown:
        qtbot.keyClicks(window.prompt, "is anyone there?")
        qtbot.keyClick(window.prompt, Qt.Key.Key_Return)
    assert "cannot reach" in shown.args[1]
    qtbot.waitUntil(lambda: window.prompt.toPlainText() == "is anyone there?", timeout=TIMEOUT)


def test_the_race_against_a_server_on_the_same_weights(make_window, ask, qtbot, server):
    window = make_window()
    window.apply_settings(replace(window.settings, endpoint_url=server, endpoint_model="tiny"))
    ask(window, "Race me")
    dialog = window.open_race(against_endpoint=True)
    assert dialog is not None
    with qtbot.waitSignal(dialog.compare.runsFinished, timeout=TIMEOUT) as done:
        pass
    summary = done.args[0]
    assert summary.baseline.label.startswith("tiny @ 127.0.0.1") and summary.other.label == "Chain(4)"
    assert summary.comparison is not None and summary.comparison.identical   # greedy, the same tiny weights
    dialog.compare.finish_replay()
    assert "vs tiny @ 127.0.0.1" in dialog.compare.verdict.text()
    dialog.close()


class MemoryKeyring(KeyringBackend):
    priority = 1

    def __init__(self):
        super().__init__()
        self.stored = {}

    def get_password(self, service, username):
        return self.stored.get((service, username))

    def set_password(self, service, username, password):
        self.stored[(service, username)] = password

    def delete_password(self, service, username):
        self.stored.pop((service, username), None)


def test_api_keys_go_to_the_keyring_never_to_settings(data_dir, monkeypatch):
    from app.main import create_app
    from app.settings import AppSettings, save_settings

    create_app()
    monkeypatch.setattr(secrets, "_session", {})
    ring = MemoryKeyring()
    previous = keyring.get_keyring()
    keyring.set_keyring(ring)
    try:
        assert "keyring" in secrets.set_key("http://h:1/v1", "sk-secret")
        assert ring.stored[(secrets.SERVICE, "http://h:1/v1")] == "sk-secret"
        monkeypatch.setattr(secrets, "_session", {})
        assert secrets.get_key("http://h:1/v1") == "sk-secret"
    finally:
        keyring.set_keyring(previous)
    monkeypatch.setattr(secrets, "keyring_available", lambda: False)
    assert "until SpecLens closes" in secrets.set_key("http://h:2/v1", "sk-other")
    assert secrets.get_key("http://h:2/v1") == "sk-other"
    save_settings(AppSettings(endpoint_url="http://h:2/v1"))
    assert "sk-" not in (data_dir / "settings.ini").read_text()
