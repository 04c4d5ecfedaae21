"""The steps of `nodedeck node setup` on a node reached over SSH (steps.py runs them and reports each one).

  connect      one command over the node's SSH settings
  python       the node's python3 (or --python) is 3.11 or newer
  disk         free space at the work dir (a warning under --min-free-gib)
  gpus         nvidia-smi's GPUs, driver and CUDA version; no GPU is reported, not an error
  lock         the environment's setup lock on the node (lock.py): a setup of it already running is named and
               waited for, never run beside
  environment  `python3 -m venv --system-site-packages <root>/.nodedeck/venv` (or --env DIR), so a
               CUDA torch installed on the node stays the one imported; or the existing env of --python
  torch        the torch that environment imports before anything is installed: it is held
  wheel        the running nodedeck's wheel (ops.setup.wheel), pushed to <root>/.nodedeck/wheels/
  wheelhouse   with --wheelhouse DIR: its wheels pushed to <root>/.nodedeck/wheelhouse/, installed with --no-index
  plan         what pip will install, and about how big, before anything is (install_plan.py); a CUDA torch
               for a node without GPUs stops here, saying how to get a CPU build (--torch-index, --wheelhouse)
  install      that wheel into the environment (skipped when its nodedeck-train is already this build)
  dependencies `pip install 'nodedeck[trainer]'` (`[trainer,node]` with --with-node-stack), torch held by a
               constraint at the version found (or taken from --torch-index); from the index, or the wheelhouse
  torch after  the environment still imports the torch it had (else the setup fails, saying so)
  verify       `nodedeck-train --version` in the environment

The long commands (the venv, pip) run as process groups the lock's keeper stops when the setup is stopped.
"""

from __future__ import annotations

import hashlib
import posixpath
import threading
import time
from pathlib import Path
from typing import Callable

from ops.hosts.base import CommandResult, node_path
from ops.node_handle import NodeHandle
from ops.setup.checks import check_disk, check_gpus, check_python, last_words, torch_text, verify_trainer
from ops.setup.install_plan import CPU_TORCH_INDEX, NoPlan, install_plan
from ops.setup.lock import SetupLock
from ops.setup.probe import NodeFacts, probe
from ops.setup.record import TrainerSetup
from ops.setup.results import Failed, Outcome, SetupOptions, StepResult, StepStatus
from ops.setup.wheel import build_id, build_wheel
from ops.textsafe import printable
from ops.units import human_bytes

SETUP_SUBDIR = ".nodedeck"
PIP_TIMEOUT = 3600.0


