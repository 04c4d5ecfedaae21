"""`nodedeck node setup NODE`: make a node ready to run plans, one checked step at a time.

Each step looks at what is there before it changes anything, so a second setup only checks (the steps say
`skipped`) and a setup cut short resumes where it stopped. The steps on a node reached over SSH are in
remote.py; node `local` is this machine, whose trainer is the running nodedeck's own, checked and recorded.

One setup of a node environment runs at a time (lock.py): a second one, from another terminal or the dashboard,
is told who runs the first and waits for it. A setup can be stopped (`SetupRun.stop()`, the dashboard's "stop it";
Ctrl-C in the CLI): what it started on the node is stopped by its recorded process group, and the setup ends there.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Callable

from ops.errors import HostError, NodedeckError, UserError
from ops.node_handle import NodeHandle
from ops.setup import record as setup_record
from ops.setup.checks import check_disk, check_gpus, check_python, torch_text, verify_trainer
from ops.setup.lock import SetupLock, holder_here
from ops.setup.probe import NodeFacts, probe
from ops.setup.record import TrainerSetup
from ops.setup.remote import Remote
from ops.setup.results import Failed, Outcome, SetupOptions, SetupResult, StepResult, StepStatus
from ops.setup.wheel import build_id
from ops.textsafe import printable, shown

__all__ = ["SetupOptions", "SetupResult", "SetupRun", "StepResult", "StepStatus", "setup_node", "check_gpus"]

Watcher = Callable[[StepResult], None]
STOP_SAID_S = 60.0   # how long a step that ended as it was stopped waits to say what was stopped


class SetupRun:
    """One `node setup` of one node: `run(handle)` in one thread; `stop()` and `watch()` from any other.

    `holder` names who runs it in the node's lock file (which nodedeck, in which face)."""

    def __init__(self, options: SetupOptions = SetupOptions(), on_step: Watcher | None = None,
                 face: str = "nodedeck node setup"):
        self.options = options
        self.holder = holder_here(face)
        self.started_at = time.time()
        self.stopping = threading.Event()
        self.done = threading.Event()
        self._remote: Remote | None = None          # the steps on a node over SSH, once they run
        self.result: SetupResult | None = None
        self.stopped = ""                          # what stop() stopped on the node, said once it did
        self._stop_said = threading.Event()        # set once stop() knows what it stopped
        self._guard = threading.Lock()
        self._steps: list[StepResult] = []
        self._watchers: list[Watcher] = [on_step] if on_step is not None else []

    @property
    def node_lock(self) -> SetupLock | None:
        """The node environment's setup lock, once held (remote nodes)."""
        return self._remote.node_lock if self._remote is not None else None

    @property
    def steps(self) -> tuple[StepResult, ...]:
        with self._guard:
            return tuple(self._steps)

    def watch(self, fn: Watcher) -> tuple[StepResult, ...]:
        """Call fn with every step from now on; returns the steps so far (none is missed or told twice)."""
        with self._guard:
            self._watchers.append(fn)
            return tuple(self._steps)

    def unwatch(self, fn: Watcher) -> None:
        with self._guard:
            if fn in self._watchers:
                self._watchers.remove(fn)

    def report(self, result: StepResult) -> None:
        with self._guard:
            self._steps.append(result)
            watchers = list(self._watchers)
        for fn in watchers:
            fn(result)

    def step(self, name: str, fn: Callable[[], Outcome]) -> bool:
        """Run one step and report it; False when it failed (or the setup is being stopped)."""
        t0 = time.monotonic()
        if self.stopping.is_set():
            self.report(StepResult(name, StepStatus.FAILED, "not started: the setup was stopped", 0.0))
            return False
        try:
            status, detail = fn()
        except Failed as e:
            status, detail = StepStatus.FAILED, str(e)
        except NodedeckError as e:
            status, detail = StepStatus.FAILED, printable(str(e), 500)
        if status is StepStatus.FAILED and self.stopping.is_set():
            self._stop_said.wait(STOP_SAID_S)  # the command ended as it was stopped: say what stop() stopped
            detail = f"stopped{': ' + self.stopped if self.stopped else ''} ({detail})"
        self.report(StepResult(name, status, shown(detail), time.monotonic() - t0))   # a node's words, made inert
        return status is not StepStatus.FAILED

    def stop(self) -> str:
        """Stop this setup: no further step starts, and what it runs on the node is stopped by its recorded
        process group. Returns what was stopped, in words."""
        self.stopping.set()
        lock = self.node_lock
        try:
            found = lock.stop() if lock is not None else []
        except HostError as e:
            self.stopped = f"could not stop what it runs on the node: {printable(str(e), 300)}"
        else:
            self.stopped = ("stopped on the node: " + "; ".join(s.text for s in found) if found
                            else "nothing of it was running on the node")
        self._stop_said.set()
        return self.stopped

    def run(self, handle: NodeHandle) -> SetupResult:
        """Every step on the handle's node, each reported as it ends. Ctrl-C (KeyboardInterrupt) stops what the
        setup started on the node, reports that, and is raised again."""
        try:
            if handle.node.ssh is None:
                o = self.options
                if o.python or o.env or o.wheelhouse or o.with_node_stack or o.torch_index:
                    raise UserError(f"node {handle.name} is this machine, whose trainer is this nodedeck's own: "
                                    "--python, --env, --wheelhouse, --torch-index and --with-node-stack are for "
                                    "nodes reached over ssh")
                made = self._local(handle)
            else:
                made = self._on_node(handle)
            self.result = SetupResult(handle.name, self.steps, made)
            return self.result
        except KeyboardInterrupt:
            said = self.stop()
            self.report(StepResult("stopped", StepStatus.FAILED, f"interrupted (Ctrl-C): {said}", 0.0))
            raise
        finally:
            lock = self.node_lock
            if lock is not None:
                lock.release()
            self.done.set()

    def _on_node(self, handle: NodeHandle) -> TrainerSetup | None:
        if self.options.wheelhouse is not None and not self.options.wheelhouse.is_dir():
            raise UserError(f"--wheelhouse {self.options.wheelhouse}: not a directory")
        r = self._remote = Remote(handle, self.options, holder=self.holder, report=self.report,
                                  stopping=self.stopping)
        for name, fn in r.steps():
            if not self.step(name, fn):
                return None
        made = r.made()
        return made if self.step("record", lambda: _record(handle, made)) else None

    def _local(self, handle: NodeHandle) -> TrainerSetup | None:
        """`local` is this machine: the trainer is the running nodedeck's own install."""
        host = handle.host
        python = sys.executable
        facts: list[NodeFacts] = []

        def python_step() -> Outcome:
            facts.append(probe(host, python, handle.root, torch=True))
            return check_python(facts[0], python)

        if not (self.step("python", python_step)
                and self.step("disk", lambda: check_disk(facts[0], self.options.min_free_gib))
                and self.step("gpus", lambda: check_gpus(facts[0]))):
            return None
        self.step("torch", lambda: (StepStatus.OK, torch_text(facts[0])))
        bin_dir = str(Path(python).parent)
        said: list[str] = []

        def verify() -> Outcome:
            said.append(verify_trainer(host, bin_dir, build_id()))
            return StepStatus.OK, f"{bin_dir}/nodedeck-train {said[0]}"

        if not self.step("verify", verify):
            return None
        made = TrainerSetup(python=python, bin_dir=bin_dir, version=said[0], torch=facts[0].torch_version,
                            at=time.time())
        return made if self.step("record", lambda: _record(handle, made)) else None


def _record(handle: NodeHandle, made: TrainerSetup) -> Outcome:
    setup_record.save(handle.store, made)
    return StepStatus.OK, f"stages on {handle.name} get {made.bin_dir} first on their PATH"


def setup_node(handle: NodeHandle, options: SetupOptions = SetupOptions(),
               on_step: Watcher = lambda r: None) -> SetupResult:
    """Make the handle's node ready to run plans; every step is reported to on_step as it ends."""
    return SetupRun(options, on_step).run(handle)
