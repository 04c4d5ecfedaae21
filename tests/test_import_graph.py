"""The layers' import arrows point one way, read from the source with ast (nothing is imported to check):
ops/ (the library) never imports the dashboard, Textual or the CLI, not even inside a function; cli/ (the
composition root) may import both ops/ and tui/, and tui/ never imports cli/; ops/tmux and ops/setup never
import ops/plan (plans run in tmux, and their stages with what node setup recorded, not the other way round);
nothing the trainer reaches (it runs on the node) imports a UI or SSH."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def module_name(path: Path, root: Path) -> str:
    """`ops/tmux/scripts.py` -> `ops.tmux.scripts`; a package's `__init__.py` is the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path, *, eager_only: bool = False) -> set[str]:
    """Every module a file imports, relative imports resolved; for `from a import b` both `a` and `a.b`
    (b may be a submodule). eager_only: only what importing the file runs (not what a function imports)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if eager_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        todo.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def source_of(module: str, root: Path) -> Path | None:
    """The file of a first-party module under root, None for anything else."""
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def violations(root: Path, under: str, forbidden: tuple[str, ...], *, transitive: bool = False) -> list[str]:
    """`file: module` for each import of a forbidden module (or one inside it) by a file under `root/under`
    or, when transitive, by any first-party file those files reach (package `__init__`s included)."""
    todo = sorted((root / under).rglob("*.py"))
    seen = set(todo)
    out = []
    while todo:
        path = todo.pop(0)
        for module in sorted(imports_of(path, root)):
            if forbidden_in(module, forbidden):
                out.append(f"{path.relative_to(root)}: {module}")
            if transitive:
                parts = module.split(".")
                for n in range(1, len(parts) + 1):
                    found = source_of(".".join(parts[:n]), root)
                    if found is not None and found not in seen:
                        seen.add(found)
                        todo.append(found)
    return out


def forbidden_in(module: str, forbidden: tuple[str, ...]) -> bool:
    return any(module == f or module.startswith(f + ".") for f in forbidden)


UI = ("tui", "textual")
CLI = ("cli",)
RULES = [("ops", UI + CLI), ("ops/tmux", ("ops.plan",)), ("ops/setup", ("ops.plan",)), ("tui", CLI)]
NODE_SIDE = ("tui", "textual", "rich", "paramiko", "ops.hosts")
"""What the trainer must not reach: it runs on the node, where only nodedeck[trainer] is installed."""
DASHBOARD_LAUNCH = {"tui.app", "tui.app.NodedeckApp", "tui.live", "tui.live.LiveSource"}


@pytest.mark.parametrize(("under", "forbidden"), RULES, ids=[under for under, _ in RULES])
def test_no_import_runs_back_up(under, forbidden):
    assert violations(ROOT, under, forbidden) == []


def test_the_cli_loads_the_dashboard_only_to_open_it():
    """cli/ is the `nodedeck` entry point: the commands that open the dashboard import tui.app and
    tui.live inside themselves, so every other command runs without loading Textual."""
    for path in sorted((ROOT / "cli").glob("*.py")):
        assert {m for m in imports_of(path, ROOT, eager_only=True) if forbidden_in(m, UI)} == set(), path.name
        assert {m for m in imports_of(path, ROOT) if forbidden_in(m, UI)} <= DASHBOARD_LAUNCH, path.name


def test_nothing_the_trainer_reaches_imports_a_ui_or_ssh():
    assert violations(ROOT, "trainer", NODE_SIDE, transitive=True) == []


def test_the_scan_sees_relative_nested_and_from_imports(tmp_path):
    pkg = tmp_path / "ops" / "tmux"
    pkg.mkdir(parents=True)
    (tmp_path / "ops" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from ..plan import progress\n")
    (pkg / "a.py").write_text("def f():\n    import textual.app\n    from . import model\n")
    (pkg / "b.py").write_text("from ops import plan\nfrom ops.planner import x\n")
    assert violations(tmp_path, "ops/tmux", ("ops.plan",)) == [
        "ops/tmux/__init__.py: ops.plan",
        "ops/tmux/__init__.py: ops.plan.progress",
        "ops/tmux/b.py: ops.plan",
    ]
    assert violations(tmp_path, "ops", ("textual",)) == ["ops/tmux/a.py: textual.app"]
    assert imports_of(pkg / "a.py", tmp_path) == {"textual.app", "ops.tmux", "ops.tmux.model"}
    assert imports_of(pkg / "a.py", tmp_path, eager_only=True) == set()
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "step.py").write_text("from ops.tmux import a\n")
    assert violations(tmp_path, "trainer", ("textual",)) == []
    assert violations(tmp_path, "trainer", ("textual",), transitive=True) == ["ops/tmux/a.py: textual.app"]
