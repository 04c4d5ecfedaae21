"""The layers' import arrows point one way, read from the source with ast (nothing is imported to check):
ops/ (the library) never imports the dashboard, Textual or the CLI, not even inside a function; cli/ (the
composition root) may import both ops/ and tui/, and tui/ never imports cli/; the plan language (ops/plan) never
imports the run engine (ops/run), which reads plans; ops/tmux and ops/setup import neither (plans run in tmux,
and their stages with what node setup recorded, not the other way round);
nothing the trainer reaches (it runs on the node) imports a UI or SSH. An import inside a function hides an arrow:
only a heavy or optional package waits there, with a `# lazy: why` comment on its line."""

from __future__ import annotations

import ast
import re
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
PLANS = ("ops.plan", "ops.run")
RULES = [("ops", UI + CLI), ("ops/plan", ("ops.run",)), ("ops/tmux", PLANS), ("ops/setup", PLANS), ("tui", CLI)]
NODE_SIDE = ("tui", "textual", "rich", "paramiko", "ops.hosts")
"""What the trainer must not reach: it runs on the node, where only nodedeck[trainer] is installed."""
DASHBOARD_LAUNCH = {"tui.app", "tui.app.NodedeckApp", "tui.live", "tui.live.LiveSource"}
FIRST_PARTY = ("ops", "tui", "cli", "trainer")
LAZY_FIRST_PARTY = 10
"""First-party imports that wait inside a function for the heavy package they bring (Textual: the CLI's dashboard
commands; paramiko: ops.hosts.ssh). A new one raises this on purpose."""


def function_imports(path: Path) -> list[tuple[int, str, bool]]:
    """(line, module, why) of each import inside a function of the file (a relative one's module starts with
    dots); why: a `# lazy: <reason>` comment on one of its lines."""
    source = path.read_text()
    lines = source.splitlines()
    out = []
    todo: list[tuple[ast.AST, bool]] = [(ast.parse(source, filename=str(path)), False)]
    while todo:
        node, inside = todo.pop()
        if inside and isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                ["." * node.level + (node.module or "")]
            why = any(re.search(r"# lazy: \S", line) for line in lines[node.lineno - 1:node.end_lineno])
            out.append((node.lineno, ", ".join(names), why))
        inner = inside or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        todo.extend((child, inner) for child in ast.iter_child_nodes(node))
    return sorted(out)


def first_party(module: str) -> bool:
    return any(m.startswith(".") or m.split(".")[0] in FIRST_PARTY for m in module.split(", "))


def all_function_imports() -> list[tuple[str, str, bool]]:
    """(file:line, module, why) of every import inside a function of first-party code."""
    return [(f"{path.relative_to(ROOT)}:{line}", module, why)
            for name in FIRST_PARTY for path in sorted((ROOT / name).rglob("*.py"))
            for line, module, why in function_imports(path)]


@pytest.mark.parametrize(("under", "forbidden"), RULES, ids=[under for under, _ in RULES])
def test_no_import_runs_back_up(under, forbidden):
    assert violations(ROOT, under, forbidden) == []


def test_the_cli_loads_the_dashboard_only_to_open_it():
    """cli/ is the `nodedeck` entry point: the commands that open the dashboard import tui.app and
    tui.live inside themselves, so every other command runs without loading Textual."""
    for path in sorted((ROOT / "cli").glob("*.py")):
        assert {m for m in imports_of(path, ROOT, eager_only=True) if forbidden_in(m, UI)} == set(), path.name
        assert {m for m in imports_of(path, ROOT) if forbidden_in(m, UI)} <= DASHBOARD_LAUNCH, path.name


def test_an_import_inside_a_function_says_why():
    """Only a heavy or optional package (torch, transformers, Textual in the CLI's light commands, paramiko, boto3,
    the node sampler's NVML) is imported inside the function that needs it, saying why."""
    assert [f"{where}: {module}" for where, module, why in all_function_imports() if not why] == []


def test_first_party_imports_inside_functions_are_counted():
    lazy = [f"{where}: {module}" for where, module, _ in all_function_imports() if first_party(module)]
    assert len(lazy) <= LAZY_FIRST_PARTY, "\n".join(lazy)


def test_the_scan_finds_imports_inside_functions_and_their_reasons(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os\nif os:\n    import sys\n\n\ndef f():\n    import json, ops.x\n"
                 "    from ops import x  # lazy: heavy\n\n\nclass C:\n    def g(self):\n        def h():\n"
                 "            from . import (  # lazy: Textual\n                y,\n            )\n"
                 "        from tui import z  # lazy:\n        return lambda: __import__('q')\n")
    assert function_imports(f) == [(7, "json, ops.x", False), (8, "ops", True), (14, ".", True), (17, "tui", False)]
    assert [first_party(m) for _, m, _ in function_imports(f)] == [True, True, True, True]
    assert not first_party("json") and not first_party("opsx.y")


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
