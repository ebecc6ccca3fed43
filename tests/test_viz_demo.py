"""`speclens demo` plays its whole script in the real window: typed prompt, live answer, slider replay, race."""
from __future__ import annotations

from PySide6.QtWidgets import QApplication

from app.demo import DemoScript, parse_args


def test_demo_script_plays_to_the_end_of_the_race(qtbot, make_window):
    window = make_window(wait=False, max_new_tokens=24)
    args = parse_args(["--pair", "tiny", "--speed", "25", "--max-new-tokens", "24", "--prompt", "Hi there"])
    script = DemoScript(window, args, QApplication.instance())   # acts from the warm-up's end on
    qtbot.waitUntil(lambda: script.race is not None and script.race.compare.summary is not None, timeout=120_000)
    assert script.failed == ""
    messages = window.session.conv.messages
    assert [m.role for m in messages] == ["user", "assistant"] and messages[0].content == "Hi there"
    tree = window.viz.tree
    assert tree.slider.value() == tree.slider.maximum() == len(tree.events) - 1
    summary = script.race.compare.summary
    assert summary.comparison.identical            # greedy, float64 tiny pair: the race's two answers agree
    assert summary.other.result.text == messages[1].content
    script.race.close()


def test_the_window_races_its_last_prompt(qtbot, make_window, ask):
    window = make_window(max_new_tokens=16)
    assert window.race_action.isEnabled()
    ask(window, "Hello")
    window.race_action.trigger()
    dialog = next(w for w in QApplication.topLevelWidgets() if w.windowTitle().startswith("SpecLens \u2014 race"))
    with qtbot.waitSignal(dialog.compare.runsFinished, timeout=120_000) as done:
        pass
    summary = done.args[0]
    assert summary.other.label == "Chain(4)" and summary.comparison.identical
    assert summary.other.result.text == window.session.conv.messages[-1].content
    dialog.close()
