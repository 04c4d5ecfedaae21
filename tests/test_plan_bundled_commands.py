"""The bundled plans call nodedeck-train only with options its steps really have."""

from __future__ import annotations

import contextlib
import io
import re
import shlex

import pytest

from ops.paths import ASSETS
from ops.plan.parse import load_plan
from trainer import cli

PLANS = sorted((ASSETS / "plans").glob("*.toml"))
_help: dict[str, set[str]] = {}


def _options(step: str) -> set[str]:
    if step not in _help:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            cli.main([step, "--help"])
        _help[step] = set(re.findall(r"--[a-z0-9][a-z0-9-]*", out.getvalue()))
    return _help[step]


def _train_calls(command: str):
    """(step, options) of each nodedeck-train call in a stage command line."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.wordchars += "${}/.=,:-+*"
    words = list(lexer)
    for i, w in enumerate(words):
        if (w.endswith("nodedeck-train") or w == "${train}") and i + 1 < len(words):
            rest = words[i + 2:]
            end = next((j for j, x in enumerate(rest) if x in ("&&", "||", ";", "|", ">", "<")), len(rest))
            yield words[i + 1], [x.split("=")[0] for x in rest[:end] if x.startswith("--")]


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.name)
def test_trainer_steps_and_options_exist(path):
    plan = load_plan(path)
    calls = 0
    for stage in plan.stages:
        commands = [stage.command] + ([stage.smoke.command] if stage.smoke is not None else [])
        for command in commands:
            for step, options in _train_calls(command):
                calls += 1
                assert step in cli.STEPS, f"{path.name}: stage {stage.id}: no step {step!r}"
                unknown = [o for o in options if o not in _options(step)]
                assert not unknown, f"{path.name}: stage {stage.id}: {step} has no {unknown}"
    assert calls > 0
