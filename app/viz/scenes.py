"""Scenes of the live view and the race for `speclens screenshot` (registered in app/screenshots.py).

Each scene takes the screenshot command's context, uses the pair its main window loaded (``ctx.window().session.backends``),
decodes a real prompt, and returns the widget to grab. Nothing is faked: the numbers in the pictures are this
machine's, from the engine's timestamps.
"""
from __future__ import annotations

from dataclasses import replace

from PySide6.QtWidgets import QWidget

from app.compare.compare_widget import CompareWidget
from app.viz.panel import VizPanel
from app.viz.tree_layout import explain_node
from app.worker import on_engine_thread
from core.auto import Auto, get_plan
from core.drafting import Baseline, Chain, Tree
from core.engine import SpeculativeEngine
from core.events import Fate, GenerationResult, StepEvent
from core.sampling import SamplingParams

PROMPT = "Write a Python function is_palindrome(s) that ignores case and punctuation. Keep it short."
# an edit: the answer copies most of the question, which is where drafting from memory pays on a CPU
EDIT_PROMPT = ("Add type hints to this function and return the whole function:\n\n```python\n"
               "def merge_sorted(left, right):\n    result = []\n    i = j = 0\n"
               "    while i < len(left) and j < len(right):\n        if left[i] <= right[j]:\n"
               "            result.append(left[i])\n            i += 1\n        else:\n"
               "            result.append(right[j])\n            j += 1\n    result.extend(left[i:])\n"
               "    result.extend(right[j:])\n    return result\n```")
PANEL_SIZE = (1100, 720)
RACE_SIZE = (1200, 760)


def record(pair, strategy, sampling: SamplingParams, max_new_tokens: int, prompt: str = PROMPT) -> GenerationResult:
    """Decode ``prompt`` (as a chat message) with ``strategy`` and return the whole run; on the engine thread, where
    the window loaded and warmed the pair (a second thread decoding slows llama.cpp: app.worker)."""
    target, draft = pair
    engine = SpeculativeEngine(target, None if isinstance(strategy, Baseline) else draft, strategy, sampling)
    ids = engine.chat_ids([{"role": "user", "content": prompt}])
    return on_engine_thread(lambda: engine.generate(ids, max_new_tokens))


_warmed: set[int] = set()


def warm_up(pair) -> None:
    """One short decode with both models before anything is timed: the first call pays page-ins and allocations
    that would otherwise land on whichever run goes first (the screenshot command shares one pair between scenes)."""
    if id(pair[0]) not in _warmed:
        record(pair, Chain(2), SamplingParams(temperature=0.0), 4)
        _warmed.add(id(pair[0]))


def feed(panel: VizPanel, strategy, result: GenerationResult) -> None:
    """Play a recorded run into the panel as the chat window would, live."""
    panel.on_generation_started(strategy.label)
    panel.on_steps(result.steps)
    panel.on_finished(result)


def telling_step(steps: tuple[StepEvent, ...]) -> int:
    """The step that shows the most: the longest accepted path among steps that also rejected something."""
    def score(i: int) -> tuple[int, int, int]:
        e = steps[i]
        rejected = sum(1 for n in e.nodes if n.fate == Fate.REJECTED)
        return (int(rejected > 0), len(e.accepted_path), len(e.nodes))
    return max(range(len(steps)), key=score)


def scene_tree(ctx) -> QWidget:
    """The live panel's Tree tab on a Sequoia tree sampled at temperature 0.7, with a rejected node explained."""
    pair = ctx.window().session.backends
    warm_up(pair)
    strategy = Tree.sequoia(budget=12, max_depth=4)
    result = record(pair, strategy, SamplingParams(temperature=0.7, seed=7), 64)
    panel = VizPanel()
    panel.resize(*PANEL_SIZE)
    feed(panel, strategy, result)
    i = telling_step(result.steps)
    panel.tree.show_index(i, animate=False)
    event = result.steps[i]
    shown = next((n for n in event.nodes if n.fate == Fate.REJECTED), event.nodes[0] if event.nodes else None)
    if shown is not None:
        panel.tree.details.setText(explain_node(shown, event))  # as if that box had been clicked
    return panel


def scene_plots(ctx) -> QWidget:
    """The Plots tab after a greedy Auto answer to an edit, with the baseline's speed on the same axes."""
    pair = ctx.window().session.backends
    warm_up(pair)
    strategy = Auto(use_memory=False)
    greedy = SamplingParams(temperature=0.0)
    baseline = record(pair, Baseline(), greedy, 160, EDIT_PROMPT)
    result = record(pair, strategy, greedy, 160, EDIT_PROMPT)
    panel = VizPanel()
    panel.resize(*PANEL_SIZE)
    feed(panel, strategy, result)
    for event in baseline.steps:
        panel.plots.add_baseline_step(event)
    panel.plots.refresh()
    panel.tabs.setCurrentWidget(panel.plots)
    return panel


