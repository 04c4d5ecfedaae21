"""Fuzzing the three input readers: a plan, nodes.toml and a todowrite list.

Each reader either succeeds or raises one UserError whose every line reads `FILE:LINE: ...`;
never another exception, never a hang. In-process with hypothesis (1000+ cases each, fast),
then a few real `nodedeck` runs: exit 2, one line on stderr, no traceback (a FIFO included).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ops.errors import UserError
from ops.nodes import get_node, load_nodes
from ops.paths import ASSETS
from ops.plan.parse import PLAN_KEYS, SMOKE_KEYS, STAGE_KEYS, parse_plan
from ops.plan.records import CHECK_KINDS
from ops.run.todowrite import parse_todos

FUZZ = settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
SEED_PLAN = (ASSETS / "plans" / "demo.toml").read_text()
ONE_ERROR = re.compile(r"^\S.*?:\d+: \S")


# -- TOML and JSON documents of any shape ------------------------------------------------
def _toml_str(s: str) -> str:
    return json.dumps(s)   # a JSON string is a TOML basic string (a lone surrogate: invalid TOML, fine too)


def _render(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_render(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_str(k)} = {_render(x)}" for k, x in v.items()) + " }"
    return str(v)   # a date


WORDS = sorted(PLAN_KEYS | STAGE_KEYS | SMOKE_KEYS | {"kind", "path", "min", "pattern", "url", "op", "value",
                                                     "field", "line", "src", "dest", "ssh", "port", "root",
                                                     "watch", "max_parallel", "metrics_url", "content", "status",
                                                     "priority", "todos"}) + list(CHECK_KINDS)
scalars = (st.integers(-2**70, 2**70) | st.sampled_from([0.5, -1.0, math.nan, math.inf]) | st.booleans()
           | st.just(__import__("datetime").date(2026, 1, 2))
           | st.sampled_from(WORDS + ["", "x", "${x}", "a:b", "/abs", "~/w", "http://h/", "30m", "high", "'\"\n"])
           | st.text(max_size=4))
keys = st.sampled_from(WORDS + ["", "a b", "x"])
values = st.recursive(scalars, lambda ch: st.lists(ch, max_size=2) | st.dictionaries(keys, ch, max_size=2),
                      max_leaves=4)


def _table(pairs: dict) -> str:
    return "".join(f"{_toml_str(k)} = {_render(v)}\n" for k, v in pairs.items())


check = st.dictionaries(st.sampled_from(["path", "min", "pattern", "url", "op", "value", "timeout"]), values,
                        max_size=3).flatmap(
    lambda d: (st.sampled_from(CHECK_KINDS) | values).map(lambda k: {"kind": k, **d}))
stage_keys = st.sampled_from(sorted(STAGE_KEYS - {"id", "command", "verify"}))
stage = st.tuples(st.sampled_from(["a", "b", "c"]) | values, st.sampled_from(["true", "echo ${x}"]) | values,
                  st.lists(check, max_size=2), st.dictionaries(stage_keys, values, max_size=3)).map(
    lambda t: {"id": t[0], "command": t[1], "verify": t[2], **t[3]})


@st.composite
def plans(draw) -> bytes:
    parts = []
    if draw(st.booleans()):
        parts.append("[plan]\n"
                     + _table(draw(st.dictionaries(st.sampled_from(sorted(PLAN_KEYS)) | keys, values, max_size=2))))
    if draw(st.booleans()):
        parts.append("[vars]\n" + _table(draw(st.dictionaries(st.sampled_from(["x", "y"]) | keys, values, max_size=2))))
    for s in draw(st.lists(stage, max_size=2)):
        parts.append("[[stage]]\n" + _table(s))
    text = "\n".join(parts)
    return _mutate(draw, text.encode())


NODE_KEYS = ("ssh", "port", "root", "watch", "max_parallel", "metrics_url", "connect_timeout", "ssh_config", "x")


@st.composite
def node_files(draw) -> bytes:
    parts = []
    for name in draw(st.lists(st.sampled_from(["gpu1", "local", '"a b"', "x.y"]), max_size=2, unique=True)):
        body = draw(st.dictionaries(st.sampled_from(NODE_KEYS), values | st.sampled_from(["gpu1", "/data", 22]),
                                    max_size=4))
        parts.append(f"[nodes.{name}]\n" + _table(body))
    if draw(st.booleans()):
        parts.append(_table(draw(st.dictionaries(keys, values, max_size=2))))
    return _mutate(draw, "\n".join(parts).encode())


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.sampled_from([0.5, 1e300])
                           | st.text(max_size=4)
                           | st.sampled_from(["pending", "completed", "high", "low", "x", "\ud800"]),
                           lambda ch: st.lists(ch, max_size=2) | st.dictionaries(keys, ch, max_size=2), max_leaves=4)
todo_item = st.dictionaries(st.sampled_from(["id", "content", "status", "priority"]), json_values, max_size=4)


@st.composite
def todo_files(draw) -> bytes:
    items = draw(st.lists(todo_item | json_values, max_size=3))
    doc = {"todos": items} if draw(st.booleans()) else items
    return _mutate(draw, json.dumps(doc, indent=draw(st.sampled_from([None, 1]))).encode())


def _mutate(draw, raw: bytes) -> bytes:
    """Sometimes cut, splice or nest the document (deep brackets, stray bytes)."""
    how = draw(st.sampled_from(["none", "none", "cut", "insert", "deep"]))
    if how == "cut" and raw:
        i = draw(st.integers(0, len(raw)))
        j = draw(st.integers(i, len(raw)))
        return raw[:i] + raw[j:]
    if how == "insert":
        i = draw(st.integers(0, len(raw)))
        return raw[:i] + draw(st.binary(max_size=3)
                              | st.sampled_from([b"[", b"{", b"]]", b"\"", b"\n[[stage]]\n", b"\xff"])) + raw[i:]
    if how == "deep":
        n = draw(st.integers(30, 3000))
        return raw + b"\nzz = " + b"[" * n + b"]" * n + b"\n"
    return raw


def _assert_one_line_errors(e: UserError, name: str) -> None:
    lines = getattr(e, "errors", None) or [str(e)]
    for line in lines:
        assert "\n" not in line and line.startswith(name) and ONE_ERROR.match(line), line


@FUZZ
@given(raw=plans())
def test_plan_reader_never_crashes(raw):
    try:
        parse_plan(raw, "p.toml")
    except UserError as e:
        _assert_one_line_errors(e, "p.toml:")


@FUZZ
@given(raw=node_files())
def test_nodes_reader_never_crashes(tmp_path_factory, raw):
    path = tmp_path_factory.getbasetemp() / "fuzz-nodes.toml"
    path.write_bytes(raw)
    try:
        nodes = load_nodes(path)
    except UserError as e:
        _assert_one_line_errors(e, f"{path}:")
        return
    assert "local" in nodes or "local" in nodes.errors   # a bad [nodes.local] makes local unusable, loudly
    for name in nodes.errors:
        with pytest.raises(UserError) as e:
            get_node(nodes, name)
        _assert_one_line_errors(e.value, f"{path}:")


@FUZZ
@given(raw=todo_files())
def test_todo_reader_never_crashes(raw):
    try:
        items = parse_todos(raw, "t.json")
    except UserError as e:
        _assert_one_line_errors(e, "t.json:")
        return
    for item in items:   # what was accepted can be printed and stored
        (item.id + item.content).encode("utf-8")


# -- the real CLI ---------------------------------------------------------------------------
def _nodedeck(tmp_path, *argv, config=None):
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "XDG_STATE_HOME": str(tmp_path / "state"),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    pre = ["--config", str(config)] if config else []
    return subprocess.run([sys.executable, "-m", "cli.main", *pre, *argv], capture_output=True, text=True,
                          timeout=60, env=env)


def _assert_exit_2_one_line(res, fragment):
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1 and fragment in res.stderr, res.stderr


def test_a_fifo_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    _assert_exit_2_one_line(_nodedeck(tmp_path, "plan", "check", str(fifo)), "it is a FIFO, not a regular file")
    _assert_exit_2_one_line(_nodedeck(tmp_path, "nodes", config=fifo), "it is a FIFO, not a regular file")
    _assert_exit_2_one_line(_nodedeck(tmp_path, "todo", "import", str(fifo)), "it is a FIFO, not a regular file")


def test_hostile_files_through_the_cli(tmp_path):
    deep = tmp_path / "deep.toml"
    deep.write_text('[[stage]]\nid = "a"\ncommand = "true"\nverify = ' + "[" * 5000 + "]" * 5000 + "\n")
    _assert_exit_2_one_line(_nodedeck(tmp_path, "plan", "check", str(deep)),
                            f"{deep}:4: arrays or tables nested deeper")
    kind = tmp_path / "kind.toml"
    kind.write_text('[[stage]]\nid = "a"\ncommand = "true"\nverify = [{ kind = [] }]\n')
    _assert_exit_2_one_line(_nodedeck(tmp_path, "plan", "check", str(kind)),
                            f"{kind}:4: stage 'a': verify[0]: unknown check kind")
    todo = tmp_path / "t.json"
    todo.write_text('{"todos": [\n  {"content": "a"},\n  {"content": "\\ud800"}\n]}')
    _assert_exit_2_one_line(_nodedeck(tmp_path, "todo", "import", str(todo)), f"{todo}:3: todos[1]: content")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (5 << 20))
    _assert_exit_2_one_line(_nodedeck(tmp_path, "todo", "import", str(big)), "larger than 4 MiB")


def test_a_bad_node_section_breaks_only_that_node(tmp_path):
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{tmp_path}/work"\n\n[nodes.gpu1]\nssh = "gpu1"\nport = "22"\n')
    res = _nodedeck(tmp_path, "run", "local", "--", "echo", "still works", config=cfg)
    assert res.returncode == 0 and res.stdout == "still works\n", res.stderr
    _assert_exit_2_one_line(_nodedeck(tmp_path, "run", "gpu1", "--", "true", config=cfg),
                            f"{cfg}:6: nodes.gpu1.port: expected a whole number")
    res = _nodedeck(tmp_path, "nodes", "--json", config=cfg)   # listing nodes.toml: its error first and alone
    assert res.returncode == 2 and json.loads(res.stdout)["error"].startswith(f"{cfg}:6: nodes.gpu1.port")
    assert res.stderr.strip().endswith("nodes.gpu1.port: expected a whole number from 1 to 65535, got '22'")
