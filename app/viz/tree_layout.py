"""What the tree view draws for one StepEvent, as plain data: boxes, their kind, position and explanation.

No Qt here, so the layout and the words shown on hover can be tested on their own. The view (tree_view.py) only
turns these records into graphics items.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from core.events import Fate, NodeInfo, Origin, StepEvent

# What each box stands for; the view maps a kind to its colours.
ROOT = "root"
ACCEPTED = Fate.ACCEPTED.value
REJECTED = Fate.REJECTED.value
NOT_REACHED = Fate.NOT_REACHED.value
CORRECTION = Origin.CORRECTION.value
BONUS = Origin.BONUS.value
PLANNED = "planned"

# Which drafter proposed a node, shown as a coloured badge when one step's tree mixes several (core.merge). The hues
# stay clear of the fate colours (green, red, grey, orange, blue).
SOURCE_COLOURS = {"draft": "#7e57c2", "ngram": "#00897b", "memory": "#c29100", "self": "#8d6e63"}
OTHER_SOURCE = "#546e7a"

VISIBLE_WHITESPACE = {" ": "\u2423", "\n": "\u23ce", "\t": "\u21e5", "\r": "\u240d"}
MAX_LABEL = 12


def visible_token(text: str, limit: int = MAX_LABEL) -> str:
    """A token's text with whitespace and control characters made visible, shortened to ``limit`` characters."""
    if text == "":
        return "\u2205"  # the empty set: a token that decodes to nothing on its own (part of a UTF-8 character)
    out = []
    for ch in text:
        if ch in VISIBLE_WHITESPACE:
            out.append(VISIBLE_WHITESPACE[ch])
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    label = "".join(out)
    return label if len(label) <= limit else label[: limit - 1] + "\u2026"


# a control token (end of text) is drawn as a marked box, never as its name's text; a square every font has (the stop
# sign, U+23F9, is missing from DejaVu, the one font of a bare Linux desktop, and drew as a blank box there)
END_MARK = "\u25a0"


def token_label(text: str, special: str = "", limit: int = MAX_LABEL) -> str:
    """A box's label: the visible text, or for a control token a marked end-of-text label."""
    if special:
        return f"{END_MARK} end" if "end" in special.lower() or "eot" in special.lower() else f"{END_MARK} control"
    return visible_token(text, limit)


@dataclass(frozen=True)
class Box:
    """One box of the drawing. ``key`` stays the same for the same slot from step to step (for the animation)."""

    key: str
    kind: str
    label: str
    parent_key: str | None
    depth: int          # 0 for the root
    x: float            # in leaf slots (0, 1, 2, ...), centred over children
    detail: str         # the hover / click explanation
    on_path: bool = False   # on the accepted path (root, accepted nodes, and the extra token)
    caption: str = ""   # small print under the box: the probabilities verification used
    source: str = ""    # the drafter that proposed it, set only when the step's tree mixes drafters


def source_colour(source: str) -> str:
    return SOURCE_COLOURS.get(source, OTHER_SOURCE)


def mixed_sources(nodes: Sequence[NodeInfo]) -> tuple[str, ...]:
    """The drafters of a step's tree in order of appearance, when there are several; () otherwise."""
    sources = tuple(dict.fromkeys(n.source for n in nodes if n.source))
    return sources if len(sources) > 1 else ()


def match_planned_slots(nodes: Sequence[NodeInfo], shape: Sequence[int]) -> dict[int, int]:
    """Map each drafted node to the slot of the planned shape it fills.

    Model drafters fill a parent's slots in the shape's order and drop the tail when a budget runs out, so the
    first free slot under the matched parent is the right one. Nodes that fit no slot (another drafter) stay out.
    """
    used: set[int] = set()
    slot_of: dict[int, int] = {}
    for node in nodes:
        want = -1 if node.parent < 0 else slot_of.get(node.parent)
        if want is None:
            continue
        for slot, parent in enumerate(shape):
            if parent == want and slot not in used:
                used.add(slot)
                slot_of[node.index] = slot
                break
    return slot_of


def _accepted_child(nodes: Sequence[NodeInfo], parent: int) -> NodeInfo | None:
    return next((n for n in nodes if n.parent == parent and n.fate == Fate.ACCEPTED), None)


def _fmt(v: float | None) -> str:
    return "not compared" if v is None else f"{v:.4f}"


def explain_node(node: NodeInfo, event: StepEvent) -> str:
    """Why this drafted node was accepted, rejected or never tested, in words (shown on hover and click)."""
    head = (f"token {token_label(node.text, node.special, 40)!s} (id {node.token}), depth {node.depth}"
            + (f", drafted by {node.source}" if node.source else ""))
    greedy = event.greedy
    if greedy:
        probs = (f"p (target softmax) = {_fmt(node.p)}   q = 1: a greedy draft proposes its top tokens, "
                 "declared deterministic")
    else:
        probs = f"q (draft) = {_fmt(node.q)}   p (target) = {_fmt(node.p)}"
    if node.fate == Fate.NOT_REACHED:
        why = ("not reached: verification left this branch earlier (an ancestor was rejected, or a sibling "
               "before it was accepted), so the target never tested it")
    elif greedy:
        if node.fate == Fate.ACCEPTED:
            why = "accepted: it is the target's argmax here (greedy decoding keeps exactly the target's choice)"
        else:
            winner = _accepted_child(event.nodes, node.parent)
            choice = winner.text if winner is not None else (event.token_texts[-1] if event.token_texts else "?")
            why = f"rejected: the target's argmax here is {visible_token(choice, 40)}, not this token"
    else:
        a = node.accept_prob if node.accept_prob is not None else 0.0
        ratio = ""
        if node.p is not None and node.q > 0:
            ratio = f"; min(1, p/q) = {min(1.0, node.p / node.q):.4f}"
        after_rejections = any(m.parent == node.parent and m.index < node.index and m.fate == Fate.REJECTED
                               for m in event.nodes)
        residual = (" (tested against the residual left by earlier rejected siblings, not against p itself)"
                    if after_rejections else "")
        if node.fate == Fate.ACCEPTED:
            why = f"accepted with probability {a:.4f}{ratio}{residual}"
        else:
            why = (f"rejected with probability {1 - a:.4f}{ratio}{residual}; the target then keeps the residual "
                   "norm(max(p - q, 0)) for the next sibling or for its own correction token")
    return f"{head}\n{probs}\n{why}"


