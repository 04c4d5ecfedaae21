"""`nodedeck node setup NODE`: make a node ready to run plans, one checked step at a time.

Each step looks at what is there before it changes anything, so a second setup only checks (the
steps say `skipped`) and a setup cut short resumes where it stopped:

  connect      one command over the node's SSH settings
  python       the node's python3 (or --python) is 3.11 or newer
  disk         free space at the work dir (a warning under --min-free-gib)
  gpus         nvidia-smi's GPUs, driver and CUDA version; no GPU is reported, not an error
  environment  `python3 -m venv --system-site-packages <root>/.nodedeck/venv` (or --env DIR), so a
               CUDA torch installed on the node stays the one imported; or the existing env of --python
  torch        the torch that environment imports before anything is installed: it is held
  wheel        the running nodedeck's wheel (ops.setup.wheel), pushed to <root>/.nodedeck/wheels/
  wheelhouse   with --wheelhouse DIR: its wheels pushed to <root>/.nodedeck/wheelhouse/, installed with --no-index
  install      that wheel into the environment (skipped when its nodedeck-train is already this build)
  dependencies `pip install 'nodedeck[trainer]'` (`[trainer,node]` with --with-node-stack), torch held by a
               constraint at the version found; from the index, or only from the wheelhouse
  torch after  the environment still imports the torch it had (else the setup fails, saying so)
  verify       `nodedeck-train --version` in the environment
  record       the environment's bin dir in the node's state (ops.setup.record)

Node `local` is this machine: its trainer is the running nodedeck's own, checked and recorded.
"""

from __future__ import annotations

import enum
import posixpath
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ops.errors import NodedeckError, UserError
from ops.hosts.base import Host, node_path
from ops.node_handle import NodeHandle
from ops.setup import record as setup_record
from ops.setup.probe import NodeFacts, printable, probe
from ops.setup.record import TrainerSetup
from ops.setup.wheel import build_id, build_wheel
from ops.textsafe import shown
from ops.units import human_bytes

MIN_PYTHON = (3, 11)
SETUP_SUBDIR = ".nodedeck"
PIP_TIMEOUT = 3600.0


class StepStatus(str, enum.Enum):
    OK = "ok"                # checked, or done now
    SKIPPED = "skipped"      # already done by an earlier setup
    WARNING = "warning"      # worth knowing, the setup goes on
    FAILED = "failed"        # the setup stops here


@dataclass(frozen=True)
class StepResult:
    step: str
    status: StepStatus
    detail: str
    seconds: float

    def to_json(self) -> dict:
        return {"step": self.step, "status": self.status.value, "detail": self.detail,
                "seconds": round(self.seconds, 2)}


@dataclass(frozen=True)
class SetupOptions:
    python: str | None = None          # an existing env's python on the node (installed into, no venv made)
    env: str | None = None             # where the venv goes (default <root>/.nodedeck/venv)
    wheelhouse: Path | None = None     # wheels on this machine to push and install from with --no-index
    with_node_stack: bool = False      # also the `node` extra (sglang)
    min_free_gib: float = 20.0


@dataclass(frozen=True)
class SetupResult:
    node: str
    steps: tuple[StepResult, ...]
    setup: TrainerSetup | None

    @property
    def ok(self) -> bool:
        return self.setup is not None and all(s.status is not StepStatus.FAILED for s in self.steps)

    def to_json(self) -> dict:
        return {"node": self.node, "ok": self.ok, "steps": [s.to_json() for s in self.steps],
                "setup": self.setup.to_json() if self.setup else None}


class _Failed(Exception):
    """A step that cannot go on: its one-line reason."""


Outcome = tuple[StepStatus, str]


class _Run:
    """The steps done so far, each reported to on_step as it ends."""

    def __init__(self, on_step: Callable[[StepResult], None]):
        self.on_step = on_step
        self.steps: list[StepResult] = []

    def step(self, name: str, fn: Callable[[], Outcome]) -> bool:
        t0 = time.monotonic()
        try:
            status, detail = fn()
        except _Failed as e:
            status, detail = StepStatus.FAILED, str(e)
        except NodedeckError as e:
            status, detail = StepStatus.FAILED, printable(str(e), 500)
        result = StepResult(name, status, shown(detail), time.monotonic() - t0)   # a node's words, made inert
        self.steps.append(result)
        self.on_step(result)
        return status is not StepStatus.FAILED


