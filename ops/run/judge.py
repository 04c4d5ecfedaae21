"""The verdict on a run: `judge()` is the one place a StageVerdict is made, from facts already gathered.

Pure: no I/O and no store writes. The scheduler finds out what happened (the run as recorded, the
runner's word on a lost run, the last log line, the checks it ran) and hands it here with what
brought the run to judgement (`Ending`); it records and shows the verdict it gets back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ops.plan.records import Stage, StageKind
from ops.run.record import StageVerdict, Why
from ops.run.views import CheckResult, StageState
from ops.state import RunRecord
from ops.units import HOURS, human_duration


@dataclass(frozen=True)
class Ended:
    """The run is over on its own (exited, lost, stopped, never launched) and has no verdict yet."""

    lost_detail: str = ""   # the runner's word on a lost run ("" when it has none)
    last_line: str = ""     # the last line the run wrote to its log (read for an exit != 0)


@dataclass(frozen=True)
class TimedOut:
    """It ran past its timeout (and is being stopped)."""

    after: float


@dataclass(frozen=True)
class StoppedByUser:
    """The user stopped it; a server that was seen up did its part."""

    was_up: bool


@dataclass(frozen=True)
class LaunchFailed:
    """It could not be launched (the run is the stage's latest one after the attempt, if any)."""

    error: str


@dataclass(frozen=True)
class RankFailed:
    """One node-rank of a run on several nodes ended badly (the first to)."""

    detail: str                # `node-rank 1 on gpu2: exit 1: ...`
    rank_run: RunRecord        # that node-rank's run


@dataclass(frozen=True)
class VerifyAsked:
    """The user asked for a verdict (`stage verify`) on a run that is over, or a server alive."""

    running: bool              # its process (any node-rank's) is alive now
    clean: bool                # it ended well so far: exited 0 on its own (each node-rank), or a server alive
    rank_failed: str = ""      # the detail of the node-rank that ended badly, on several nodes
    done_before: StageVerdict | None = None
    """A server's completed verdict on this run (it was up, then stopped): down now, it did its part and stays
    completed, its checks failing now."""


@dataclass(frozen=True)
class Rechecked:
    """A settled verdict whose checks were run again (an ended server's, now down)."""

    verdict: StageVerdict


Ending = Ended | TimedOut | StoppedByUser | LaunchFailed | RankFailed | VerifyAsked | Rechecked
"""What brought a run to judgement."""


def checks_decide(stage: Stage, run: RunRecord) -> bool:
    """A run over whose verdict the verify checks decide: a job that exited 0 on its own."""
    return (stage.kind is StageKind.JOB and run.state not in ("failed", "lost") and run.stopped_at is None
            and run.exit_code == 0)


def checks_shown(stage: Stage, run: RunRecord) -> bool:
    """A run over whose checks are run to be shown with its verdict: one the checks decide, and a
    server that was launched (down now: its checks say so, with their age)."""
    return checks_decide(stage, run) or (stage.kind is StageKind.SERVER and run.state != "failed")


def quotes_log(stage: Stage, run: RunRecord) -> bool:
    """A run over whose verdict quotes its last log line: a job that exited non-zero on its own, a server that
    exited on its own (why it could not serve: `cannot listen on ...: Address already in use`)."""
    return (run.state not in ("failed", "lost") and run.stopped_at is None
            and (run.exit_code != 0 or stage.kind is StageKind.SERVER))


def judge(stage: Stage, run: RunRecord | None, ending: Ending, checks: tuple[CheckResult, ...] = ()) -> StageVerdict:
    """The verdict on `run` of `stage` (None: a launch that failed before any run was recorded), given
    why it is judged and the checks run for it (checks_shown says when an Ended run needs them)."""
    run_id = run.id if run is not None else None
    failed = next((r for r in checks if not r.ok), None)
    if isinstance(ending, LaunchFailed):
        return StageVerdict(run_id, StageState.FAILED, f"could not launch: {ending.error}", Why.LAUNCH_ERROR)
    if isinstance(ending, Rechecked):
        return replace(ending.verdict, results=checks)
    if run is None:
        raise ValueError(f"stage {stage.id}: only a failed launch is judged without a run")
    if isinstance(ending, StoppedByUser):
        return StageVerdict(run.id, StageState.COMPLETED if ending.was_up else StageState.FAILED,
                            "stopped by user" + (" after it was up" if ending.was_up else ""), Why.STOPPED, checks)
    if isinstance(ending, TimedOut):
        detail = f"timed out after {human_duration(ending.after, HOURS)}" + (f": {failed.text}" if failed else "")
        return StageVerdict(run.id, StageState.FAILED, detail, Why.TIMEOUT, checks)
    if isinstance(ending, RankFailed):
        r = ending.rank_run
        why = Why.STOPPED if r.stopped_at is not None else Why.LAUNCH_ERROR if r.state == "failed" else Why.EXIT
        return StageVerdict(run.id, StageState.FAILED, ending.detail, why)
    if isinstance(ending, VerifyAsked):
        if ending.done_before is not None and not ending.running:
            return replace(ending.done_before, results=checks)
        if failed is None and ending.clean:
            state, detail = StageState.COMPLETED, f"verified: {len(checks)} checks pass"
        else:
            state, detail = StageState.FAILED, (failed.text if failed is not None else ending.rank_failed
                                                or _end_detail(stage, run, ending.running))
        return StageVerdict(run.id, state, detail, Why.VERIFIED, checks)
    return _ended(stage, run, ending, checks)


def _ended(stage: Stage, run: RunRecord, ending: Ended, checks: tuple[CheckResult, ...]) -> StageVerdict:
    """A run over on its own: its exit decides, then (exit 0) its checks."""
    why = Why.EXIT
    if run.state == "failed":
        return StageVerdict(run.id, StageState.FAILED, "could not launch (see events)", Why.LAUNCH_ERROR)
    if run.state == "lost":
        detail = f"lost: {ending.lost_detail or 'process gone without an exit status'}"
    elif run.stopped_at is not None:
        detail, why = "stopped", Why.STOPPED
    elif stage.kind is StageKind.SERVER:
        detail = f"server exited with status {run.exit_code}" + (f": {ending.last_line}" if ending.last_line else "")
    elif run.exit_code != 0:
        detail = (f"exit {run.exit_code}" + (" (smoke run)" if run.smoke else "")
                  + (f": {ending.last_line}" if ending.last_line else ""))
    else:
        failed = next((r for r in checks if not r.ok), None)
        if failed is None:
            return StageVerdict(run.id, StageState.COMPLETED, f"exit 0; {len(checks)} checks pass", why, checks)
        return StageVerdict(run.id, StageState.FAILED, failed.text, why, checks)
    return StageVerdict(run.id, StageState.FAILED, detail, why, checks if checks_shown(stage, run) else ())


def _end_detail(stage: Stage, run: RunRecord, running: bool) -> str:
    """Why a run the user asked to verify is not clean, when no check and no node-rank says it."""
    if run.stopped_at is not None:
        return "stopped"
    if run.state == "lost":
        return "lost: process gone without an exit status"
    if stage.kind is StageKind.SERVER and not running:
        return f"server exited with status {run.exit_code}"
    return f"exit {run.exit_code}"
