"""Settings: the dialog checks values through the objects they build, persistence, strategies on offer."""
from __future__ import annotations

from dataclasses import replace

import pytest

from app.settings import (AppSettings, SettingsError, branching_parents, load_settings, parse_branching,
                          save_settings, strategy_options)
from app.settings_dialog import SettingsDialog
from core.drafting import Chain, Tree
from core.sampling import SamplingError


@pytest.fixture
def dialog(qtbot, data_dir):
    from app.main import create_app

    create_app()
    dlg = SettingsDialog(AppSettings(pair="tiny", backend="hf"))
    qtbot.addWidget(dlg)
    dlg.show()
    return dlg


def test_bad_sampling_value_is_shown_and_the_dialog_stays_open(dialog):
    dialog.top_p.setValue(0.0)
    dialog.accept()
    assert dialog.result_settings is None and dialog.isVisible()
    assert dialog.error_label.isVisible() and "top_p must be in (0, 1]" in dialog.error_label.text()
    dialog.top_p.setValue(0.9)
    dialog.temperature.setValue(0.7)
    dialog.seed.setValue(42)
    dialog.min_p.setValue(0.05)
    dialog.context.setValue(16384)
    dialog.accept()
    assert not dialog.isVisible()
    accepted = dialog.result_settings
    assert accepted.sampling() == accepted.sampling().__class__(temperature=0.7, top_k=0, top_p=0.9, min_p=0.05,
                                                                seed=42)
    assert accepted.pair_choice().context == 16384      # a new context is a new pair to load


def test_bad_tree_shape_is_shown(dialog):
    dialog.strategy_combo.setCurrentIndex(dialog.strategy_combo.findData("tree"))
    assert dialog.strategy_pages.currentWidget().isVisible()
    dialog.tree_branching.setText("2,x")
    dialog.accept()
    assert dialog.result_settings is None and "2,x" in dialog.error_label.text()
    dialog.tree_branching.setText("8,8")
    dialog.accept()
    assert dialog.result_settings is None and "more than 63 nodes" in dialog.error_label.text()
    dialog.tree_branching.setText("63")      # 63 leaves fit the llama.cpp backend's sequences; 64 would not
    dialog.accept()
    assert dialog.result_settings is not None


def test_custom_pair_needs_two_paths(dialog):
    dialog.pair_combo.setCurrentIndex(dialog.pair_combo.findData("custom"))
    assert dialog.custom_rows.isVisible()
    dialog.target_edit.setText("/models/target.gguf")
    dialog.accept()
    assert dialog.result_settings is None and "both a target and a draft" in dialog.error_label.text()


def test_strategy_options_offer_auto_first():
    keys = [o.key for o in strategy_options()]
    assert keys[:5] == ["auto", "baseline", "chain", "multidraft", "tree"]
    assert {"sequoia", "memory", "ngram"} <= set(keys)
    assert AppSettings().strategy == "auto"
    settings = AppSettings(strategy="sequoia", tree_budget=8, tree_depth=3)
    tree = settings.build_strategy()
    assert isinstance(tree, Tree) and len(tree.parents) == 7  # a budget of 8 counts the committed root
    assert AppSettings(strategy="chain", chain_k=5).build_strategy() == Chain(5)
    with pytest.raises(SettingsError):
        AppSettings(strategy="no-such").build_strategy()


def test_branching_parents_is_breadth_first():
    assert parse_branching(" 2, 1 ") == (2, 1)
    assert branching_parents((2, 2)) == (-1, -1, 0, 0, 1, 1)
    assert branching_parents((3,)) == (-1, -1, -1)


def test_settings_round_trip_through_qsettings(data_dir):
    from app.main import create_app

    create_app()
    chosen = AppSettings(pair="tiny", backend="hf", strategy="multidraft", multi_k=3, temperature=0.5, top_k=20,
                         top_p=0.8, min_p=0.1, seed=7, max_new_tokens=99, theme="dark", color_origins=False,
                         context_size=0)
    save_settings(chosen)
    assert load_settings() == chosen
    assert load_settings(theme="light") == replace(chosen, theme="light")
    assert (data_dir / "settings.ini").exists()