def _last_line(data: bytes) -> str:
    lines = [ln for ln in data.decode(errors="replace").splitlines() if ln.strip()]
    return printable(lines[-1] if lines else "(no output)")


def _invalid(facts: NodeFacts, field: str) -> str:
    """What the node sent for `field` that was no number of it (`: invalid free disk ...`), else ''."""
    said = [v for v in facts.invalid if v.startswith(f"invalid {field} ")]
    return f": {'; '.join(said)}" if said else ""


def _check_python(facts: NodeFacts, python: str) -> Outcome:
    if facts.python < MIN_PYTHON:
        raise _Failed(f"{python} is Python {facts.python_version}{_invalid(facts, 'Python version')}; nodedeck's "
                      f"trainer needs {'.'.join(map(str, MIN_PYTHON))} or newer: install one, or name an env with "
                      "--python")
    return StepStatus.OK, f"Python {facts.python_version} ({facts.executable})"


def _check_disk(facts: NodeFacts, min_free_gib: float) -> Outcome:
    if facts.disk_free is None:
        bad = _invalid(facts, "free disk")
        return StepStatus.WARNING, f"free space unknown{bad or ' (the node did not say)'}"
    total = "?" if facts.disk_total is None else human_bytes(facts.disk_total)
    text = f"{human_bytes(facts.disk_free)} free of {total} at {facts.disk_path}"
    if facts.disk_free < min_free_gib * 2**30:
        return StepStatus.WARNING, f"{text}: less than {min_free_gib:g} GiB"
    return StepStatus.OK, text


def _check_gpus(facts: NodeFacts) -> Outcome:
    if facts.gpus is None:
        return StepStatus.WARNING, "no GPUs: nvidia-smi is not on the node's PATH (stages run on its CPU)"
    if facts.gpu_error or not facts.gpus:
        return StepStatus.WARNING, f"nvidia-smi found no usable GPU: {facts.gpu_error or 'it listed none'}"
    names: dict[str, int] = {}
    for g in facts.gpus:
        label = g.name + (f" {g.memory_mib // 1024} GiB" if g.memory_mib else "")
        names[label] = names.get(label, 0) + 1
    listed = ", ".join(f"{n} x {label}" for label, n in names.items())
    text = f"{listed}; driver {facts.gpus[0].driver}, CUDA {facts.cuda or 'unknown'}"
    bad = _invalid(facts, "GPU memory")
    return (StepStatus.WARNING, text + "; " + bad[2:]) if bad else (StepStatus.OK, text)


def _torch_text(f: NodeFacts) -> str:
    if f.torch_version is None:
        return "no torch"
    cuda = f", CUDA {f.torch_cuda}" if f.torch_cuda else ", CPU build" if f.torch_file else ""
    where = f" from {f.torch_file}" if f.torch_file else f" (import failed: {f.torch_error})" if f.torch_error else ""
    return f"torch {f.torch_version}{cuda}{where}"


def _verify(host: Host, bin_dir: str, want_build: str | None) -> str:
    """`nodedeck-train --version` in bin_dir, checked to be this nodedeck's build; its words."""
    res = host.run([posixpath.join(bin_dir, "nodedeck-train"), "--version"], timeout=120)
    said = _last_line(res.stdout) if res.stdout.strip() else ""
    if res.returncode != 0 or not said.startswith("nodedeck-train "):
        raise _Failed(f"{bin_dir}/nodedeck-train --version failed: {_last_line(res.stderr or res.stdout)}")
    if want_build and f"(build {want_build})" not in said:
        raise _Failed(f"{bin_dir}/nodedeck-train is {said!r}, not build {want_build}")
    return said[len("nodedeck-train "):]


def setup_node(handle: NodeHandle, options: SetupOptions = SetupOptions(),
               on_step: Callable[[StepResult], None] = lambda r: None) -> SetupResult:
    """Make the handle's node ready to run plans; every step is reported to on_step as it ends."""
    run = _Run(on_step)
    if handle.node.ssh is None:
        if options.python or options.env or options.wheelhouse or options.with_node_stack:
            raise UserError(f"node {handle.name} is this machine, whose trainer is this nodedeck's own: "
                            "--python, --env, --wheelhouse and --with-node-stack are for nodes reached over ssh")
        made = _setup_local(handle, options, run)
    else:
        made = _setup_remote(handle, options, run)
    return SetupResult(handle.name, tuple(run.steps), made)


