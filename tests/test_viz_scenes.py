"""`speclens screenshot` renders the visualisation scenes from real runs of the tiny pair."""
from __future__ import annotations

import threading

from PySide6.QtGui import QImage

from app.screenshots import main
from app.viz.scenes import PANEL_SIZE, RACE_SIZE


def test_viz_scenes_are_registered_and_rendered(qapp, data_dir, tmp_path, compute_threads):
    out = tmp_path / "shots"
    assert main(["--scene", "tree,plots,race", "--out", str(out), "--pair", "tiny"]) == 0
    # recorded on the thread where the window loaded and warmed the pair, as the speeds they show must be
    assert len(compute_threads) == 1 and threading.get_ident() not in compute_threads
    for name, size in (("tree", PANEL_SIZE), ("plots", PANEL_SIZE), ("race", RACE_SIZE)):
        image = QImage(str(out / f"{name}.png"))
        assert (image.width(), image.height()) == size, name
        # a real picture, not a blank widget: many distinct colours
        colours = {image.pixel(x, y) for x in range(0, size[0], 7) for y in range(0, size[1], 7)}
        assert len(colours) > 50, name


def test_a_snapshot_shows_what_draws_only_while_visible(qapp):
    # the plots push their data only while visible (bounded GUI work); a screenshot must show them drawn
    from PySide6.QtWidgets import QApplication

    from app.screenshots import snapshot
    from app.viz.panel import VizPanel
    from app.viz.scenes import feed, record
    from core.drafting import Chain
    from core.sampling import SamplingParams
    from core.tiny import tiny_pair

    strategy = Chain(2)
    result = record(tiny_pair(), strategy, SamplingParams(temperature=0.0), 24)
    panel = VizPanel()
    feed(panel, strategy, result)
    panel.tabs.setCurrentWidget(panel.plots)
    assert len(panel.plots.spec_curve.getData()[0] or ()) == 0      # hidden: nothing pushed yet
    snapshot(panel, QApplication.instance())
    assert len(panel.plots.spec_curve.getData()[0]) > 0
    panel.close()
