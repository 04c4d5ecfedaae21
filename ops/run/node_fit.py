"""What a node lacks for a plan: `nodedeck plan check FILE --node N` (nothing is started).

From each stage that runs on the node, resolved for it, come what it asks for:
- GPUs: the indices in CUDA_VISIBLE_DEVICES (the plan's env, then the stage's), else a tensor-parallel size
  (`--tp-size`, `--tp`, `--tensor-parallel-size`, `-tp`), `--device cuda[:N]`, or one GPU per rank
  (torchrun's `--nproc-per-node gpu`, a stage's `nproc_per_node = "gpu"`);
- engines and launchers: `python -m sglang.*` and `--backend sglang` need sglang importable by that python,
  `python -m vllm.*` vllm; `vllm ...` and `torchrun` must be on the PATH (so must torchrun for a stage on
  several nodes).
Then the node is probed, in the environment the stages get (the recorded setup's bin first on PATH, the env
and setup lines of the plan and the stage: ops.run.context): `command -v` and
`importlib.util.find_spec` (nothing is imported), one script per distinct environment, and its GPUs read as
the GPU panel reads them. Each thing the node lacks is one line naming the stages that ask for it.

Before launch, without probing (`plan run`, `plan check`, the dashboard): the nodes a plan runs `nodedeck-train` on
that `nodedeck node setup` never set up (`missing_trainers`).
"""

from __future__ import annotations

import posixpath
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ops import hints
from ops.plan.command_words import split_commands
from ops.plan.resolve import Resolver
from ops.setup.record import TrainerSetup
from ops.telemetry.gpus import read_remote_gpus

if TYPE_CHECKING:
    from ops.node_handle import NodeHandle
    from ops.plan.records import Plan, Stage
    from ops.run.scheduler import Scheduler

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_TP_FLAGS = ("--tp-size", "--tp", "--tensor-parallel-size", "-tp")
_ENGINES = ("sglang", "vllm")
_MARK = "@@nodedeck-fit"
_TRAINER = re.compile(r"(?<![\w/.~-])nodedeck-train(?![\w.-])")   # the bare command, not /some/bin/nodedeck-train
_VAR = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_.]*)(?::raw)?\}")


@dataclass(frozen=True)
class GpuAsk:
    """The GPUs one stage asks for: these indices, or at least this many."""

    stage: str
    indices: tuple[int, ...] = ()
    count: int = 0
    why: str = ""

    def lacks(self, have: set[int]) -> str | None:
        """What of it the node's GPU indices `have` do not give, in words; None when nothing."""
        if self.indices:
            missing = [i for i in self.indices if i not in have]
            if not missing:
                return None
            return f"GPU{'s' if len(missing) > 1 else ''} {','.join(map(str, missing))} ({self.why})"
        return f"{self.count} GPU{'s' if self.count > 1 else ''} ({self.why})" if self.count > len(have) else None


@dataclass(frozen=True)
class ToolAsk:
    """A command on the stage's PATH (python None), or a module its python must import."""

    stage: str
    name: str
    python: str | None = None
    why: str = ""


def _flag(words: tuple[str, ...], names: tuple[str, ...]) -> str | None:
    """The value of the first of these options (`--x V` or `--x=V`) among words."""
    for k, w in enumerate(words):
        name, eq, value = w.partition("=")
        if name in names:
            if eq:
                return value
            if k + 1 < len(words):
                return words[k + 1]
    return None


