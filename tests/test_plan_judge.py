"""judge(): the one place a stage's verdict is made, over its table of cases (issue 32 item 2).

The expected verdicts are those the scheduler reached before judge() was split out of it (the
same texts the scheduler tests read on real runs); judge is pure, so the table needs no node."""

from __future__ import annotations

import dataclasses

import pytest

from ops.plan.records import Stage, StageKind
from ops.run.judge import (
    Ended,
    LaunchFailed,
    RankFailed,
    Rechecked,
    StoppedByUser,
    TimedOut,
    VerifyAsked,
    checks_decide,
    checks_shown,
    judge,
    quotes_log,
)
from ops.run.record import StageVerdict, Why
from ops.run.views import CheckResult
from ops.run.views import StageState as S
from ops.state import RunRecord

JOB = Stage(id="prep", title="prep", command="true")
SERVER = Stage(id="serve", title="serve", command="serve", kind=StageKind.SERVER)
PASS = CheckResult("file_exists", True, "file_exists a.out ✓", 100.0)
FAIL = CheckResult("min_lines", False, "min_lines a.out >= 10: 3 ✗", 100.0)


def run(state="exited", exit_code=0, *, stopped=False, smoke=False, run_id=7) -> RunRecord:
    return RunRecord(id=run_id, stage="p/prep", tmux_session="p-prep-abc", command="true", cwd="/w",
                     log_path="/w/l.log", exit_path="/w/l.exit", pid=11, pgid=11, proc_start=5, started_at=10.0,
                     ended_at=None if state in ("starting", "running") else 20.0, exit_code=exit_code, state=state,
                     smoke=smoke, attempt=1, stopped_at=15.0 if stopped else None)


CASES = [
    # (name, stage, run, ending, checks) -> (state, detail, why, results kept)
    ("exited 0, checks pass", JOB, run(), Ended(), (PASS,),
     (S.COMPLETED, "exit 0; 1 checks pass", Why.EXIT, (PASS,))),
    ("exited 0, a check fails", JOB, run(), Ended(), (PASS, FAIL),
     (S.FAILED, FAIL.text, Why.EXIT, (PASS, FAIL))),
    ("exited 0, no checks", JOB, run(), Ended(), (),
     (S.COMPLETED, "exit 0; 0 checks pass", Why.EXIT, ())),
    ("exit 1 with its last log line", JOB, run(exit_code=1), Ended(last_line="Traceback: boom"), (),
     (S.FAILED, "exit 1: Traceback: boom", Why.EXIT, ())),
    ("a smoke run's exit 2, empty log", JOB, run(exit_code=2, smoke=True), Ended(), (),
     (S.FAILED, "exit 2 (smoke run)", Why.EXIT, ())),
    ("never launched", JOB, run("failed", None), Ended(), (),
     (S.FAILED, "could not launch (see events)", Why.LAUNCH_ERROR, ())),
    ("lost, the runner says why", JOB, run("lost", None), Ended(lost_detail="pid 11 gone"), (),
     (S.FAILED, "lost: pid 11 gone", Why.EXIT, ())),
    ("lost, nothing said", JOB, run("lost", None), Ended(), (),
     (S.FAILED, "lost: process gone without an exit status", Why.EXIT, ())),
    ("stopped (another process's user stop)", JOB, run(exit_code=143, stopped=True), Ended(), (),
     (S.FAILED, "stopped", Why.STOPPED, ())),
    ("a server exited, its checks kept", SERVER, run(exit_code=0), Ended(), (FAIL,),
     (S.FAILED, "server exited with status 0", Why.EXIT, (FAIL,))),
    ("a server that could not listen, its log's last line", SERVER, run(exit_code=2),
     Ended(last_line="cannot listen on 127.0.0.1:8123: Address already in use"), (FAIL,),
     (S.FAILED, "server exited with status 2: cannot listen on 127.0.0.1:8123: Address already in use", Why.EXIT,
      (FAIL,))),
    ("a server never launched: no checks", SERVER, run("failed", None), Ended(), (FAIL,),
     (S.FAILED, "could not launch (see events)", Why.LAUNCH_ERROR, ())),
    ("a stopped server keeps its checks", SERVER, run(exit_code=143, stopped=True), Ended(), (FAIL,),
     (S.FAILED, "stopped", Why.STOPPED, (FAIL,))),
    ("timed out, a check failing", SERVER, run("running", None), TimedOut(600), (FAIL,),
     (S.FAILED, f"timed out after 10m00s: {FAIL.text}", Why.TIMEOUT, (FAIL,))),
    ("timed out on several nodes", JOB, run("running", None), TimedOut(4), (),
     (S.FAILED, "timed out after 4s", Why.TIMEOUT, ())),
    ("stopped by the user", JOB, run("running", None), StoppedByUser(was_up=False), (PASS,),
     (S.FAILED, "stopped by user", Why.STOPPED, (PASS,))),
    ("a server stopped after it was up", SERVER, run("running", None), StoppedByUser(was_up=True), (PASS,),
     (S.COMPLETED, "stopped by user after it was up", Why.STOPPED, (PASS,))),
    ("launch error (lease lost, upload missing)", JOB, run("failed", None), LaunchFailed("upload x: no such file"), (),
     (S.FAILED, "could not launch: upload x: no such file", Why.LAUNCH_ERROR, ())),
    ("a node-rank exited 1", JOB, run("exited", 143, stopped=True),
     RankFailed("node-rank 1 on gpu2: exit 1: oom", run(exit_code=1, run_id=3)), (),
     (S.FAILED, "node-rank 1 on gpu2: exit 1: oom", Why.EXIT, ())),
    ("a node-rank stopped", JOB, run(), RankFailed("node-rank 1 on gpu2: stopped", run(stopped=True)), (),
     (S.FAILED, "node-rank 1 on gpu2: stopped", Why.STOPPED, ())),
    ("a node-rank never launched", JOB, run(), RankFailed("node-rank 1 on gpu2: could not launch (see events)",
                                                          run("failed", None)), (),
     (S.FAILED, "node-rank 1 on gpu2: could not launch (see events)", Why.LAUNCH_ERROR, ())),
    ("verify asked, clean", JOB, run(), VerifyAsked(running=False, clean=True), (PASS,),
     (S.COMPLETED, "verified: 1 checks pass", Why.VERIFIED, (PASS,))),
    ("verify asked, a check fails", JOB, run(), VerifyAsked(running=False, clean=True), (FAIL,),
     (S.FAILED, FAIL.text, Why.VERIFIED, (FAIL,))),
    ("verify asked after exit 3", JOB, run(exit_code=3), VerifyAsked(running=False, clean=False), (PASS,),
     (S.FAILED, "exit 3", Why.VERIFIED, (PASS,))),
    ("verify asked after a stop", JOB, run(exit_code=143, stopped=True), VerifyAsked(False, False), (PASS,),
     (S.FAILED, "stopped", Why.VERIFIED, (PASS,))),
    ("verify asked on a lost run", JOB, run("lost", None), VerifyAsked(False, False), (),
     (S.FAILED, "lost: process gone without an exit status", Why.VERIFIED, ())),
    ("verify asked on a server that exited", SERVER, run(exit_code=1), VerifyAsked(False, False), (),
     (S.FAILED, "server exited with status 1", Why.VERIFIED, ())),
    ("verify asked on a server alive", SERVER, run("running", None), VerifyAsked(True, True), (PASS,),
     (S.COMPLETED, "verified: 1 checks pass", Why.VERIFIED, (PASS,))),
    ("verify asked, a node-rank failed", JOB, run(), VerifyAsked(False, False, "node-rank 1 on gpu2: exit 1"), (),
     (S.FAILED, "node-rank 1 on gpu2: exit 1", Why.VERIFIED, ())),
    ("verify asked on a server down after it was up", SERVER, run(exit_code=143, stopped=True),
     VerifyAsked(False, False, done_before=StageVerdict(7, S.COMPLETED, "stopped by user after it was up", Why.STOPPED,
                                                        (PASS,))), (FAIL,),
     (S.COMPLETED, "stopped by user after it was up", Why.STOPPED, (FAIL,))),
]