def explain_extra(event: StepEvent) -> str:
    """The correction or bonus token at the end of a step, in words."""
    text = event.token_texts[-1] if event.token_texts else ""
    special = event.specials[-1] if event.specials else ""
    token = event.tokens[-1] if event.tokens else None
    head = f"token {token_label(text, special, 40)} (id {token}), emitted by the target"
    greedy = event.greedy
    if event.origins and event.origins[-1] == Origin.BONUS:
        why = ("bonus: every drafted token on the path was accepted, so the target's distribution at the leaf gives "
               "one more token for free" + (" (its argmax)" if greedy else " (sampled from p)"))
    elif not event.nodes:
        why = "plain decoding: nothing was drafted, the target produced this token alone"
    elif greedy:
        why = "correction: the drafted children here were not the target's argmax, so the argmax is emitted"
    else:
        why = ("correction: every drafted child here was rejected, so this token was sampled from the residual "
               "norm(max(p - q, 0)) left after the rejections: the output keeps exactly the target's distribution")
    margin = event.margins[-1] if event.margins and event.margins[-1] is not None else None
    extra = f"\ntarget top-2 logit margin {margin:.4f}" if margin is not None else ""
    return f"{head}\n{why}{extra}"


def caption(node: NodeInfo, greedy: bool) -> str:
    """The probabilities printed under a tested node's box."""
    if node.p is None:
        return ""
    return f"p {node.p:.2f}" if greedy else f"p {node.p:.2f} q {node.q:.2f}"


def _tidy_x(children: dict[str, list[str]], root: str) -> dict[str, float]:
    """Leaves get consecutive slots in depth-first order; a parent sits midway between its first and last child."""
    xs: dict[str, float] = {}
    next_leaf = 0.0

    def place(key: str) -> None:
        nonlocal next_leaf
        kids = children.get(key, [])
        if not kids:
            xs[key] = next_leaf
            next_leaf += 1.0
            return
        for kid in kids:
            place(kid)
        xs[key] = (xs[kids[0]] + xs[kids[-1]]) / 2

    place(root)
    return xs


def layout_step(event: StepEvent) -> list[Box]:
    """The boxes for one step: root, drafted nodes, the target's extra token, and the planned-but-undrafted slots of
    the shape the step drafted from (``event.shape``)."""
    nodes = event.nodes
    shape, root_text = event.shape, event.root_text
    slot_of = match_planned_slots(nodes, shape) if shape else {}
    if shape and len(slot_of) < len(nodes):
        shape, slot_of = None, {}  # another drafter made this tree (Auto's n-gram chain): the plan does not apply
    # keys follow planned slots when there is a plan, so a node keeps its place from step to step
    key_of = {n.index: (f"s{slot_of[n.index]}" if n.index in slot_of else f"n{n.index}") for n in nodes}
    on_path = set(event.accepted_path)
    greedy = event.greedy
    mixed = bool(mixed_sources(nodes))
    entries: list[tuple[str, str, str, str | None, int, str, bool, str]] = [
        ("root", ROOT, visible_token(root_text) if root_text else "prompt", None, 0,
         "the last committed token: every drafted node continues from here", True, "")]
    source_of = {key_of[n.index]: n.source for n in nodes} if mixed else {}
    for n in nodes:
        parent_key = "root" if n.parent < 0 else key_of[n.parent]
        entries.append((key_of[n.index], n.fate.value, token_label(n.text, n.special), parent_key, n.depth,
                        explain_node(n, event), n.index in on_path, caption(n, greedy)))
    if shape:
        depths: list[int] = []
        for p in shape:
            depths.append(1 if p < 0 else depths[p] + 1)
        filled = set(slot_of.values())
        for slot, p in enumerate(shape):
            if slot not in filled:
                entries.append((f"s{slot}", PLANNED, "", "root" if p < 0 else f"s{p}", depths[slot],
                                "a slot of the planned shape that was not drafted this step (node budget or the "
                                "answer's remaining length cut the tree)", False, ""))
    if event.tokens and event.origins and event.origins[-1] != Origin.DRAFT:
        last = event.accepted_path[-1] if event.accepted_path else -1
        parent_key = "root" if last < 0 else key_of[last]
        depth = 1 + next((n.depth for n in nodes if n.index == last), 0)
        entries.append(("extra", event.origins[-1].value,
                        token_label(event.token_texts[-1], event.specials[-1] if event.specials else ""), parent_key,
                        depth,
                        explain_extra(event), True, event.origins[-1].value))
    children: dict[str, list[str]] = {}
    for key, _, _, parent_key, *_ in entries:
        if parent_key is not None:
            children.setdefault(parent_key, []).append(key)
    xs = _tidy_x(children, "root")
    return [Box(key, kind, label, parent_key, depth, xs.get(key, 0.0), detail, path, cap, source_of.get(key, ""))
            for key, kind, label, parent_key, depth, detail, path, cap in entries]
