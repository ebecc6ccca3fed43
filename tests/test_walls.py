"""The walls of STYLE.md, read from the source (every import, function-level ones included):

- core/ never imports app/ or a GUI toolkit;
- the algorithms are pure: they import no backend, no engine and nothing that measures or loads models;
- backends import only the backend protocol, their own helpers and the token tree.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GUI = ("app", "PySide6", "shiboken6", "pyqtgraph")
PURE = ["core/sampling.py", "core/tree.py", "core/verify.py", "core/sequoia.py", "core/context.py",
        "core/auto/costs.py", "core/auto/estimates.py", "core/memory/index.py", "core/memory/proposal.py",
        "core/memory/stats.py"] + [p for p in ("core/spectr.py", "core/tree_budget.py") if (ROOT / p).exists()]
IMPURE = ("core.backends", "core.engine", "core.models", "core.assembly", "core.auto.calibrate", "core.bench",
          "core.record", "llama_cpp", "transformers")


def imports(path: Path) -> set[str]:
    """Every module a file imports, wherever the import statement is."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def crossing(path: Path, banned) -> list[str]:
    return sorted(m for m in imports(path) if any(m == b or m.startswith(b + ".") for b in banned))


def test_core_never_imports_the_app_or_qt() -> None:
    bad = {str(p.relative_to(ROOT)): crossing(p, GUI) for p in (ROOT / "core").rglob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_algorithms_are_pure() -> None:
    bad = {p: crossing(ROOT / p, IMPURE) for p in PURE}
    assert {k: v for k, v in bad.items() if v} == {}


def test_backends_import_only_the_protocol_and_the_tree() -> None:
    allowed = ("core.backends", "core.tree")
    bad = {}
    for path in (ROOT / "core" / "backends").glob("*.py"):
        own = {m for m in imports(path) if m.startswith("core")}
        outside = sorted(m for m in own if not any(m == a or m.startswith(a + ".") for a in allowed))
        if outside:
            bad[path.name] = outside
    assert bad == {}


def test_a_crossing_is_caught(tmp_path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from app.session import ChatSession\n    import PySide6.QtCore\n")
    assert crossing(sample, GUI) == ["PySide6.QtCore", "app.session"]