def scene_race(ctx) -> QWidget:
    """Baseline against Auto (what the chat uses), greedy, on an edit, raced on the recorded engine timestamps."""
    pair = ctx.window().session.backends
    warm_up(pair)
    greedy = SamplingParams(temperature=0.0)
    strategy = Auto(use_memory=False)
    baseline = record(pair, Baseline(), greedy, 160, EDIT_PROMPT)
    other = record(pair, strategy, greedy, 160, EDIT_PROMPT)
    widget = CompareWidget(lambda s: SpeculativeEngine(pair[0], pair[1], s, greedy))
    widget.resize(*RACE_SIZE)
    widget.show_results("Baseline", baseline, strategy.label, other)
    widget.finish_replay()
    return widget


def scene_planner(ctx) -> QWidget:
    """The Planner tab: Auto's plan for this pair and machine (acceptance on calibration prompts, latencies, the DP
    and the chosen tree; cached as Auto uses it, measured when missing) and the speedup it predicted against the one
    a run of the demo prompt realised."""
    pair = ctx.window().session.backends
    warm_up(pair)
    greedy = SamplingParams(temperature=0.0)
    plan = on_engine_thread(lambda: get_plan(pair[0], pair[1], greedy))
    if plan.tree is None:
        raise ValueError("the planner found no tree to show: no draft token was accepted during calibration")
    strategy = Tree(plan.tree.parents, name=f"Sequoia({plan.tree.budget})")
    baseline = record(pair, Baseline(), greedy, 48)
    planned = record(pair, strategy, greedy, 48)
    realised = planned.stats.tokens_per_second / baseline.stats.tokens_per_second
    note = (f"Auto's plan (acceptance from {plan.calibration_steps} calibration target calls); realised = decode "
            "tokens/s of this tree over Baseline's on the demo prompt (48 tokens, greedy, one after the other)")
    panel = VizPanel()
    panel.resize(*PANEL_SIZE)
    panel.set_plan(plan.to_event(note).with_realised(realised))
    feed(panel, strategy, planned)
    panel.tabs.setCurrentWidget(panel.planner)
    return panel


def scene_learn(ctx) -> QWidget:
    """The Learn tab on a sampled step of the planned Sequoia tree (temperature 0.7): each tested node's test, the
    residual behind the correction, the chain formula against the measured point, and the plan's c(n, d)."""
    pair = ctx.window().session.backends
    warm_up(pair)
    plan = on_engine_thread(lambda: get_plan(pair[0], pair[1], SamplingParams(temperature=0.0)))
    if plan.tree is None:
        raise ValueError("the planner found no tree to explain: no draft token was accepted during calibration")
    strategy = Tree(plan.tree.parents, name=f"Sequoia({plan.tree.budget})")
    result = record(pair, strategy, SamplingParams(temperature=0.7, seed=7), 48)
    panel = VizPanel()
    panel.resize(*PANEL_SIZE)
    panel.set_plan(plan.to_event("Auto's plan for this pair and machine"))
    feed(panel, strategy, result)
    i = telling_step(result.steps)
    panel.tree.show_index(i, animate=False)
    panel.learn.show_index(i)
    panel.tabs.setCurrentWidget(panel.learn)
    return panel


def _edit_request(ctx, window, listed) -> None:
    """An editor's fast-apply request to the window's server: the function to edit, and itself as the prediction."""
    import threading

    import openai

    code = EDIT_PROMPT.split("```python\n", 1)[1].split("```", 1)[0]
    done: list = []

    def ask() -> None:
        client = openai.OpenAI(base_url=window.serve.host.url, api_key="none", max_retries=0, timeout=600)
        model = client.models.list().data[0].id
        done.append(client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": EDIT_PROMPT}], temperature=0, max_tokens=160,
            prediction={"type": "content", "content": f"```python\n{code}```"}))

    threading.Thread(target=ask, daemon=True).start()
    ctx.wait_until(lambda: bool(done) and listed(1), "the served request")


