"""The chat window driven for real on the tiny model pair: streaming, stop, regenerate, edit, strategies, closing."""
from __future__ import annotations

import sqlite3
from dataclasses import replace

import pytest
from PySide6.QtCore import Qt

from app.chat.render import DRAFT, step_origin_codes
from app.main import HISTORY_FILE
from core.events import StopReason

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def stored_messages(data_dir):
    with sqlite3.connect(data_dir / HISTORY_FILE) as conn:
        return conn.execute("SELECT role, content, origins, complete FROM messages ORDER BY position").fetchall()


def test_send_streams_the_answer_step_by_step(make_window, qtbot, data_dir):
    window = make_window()
    shown = []
    window.answer_updated.connect(lambda event: shown.append(window.conv.messages[-1].content))
    with qtbot.waitSignal(window.generation_finished, timeout=60_000) as blocker:
        qtbot.keyClicks(window.prompt, "Hello there")
        qtbot.keyClick(window.prompt, Qt.Key.Key_Return)  # Enter sends
    result = blocker.args[0]
    assert result.stop_reason in (StopReason.EOS, StopReason.MAX_TOKENS)
    answer = window.conv.messages[-1]
    assert answer.role == "assistant" and answer.complete
    assert answer.content == result.text  # the streamed deltas add up to the engine's text
    assert window.prompt.toPlainText() == ""
    # the answer grew step by step, one update per target call
    assert len(shown) == result.stats.target_calls == len(result.steps) > 1
    assert shown == ["".join(s.text for s in result.steps[:i + 1]) for i in range(len(result.steps))]
    expected_origins = "".join(step_origin_codes(s.text, s.token_texts, s.origins) for s in result.steps)
    assert answer.origins == expected_origins and len(answer.origins) == len(answer.content)
    assert (DRAFT in answer.origins) == (result.stats.accepted > 0)
    # stats under the answer and live tokens/s in the status bar, both from engine timestamps
    card = window.cards[-1]
    assert f"{result.stats.tokens_per_second:.1f} tok/s" in card.stats_label.text()
    assert f"{result.stats.new_tokens} tokens" in card.stats_label.text()
    assert f"draft {result.stats.accepted} accepted / {result.stats.rejected} rejected" in card.stats_label.text()
    assert window.speed_label.text() == f"{result.stats.tokens_per_second:.1f} tok/s"
    assert "Chain(4)" in window.strategy_label.text() and "tiny" in window.pair_label.text()
    assert stored_messages(data_dir) == [("user", "Hello there", "", 1),
                                         ("assistant", result.text, expected_origins, 1)]


