"""Property tests: whatever the plan file holds, `plan check` answers ok or one-line errors, never a traceback."""

from __future__ import annotations

import copy
import json
import re
import tomllib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.main import main
from ops.plan.parse import PlanError, parse_plan
from tests.test_plan_parse import GOOD

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
BASE = tomllib.loads(GOOD)
ERROR_LINE = re.compile(r"^nodedeck: (?P<file>[^\n]+?):(?P<line>\d+): \S.*$")
WARNING_LINE = re.compile(r"^nodedeck: warning: node .+ has no trainer installed by nodedeck \(.+\): "
                          r"run `nodedeck node setup .+`$")


# -- a small TOML writer (the test must not trust the parser it tests) -------------------
def _val(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v) if v == v and abs(v) != float("inf") else "nan"
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)   # JSON escapes are valid TOML basic-string escapes
    if isinstance(v, list):
        return "[" + ", ".join(_val(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_val(k)} = {_val(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def to_toml(doc: dict) -> str:
    out = []
    for key, value in doc.items():
        if key == "stage" and isinstance(value, list) and all(isinstance(s, dict) for s in value):
            continue
        if isinstance(value, dict):
            out.append(f"[{_val(key)}]")
            out += [f"{_val(k)} = {_val(v)}" for k, v in value.items()]
        else:
            out.insert(0, f"{_val(key)} = {_val(value)}")
    for stage in doc.get("stage", []) if isinstance(doc.get("stage"), list) else []:
        if isinstance(stage, dict):
            out.append("[[stage]]")
            out += [f"{_val(k)} = {_val(v)}" for k, v in stage.items()]
    return "\n".join(out) + "\n"


scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=12), st.sampled_from(["a", "prep", "serve", "train", "high", "server", "x:y"]))
values = st.recursive(scalars.filter(lambda v: v is not None),
                      lambda inner: st.one_of(st.lists(inner, max_size=3),
                                              st.dictionaries(st.sampled_from(
                                                  ["kind", "path", "min", "src", "dest", "x"]),
                                                              inner, max_size=3)),
                      max_leaves=6)
STAGE_KEYS = ["id", "title", "priority", "depends_on", "node", "cwd", "command", "upload", "outputs", "timeout",
              "retries", "log", "env", "smoke", "smoke_args", "kind", "verify", "bogus"]


@st.composite
def mutated_plans(draw) -> dict:
    doc = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["drop", "retype", "cycle", "dup", "unknown_dep", "check_kind", "plan_key"]))
        stages = doc["stage"]
        i = draw(st.integers(0, len(stages) - 1))
        s = stages[i]
        if op == "drop" and s:
            s.pop(draw(st.sampled_from(sorted(s))))
        elif op == "retype":
            s[draw(st.sampled_from(STAGE_KEYS))] = draw(values)
        elif op == "cycle":
            ids = [x.get("id") for x in stages if isinstance(x.get("id"), str)]
            if ids:
                s["depends_on"] = [draw(st.sampled_from(ids))]
                stages[0]["depends_on"] = [s.get("id") if isinstance(s.get("id"), str) else "z"]
        elif op == "dup":
            stages.append(copy.deepcopy(s))
        elif op == "unknown_dep":
            s["depends_on"] = [draw(st.text(max_size=5))]
        elif op == "check_kind":
            s["verify"] = [{"kind": draw(st.sampled_from(["file_exists", "min_lines", "json_field",
                                                          "nope", "http_ok"])),
                            **draw(st.dictionaries(st.sampled_from(["path", "min", "url", "op", "value", "field"]),
                                                   values, max_size=4))}]
        elif op == "plan_key":
            doc.setdefault("plan", {})[draw(st.sampled_from(["name", "max_parallel", "node", "zzz"]))] = draw(values)
    return doc


def assert_check_answers(path, capsys) -> None:
    rc = main(["plan", "check", str(path)])
    out, err = capsys.readouterr()
    assert rc in (0, 2), (rc, out, err)
    if rc == 0:            # ok, and at most one-line warnings (a node that runs nodedeck-train was never set up)
        assert out.startswith("ok: ")
        assert all(WARNING_LINE.match(line) for line in err.splitlines()), err
        return
    lines = err.splitlines()
    assert lines, "exit 2 without a message"
    for line in lines:
        m = ERROR_LINE.match(line)
        assert m and m.group("file") == str(path), line
        assert "Traceback" not in line


@SETTINGS
@given(doc=mutated_plans())
def test_mutated_plans_get_ok_or_one_line_errors(doc, tmp_path, capsys):
    path = tmp_path / "mutated.toml"
    path.write_text(to_toml(doc))
    assert_check_answers(path, capsys)


@SETTINGS
@given(text=st.text(max_size=300))
def test_random_text_never_raises(text, tmp_path, capsys):
    path = tmp_path / "random.toml"
    path.write_text(text)
    assert_check_answers(path, capsys)


@SETTINGS
@given(cut=st.integers(0, len(GOOD)), length=st.integers(0, 40), junk=st.binary(max_size=12))
def test_damaged_good_plan(cut, length, junk, tmp_path, capsys):
    raw = GOOD.encode()
    path = tmp_path / "damaged.toml"
    path.write_bytes(raw[:cut] + junk + raw[cut + length:])
    assert_check_answers(path, capsys)


@SETTINGS
@given(doc=mutated_plans())
def test_parser_raises_only_plan_errors(doc):
    try:
        parse_plan(to_toml(doc), "m.toml")
    except PlanError as e:
        assert e.errors and all("\n" not in x and x.startswith("m.toml:") for x in e.errors)


def test_writer_round_trips_the_base_plan():
    assert tomllib.loads(to_toml(BASE)) == BASE