class Remote:
    """One setup of a node over SSH: what the steps found, for the steps after them."""

    def __init__(self, handle: NodeHandle, options: SetupOptions, *, holder: str,
                 report: Callable[[StepResult], None], stopping: threading.Event):
        self.handle, self.options, self.host = handle, options, handle.host
        self.holder, self.report, self.stopping = holder, report, stopping   # of the run (steps.SetupRun)
        self.node_lock: SetupLock | None = None   # held from the lock step on
        self.facts: NodeFacts | None = None
        self.base = ""                       # <root>/.nodedeck
        self.base_python = ""                # the python that makes the venv (python3 on the PATH, or --python)
        self.python = ""                     # the environment's python
        self.env: str | None = None
        self.before: NodeFacts | None = None
        self.wheel: Path | None = None
        self.remote_wheel = ""
        self.wheel_sha = ""
        self.wheelhouse: str | None = None
        self.source: list[str] = []          # where pip finds packages (the pushed wheel's dir, indexes)
        self.version = ""
        self.after: NodeFacts | None = None

    @property
    def bin_dir(self) -> str:
        return posixpath.dirname(self.python)

    def steps(self) -> list[tuple[str, Callable[[], Outcome]]]:
        o = self.options
        out: list[tuple[str, Callable[[], Outcome]]] = [
            ("connect", self.connect),
            ("python", self.python_step),
            ("disk", lambda: check_disk(self.facts, o.min_free_gib) if self.facts else (StepStatus.WARNING, "?")),
            ("gpus", lambda: check_gpus(self.facts) if self.facts else (StepStatus.WARNING, "?")),
            ("lock", self.lock),
            ("environment", self.environment),
            ("torch", self.torch_before),
            ("wheel", self.push_wheel),
        ]
        if o.wheelhouse is not None:
            out.append(("wheelhouse", self.push_wheelhouse))
        return out + [("plan", self.plan), ("install", self.install), ("dependencies", self.dependencies),
                      ("torch after", self.torch_after), ("verify", self.verify)]

    def _long(self, argv: list[str], timeout: float) -> CommandResult:
        """A long command, as a process group the setup lock's keeper stops when the setup is stopped."""
        lock = self.node_lock
        return self.host.run(lock.wrap(argv) if lock is not None else argv, timeout=timeout)

    def connect(self) -> Outcome:
        self.host.run(["true"], timeout=60).check()
        self.base = f"{self.handle.root.rstrip('/')}/{SETUP_SUBDIR}"
        return StepStatus.OK, f"{self.handle.node.target}, work dir {printable(self.handle.root)}"

    def _absolute(self, path: str) -> str:
        return self.handle.resolve(path) if path.startswith("~") or path.startswith("/") else path

    def python_step(self) -> Outcome:
        if self.options.python:
            base = self._absolute(self.options.python)
        else:
            res = self.host.run(["sh", "-c", "command -v python3"], timeout=60)
            said = res.stdout.strip().splitlines()
            base = node_path(self.host.name, "python3", said[-1]) if res.ok and said else ""
            if not base.startswith("/"):
                raise Failed("no python3 on the node's PATH: install Python 3.11 or newer, or name one "
                             "with --python /path/to/env/bin/python")
        self.facts = probe(self.host, base, self.handle.root)
        self.base_python = base
        if self.options.python:
            self.python = base
        else:
            self.env = self._absolute(self.options.env) if self.options.env else f"{self.base}/venv"
            self.python = f"{self.env}/bin/python"
        return check_python(self.facts, printable(base))

    def lock(self) -> Outcome:
        env = self.env or posixpath.dirname(self.bin_dir)
        lock = SetupLock(self.host, self.base_python, self.base, env)
        shown = printable(env)

        def busy(holder) -> None:
            self.report(StepResult("lock", StepStatus.WARNING, f"{shown} is being set up by {holder.text}: "
                                   "waiting for that setup to end (never two at once)", 0.0))

        waited = lock.acquire(self.holder, busy, self.stopping.is_set)
        self.node_lock = lock
        if waited is not None:
            return StepStatus.OK, f"held for {shown} (waited for the setup of {waited.text} to end)"
        return StepStatus.OK, f"held for {shown}: no other setup of it runs"

    def environment(self) -> Outcome:
        if self.options.python:
            return StepStatus.OK, f"the existing environment of {printable(self.python)} (nothing is created)"
        env = self.env or ""
        if self.host.run([self.python, "-m", "pip", "--version"], timeout=120).ok:
            return StepStatus.SKIPPED, f"{printable(env)} exists"
        # without a pip of its own when the system's (which it sees) can install into it: seconds, not a minute
        res = self._long([self.base_python, "-m", "venv", "--system-site-packages", "--without-pip", env], 900)
        if not res.ok:
            raise Failed(f"python3 -m venv {printable(env)} failed: {last_words(res.stderr or res.stdout)} "
                         "(on Debian/Ubuntu: apt install python3-venv)")
        pip = "the system's pip"
        if not self.host.run([self.python, "-m", "pip", "--version"], timeout=120).ok:
            res = self._long([self.python, "-m", "ensurepip"], 900)
            if not res.ok:
                raise Failed(f"{printable(env)} has no pip and ensurepip failed: {last_words(res.stderr)} "
                             "(on Debian/Ubuntu: apt install python3-venv python3-pip)")
            pip = "its own pip"
        return StepStatus.OK, f"made {printable(env)} (a venv that sees the system's packages; {pip})"

    def torch_before(self) -> Outcome:
        self.before = probe(self.host, self.python, self.handle.root, torch=True)
        if self.before.torch_version is None:
            return StepStatus.OK, "no torch in the environment: pip installs one with the trainer (see plan)"
        return StepStatus.OK, f"{torch_text(self.before)}: held at this version"

    def push_wheel(self) -> Outcome:
        self.wheel = build_wheel()
        self.wheel_sha = hashlib.sha256(self.wheel.read_bytes()).hexdigest()
        self.remote_wheel = f"{self.base}/wheels/{self.wheel.name}"
        st = self.host.stat(self.remote_wheel)
        if st is not None and st.size == self.wheel.stat().st_size and self.host.sha256(self.remote_wheel) == \
                self.wheel_sha:
            return StepStatus.SKIPPED, f"{self.wheel.name} is on the node"
        # one wheel per name there: an older build of the same version is replaced
        self.host.push(self.wheel, self.remote_wheel, verify=True)
        return StepStatus.OK, f"pushed {self.wheel.name} ({human_bytes(self.wheel.stat().st_size)})"

    def push_wheelhouse(self) -> Outcome:
        local = self.options.wheelhouse
        assert local is not None
        files = sorted(p for p in local.iterdir() if p.is_file() and p.name.endswith((".whl", ".tar.gz", ".zip")))
        if not files:
            raise Failed(f"{local}: no wheels there (make it with `pip download -d {local} ...`)")
        self.wheelhouse = f"{self.base}/wheelhouse"
        pushed = size = 0
        for f in files:
            remote = f"{self.wheelhouse}/{f.name}"
            st = self.host.stat(remote)
            if st is not None and st.size == f.stat().st_size and \
                    self.host.sha256(remote) == hashlib.sha256(f.read_bytes()).hexdigest():
                continue
            self.host.push(f, remote, verify=True)
            pushed += 1
            size += f.stat().st_size
        if not pushed:
            return StepStatus.SKIPPED, f"all {len(files)} files of {local} are on the node"
        return StepStatus.OK, f"pushed {pushed} of {len(files)} files ({human_bytes(size)}) to {self.wheelhouse}"

    @property
    def _extras(self) -> str:
        return "trainer,node" if self.options.with_node_stack else "trainer"

    @property
    def _where(self) -> str:
        if self.wheelhouse:
            return "the wheelhouse only (--no-index)"
        return f"the package index and {self.options.torch_index}" if self.options.torch_index else \
            "the package index"

    def plan(self) -> Outcome:
        """What the install will bring, before it does; stops a CUDA torch headed for a node without GPUs."""
        held = self.before.torch_version if self.before else None
        self.source = ["--find-links", posixpath.dirname(self.remote_wheel)]
        if self.wheelhouse:
            self.source += ["--no-index", "--find-links", self.wheelhouse]
        note = ""
        index = self.options.torch_index
        if index and held:
            note = f" (--torch-index not used: the environment has torch {held})"
        elif index and not self.wheelhouse:
            try:
                chosen = install_plan(self.host, self.python, ["--index-url", index, "torch"], 600).get("torch")
            except NoPlan as e:
                raise Failed(f"--torch-index {printable(index)}: pip finds no torch there: {e}") from None
            if chosen is not None:
                held = chosen.version
            self.source += ["--extra-index-url", index]
        self.host.write_file(f"{self.base}/constraints.txt", (f"torch=={held}\n" if held else "").encode())
        try:
            plan = install_plan(self.host, self.python, ["--constraint", f"{self.base}/constraints.txt",
                                                          *self.source, f"nodedeck[{self._extras}]"], 900)
        except NoPlan as e:
            return StepStatus.WARNING, f"pip could not say beforehand what it will install: {e}"
        said = plan.summary(self._where) + note
        gpus = bool(self.facts and self.facts.gpus and not self.facts.gpu_error)
        if plan.cuda_torch and not gpus and not index and not self.wheelhouse:
            raise Failed(f"{said}. This node has no GPU, and that torch is a CUDA build: nothing was installed. "
                         f"For a CPU build: --torch-index {CPU_TORCH_INDEX} (or a --wheelhouse holding a CPU "
                         "torch); to install this one anyway, pass its index as --torch-index URL")
        return (StepStatus.SKIPPED if not plan.packages else StepStatus.OK), said

    def _pip(self, *args: str) -> bytes:
        res = self._long([self.python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", *args],
                         PIP_TIMEOUT)
        if not res.ok:
            text = (res.stderr + b"\n" + res.stdout).decode(errors="replace").splitlines()
            why = next((ln for ln in text if ln.startswith("ERROR: ")), None)
            raise Failed(f"pip install failed: {printable(why) if why else last_words(res.stderr or res.stdout)}")
        return res.stdout

    def install(self) -> Outcome:
        try:
            said = verify_trainer(self.host, self.bin_dir, build_id())
            return StepStatus.SKIPPED, f"nodedeck-train {said} is installed"
        except Failed:
            pass
        self._pip("--no-deps", "--force-reinstall", self.remote_wheel)
        return StepStatus.OK, f"installed {self.wheel.name if self.wheel else 'nodedeck'} into {self.bin_dir}"

    def dependencies(self) -> Outcome:
        extras = self._extras
        out = self._pip("--constraint", f"{self.base}/constraints.txt", *self.source,
                        f"nodedeck[{extras}]").decode(errors="replace")
        done = next((ln for ln in out.splitlines() if ln.startswith("Successfully installed ")), None)
        if done is None:
            return StepStatus.OK, f"nodedeck[{extras}]: every requirement was already there"
        n = len(done.split()) - 2
        return StepStatus.OK, f"nodedeck[{extras}]: installed {n} package{'' if n == 1 else 's'} from {self._where}"

    def torch_after(self) -> Outcome:
        self.after = after = probe(self.host, self.python, self.handle.root, torch=True)
        before = self.before
        if before is not None and before.torch_version is not None and (
                after.torch_version != before.torch_version or after.torch_file != before.torch_file):
            raise Failed(f"torch changed: {torch_text(before)} is now {torch_text(after)}; restore it "
                         "(nodedeck held it with a pip constraint: something else replaced it)")
        gpus = bool(self.facts and self.facts.gpus)
        if after.torch_version is not None and gpus and not after.torch_cuda:
            return StepStatus.WARNING, f"{torch_text(after)} on a node with GPUs: install a CUDA torch"
        kept = " (kept)" if before is not None and before.torch_version else ""
        return StepStatus.OK, torch_text(after) + kept

    def verify(self) -> Outcome:
        self.version = verify_trainer(self.host, self.bin_dir, build_id())
        return StepStatus.OK, f"{self.bin_dir}/nodedeck-train {self.version}"

    def made(self) -> TrainerSetup:
        return TrainerSetup(python=self.python, bin_dir=self.bin_dir, version=self.version, env=self.env,
                            wheel_sha256=self.wheel_sha or None,
                            torch=self.after.torch_version if self.after else None, at=time.time())