def _infill_requests(ctx, window, listed) -> None:
    """An editor plugin's completions at the cursor through llama-server's /infill, as llama.vim asks: the first,
    then another once the user has typed the start of the suggestion (drafted from the answer before)."""
    import threading

    import httpx

    code = EDIT_PROMPT.split("```python\n", 1)[1].split("```", 1)[0]
    loop = "    while i < len(left) and j < len(right):\n"
    before, body = code.split(loop)
    after = body[body.index("    result.extend"):]      # the loop's body is the gap, its indentation typed
    done: list = []

    refused: list = []

    def ask() -> None:
        typed = "        "
        for _ in range(2):
            r = httpx.post(f"{window.serve.host.url.removesuffix('/v1')}/infill", timeout=600, json={
                "input_prefix": before + loop, "prompt": typed, "input_suffix": after, "n_predict": 64,
                "temperature": 0, "n_indent": 8})
            if r.status_code != 200:     # the tiny pair, say: no fill-in-the-middle tokens
                refused.append(r.json()["error"]["message"])
                return
            done.append(r.json())
            typed += done[-1]["content"][:12]

    threading.Thread(target=ask, daemon=True).start()
    ctx.wait_until(lambda: refused or (len(done) == 2 and listed(2)),
                   "the served completions")
    if refused:
        raise ValueError(refused[0])


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _tool_request(ctx, window, listed) -> None:
    """An agent's turn that offers a tool, answered with a call to it (the default pair's template offers tools)."""
    import threading

    import httpx

    answers: list = []

    def ask() -> None:
        answers.append(httpx.post(f"{window.serve.host.url}/chat/completions", timeout=600, json={
            "messages": [{"role": "user", "content": "What's the weather in Paris? Use the tool."}],
            "tools": [WEATHER_TOOL], "temperature": 0, "max_tokens": 80}))

    threading.Thread(target=ask, daemon=True).start()
    ctx.wait_until(lambda: answers and (answers[0].status_code != 200 or listed(1)),
                   "the served request")
    if answers[0].status_code != 200:     # the tiny pair, say: its template has no place for tools
        raise ValueError(answers[0].json()["error"]["message"])


def _serving(ctx, ask) -> QWidget:
    """The window serving an editor's requests (``ask(ctx, window, listed)``, ``listed(n)`` saying whether n more
    are listed since it began), decoded live on the chat's models, the last one opened from the Served list, the
    status bar saying where SpecLens listens."""
    from core.endpoints.llama_server import free_port

    window = ctx.window()
    warm_up(window.session.backends)
    if not window.serve.running:        # a scene before this one in the same run may have switched it on
        window.apply_settings(replace(window.settings, serve_port=free_port()))
        window.serve_action.trigger()
        if not window.serve.running:
            raise ValueError("Serve did not start")
    before = window.served_list.list.count()
    ask(ctx, window, lambda n: window.served_list.list.count() >= before + n)
    window.served_list.list.setCurrentRow(0)
    window.open_served(window.serve.host.monitor.records[-1])   # as a click on it does
    return window


def scene_serve(ctx) -> QWidget:
    """A fast-apply request with its prediction."""
    return _serving(ctx, _edit_request)


def scene_serve_infill(ctx) -> QWidget:
    """Completion at the cursor through /infill (the default pair: the tiny one has no fill-in-the-middle tokens)."""
    return _serving(ctx, _infill_requests)


def scene_serve_tools(ctx) -> QWidget:
    """An agent's request with a tool, its answer returned as a call (the default pair: the tiny one's template has
    no place for tools)."""
    return _serving(ctx, _tool_request)


def scene_race_endpoint(ctx) -> QWidget:
    """SpecLens Auto against another server on the same model and prompt: llama.cpp's own llama-server on the target's
    file when it is installed and the pair runs on llama.cpp, else a second SpecLens server (Baseline) of the pair."""
    from core.endpoints.client import Endpoint, EndpointRun, probe
    from core.endpoints.llama_server import LlamaServer, LlamaServerError
    from core.serve.background import ServerThread
    from core.serve.job import ServedModels

    pair = ctx.window().session.backends
    warm_up(pair)
    greedy = SamplingParams(temperature=0.0)
    target = pair[0]
    try:
        server = LlamaServer(target.path, threads=target.n_threads, context=target.context_length).start()
    except (LlamaServerError, AttributeError):   # no binary, or the pair is not a GGUF one
        server = ServerThread(ServedModels(*pair, Baseline(), "speclens-baseline", remember_answers=False)).start()
    try:
        found = probe(Endpoint(server.url))
        endpoint = EndpointRun.for_target(Endpoint(server.url, model=found.models[0]), found.engine, target)
        messages = [{"role": "user", "content": EDIT_PROMPT}]
        on_engine_thread(lambda: [None for _ in endpoint.stream(messages, 160, greedy)])
    finally:
        server.stop()
    strategy = Auto(use_memory=False)
    other = record(pair, strategy, greedy, 160, EDIT_PROMPT)
    widget = CompareWidget(lambda s: SpeculativeEngine(pair[0], pair[1], s, greedy))
    widget.resize(*RACE_SIZE)
    widget.show_results(endpoint.endpoint.label, endpoint.result.result, strategy.label, other)
    widget.finish_replay()
    return widget
