"""The Learn tab: for one step, the formulas verification applied, each with its numbers, a sentence and its paper.

Three parts: the test at every node the target checked (min(1, p/q), or SpecTr's min(1, p/(rho q)), and the residual
the extra token came from); the chain formula (1 - b^(g+1)) / (1 - b) against the measured tokens per call; and,
when a plan is known, Sequoia's c(n, d) for the planned tree. Built from a StepEvent and a PlanEvent only (immutable
data): :func:`learn_html` is plain Python, the widget only shows its result.
"""
from __future__ import annotations

from html import escape
from typing import Sequence

from PySide6.QtWidgets import QTextBrowser, QVBoxLayout, QWidget

from app.viz.plots import expected_tokens_per_call
from app.viz.tree_layout import token_label
from core.events import Fate, NodeInfo, Origin, PlanEvent, StepEvent
from core.sequoia import tree_value

ACCEPTED_INK = "#1e8e3e"
REJECTED_INK = "#c62828"
MUTED_INK = "#78909c"
MARK = "\u2020"  # a test whose probability is not min(1, p/q): a residual (rule 3) or SpecTr's divisor

LEVIATHAN = "Leviathan, Kalman &amp; Matias 2023, <i>Fast Inference from Transformers via Speculative Decoding</i>"
CHEN_2023 = "Chen et al. 2023, <i>Accelerating LLM Decoding with Speculative Sampling</i>"
SPECINFER = "Miao et al. 2024, <i>SpecInfer</i> (token trees, multi-step speculative sampling)"
SPECTR = "Sun et al. 2023, <i>SpecTr: Fast Speculative Decoding via Optimal Transport</i> (K-SEQ)"
SEQUOIA = "Chen et al. 2024, <i>Sequoia</i> (the tree dynamic program)"


def verifier_of(event: StepEvent) -> str:
    """"greedy", "spectr" or "rule3". The event names the strategy, not the rule: a MultiDraft verified by SpecTr's
    K-SEQ says so in its label ("MultiDraft(3x3, SpecTr)"); every other strategy uses rule 3."""
    if event.greedy:
        return "greedy"
    return "spectr" if "SpecTr" in event.strategy else "rule3"


def _num(v: float | None) -> str:
    return "&ndash;" if v is None else f"{v:.3f}"


def _plain_ratio(node: NodeInfo) -> float | None:
    """min(1, p/q), the test a first child faces under rule 3."""
    if node.p is None or node.q <= 0:
        return None
    return min(1.0, node.p / node.q)


def _rho(node: NodeInfo) -> float | None:
    """SpecTr's divisor, read back from a test that was not certain: a = p / (rho q)."""
    a = node.accept_prob
    if node.p is None or a is None or not 0.0 < a < 1.0 or node.q <= 0:
        return None
    return node.p / (node.q * a)


def _tested(event: StepEvent) -> list[NodeInfo]:
    return sorted((n for n in event.nodes if n.accept_prob is not None), key=lambda n: (n.depth, n.index))


def _node_rows(event: StepEvent, rule: str) -> tuple[str, bool]:
    """The table of tested nodes, and whether any test differed from min(1, p/q)."""
    head = ["depth", "token", "p (target)", "q (draft)", "min(1, p/q)", "tested with", "outcome"]
    if rule == "spectr":
        head.insert(6, "&rho;")
    rows, marked = [], False
    for n in _tested(event):
        plain = _plain_ratio(n)
        # rule 3 tests a first child with min(1, p/q): a different number is a residual's test (SpecTr shows rho)
        differs = rule == "rule3" and plain is not None and abs(plain - n.accept_prob) > 1e-9
        marked |= differs
        ok = n.fate == Fate.ACCEPTED
        outcome = (f"<span style='color:{ACCEPTED_INK}'>accepted</span>" if ok else
                   f"<span style='color:{REJECTED_INK}'>rejected</span>")
        cells = [str(n.depth), f"<tt>{escape(token_label(n.text, n.special, 16))}</tt>", _num(n.p),
                 "1 (top-ranked)" if rule == "greedy" else _num(n.q), "&ndash;" if rule == "greedy" else _num(plain),
                 _num(n.accept_prob) + (f" {MARK}" if differs else ""), outcome]
        if rule == "spectr":
            cells.insert(6, _num(_rho(n)))
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    if not rows:
        return "<p><i>Nothing was drafted this step: the target produced its token alone.</i></p>", False
    table = ("<table cellspacing='0' cellpadding='4' border='0'><tr>" +
             "".join(f"<th align='left'>{h}</th>" for h in head) + "</tr>" + "".join(rows) + "</table>")
    return table, marked


