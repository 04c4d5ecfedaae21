"""What a launch does before the runner starts a stage's command: the lease, the uploads, the
directories and the environment (the scheduler decides when; ops.run.ranks adds torchrun)."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path
from typing import Iterator

from ops import nodenum
from ops.errors import HostError, UserError
from ops.hosts.base import Host, join_argv
from ops.plan.records import Plan, Stage
from ops.plan.resolve import Resolver
from ops.setup import record as trainer_record
from ops.state import StateStore

LEASE_TTL = 600.0
"""Seconds a launch lease holds (uploads included); a holder that died frees the stage after this."""


def lease_holder() -> str:
    """Who a scheduler is in launch leases: `host:pid:id`, one id per call."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def holder_gone(holder: str) -> bool:
    """A lease holder (`host:pid:id`) on this machine whose process is no more: its lease is free."""
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def stage_environment(plan: Plan, stage: Stage, resolver: Resolver,
                      store: StateStore) -> tuple[dict[str, str], list[str]]:
    """The stage's environment (the plan's env, then its own) and setup lines (the trainer's directory
    first on PATH when `nodedeck node setup` recorded one for the node, then the plan's, then its own),
    substituted: set explicitly, since a tmux pane gets the tmux server's environment."""
    env = {**{k: resolver.sub(v) for k, v in plan.env.items()},
           **{k: resolver.sub(v) for k, v in stage.env.items()}}
    trainer = trainer_record.load(store)
    first = [trainer_record.path_line(trainer)] if trainer is not None else []
    return env, first + [resolver.shell(line) for line in (plan.setup, stage.setup) if line]


def upload(resolved: Stage, base_dir: Path, host: Host) -> Iterator[tuple[Path, str]]:
    """Push the stage's uploads (relative sources are under the plan's directory); yields each
    (source, destination) once pushed. UserError for a source that is not a local file."""
    for up in resolved.upload:
        src = Path(up.src) if Path(up.src).is_absolute() else base_dir / up.src
        if not src.is_file():
            raise UserError(f"upload {src}: no such local file")
        host.push(src, up.dest)
        yield src, up.dest


def prepare(host: Host, dirs: list[str], keep: str) -> float:
    """One round trip before the runner: the directories made, `keep` run (the last run's metrics
    kept, ops.run.runmetrics), and the node's clock read (outputs must be newer than it)."""
    made = host.run_script(f"{join_argv(['mkdir', '-p', '--', *dirs])} && {keep} && date +%s.%N", timeout=30)
    said = made.check().text.split()
    try:
        return nodenum.UNIX_TIME.parse(said[-1] if said else "")
    except nodenum.Invalid as e:
        raise HostError(f"{host.name}: date printed no clock: {e}") from None
