"""Progress records of a stage (`$NODEDECK_PROGRESS`) read over the Host API, and a log's growth rate."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ops.hosts.local import LocalHost
from ops.run.progress import (
    LogGrowthTracker,
    Progress,
    last_record,
    read_progress,
)
from ops.textsafe import shown
from tests.support.tmux_sessions import kill_plan_sessions


def rec(done, total=300, rate=10.0, ts=1.0, unit="steps") -> str:
    return json.dumps({"ts": ts, "done": done, "total": total, "unit": unit, "rate": rate}) + "\n"


def test_the_last_complete_line_wins_and_a_half_written_one_is_ignored(tmp_path):
    p = tmp_path / "x.progress.jsonl"
    p.write_text(rec(10) + rec(150) + '{"ts": 2, "done": 16')
    got = read_progress(LocalHost(), str(p))
    assert got == Progress(1.0, 150.0, 300.0, "steps", 10.0)
    assert got.fraction == 0.5 and got.eta_s == 15.0


def test_junk_lines_are_skipped_never_fatal(tmp_path):
    p = tmp_path / "x.progress.jsonl"
    p.write_text(rec(5) + "not json\n" + '{"done": "many", "ts": 1}\n' + '["a"]\n' + '{"ts": 1, "done": NaN}\n')
    assert read_progress(LocalHost(), str(p)).done == 5.0
    p.write_text("garbage only\n\xff\xfe\n")
    assert read_progress(LocalHost(), str(p)) is None
    assert read_progress(LocalHost(), str(tmp_path / "missing.jsonl")) is None
    assert read_progress(LocalHost(), str(tmp_path)) is None


def test_the_read_is_bounded_to_the_tail(tmp_path):
    p = tmp_path / "x.progress.jsonl"
    p.write_text("".join(rec(i) for i in range(20_000)))
    calls = []
    host = LocalHost()
    real = host.read_range
    host.read_range = lambda path, off=0, n=None: calls.append(n) or real(path, off, n)
    assert read_progress(host, str(p), tail=4096).done == 19_999.0
    assert calls == [4096]


def test_unknown_total_and_rate_give_no_eta():
    got = last_record(rec(7, total=None, rate=None, unit="samples").encode())
    assert got.unit == "samples" and got.fraction is None and got.eta_s is None


@pytest.mark.parametrize("unit", ["\x1b[2J\x1b]52;c;aGk=\x07", "7\n8", "x" * 70_000, "tok\u202ens", "", 12, ["a"]],
                         ids=["escapes", "newline", "70k", "bidi", "empty", "number", "list"])
def test_a_unit_that_is_no_short_plain_word_is_steps_and_named_inert(unit):
    got = last_record((json.dumps({"ts": 1, "done": 5, "total": 10, "unit": unit, "rate": 1}) + "\n").encode())
    text = got.describe()
    assert got.unit == "steps" and text.startswith("5/10 steps (50%), 1 steps/s")
    assert "invalid unit" in text and shown(text) == text and len(text) < 200


def test_a_short_unit_with_spaces_is_kept():
    text = last_record(rec(7, unit="GiB hashed").encode()).describe()
    assert text.startswith("7/300 GiB hashed (2%), 10 GiB hashed/s") and "invalid" not in text


def test_log_growth_is_bytes_per_second_between_two_polls():
    t = LogGrowthTracker()
    assert t.update("a", 1000, 10.0).rate is None
    assert t.update("a", 3000, 12.0).rate == 1000.0
    assert t.update("a", 10, 13.0).rate is None   # truncated: start over


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_give_a_record_or_none(data):
    got = last_record(data)
    assert got is None or isinstance(got, Progress)


def test_plan_show_reports_a_running_stage_progress(tmp_path, capsys):
    import time
    import uuid

    from cli.main import main

    name = f"pg{uuid.uuid4().hex[:8]}"
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{tmp_path / "work"}"\n')
    plan = tmp_path / "plan.toml"
    plan.write_text(f'[plan]\nname = "{name}"\n[[stage]]\nid = "tok"\ncommand = \'\'\''
                    'printf \'{"ts": 1, "done": 150, "total": 300, "unit": "samples", "rate": 25}\\n\' '
                    '>> "$NODEDECK_PROGRESS"; sleep 60\'\'\'\n')
    try:
        assert main(["--config", str(cfg), "stage", "start", "tok", "--plan", str(plan), "--force"]) == 0
        deadline = time.monotonic() + 20
        while True:
            capsys.readouterr()
            assert main(["--config", str(cfg), "plan", "show", str(plan), "--json"]) == 0
            stage = json.loads(capsys.readouterr().out)["stages"][0]
            if stage["progress"] is not None or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert stage["progress"] == {"ts": 1.0, "done": 150.0, "total": 300.0, "unit": "samples", "rate": 25.0,
                                     "eta_s": 6.0, "invalid": []}
        assert main(["--config", str(cfg), "plan", "show", str(plan)]) == 0
        assert "  progress 150/300 samples (50%), 25 samples/s, ETA 6s" in capsys.readouterr().out
    finally:
        kill_plan_sessions(name)
