"""The window's Serve switch on the tiny pair: an OpenAI client is answered by the chat's own models on the app's
engine thread, the request shows live and in the Served list, nothing reaches the history unless kept, and the chat
stays usable meanwhile."""
from __future__ import annotations

import sqlite3
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import openai
import pytest

from app.chat.origins import origin_codes
from app.main import HISTORY_FILE
from app.session import as_code
from core.endpoints.llama_server import free_port

TIMEOUT = 60_000


@pytest.fixture
def serving_window(make_window, qtbot):
    window = make_window()
    window.apply_settings(replace(window.settings, serve_port=free_port()))
    window.serve_action.trigger()
    assert window.serve.running and "Serving http://127.0.0.1:" in window.serve_label.text()
    yield window
    window.serve.set_serving(False)


def ask_server(window, **kwargs):
    url = window.serve.host.url
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
    model = client.models.list().data[0].id
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello server"}],
                                          temperature=0, **kwargs)


def stored_conversations(data_dir) -> int:
    with sqlite3.connect(data_dir / HISTORY_FILE) as conn:
        return conn.execute("SELECT COUNT(*) FROM conversations").fetchone()[0]


def test_a_served_request_is_answered_shown_live_listed_and_not_kept(serving_window, qtbot, data_dir, saved):
    window = serving_window
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(ask_server, window, max_tokens=30, extra_body={"min_tokens": 30})
        qtbot.waitUntil(reply.done, timeout=TIMEOUT)
    out = reply.result()
    assert out.usage.completion_tokens == 30
    qtbot.waitUntil(lambda: window.served_list.list.count() == 1, timeout=TIMEOUT)
    record = window.serve.host.monitor.records[-1]
    assert record.finished.text == out.choices[0].message.content
    assert window.viz.tree.events == list(record.finished.result.steps)   # followed live in the tree view
    # the list names the client by its agent's product, without the version: here the openai SDK's
    assert window.served_list.list.item(0).text().split("\n")[0].endswith("  OpenAI/Python")
    saved(window)
    assert stored_conversations(data_dir) == 0                            # nothing in the history
    window.served_list.open_requested.emit(record)
    assert window.transcript.count() == 2 and window.served_banner.isVisible()
    assert window.session.conv.messages[-1].content == out.choices[0].message.content
    window.keep_button.click()
    saved(window)
    assert stored_conversations(data_dir) == 1 and not window.served_banner.isVisible()


def test_the_chat_stays_usable_while_a_request_is_served(serving_window, qtbot, ask, compute_threads):
    import threading

    window = serving_window
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(ask_server, window, max_tokens=200, extra_body={"min_tokens": 200})
        chat = ask(window, "and the chat too")        # queued with the served request on the one engine thread
        qtbot.waitUntil(reply.done, timeout=TIMEOUT)
    assert chat.tokens and reply.result().usage.completion_tokens == 200
    # both decoded on the app's engine thread: never two callers of the models at once, never the GUI thread
    assert len(compute_threads) == 1 and threading.get_ident() not in compute_threads


def test_a_port_in_use_is_refused_with_the_reason(make_window, qtbot):
    import socket

    window = make_window()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        window.apply_settings(replace(window.settings, serve_port=busy.getsockname()[1]))
        with qtbot.waitSignal(window.message_shown, timeout=TIMEOUT) as shown:
            window.serve_action.trigger()
    assert not window.serve.running and not window.serve_action.isChecked()
    assert "Cannot serve on port" in shown.args[1]


def test_a_served_text_completion_opens_as_code_its_lines_kept(serving_window, qtbot):
    window = serving_window
    prompt = "def f(x):\n    ``` not a fence\n    return "
    url = window.serve.host.url
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(client.completions.create, model=client.models.list().data[0].id, prompt=prompt,
                            max_tokens=4, temperature=0)
        qtbot.waitUntil(reply.done, timeout=TIMEOUT)
    qtbot.waitUntil(lambda: window.served_list.list.count() == 1, timeout=TIMEOUT)
    window.served_list.open_requested.emit(window.serve.host.monitor.records[-1])
    asked = window.session.conv.messages[0].content
    assert asked == f"````\n{prompt}\n````"                   # a longer fence than the backticks it holds
    assert window.session.conv.title == "Served: def f(x):"
    answer = window.session.conv.messages[-1]
    text = window.serve.host.monitor.records[-1].finished.text
    start = answer.content.index("\n") + 1
    assert answer.content == as_code(text) and answer.content[start:start + len(text)] == text
    steps = window.serve.host.monitor.records[-1].finished.result.steps
    codes = "".join(origin_codes(step, 0, len(step.text)) for step in steps)[:len(text)].ljust(len(text))
    assert len(answer.origins) == len(answer.content) and not answer.origins[:start].strip()
    assert answer.origins[start:start + len(text)] == codes                  # the origins moved with the text