def test_shift_enter_adds_a_line_instead_of_sending(make_window, qtbot):
    window = make_window()
    qtbot.keyClicks(window.prompt, "line one")
    qtbot.keyClick(window.prompt, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(window.prompt, "line two")
    assert window.prompt.toPlainText() == "line one\nline two"
    assert window.conv is None and window._stream is None


def test_stop_mid_answer_keeps_the_text_and_saves_it(make_window, qtbot, data_dir):
    window = make_window(max_new_tokens=3000)
    emitted = []  # appended in the worker thread as each step leaves the engine
    with qtbot.waitSignal(window.generation_finished, timeout=60_000) as blocker:
        assert window.send("Tell me a long story")
        window._stream.worker.step.connect(emitted.append, Qt.ConnectionType.DirectConnection)
        qtbot.waitUntil(lambda: window.conv.messages[-1].content != "", timeout=60_000)
        assert window.stop_button.isVisible() and not window.send_button.isVisible()
        qtbot.keyClick(window, Qt.Key.Key_Escape)  # Esc stops
        steps_at_stop = len(emitted)
    result = blocker.args[0]
    assert result.stop_reason == StopReason.CANCELLED
    assert 0 < len(result.tokens) < 3000
    assert len(emitted) <= steps_at_stop + 1  # the engine stopped within one step of the Esc
    assert window.conv.messages[-1].content == result.text
    assert "stopped" in window.cards[-1].stats_label.text()
    assert stored_messages(data_dir)[-1] == ("assistant", result.text, window.conv.messages[-1].origins, 1)
    assert window.send_button.isVisible() and not window.stop_button.isVisible()


def test_partial_answer_is_on_disk_while_it_streams(make_window, qtbot, data_dir):
    window = make_window(max_new_tokens=3000)
    snapshots = []

    def check_disk(_event):
        # answer_updated comes after the window showed the step: what is shown must already be stored
        shown = window.conv.messages[-1].content
        snapshots.append((shown, stored_messages(data_dir)[-1]))

    window.answer_updated.connect(check_disk)
    with qtbot.waitSignal(window.generation_finished, timeout=60_000):
        assert window.send("Stream something")
        qtbot.waitUntil(lambda: len(snapshots) >= 3, timeout=60_000)
        window.stop()
    for shown, (role, content, _origins, complete) in snapshots[:3]:
        assert role == "assistant" and content == shown and complete == 0


def test_regenerate_replaces_the_last_answer(make_window, ask, qtbot, data_dir):
    window = make_window()
    first = ask(window, "Say something")
    assert window.cards[-1].regenerate_button.isVisible()
    assert not window.cards[0].regenerate_button.isVisible()
    with qtbot.waitSignal(window.generation_finished, timeout=60_000) as blocker:
        qtbot.mouseClick(window.cards[-1].regenerate_button, Qt.MouseButton.LeftButton)
    second = blocker.args[0]
    assert second.text == first.text  # greedy and lossless: the same prompt gives the same answer
    assert [m.role for m in window.conv.messages] == ["user", "assistant"]
    assert len(window.cards) == 2
    assert [r[:2] for r in stored_messages(data_dir)] == [("user", "Say something"), ("assistant", second.text)]


def test_edit_and_resend_replaces_the_message_and_what_followed(make_window, ask, qtbot, data_dir):
    window = make_window()
    ask(window, "first question")
    ask(window, "second question")
    assert len(window.conv.messages) == 4
    qtbot.mouseClick(window.cards[0].edit_button, Qt.MouseButton.LeftButton)
    assert window.prompt.toPlainText() == "first question"
    assert window.edit_banner.isVisible()
    window.prompt.selectAll()
    with qtbot.waitSignal(window.generation_finished, timeout=60_000) as blocker:
        qtbot.keyClicks(window.prompt, "edited question")
        qtbot.keyClick(window.prompt, Qt.Key.Key_Return)
    result = blocker.args[0]
    assert [(m.role, m.content) for m in window.conv.messages] == [("user", "edited question"),
                                                                   ("assistant", result.text)]
    assert [r[:2] for r in stored_messages(data_dir)] == [("user", "edited question"), ("assistant", result.text)]
    assert not window.edit_banner.isVisible()


def test_edit_can_be_cancelled_with_escape(make_window, ask, qtbot):
    window = make_window()
    ask(window, "keep me")
    window.begin_edit(window.conv.messages[0])
    qtbot.keyClick(window, Qt.Key.Key_Escape)
    assert window.prompt.toPlainText() == "" and not window.edit_banner.isVisible()
    assert window._editing is None


def test_switching_strategy_changes_decoding_not_the_greedy_text(make_window, ask):
    window = make_window()
    results = {}
    for key, extra in (("baseline", {}), ("chain", {"chain_k": 3}), ("tree", {"tree_branching": "2,2"}),
                       ("sequoia", {"tree_budget": 8, "tree_depth": 4})):
        window.apply_settings(replace(window.settings, strategy=key, **extra))
        label = window.settings.build_strategy().label
        assert window.strategy_label.text() == f"Strategy: {label}"
        window.new_chat()
        results[key] = ask(window, "Compare the strategies")
        assert {s.strategy for s in results[key].steps} == {label}
    assert results["baseline"].stats.drafted == 0
    assert all(results[k].stats.drafted > 0 for k in ("chain", "tree", "sequoia"))
    texts = {k: r.text for k, r in results.items()}
    assert len(set(texts.values())) == 1, texts  # lossless: every strategy gives the baseline's greedy text


def test_bad_sampling_value_is_a_dialog_not_a_crash(make_window, qtbot):
    window = make_window()
    window.settings = replace(window.settings, top_p=0.0)  # what a hand-edited settings file could hold
    with qtbot.waitSignal(window.message_shown, timeout=5_000) as blocker:
        assert not window.send("hello")
    assert "top_p" in blocker.args[1]
    assert window._stream is None and window.conv.messages[-1].role == "user"


def test_missing_model_path_shows_an_error_and_the_app_stays_up(make_window, qtbot, tmp_path):
    from app.chat.loader import load_backends

    window = make_window(load=load_backends)  # the real loader: core.models builds the tiny pair
    missing = tmp_path / "nowhere" / "model.gguf"
    custom = replace(window.settings, pair="custom", target_path=str(missing), draft_path=str(missing),
                     backend="llama.cpp")
    with qtbot.waitSignal(window.message_shown, timeout=30_000) as blocker:
        window.apply_settings(custom)
    title, text = blocker.args
    assert title == "Could not load the models" and str(missing) in text and "does not exist" in text
    assert window.backends is None and not window.send_button.isEnabled()
    assert not window.send("anyone there?")
    assert window.dialogs and window.dialogs[-1].isVisible()
    with qtbot.waitSignal(window.models_loaded, timeout=30_000):
        window.apply_settings(replace(custom, pair="tiny", backend="hf"))
    assert window.send_button.isEnabled() and "tiny" in window.pair_label.text()


def test_closing_during_generation_cancels_and_waits(make_window, qtbot, data_dir):
    window = make_window(max_new_tokens=3000)
    assert window.send("Keep talking")
    qtbot.waitUntil(lambda: window.conv.messages[-1].content != "", timeout=60_000)
    thread = window._stream.thread
    window.close()
    assert thread.isFinished()
    assert window._threads == set()
    role, content, _origins, complete = stored_messages(data_dir)[-1]
    assert role == "assistant" and content and complete == 1
    assert len(content) < 3000


def test_new_chat_shortcut_and_busy_buttons_say_why(make_window, qtbot):
    window = make_window(max_new_tokens=3000)
    with qtbot.waitSignal(window.generation_finished, timeout=60_000) as blocker:
        assert window.send("busy?")
        assert not window.new_button.isEnabled()
        assert "Stop" in window.new_button.toolTip()
        assert not window.cards[0].edit_button.isEnabled() and "generating" in window.cards[0].edit_button.toolTip()
        window.stop()
    assert blocker.args[0].stop_reason == StopReason.CANCELLED
    window.prompt.setFocus()
    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.conv is None and window.cards == []


def test_engine_error_is_a_dialog_and_never_text_in_the_answer(make_window, qtbot, data_dir, ask):
    window = make_window()
    too_long = "x" * (window.backends[0].context_length + 10)
    with qtbot.waitSignal(window.message_shown, timeout=60_000) as shown:
        with qtbot.waitSignal(window.generation_finished, timeout=60_000) as finished:
            assert window.send(too_long)
    assert finished.args == [None]
    title, text = shown.args
    assert title == "Generation failed" and "context" in text
    assert [m.role for m in window.conv.messages] == ["user"]  # no answer card holding the error
    assert [c.message.role for c in window.cards] == ["user"]
    assert [r[0] for r in stored_messages(data_dir)] == ["user"]
    window.new_chat()
    assert ask(window, "still working?").tokens  # the app stays usable


def test_ctrl_comma_opens_settings_and_accepting_applies_them(make_window, qtbot, data_dir):
    from app.settings import load_settings
    from app.settings_dialog import SettingsDialog

    window = make_window()
    qtbot.keyClick(window, Qt.Key.Key_Comma, Qt.KeyboardModifier.ControlModifier)
    dialogs = [d for d in window.findChildren(SettingsDialog) if d.isVisible()]
    assert len(dialogs) == 1
    dialog = dialogs[0]
    dialog.strategy_combo.setCurrentIndex(dialog.strategy_combo.findData("multidraft"))
    dialog.multi_k.setValue(3)
    dialog.accept()
    assert window.strategy_label.text() == "Strategy: MultiDraft(3x3)"
    assert load_settings().strategy == "multidraft"  # persisted


def test_loading_shows_progress_and_closing_mid_load_ends_cleanly(make_window, qtbot):
    import threading

    reported = threading.Event()

    def slow_load(choice, progress):
        # reports progress until the window cancels the load (progress then raises)
        while True:
            progress("Assembling the target model", 0.25)
            reported.set()
            threading.Event().wait(0.005)

    window = make_window(load=slow_load, wait=False)
    window.load_models()
    qtbot.waitUntil(lambda: window.progress.isVisible() and window.progress.value() == 250, timeout=30_000)
    assert window.progress_label.text() == "Assembling the target model"
    assert not window.send_button.isEnabled() and "loading" in window.pair_label.text()
    assert reported.is_set()
    threads = set(window._threads)
    window.close()
    assert threads and all(t.isFinished() for t in threads)


def test_origin_highlight_toggle_and_system_prompt(make_window, ask, qtbot, monkeypatch, tiny_backends):
    from app.chat.render import tinted_text

    target = tiny_backends[0]
    seen = []
    original = target.apply_chat_template
    monkeypatch.setattr(target, "apply_chat_template", lambda messages: seen.append(messages) or original(messages))
    window = make_window()
    window.system_edit.setText("Answer in French.")
    result = ask(window, "Bonjour")
    assert seen[-1] == [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Bonjour"}]
    assert window.store.conversation(window.conv.id).system_prompt == "Answer in French."
    assert result.stats.accepted > 0
    card = window.cards[-1]
    assert tinted_text(card.body.document())  # accepted draft tokens are highlighted
    window.origins_action.trigger()
    assert not window.settings.color_origins and tinted_text(card.body.document()) == ""
    assert window.legend.text() == ""
    window.origins_action.trigger()
    assert tinted_text(card.body.document())