def test_sampling_errors_come_from_sampling_params():
    with pytest.raises(SamplingError):
        AppSettings(temperature=-1.0).sampling()
    assert AppSettings(seed=-1).sampling().seed is None


def test_unusable_saved_values_fall_back_with_a_notice(data_dir):
    from app.main import create_app
    from app.settings import read_settings

    create_app()
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "settings.ini").write_text("[General]\ntheme=purple\nchain_k=lots\nstrategy=chain\n")
    settings, notices = read_settings()
    assert settings.theme == "light" and settings.chain_k == 4 and settings.strategy == "chain"
    assert len(notices) == 2 and any("theme" in n and "purple" in n for n in notices)


def test_an_unusable_data_folder_is_a_clear_error(tmp_path, monkeypatch):
    from app.settings import data_dir

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SPECLENS_DATA_DIR", str(blocker))
    with pytest.raises(SettingsError, match="SPECLENS_DATA_DIR"):
        data_dir()
    monkeypatch.setenv("SPECLENS_DATA_DIR", str(blocker / "below"))
    with pytest.raises(SettingsError, match="cannot be used"):
        data_dir()


def test_settings_that_cannot_be_saved_say_so(data_dir):
    from app.main import create_app

    create_app()
    (data_dir / "settings.ini").mkdir(parents=True)   # what QSettings cannot write over, even as root
    with pytest.raises(SettingsError, match="could not save the settings"):
        save_settings(AppSettings(theme="dark"))


def test_saved_settings_that_cannot_generate_fall_back_to_defaults_naming_each(data_dir):
    from app.main import create_app
    from app.settings import read_settings

    create_app()
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "settings.ini").write_text("[General]\ntemperature=nan\ntop_p=7\nmin_p=1\nstrategy=tree\n"
                                           "tree_branching=\"99,99\"\nmax_new_tokens=-5\nchain_k=500\n"
                                           "min_new_tokens=-1\nseed=12\ncontext_size=-5\n")
    settings, notices = read_settings()
    defaults = AppSettings()
    assert (settings.temperature, settings.top_p, settings.min_p, settings.tree_branching, settings.max_new_tokens,
            settings.chain_k, settings.min_new_tokens) == (defaults.temperature, defaults.top_p, defaults.min_p,
                                                           defaults.tree_branching, defaults.max_new_tokens,
                                                           defaults.chain_k, defaults.min_new_tokens)
    assert settings.strategy == "tree" and settings.seed == 12      # the usable values are kept
    assert settings.problems() == []
    for named in ("temperature=nan", "top_p=7.0", "min_p=1.0", "tree_branching='99,99'", "max_new_tokens=-5",
                  "chain_k=500", "min_new_tokens=-1", "context_size=-5"):
        assert sum(named in n for n in notices) == 1, named
    assert all("settings.ini" in n for n in notices)


def test_the_dialog_refuses_what_cannot_generate(dialog):
    assert dialog.max_new.minimum() == 1 and dialog.min_new.minimum() == 0   # the ranges the settings allow
    dialog.min_new.setValue(20)
    dialog.accept()
    assert dialog.result_settings.min_new_tokens == 20 and dialog.result_settings.sampling().min_tokens == 20


def test_the_dialog_fits_the_screen_and_shows_every_help_line_whole(dialog, qtbot):
    """On a screen shorter than the settings (the offscreen one is 800 px), they scroll and OK stays in view; at
    the whole height every wrapped help line has the height of all its lines."""
    from PySide6.QtWidgets import QLabel

    screen = dialog.screen().availableGeometry().height()
    whole = dialog.whole_height()
    assert whole > screen >= dialog.height()
    assert dialog.scroll.verticalScrollBar().maximum() > 0
    assert dialog.buttons.geometry().bottom() <= dialog.height()
    dialog.resize(dialog.width(), whole)
    qtbot.waitUntil(lambda: dialog.height() == whole)
    dialog.layout().activate()
    helps = [label for label in dialog.findChildren(QLabel, "HelpLine") if label.isVisible()]
    assert len(helps) > 10
    clipped = [label.text()[:40] for label in helps if label.height() < label.heightForWidth(label.width())]
    assert clipped == []