def _rule_sentence(rule: str, marked: bool) -> str:
    if rule == "greedy":
        return ("Greedy decoding: the target's distribution is one-hot at its argmax, so a drafted token is kept "
                "exactly when it is that argmax; p above is the target's plain softmax, shown for interest. "
                f"({LEVIATHAN}.)")
    if rule == "spectr":
        return ("SpecTr's k-sequential selection tests the drafts at a node one after the other, each kept with "
                "probability min(1, p(x) / (&rho; q(x))) with one divisor &rho; in [1, k], the smallest that keeps "
                "the output exactly p; every sequence that agrees with the accepted prefix is a candidate at the next "
                f"level. ({SPECTR}.)")
    text = ("Each drafted token x is kept with probability min(1, p(x) / q(x)): a token the draft proposes more "
            "often than the target would is thinned to the target's share, one it proposes less often is always "
            f"kept. ({LEVIATHAN}; {CHEN_2023}.)")
    if marked:
        text += (f" {MARK} After a sibling was rejected, the next one is tested against the residual "
                 "R = norm(max(p &minus; q, 0)) instead of p, R[x] / q[x]: the target's mass the rejected draft did "
                 f"not cover. ({SPECINFER}.)")
    return text


def _extra_sentence(event: StepEvent, rule: str) -> str:
    if not event.tokens:
        return ""
    token = f"<tt>{escape(token_label(event.token_texts[-1], event.specials[-1] if event.specials else '', 24))}</tt>"
    origin = event.origins[-1]
    if origin == Origin.DRAFT:
        return f"The last accepted token {token} ends the text: nothing follows it."
    if origin == Origin.BONUS:
        return (f"Bonus {token}: every drafted token on the path was accepted, so the target's distribution at the "
                f"leaf gave one more token for free. ({LEVIATHAN}.)")
    if not event.nodes:
        return f"Plain decoding: the target sampled {token} from p."
    if rule == "greedy":
        return f"Correction {token}: no drafted child was the target's argmax, so the argmax itself is emitted."
    if rule == "spectr":
        return (f"Correction {token}: every candidate was rejected, so it was drawn from the residual "
                "p<sub>res</sub> = (p &minus; &alpha;) / &prod;<sub>j</sub>(1 &minus; &beta;<sub>j</sub>), where "
                "&alpha;(x) = &sum;<sub>i</sub> &prod;<sub>j&lt;i</sub>(1 &minus; &beta;<sub>j</sub>) "
                "min(q<sub>i</sub>(x), p(x)/&rho;) is the chance x was already emitted by an acceptance and "
                "&beta;<sub>j</sub> the chance candidate j is accepted: accepted-or-residual is exactly p. "
                f"({SPECTR}.)")
    return (f"Correction {token}: every drafted child at the last node reached was rejected, so it was drawn from the "
            "residual norm(max(p &minus; q, 0)) (applied once per rejected sibling): the target's mass the draft "
            f"under-covered, which makes accepted-or-residual exactly p. ({LEVIATHAN}; {SPECINFER}.)")


def _chain_section(event: StepEvent) -> str:
    stats = event.stats
    tested = sum(stats.attempted_by_depth)
    g = max((n.depth for n in event.nodes), default=0)
    if not tested or not g:
        return ("<p>The chain formula needs drafted tokens: with acceptance b per token, a chain of g drafts gives "
                f"(1 &minus; b<sup>g+1</sup>) / (1 &minus; b) tokens per target call. ({LEVIATHAN}, eq. 1.)</p>")
    b = sum(stats.accepted_by_depth) / tested
    predicted = expected_tokens_per_call(b, g)
    return (f"<p><b>(1 &minus; b<sup>g+1</sup>) / (1 &minus; b) = {predicted:.2f}</b> tokens per target call for a "
            f"chain of g = {g} drafts (this step's depth) whose tokens are each accepted with probability "
            f"b = {b:.2f} (accepted &divide; tested so far); <b>measured: {stats.tokens_per_call:.2f}</b> per call "
            f"over {stats.target_calls} calls. Extra branches catch some of what one chain misses; acceptance that "
            f"falls with depth pulls the other way. ({LEVIATHAN}, eq. 1.)</p>")


def _dp_table(plan: PlanEvent) -> str:
    values = plan.best_value
    max_n, max_d = len(values[0]) - 1, len(values) - 1
    ns = sorted({n for n in (2, 4, 8, 16, 32, 64) if n <= max_n} | {plan.plan_budget})
    ds = [d for d in range(max(1, plan.plan_depth - 1), min(max_d, plan.plan_depth + 1) + 1)]
    head = "<tr><th align='left'>c(n, d)</th>" + "".join(f"<th align='right'>n = {n}</th>" for n in ns) + "</tr>"
    rows = []
    for d in ds:
        cells = []
        for n in ns:
            v = f"{values[d][n]:.2f}"
            cells.append(f"<td align='right'><b>{v}</b></td>" if (n, d) == (plan.plan_budget, plan.plan_depth)
                         else f"<td align='right'>{v}</td>")
        rows.append(f"<tr><th align='left'>d &le; {d}</th>{''.join(cells)}</tr>")
    return f"<table cellspacing='0' cellpadding='5'>{head}{''.join(rows)}</table>"


