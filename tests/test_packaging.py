"""The base install (`pip install .`, no extras) holds everything ops/, tui/ and cli/ import and every asset.

The real install is checked by `.ci/base-install-check` (in `make test`); this is its fast static half.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _imported_top_levels(*packages: str) -> dict[str, str]:
    """Top-level module -> a file importing it, for every import in the packages' sources."""
    found: dict[str, str] = {}
    for pkg in packages:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                for n in names:
                    found.setdefault(n.split(".")[0], str(path.relative_to(ROOT)))
    return found


def test_every_import_of_ops_tui_and_cli_is_a_base_dependency():
    declared = {_norm(re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0]) for d in PYPROJECT["project"]["dependencies"]}
    dists = importlib.metadata.packages_distributions()
    missing = []
    for module, where in _imported_top_levels("ops", "tui", "cli").items():
        if module in sys.stdlib_module_names or module in ("ops", "tui", "cli", "trainer"):
            continue
        owners = {_norm(d) for d in dists.get(module, [module])}
        if not owners & declared:
            missing.append(f"{module} (imported by {where}; distribution {', '.join(sorted(owners))})")
    assert not missing, "not in [project] dependencies: " + "; ".join(missing)


def test_every_asset_is_shipped_in_the_package():
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"]["assets"]
    assert any(fnmatch.fnmatch("assets", p) for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"])
    files = [p.relative_to(ROOT / "assets").as_posix() for p in (ROOT / "assets").rglob("*") if p.is_file()]
    unshipped = [f for f in files if not any(fnmatch.fnmatch(f, p) for p in patterns)]
    assert files and not unshipped, f"assets left out of the package: {unshipped}"


def test_every_console_script_is_shipped():
    """`nodedeck = "cli.main:main"`: the script's package is one that packages.find includes."""
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    for name, target in PYPROJECT["project"]["scripts"].items():
        package = target.split(":")[0].split(".")[0]
        assert any(fnmatch.fnmatch(package, p) for p in include), f"{name}: {package} is not installed"