@pytest.mark.parametrize("name, stage, the_run, ending, checks, expected", CASES, ids=[c[0] for c in CASES])
def test_the_verdict_of_each_case(name, stage, the_run, ending, checks, expected):
    state, detail, why, results = expected
    assert judge(stage, the_run, ending, checks) == StageVerdict(the_run.id, state, detail, why, results)


def test_a_launch_that_failed_before_any_run_is_judged_without_one():
    assert judge(JOB, None, LaunchFailed("node gpu1 refused")) == StageVerdict(
        None, S.FAILED, "could not launch: node gpu1 refused", Why.LAUNCH_ERROR)
    with pytest.raises(ValueError):
        judge(JOB, None, Ended())


def test_a_recheck_keeps_the_verdict_and_takes_the_new_checks():
    up = StageVerdict(7, S.COMPLETED, "stopped by user after it was up", Why.STOPPED, (PASS,))
    assert judge(SERVER, run(exit_code=143, stopped=True), Rechecked(up), (FAIL,)) == dataclasses.replace(
        up, results=(FAIL,))


def test_only_user_stops_and_launch_errors_are_never_retried():
    retried = {name for name, stage, r, ending, checks, _ in CASES if judge(stage, r, ending, checks).retryable}
    assert retried == {"exited 0, a check fails", "exit 1 with its last log line", "a smoke run's exit 2, empty log",
                       "lost, the runner says why", "lost, nothing said", "a server exited, its checks kept",
                       "a server that could not listen, its log's last line",
                       "timed out, a check failing", "timed out on several nodes", "a node-rank exited 1"}


@pytest.mark.parametrize("stage, the_run, decide, shown, quoted", [
    (JOB, run(), True, True, False),
    (JOB, run(exit_code=1), False, False, True),
    (JOB, run("lost", None), False, False, False),
    (JOB, run("failed", None), False, False, False),
    (JOB, run(exit_code=0, stopped=True), False, False, False),
    (SERVER, run(exit_code=0), False, True, True),      # a server exited on its own: its log says why
    (SERVER, run(exit_code=143, stopped=True), False, True, False),
    (SERVER, run("failed", None), False, False, False),
])
def test_what_is_gathered_before_judging_an_ended_run(stage, the_run, decide, shown, quoted):
    assert (checks_decide(stage, the_run), checks_shown(stage, the_run), quotes_log(stage, the_run)) == (
        decide, shown, quoted)