def _dp_section(event: StepEvent, plan: PlanEvent | None) -> str:
    formula = ("c(n, d) = 1 + max over s<sub>1</sub> + &hellip; + s<sub>m</sub> = n &minus; 1 of "
               "&sum;<sub>i</sub> a<sub>i</sub> c(s<sub>i</sub>, d &minus; 1)")
    if plan is None or not plan.best_value or not plan.plan_parents:
        return (f"<p>{formula}: the best expected tokens per call of a tree of n tokens and depth &le; d. No plan is "
                f"known for this answer: Auto and <tt>speclens plan</tt> run this program. ({SEQUOIA}.)</p>")
    a = ", ".join(f"{x:.2f}" for x in plan.acceptance)
    text = (f"<p><b>{formula}</b>: the best expected tokens per call of any tree of n tokens (the committed one "
            "included) and depth &le; d, when the i-th drafted child of a node is the accepted one with probability "
            f"a<sub>i</sub>; measured a = ({a}). The plan: <b>c({plan.plan_budget}, {plan.plan_depth}) = "
            f"{plan.predicted_tokens:.2f}</b>. ({SEQUOIA}.)</p>")
    if event.nodes:
        parents = [n.parent for n in sorted(event.nodes, key=lambda n: n.index)]
        whose = (f"{len(parents)} of the plan's {len(plan.plan_parents)} drafted tokens" if event.shape ==
                 plan.plan_parents else f"{len(parents)} drafted tokens, not the plan's shape")
        text += (f"<p>This step's tree ({whose}) is worth F(T) = 1 + &sum;<sub>v</sub> &prod; a<sub>rank</sub> = "
                 f"{tree_value(parents, plan.acceptance):.2f} under the same a; this call emitted "
                 f"{len(event.tokens)}.</p>")
    return text + _dp_table(plan)


def learn_html(event: StepEvent, plan: PlanEvent | None = None) -> str:
    """The Learn tab's page for one step (rich text)."""
    rule = verifier_of(event)
    table, marked = _node_rows(event, rule)
    kept = len(event.accepted_path)
    title = (f"<h3>Step {event.step + 1} &mdash; {escape(event.strategy or 'decoding')}: drafted {len(event.nodes)}, "
             f"accepted {kept}, emitted {len(event.tokens)}</h3>")
    return (title + "<h4>1. The test at each node the target checked</h4>" + table +
            f"<p>{_rule_sentence(rule, marked)}</p><p>{_extra_sentence(event, rule)}</p>"
            "<h4>2. The chain formula against the measured point</h4>" + _chain_section(event) +
            "<h4>3. The tree the planner would draft: Sequoia's c(n, d)</h4>" + _dp_section(event, plan) +
            f"<p style='color:{MUTED_INK}'>p: the target's probability of the token after temperature, top-k and "
            "top-p; q: the draft's, under the distribution the token was really drawn from.</p>")


class LearnView(QWidget):
    """The formulas of one step: the newest while the answer streams, or the step :meth:`show_index` picks."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.browser = QTextBrowser()
        self.browser.setHtml("<p>No answer yet: send a prompt, then read here what verification computed at each "
                             "step and why.</p>")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.browser)
        self.events: list[StepEvent] = []
        self.plan: PlanEvent | None = None
        self.index: int | None = None   # None: follow the newest step
        self._stale = False

    def reset(self) -> None:
        """A new answer: forget its steps (a plan stays until a new one arrives)."""
        self.events, self.index, self._stale = [], None, False

    def set_plan(self, plan: PlanEvent) -> None:
        self.plan = plan
        self._refresh()

    def add_steps(self, events: Sequence[StepEvent]) -> None:
        """Record a frame's steps; the page is rebuilt only while it is visible."""
        self.events.extend(events)
        if events and self.index is None:
            self._refresh()

    def show_index(self, i: int) -> None:
        """Explain step ``i`` (0-based), e.g. the step the tree view replays; the newest one: follow new steps again,
        as the replay does."""
        if not 0 <= i < len(self.events):
            raise IndexError(f"step {i} does not exist: the answer has {len(self.events)} steps")
        self.index = None if i == len(self.events) - 1 else i
        self._refresh(force=True)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._stale:
            self._refresh()

    def _refresh(self, force: bool = False) -> None:
        if not self.events:
            return
        if not force and not self.isVisible():
            self._stale = True
            return
        self._stale = False
        shown = self.events[-1 if self.index is None else self.index]
        self.browser.setHtml(learn_html(shown, self.plan))