def _gpus_of(stage: Stage, command: str, env: dict[str, str]) -> GpuAsk | None:
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        tokens = [t.strip() for t in visible.split(",") if t.strip()]
        if not tokens or tokens == ["-1"]:
            return None
        why = f"CUDA_VISIBLE_DEVICES={visible}"
        if all(t.isascii() and t.isdigit() for t in tokens):
            return GpuAsk(stage.id, tuple(sorted({int(t) for t in tokens})), why=why)
        return GpuAsk(stage.id, count=len(tokens), why=why)
    asks: list[tuple[int, str]] = []
    if stage.nodes and stage.nproc_per_node == "gpu":
        asks.append((1, 'nproc_per_node = "gpu"'))
    for cmd in split_commands(command):
        tp = _flag(cmd.words, _TP_FLAGS)
        if tp is not None and tp.isascii() and tp.isdigit() and int(tp) > 0:
            asks.append((int(tp), f"tensor parallel {tp}"))
        device = _flag(cmd.words, ("--device",))
        if device is not None and device.startswith("cuda"):
            n = device.partition(":")[2]
            asks.append((int(n) + 1 if n.isascii() and n.isdigit() else 1, f"--device {device}"))
        if _flag(cmd.words, ("--nproc-per-node", "--nproc_per_node")) == "gpu":
            asks.append((1, "--nproc-per-node gpu"))
    if not asks:
        return None
    count, why = max(asks)
    return GpuAsk(stage.id, count=count, why=why)


def _tools_of(stage: Stage, command: str) -> list[ToolAsk]:
    out = [ToolAsk(stage.id, "torchrun", why="a stage on several nodes")] if stage.nodes else []
    for cmd in split_commands(command):
        words = [w for w in cmd.words if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w)]
        for k, w in enumerate(words):
            prog = posixpath.basename(w)
            if prog in ("torchrun", "vllm") and (k == 0 or words[k - 1] in ("--no-python", "exec", "env")):
                out.append(ToolAsk(stage.id, w, why=" ".join([prog, *words[k + 1:k + 2]])))
            if _PYTHON.match(prog) and k + 2 < len(words) and words[k + 1] == "-m":
                root = words[k + 2].split(".")[0]
                if root in _ENGINES:
                    out.append(ToolAsk(stage.id, root, w, f"{w} -m {words[k + 2]}"))
        trainer = any(posixpath.basename(w) == "nodedeck-train" for w in words)
        if trainer and _flag(cmd.words, ("--backend",)) == "sglang":   # its capture through SGLang
            out.append(ToolAsk(stage.id, "sglang", "python", "nodedeck-train --backend sglang"))
    return out


def _probe_script(env: dict[str, str], setup: list[str], asks: list[ToolAsk]) -> str:
    lines = ["set +e", *(f"export {k}={shlex.quote(v)}" for k, v in env.items()), *setup]
    for i, a in enumerate(asks):
        if a.python is None:
            test = f"command -v {shlex.quote(a.name)} >/dev/null 2>&1"
        else:
            test = (f"{shlex.quote(a.python)} -c 'import importlib.util as u, sys; "
                    f"sys.exit(0 if u.find_spec(sys.argv[1]) else 1)' {shlex.quote(a.name)} >/dev/null 2>&1")
        lines.append(f"if {test}; then echo '{_MARK} {i} 1'; else echo '{_MARK} {i} 0'; fi")
    return "\n".join(lines) + "\n"


def _found(handle: NodeHandle, env: dict[str, str], setup: list[str], asks: list[ToolAsk]) -> list[bool]:
    """Whether each ask is met on the node, in that environment (one round trip)."""
    res = handle.host.run_script(_probe_script(env, setup, asks), timeout=60)
    met = [False] * len(asks)
    for line in res.text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == _MARK and parts[1].isascii() and parts[1].isdigit():
            i = int(parts[1])
            if i < len(asks):
                met[i] = parts[2] == "1"
    return met


