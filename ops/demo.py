"""The bundled demo: the `demo.toml` plan on the local machine, in a work dir of its own.

The demo gets its own nodes.toml (node `local` rooted in the work dir, with the
demo server's /metrics as its inference feed) and its own state dir, so it
never mixes with the user's real `local` node; its nodedeck.toml makes the work dir a
workspace, so the CLI run there (or with `--work DIR`) sees the demo's state. Its servers
listen on free ports, picked once and kept in the workspace's [vars] (one that another process took
meanwhile is replaced, saying so): a second demo beside a running one, another workspace or the
user's own service never meets them. A second demo resumes the first: what verified is kept, what
failed is launched again (Scheduler.retry_failed); `--fresh` first stops, by recorded PID, whatever
an earlier demo left running, says what it deletes, then starts from scratch.
"""

from __future__ import annotations

import enum
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from ops import workspace
from ops.errors import UserError
from ops.hosts.local import LocalHost
from ops.node_handle import NodeHandle
from ops.nodes import load_nodes
from ops.paths import ASSETS
from ops.plan.parse import load_plan
from ops.plan.records import Plan, StageKind, tcp_port
from ops.run.ports import port_var, scan_port, work_dir_of
from ops.setup import record as setup_record
from ops.setup.wheel import version_string
from ops.state import StateStore
from ops.units import human_bytes

if TYPE_CHECKING:
    from ops.run.scheduler import Scheduler

DEMO_PLAN = ASSETS / "plans" / "demo.toml"
VLLM_PLAN = ASSETS / "plans" / "demo-vllm.toml"
CHECKOUT_VLLM = ASSETS.parent / ".venv-vllm" / "bin" / "python"
"""The engine venv `make .venv-vllm/.installed` makes beside the checkout."""
VLLM_FIX = "run `make .venv-vllm/.installed` in the checkout (or pass --engine-python PATH, or --engine standin)"
TRAINER_MODULES = ("torch", "transformers", "tokenizers", "safetensors")
"""What the demo's trainer steps import (the `trainer` extra)."""


class EngineKind(str, enum.Enum):
    STANDIN = "standin"     # nodedeck-train serve, and the eval harness's figures
    VLLM = "vllm"           # real vLLM serving the target and the drafter, benchmarked by `vllm bench serve`


@dataclass(frozen=True)
class EngineChoice:
    """The engine the demo serves with, and why it was chosen (said when the demo starts)."""

    kind: EngineKind
    why: str
    python: Path | None = None      # vLLM's Python (its `vllm` command beside it)

    @property
    def plan(self) -> Path:
        return VLLM_PLAN if self.kind is EngineKind.VLLM else DEMO_PLAN

    @property
    def plan_vars(self) -> dict[str, str]:
        return {"vllm_bin": str(self.python.parent)} if self.python is not None else {}


def find_vllm_python(option: str | None, env: Mapping[str, str]) -> tuple[Path, str] | None:
    """The Python vLLM is installed in, and where it was named: --engine-python, else $NODEDECK_VLLM_PYTHON,
    else the checkout's .venv-vllm; None when none is named and there is no .venv-vllm."""
    if option:
        return Path(option).expanduser(), "--engine-python"
    if env.get("NODEDECK_VLLM_PYTHON"):
        return Path(env["NODEDECK_VLLM_PYTHON"]).expanduser(), "$NODEDECK_VLLM_PYTHON"
    if CHECKOUT_VLLM.exists():
        return CHECKOUT_VLLM, str(CHECKOUT_VLLM.parent.parent)
    return None


def check_vllm(python: Path, named: str) -> None:
    """A one-line UserError unless `python` runs and has vLLM with its `vllm` command (the metadata the
    `vllm serve` / `vllm bench serve` entry point asks for). Reads package metadata: no vLLM import."""
    probe = ("import importlib.metadata as m, importlib.util as u, sys; "
             "sys.exit('vllm is not installed') if u.find_spec('vllm') is None else print(m.version('vllm'))")
    try:
        r = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UserError(f"vLLM's Python {python} ({named}) does not run ({e}): {VLLM_FIX}") from None
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["exit status %d" % r.returncode])[-1]
        raise UserError(f"vLLM's Python {python} ({named}) is broken ({last[:200]}): {VLLM_FIX}")
    bin_vllm = python.parent / "vllm"
    if not bin_vllm.exists():
        raise UserError(f"no `vllm` command beside {python} ({named}): {VLLM_FIX}")


