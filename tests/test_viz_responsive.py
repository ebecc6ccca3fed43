"""The GUI's work while the engine decodes is bounded per second, not per step: the worker hands the panel a frame
of steps at most FRAME_HZ times a second and the panel draws at most once every DRAW_INTERVAL_S, however fast steps
come, while every step is still kept for replay. (Bounds on counts against the elapsed time, so a slow or busy
machine can only loosen them; no latency is asserted.)"""
from __future__ import annotations

import time

from app.viz import panel as panel_module
from app.viz.panel import DRAW_INTERVAL_S, VizPanel
from app.worker import FRAME_HZ, EngineRun
from core.drafting import Tree
from core.engine import SpeculativeEngine
from core.sampling import SamplingParams
from core.tiny import tiny_pair

SHAPE = (-1, -1, 0, 0, 1, 2, 2, 4)
TIMER_SLACK = 1.1   # Qt's coarse timers may fire up to 5% early


def test_the_panel_draws_at_frame_rate_and_keeps_every_step(qtbot, monkeypatch):
    target, draft = tiny_pair(noise=0.3)
    strategy = Tree(SHAPE, name="shape")
    prompt = target.apply_chat_template([{"role": "user", "content": "Keep going for a while."}])
    panel = VizPanel()
    qtbot.addWidget(panel)
    panel.resize(900, 600)
    panel.show()
    panel.on_generation_started(strategy.label)
    draws, frames = [], []
    draw = VizPanel._draw
    monkeypatch.setattr(panel_module.VizPanel, "_draw", lambda self: (draws.append(1), draw(self)))

    def job(push, cancel):
        engine = SpeculativeEngine(target, draft, strategy, SamplingParams(temperature=0.9, seed=1))
        for event in engine.stream(prompt, 400, cancel):
            push(event)
        return engine.last_result

    run = EngineRun(job)        # as the session runs answers: the panel gets a frame of steps at a time
    run.frame.connect(lambda events: frames.append(len(events)))
    run.frame.connect(panel.on_steps)
    run.finished.connect(panel.on_finished)
    results = []
    run.finished.connect(results.append)
    start = time.monotonic()
    run.start()
    try:
        qtbot.waitUntil(lambda: bool(results), timeout=300_000)
    finally:
        run.cancel()
        run.wait(10_000)
    elapsed = time.monotonic() - start
    result = results[0]
    assert len(panel.tree.events) == len(result.steps) == sum(frames) >= 40
    assert len(frames) <= elapsed * FRAME_HZ * TIMER_SLACK + 2
    assert len(draws) <= elapsed / DRAW_INTERVAL_S + 2      # + the drawing of the last steps at the end
    assert "stopped:" in panel.summary.text()