def lacking(sched: Scheduler, node: str) -> list[str]:
    """One line per thing `node` lacks for the stages of sched's plan that run on it (empty: it has them).
    Raises what the node's connection raises."""
    gpus: list[GpuAsk] = []
    groups: dict[tuple, tuple[dict[str, str], list[str], list[ToolAsk]]] = {}
    root = sched.ctx.handle_named(node).node.root   # as configured: what a stage asks for needs no node
    for stage in sched.plan.stages:
        if node not in ((sched.ctx.node_name(stage),) if not stage.nodes else stage.nodes):
            continue
        resolver = Resolver(sched.plan, stage, node_name=node, node_root=root, run_dir=f"{root}/.nodedeck/runs")
        resolved = resolver.stage(stage)
        env = {k: resolver.sub(v) for k, v in {**sched.plan.env, **stage.env}.items()}
        commands = " ; ".join(c for c in (resolved.command, resolved.smoke.command if resolved.smoke else "") if c)
        ask = _gpus_of(stage, commands, env)
        if ask is not None:
            gpus.append(ask)
        tools = _tools_of(stage, commands)
        if tools:   # looked for in the environment the stage gets there (its setup's PATH first)
            env, setup = sched.ctx.environment(stage, sched.ctx.handle_named(node))
            group = groups.setdefault((tuple(sorted(env.items())), tuple(setup)), (env, setup, []))
            group[2].extend(tools)
    out = _gpu_lines(sched, node, gpus)
    missing: dict[tuple[str, str | None], list[ToolAsk]] = {}
    for env, setup, asks in groups.values():
        for a, met in zip(asks, _found(sched.ctx.handle_named(node), env, setup, asks)):
            if not met:
                missing.setdefault((a.name, a.python), []).append(a)
    for (name, python), asks in missing.items():
        stages = ", ".join(dict.fromkeys(f"{a.stage} ({a.why})" for a in asks))
        if python is None:
            where = "does not run there" if "/" in name else "is not on the stages' PATH"
            out.append(f"{node}: {name} {where}: {stages}")
            continue
        line = f"{node}: {name} is not importable by {python} in the stages' environment: {stages}"
        if name == "sglang":
            line += f"; `{hints.current().command('node', 'setup', node, '--with-node-stack')}` installs it"
        out.append(line)
    return out


def _gpu_lines(sched: Scheduler, node: str, asks: list[GpuAsk]) -> list[str]:
    if not asks:
        return []
    snap = read_remote_gpus(sched.ctx.handle_named(node).host)
    have = {g.index for g in snap.gpus} if snap.available else set()
    short = [(a.stage, what) for a in asks if (what := a.lacks(have)) is not None]
    if not short:
        return []
    stages = ", ".join(f"{stage} asks for {what}" for stage, what in short)
    if not have:
        reason = snap.reason or snap.error or "none found"
        return [f"{node} has no GPU ({reason}), but {stages}"]
    return [f"{node} has {len(have)} GPU{'s' if len(have) > 1 else ''} ({', '.join(map(str, sorted(have)))}), "
            f"but {stages}"]


def runs_trainer(plan: Plan, stage: Stage) -> bool:
    """The stage's command (or its smoke variant) runs `nodedeck-train` found on the PATH."""
    text = stage.command + " " + (stage.smoke.command if stage.smoke else "")
    for _ in range(8):       # variables holding variables (`train = "${bin}/..."`)
        new = _VAR.sub(lambda m: plan.vars.get(m.group(1), m.group(0)), text)
        if new == text:
            break
        text = new
    return bool(_TRAINER.search(text))


def _beside_this_python() -> bool:
    """`local` runs the nodedeck-train installed with this nodedeck, as the demo records it."""
    return (Path(sys.executable).parent / "nodedeck-train").exists()


def missing_trainers(plan: Plan, default_node: str | None,
                     recorded: Callable[[str], TrainerSetup | None]) -> list[str]:
    """One line per node that runs `nodedeck-train` for the plan and has no recorded setup (`local` needs none
    when this nodedeck's own nodedeck-train is installed beside its Python)."""
    need: dict[str, list[str]] = {}
    for stage in plan.stages:
        if runs_trainer(plan, stage):
            for name in stage.nodes or (stage.node or default_node or plan.node or "local",):
                need.setdefault(name, []).append(stage.id)
    out = []
    for name, stages in need.items():
        if recorded(name) is None and not (name == "local" and _beside_this_python()):
            listed = ", ".join(stages[:3]) + (f" and {len(stages) - 3} more" if len(stages) > 3 else "")
            out.append(f"node {name} has no trainer installed by nodedeck ({listed} run nodedeck-train there): "
                       f"run `{hints.current().command('node', 'setup', name)}`")
    return out