def choose_engine(engine: str, engine_python: str | None = None,
                  env: Mapping[str, str] = os.environ) -> EngineChoice:
    """The demo's engine for `--engine standin|vllm|auto`: auto is vLLM when its Python is named or the
    checkout's .venv-vllm exists, else the stand-in. A vLLM that is missing or broken is a one-line
    UserError naming what to run."""
    if engine == EngineKind.STANDIN.value:
        if engine_python:
            raise UserError("--engine-python is vLLM's Python: it goes with --engine vllm (or auto)")
        return EngineChoice(EngineKind.STANDIN, "--engine standin")
    if engine not in (EngineKind.VLLM.value, "auto"):
        raise UserError(f"--engine {engine!r}: expected standin, vllm or auto")
    found = find_vllm_python(engine_python, env)
    if found is None:
        if engine == "auto":
            return EngineChoice(EngineKind.STANDIN, "auto: no vLLM (.venv-vllm, $NODEDECK_VLLM_PYTHON), the stand-in")
        raise UserError(f"--engine vllm: no vLLM found (no {CHECKOUT_VLLM.parent.parent}, no "
                        f"$NODEDECK_VLLM_PYTHON): {VLLM_FIX}")
    python, named = found
    if not python.exists():
        raise UserError(f"vLLM's Python {python} ({named}) does not exist: {VLLM_FIX}")
    check_vllm(python, named)
    why = f"{'auto' if engine == 'auto' else '--engine vllm'}: vLLM from {named}"
    return EngineChoice(EngineKind.VLLM, why, python)


@dataclass(frozen=True)
class DemoSetup:
    work: Path
    config: Path
    plan: Path
    plan_vars: dict[str, str]
    engine: EngineChoice = field(default_factory=lambda: EngineChoice(EngineKind.STANDIN, "default"))


def require_trainer() -> None:
    """A one-line UserError when the trainer's libraries are not installed beside this Python."""
    missing = [m for m in TRAINER_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"the demo runs the trainer on this machine and {', '.join(missing)} "
                        f"{'is' if len(missing) == 1 else 'are'} not installed: "
                        "`pip install 'nodedeck[trainer]'` (or run `make demo`)")


def train_command() -> str:
    """The nodedeck-train beside this Python (tmux sessions don't inherit the venv's PATH)."""
    exe = Path(sys.executable).parent / "nodedeck-train"
    if not exe.exists():
        found = shutil.which("nodedeck-train")
        if found is None:
            raise UserError("nodedeck-train is not installed next to this Python: run `make demo`")
        return found
    return str(exe)


def describe(work: Path) -> str:
    """What a --fresh demo would delete: the files and bytes under work."""
    files = size = 0
    for dirpath, _dirs, names in os.walk(work):
        for name in names:
            files += 1
            try:
                size += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass

    return f"{files} files, {human_bytes(size)}"


DEMO_MARK = "# written by `nodedeck demo`"


def _is_demo_dir(work: Path) -> bool:
    """The demo wrote this dir's nodes.toml (a user's own nodes.toml is never overwritten or deleted)."""
    if not (work / "nodes.toml").is_file():
        return False
    try:
        with open(work / "nodes.toml", "rb") as f:
            return f.read(len(DEMO_MARK)).decode(errors="replace") == DEMO_MARK
    except OSError:
        return False


def prepare(work: Path, *, fresh: bool, say: Callable[[str], None] = print,
            engine: EngineChoice | None = None) -> DemoSetup:
    """Make (or reuse) the demo's work dir, nodes.toml, state dir and workspace file; activate it.

    An existing demo dir is resumed: what already verified is adopted, not redone (the stand-in and the
    vLLM plan share every stage but their servers and benchmarks). `fresh` deletes it first, after saying
    what goes. The engine's plan is run; with vLLM both servers' /metrics feed the dashboard."""
    require_trainer()
    work = work.resolve()
    if work.exists() and any(work.iterdir()) and not _is_demo_dir(work):
        raise UserError(f"{work}: not a nodedeck demo dir (no nodes.toml written by `nodedeck demo`); "
                        "choose another --work")
    if fresh and work.exists():
        stop_leftovers(work, say=say)
        say(f"--fresh: deleting the earlier demo in {work} ({describe(work)})")
        shutil.rmtree(work)
    elif (work / "nodes.toml").exists():
        say(f"resuming the demo in {work}: verified stages are kept (--fresh starts over)")
    recorded = workspace.load(work / workspace.FILE).vars if (work / workspace.FILE).is_file() else {}
    resumed = (work / "nodes.toml").exists()
    work.mkdir(parents=True, exist_ok=True)
    engine = engine or EngineChoice(EngineKind.STANDIN, "default")
    plan = load_plan(engine.plan)
    # a demo dir of an older nodedeck recorded no ports: its server (maybe still up) has the plan's own
    ports = choose_ports(work, plan, {**(plan.vars if resumed else {}), **recorded}, say)
    urls = ", ".join(f'"http://127.0.0.1:{ports[k]}/metrics"' for k in sorted(ports, key=lambda k: k != "draft_port"))
    config = work / "nodes.toml"
    config.write_text(
        f"{DEMO_MARK}: the local node, rooted in the demo's work dir\n"
        "[nodes.local]\n"
        f"root = {str(work)!r}\n"
        f"metrics_url = [{urls}]\n"
        f"watch = [{str(work)!r}]\n"
    )
    workspace.write(work, nodes="nodes.toml", state="state", variables=ports)
    workspace.load(work / workspace.FILE).activate()
    record_local_trainer()
    return DemoSetup(work, config, engine.plan, {**engine.plan_vars, **ports}, engine)


