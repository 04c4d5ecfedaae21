"""JSON a node sent, nested deeper than Python's parser goes, is invalid JSON like any other: never a
RecursionError out of a reader (each read it as a traceback, a dead thread or a panel's internal error)."""

from __future__ import annotations

import pytest

from ops import nodejson
from ops.decommission.report import _metrics_line
from ops.hosts.local import LocalHost
from ops.outcome import last_record as last_outcome
from ops.plan.records import CheckSpec
from ops.run.checks import CheckContext, run_check
from ops.run.progress import last_record as last_progress
from ops.setup.install_plan import NoPlan, parse_report
from ops.telemetry.training import TrainingMetrics

DEEP = "[" * 100_000 + "]" * 100_000
DEEP_DICT = '{"a":' * 100_000 + "1" + "}" * 100_000


@pytest.mark.parametrize("text", [DEEP, DEEP_DICT])
def test_nodejson_says_too_deep_as_a_value_error(text):
    with pytest.raises(ValueError, match="nested too deeply"):
        nodejson.loads(text)
    assert nodejson.loads('{"a": [1, 2.5]}') == {"a": [1, 2.5]}


@pytest.mark.parametrize("text", [DEEP, DEEP_DICT])
def test_every_reader_of_a_node_s_json_skips_json_nested_too_deep(tmp_path, text):
    tm = TrainingMetrics(LocalHost(), "/nonexistent")
    tm.ingest(text)
    assert tm.skipped == 1 and tm.records == 0
    (tmp_path / "eval.json").write_text(text + "\n" + text + "\n")
    assert last_outcome(LocalHost(), str(tmp_path / "eval.json")) is None
    assert last_progress((text + "\n").encode()) is None
    assert _metrics_line(text).startswith("`[") or _metrics_line(text).startswith("`{")
    with pytest.raises(NoPlan, match="no installation report"):
        parse_report(text.encode())
    ctx = CheckContext(LocalHost(), base_dir=str(tmp_path))
    for line in ("last", "first"):
        r = run_check(CheckSpec("json_field", {"path": "eval.json", "field": "a", "op": "==", "value": 1,
                                               "line": line}), ctx)
        assert not r.ok and len(r.text) < 300, r.text
