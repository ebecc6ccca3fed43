"""`speclens screenshot` scenes, and pictures of the window's states (kept under $SPECLENS_SHOTS_DIR when set)."""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage

from app.screenshots import SCENES, main
from tests.tiny_models import STREAMS_LONG


def distinct_colours(path: Path) -> int:
    image = QImage(str(path))
    step = max(1, image.width() // 120)
    return len({image.pixel(x, y) for x in range(0, image.width(), step) for y in range(0, image.height(), step)})


@pytest.fixture
def shots_dir(tmp_path):
    folder = Path(os.environ.get("SPECLENS_SHOTS_DIR") or tmp_path / "shots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_screenshot_command_writes_each_scene(qapp, data_dir, tmp_path, capsys):
    out = tmp_path / "scenes"
    assert main(["--scene", "chat,settings", "--out", str(out), "--pair", "tiny"]) == 0
    for name, size in (("chat", (1440, 900)), ("settings", None)):
        image = QImage(str(out / f"{name}.png"))
        assert not image.isNull()
        if size:
            assert (image.width(), image.height()) == size
        assert distinct_colours(out / f"{name}.png") > 20  # real rendered text and widgets, not a blank frame
    assert not any(data_dir.glob("*")) if data_dir.exists() else True  # scenes never touch the user's data


@pytest.mark.parametrize("scene, why", [("serve-infill", "fill-in-the-middle"), ("serve-tools", "no place for tools")])
def test_a_scene_the_pair_cannot_show_says_why_at_once(qapp, data_dir, tmp_path, capsys, scene, why):
    assert main(["--scene", scene, "--out", str(tmp_path), "--pair", "tiny", "--timeout", "120"]) == 2
    assert why in capsys.readouterr().err


def test_screenshot_command_rejects_unknown_scenes(capsys):
    assert main(["--scene", "nope", "--out", "unused"]) == 2
    assert "unknown scene" in capsys.readouterr().err
    assert {"chat", "settings"} <= set(SCENES)


def test_window_states_render(make_window, ask, qtbot, shots_dir):
    window = make_window(**STREAMS_LONG)
    window.resize(1440, 900)
    window.grab().save(str(shots_dir / "state_empty.png"))
    with qtbot.waitSignal(window.session.answer_finished, timeout=60_000):
        assert window.send("Write a haiku about speculative decoding")
        qtbot.waitUntil(lambda: len(window.session.conv.messages[-1].content) > 60, timeout=60_000)
        window.grab().save(str(shots_dir / "state_streaming.png"))
        window.session.stop()
    window.grab().save(str(shots_dir / "state_stopped.png"))
    window.begin_edit(0)
    window.grab().save(str(shots_dir / "state_editing.png"))
    qtbot.keyClick(window, Qt.Key.Key_Escape)
    window.apply_settings(replace(window.settings, theme="dark"))
    window.grab().save(str(shots_dir / "state_dark.png"))
    box = window.show_message("Could not load the models", "model path /nowhere/model.gguf does not exist")
    qtbot.waitUntil(box.isVisible)
    box.grab().save(str(shots_dir / "state_error_dialog.png"))
    window.apply_settings(replace(window.settings, theme="light"))
    for name in ("empty", "streaming", "stopped", "editing", "dark"):
        assert distinct_colours(shots_dir / f"state_{name}.png") > 20


def test_speclens_without_arguments_opens_the_window(qapp, data_dir):
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app.main import main as app_main
    from app.main_window import MainWindow

    seen = []

    def close_when_ready():
        windows = [w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow) and w.isVisible()]
        if windows and windows[0].session.is_warm:
            seen.append(windows[0].settings)
            windows[0].close()
        else:
            QTimer.singleShot(20, close_when_ready)

    QTimer.singleShot(0, close_when_ready)
    assert app_main(["--pair", "tiny"]) == 0
    assert seen and (seen[0].pair, seen[0].backend) == ("tiny", "hf")