def choose_ports(work: Path, plan: Plan, recorded: Mapping[str, str],
                 say: Callable[[str], None] = print) -> dict[str, str]:
    """A port for each plan variable the plan's servers listen on (`port = "${port}"`): the one this demo dir
    recorded while it is free or this demo's own server holds it, else a free one (said, when it moves)."""
    chosen: dict[str, str] = {}
    for name in dict.fromkeys(v for s in plan.stages if (v := port_var(s)) is not None):
        old = tcp_port(recorded.get(name, ""))
        if old is not None:
            scan = scan_port(LocalHost(), old)
            ours = bool(scan.holders) and all(work_dir_of(h) == str(work) for h in scan.holders)
            if not scan.listening or ours:
                chosen[name] = str(old)
                continue
        new = str(_free_port(set(chosen.values())))
        if old is not None:
            say(f"port {old} is in use by {scan.who(str(work))}: the demo's {name} moves to port {new}")
        chosen[name] = new
    return chosen


def _free_port(taken: set[str]) -> int:
    """A TCP port nothing listens on here now (the kernel's pick), not one of `taken`."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if str(port) not in taken:
            return port


def retry_failed(sched: Scheduler, say: Callable[[str], None] = print) -> None:
    """Resuming: what verified is kept, and each failed stage (and a server down that a stage not yet done
    needs) is launched again once ready (Scheduler.retry_failed); says so."""
    marked = sched.retry_failed()
    if marked:
        kept = sum(v.state.satisfies_dependents for v in sched.views())
        say(f"resuming: {kept} verified stage{'' if kept == 1 else 's'} kept; retrying "
            + "; ".join(f"{sid} ({why})" for sid, why in marked))


def record_local_trainer() -> None:
    """Record this nodedeck's own trainer as the `local` node's setup in the (activated) demo state, as
    `nodedeck node setup local` does: the plan's `nodedeck-train` is then the one beside this Python."""
    trainer = Path(train_command())
    store = StateStore.for_node("local")
    try:
        setup_record.save(store, setup_record.TrainerSetup(python=sys.executable, bin_dir=str(trainer.parent),
                                                           version=version_string()))
    finally:
        store.close()


def stop_leftovers(work: Path, *, say: Callable[[str], None] = print) -> None:
    """Stop the runs an earlier demo in `work` left alive (by recorded PID and start time)."""
    store_file = work / "state" / "nodedeck" / "nodes" / "local.sqlite"
    if not store_file.exists():
        return

    store = StateStore(store_file)
    try:
        nodes = load_nodes(work / "nodes.toml")
        with NodeHandle(nodes["local"], store=store) as handle:
            for status in handle.runner.reconcile():
                if status.running:
                    result = handle.runner.stop(status.tmux_session, grace=5.0)
                    say(f"stopped {status.tmux_session} left by an earlier demo (pid {status.pid}): {result.outcome}")
    finally:
        store.close()


def stop_servers(scheduler: Scheduler, *, say: Callable[[str], None] = print) -> None:
    """Stop the plan's server stages that are still up: the demo owns its server."""
    for view in scheduler.views():
        if view.kind is StageKind.SERVER:
            try:
                scheduler.stop(view.id, grace=5.0)
            except UserError:  # not running
                continue
            say(f"stopped the demo's server stage {view.id}")


def eval_summary(work: Path) -> str | None:
    """One line on what the demo's evaluation measured, when it ran."""
    try:
        ev = json.loads((work / "demo" / "eval.json").read_text())
        line = f"EAGLE-3 drafter: acceptance length {ev['mean_accept_len']:.2f} over {ev['num_prompts']} prompts"
        untrained = (ev.get("untrained") or {}).get("mean_accept_len")
        if untrained is not None:
            line += f" (untrained drafter {untrained:.2f})"
        return line + f"; speculative output identical to the target's greedy output: {ev['greedy_match_rate']:.0%}"
    except (OSError, ValueError, KeyError, TypeError):
        return None
