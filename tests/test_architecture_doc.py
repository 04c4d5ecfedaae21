"""docs/architecture.md stays a true map: every file and package it names exists, every package of ops/ is on it,
and the import rules it states are the ones tests/test_import_graph.py holds."""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_import_graph import RULES

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "architecture.md").read_text()


def test_every_path_it_names_exists():
    named = set(re.findall(r"`((?:ops|tui|cli|trainer|tests|assets)/[\w/.]*)", DOC))
    assert named, "the map names no file"
    assert sorted(p for p in named if not (ROOT / p).exists()) == []


def test_every_package_of_ops_is_on_the_map():
    packages = sorted(p.parent.name for p in (ROOT / "ops").glob("*/__init__.py"))
    house = DOC[DOC.index("## The house"):DOC.index("## Walk 1")]
    assert [p for p in packages if not re.search(rf"^\s+{p}/", house, re.M)] == []


def test_the_rules_it_states_are_the_tested_ones():
    rules = DOC[DOC.index("What may import what"):DOC.index("Two things cross every layer")]
    bullets = [b for b in rules.split("\n- ") if "never" in b or "neither" in b]
    for under, forbidden in RULES:
        for f in forbidden:
            if f == "textual":
                continue
            said = [b for b in bullets if f"`{under}`" in b and f"`{f.replace('.', '/')}`" in b]
            assert said, f"docs/architecture.md does not say that {under} never imports {f}"