def _setup_local(handle: NodeHandle, options: SetupOptions, run: _Run) -> TrainerSetup | None:
    """`local` is this machine: the trainer is the running nodedeck's own install."""
    host = handle.host
    python = sys.executable
    facts: list[NodeFacts] = []

    def python_step() -> Outcome:
        facts.append(probe(host, python, handle.root, torch=True))
        return _check_python(facts[0], python)

    if not (run.step("python", python_step) and run.step("disk", lambda: _check_disk(facts[0], options.min_free_gib))
            and run.step("gpus", lambda: _check_gpus(facts[0]))):
        return None
    run.step("torch", lambda: (StepStatus.OK, _torch_text(facts[0])))
    bin_dir = str(Path(python).parent)
    said: list[str] = []

    def verify() -> Outcome:
        said.append(_verify(host, bin_dir, build_id()))
        return StepStatus.OK, f"{bin_dir}/nodedeck-train {said[0]}"

    if not run.step("verify", verify):
        return None
    made = TrainerSetup(python=python, bin_dir=bin_dir, version=said[0], torch=facts[0].torch_version,
                        at=time.time())
    return made if run.step("record", lambda: _record(handle, made)) else None


def _record(handle: NodeHandle, made: TrainerSetup) -> Outcome:
    setup_record.save(handle.store, made)
    return StepStatus.OK, f"stages on {handle.name} get {made.bin_dir} first on their PATH"


class _Remote:
    """One setup of a node over SSH: what the steps found, for the steps after them."""

    def __init__(self, handle: NodeHandle, options: SetupOptions):
        self.handle, self.options, self.host = handle, options, handle.host
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
        self.version = ""
        self.after: NodeFacts | None = None

    @property
    def bin_dir(self) -> str:
        return posixpath.dirname(self.python)

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
                raise _Failed("no python3 on the node's PATH: install Python 3.11 or newer, or name one "
                              "with --python /path/to/env/bin/python")
        self.facts = probe(self.host, base, self.handle.root)
        self.base_python = base
        if self.options.python:
            self.python = base
        return _check_python(self.facts, printable(base))

    def environment(self) -> Outcome:
        if self.options.python:
            return StepStatus.OK, f"the existing environment of {printable(self.python)} (nothing is created)"
        self.env = self._absolute(self.options.env) if self.options.env else f"{self.base}/venv"
        self.python = f"{self.env}/bin/python"
        if self.host.run([self.python, "-m", "pip", "--version"], timeout=120).ok:
            return StepStatus.SKIPPED, f"{printable(self.env)} exists"
        # without a pip of its own when the system's (which it sees) can install into it: seconds, not a minute
        res = self.host.run([self.base_python, "-m", "venv", "--system-site-packages", "--without-pip", self.env],
                            timeout=900)
        if not res.ok:
            raise _Failed(f"python3 -m venv {printable(self.env)} failed: {_last_line(res.stderr or res.stdout)} "
                          "(on Debian/Ubuntu: apt install python3-venv)")
        pip = "the system's pip"
        if not self.host.run([self.python, "-m", "pip", "--version"], timeout=120).ok:
            res = self.host.run([self.python, "-m", "ensurepip"], timeout=900)
            if not res.ok:
                raise _Failed(f"{printable(self.env)} has no pip and ensurepip failed: {_last_line(res.stderr)} "
                              "(on Debian/Ubuntu: apt install python3-venv python3-pip)")
            pip = "its own pip"
        return StepStatus.OK, f"made {printable(self.env)} (a venv that sees the system's packages; {pip})"

    def torch_before(self) -> Outcome:
        self.before = probe(self.host, self.python, self.handle.root, torch=True)
        if self.before.torch_version is None:
            return StepStatus.OK, "no torch in the environment: pip installs one with the trainer"
        return StepStatus.OK, f"{_torch_text(self.before)}: held at this version"

    def push_wheel(self) -> Outcome:
        import hashlib

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
        import hashlib

        local = self.options.wheelhouse
        assert local is not None
        files = sorted(p for p in local.iterdir() if p.is_file() and p.name.endswith((".whl", ".tar.gz", ".zip")))
        if not files:
            raise _Failed(f"{local}: no wheels there (make it with `pip download -d {local} ...`)")
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

    def _pip(self, *args: str) -> bytes:
        res = self.host.run([self.python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
                             *args], timeout=PIP_TIMEOUT)
        if not res.ok:
            text = (res.stderr + b"\n" + res.stdout).decode(errors="replace").splitlines()
            why = next((ln for ln in text if ln.startswith("ERROR: ")), None)
            raise _Failed(f"pip install failed: {printable(why) if why else _last_line(res.stderr or res.stdout)}")
        return res.stdout

    def install(self) -> Outcome:
        try:
            said = _verify(self.host, self.bin_dir, build_id())
            return StepStatus.SKIPPED, f"nodedeck-train {said} is installed"
        except _Failed:
            pass
        self._pip("--no-deps", "--force-reinstall", self.remote_wheel)
        return StepStatus.OK, f"installed {self.wheel.name if self.wheel else 'nodedeck'} into {self.bin_dir}"

    def dependencies(self) -> Outcome:
        constraints = f"{self.base}/constraints.txt"
        held = self.before.torch_version if self.before else None
        self.host.write_file(constraints, (f"torch=={held}\n" if held else "").encode())
        extras = "trainer,node" if self.options.with_node_stack else "trainer"
        source = ["--find-links", posixpath.dirname(self.remote_wheel)]
        if self.wheelhouse:
            source += ["--no-index", "--find-links", self.wheelhouse]
        out = self._pip("--constraint", constraints, *source, f"nodedeck[{extras}]").decode(errors="replace")
        done = next((ln for ln in out.splitlines() if ln.startswith("Successfully installed ")), None)
        where = "the wheelhouse only (--no-index)" if self.wheelhouse else "the package index"
        if done is None:
            return StepStatus.OK, f"nodedeck[{extras}]: every requirement was already there"
        n = len(done.split()) - 2
        return StepStatus.OK, f"nodedeck[{extras}]: installed {n} package{'' if n == 1 else 's'} from {where}"

    def torch_after(self) -> Outcome:
        self.after = after = probe(self.host, self.python, self.handle.root, torch=True)
        before = self.before
        if before is not None and before.torch_version is not None and (
                after.torch_version != before.torch_version or after.torch_file != before.torch_file):
            raise _Failed(f"torch changed: {_torch_text(before)} is now {_torch_text(after)}; restore it "
                          "(nodedeck held it with a pip constraint: something else replaced it)")
        gpus = bool(self.facts and self.facts.gpus)
        if after.torch_version is not None and gpus and not after.torch_cuda:
            return StepStatus.WARNING, f"{_torch_text(after)} on a node with GPUs: install a CUDA torch"
        kept = " (kept)" if before is not None and before.torch_version else ""
        return StepStatus.OK, _torch_text(after) + kept

    def verify(self) -> Outcome:
        self.version = _verify(self.host, self.bin_dir, build_id())
        return StepStatus.OK, f"{self.bin_dir}/nodedeck-train {self.version}"

    def made(self) -> TrainerSetup:
        return TrainerSetup(python=self.python, bin_dir=self.bin_dir, version=self.version, env=self.env,
                            wheel_sha256=self.wheel_sha or None,
                            torch=self.after.torch_version if self.after else None, at=time.time())


def _setup_remote(handle: NodeHandle, options: SetupOptions, run: _Run) -> TrainerSetup | None:
    r = _Remote(handle, options)
    if options.wheelhouse is not None and not options.wheelhouse.is_dir():
        raise UserError(f"--wheelhouse {options.wheelhouse}: not a directory")
    steps: list[tuple[str, Callable[[], Outcome]]] = [
        ("connect", r.connect),
        ("python", r.python_step),
        ("disk", lambda: _check_disk(r.facts, options.min_free_gib) if r.facts else (StepStatus.WARNING, "?")),
        ("gpus", lambda: _check_gpus(r.facts) if r.facts else (StepStatus.WARNING, "?")),
        ("environment", r.environment),
        ("torch", r.torch_before),
        ("wheel", r.push_wheel),
    ]
    if options.wheelhouse is not None:
        steps.append(("wheelhouse", r.push_wheelhouse))
    steps += [("install", r.install), ("dependencies", r.dependencies), ("torch after", r.torch_after),
              ("verify", r.verify)]
    for name, fn in steps:
        if not run.step(name, fn):
            return None
    made = r.made()
    return made if run.step("record", lambda: _record(handle, made)) else None
