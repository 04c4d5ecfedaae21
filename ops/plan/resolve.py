"""`${var}` substitution: a parsed stage made concrete for the node it runs on.

Variables: the plan's [vars] (overridable from the command line), and
`${root}` (the plan's root, else the node's), `${node.root}`, `${node.name}`,
`${plan.name}`, `${stage.id}`, `${run_dir}`, `${session}`, `${log}`.
`$${x}` stands for a literal `${x}` (a shell variable, say). In commands a
value goes in shell-quoted, `${x:raw}` as it is (the rule: ops.plan.shelltext).
"""

from __future__ import annotations

import dataclasses
import hashlib
import posixpath
import re
from typing import Mapping

from ops.errors import UserError
from ops.plan.records import CheckSpec, Plan, Smoke, Stage, Upload
from ops.plan.shelltext import substitute

_MAX_DEPTH = 20


def session_name(plan_name: str, stage_id: str) -> str:
    """tmux session of a stage (TmuxRunner adds its `nd-` prefix): `<plan>-<stage>` in [A-Za-z0-9_-].

    A name that had to be changed or shortened gets a hash of the original, so two stages never share one.
    """
    raw = f"{plan_name}-{stage_id}"
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", raw)
    if clean != raw or len(clean) > 63 or not clean[0].isalnum():
        digest = hashlib.sha1(raw.encode()).hexdigest()[:8]
        base = clean if clean[0].isalnum() else "p" + clean
        clean = base[:54].rstrip("_-") + "-" + digest
    return clean


def apply_overrides(plan: Plan, overrides: Mapping[str, str]) -> Plan:
    """The plan with some [vars] replaced (`--var name=value`); unknown names are an error."""
    if not overrides:
        return plan
    unknown = sorted(set(overrides) - set(plan.vars))
    if unknown:
        known = ", ".join(sorted(plan.vars)) or "none"
        raise UserError(f"--var {unknown[0]}: the plan has no such variable (its [vars]: {known})")
    return dataclasses.replace(plan, vars={**plan.vars, **overrides})


def parse_overrides(items: list[str] | None) -> dict[str, str]:
    out = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UserError(f"--var {item!r}: expected NAME=VALUE")
        out[name] = value
    return out


class Resolver:
    """Substitutes variables for one stage on one node."""

    def __init__(self, plan: Plan, stage: Stage, *, node_name: str, node_root: str, run_dir: str):
        self.values: dict[str, str] = dict(plan.vars)
        self.values.update({"node.root": node_root, "node.name": node_name, "plan.name": plan.name,
                            "stage.id": stage.id, "run_dir": run_dir})
        self.values["root"] = self.sub(plan.root) if plan.root else node_root
        self.tmux_session = session_name(plan.name, stage.id)
        self.values["session"] = self.tmux_session
        self.values["log"] = posixpath.join(run_dir, f"{self.tmux_session}.log")
        if stage.log:
            self.values["log"] = self.path(stage.log, self.values["root"])

    def sub(self, text: str, depth: int = 0) -> str:
        """text with every variable's value inserted as it is (paths, env values, urls, titles)."""
        if depth > _MAX_DEPTH:
            raise UserError(f"variables nest too deep in {text!r}")
        return substitute(text, lambda name: self._value(name, depth), shell=False)

    def shell(self, text: str) -> str:
        """A command string with `${name}` inserted shell-quoted and `${name:raw}` as it is."""
        return substitute(text, lambda name: self._value(name, 0), shell=True)

    def _value(self, name: str, depth: int) -> str:
        if name not in self.values:
            raise UserError(f"unknown variable ${{{name}}}")
        return self.sub(self.values[name], depth + 1)

    def path(self, p: str, base: str) -> str:
        p = self.sub(p)
        return p if posixpath.isabs(p) else posixpath.normpath(posixpath.join(base, p))

    def stage(self, stage: Stage) -> Stage:
        """The stage with every string substituted; relative paths made absolute."""
        root = self.values["root"]
        cwd = self.path(stage.cwd, root) if stage.cwd else root
        smoke = None
        if stage.smoke:
            smoke = Smoke(self.shell(stage.smoke.command), self._checks(stage.smoke.verify, cwd), stage.smoke.timeout)
        return dataclasses.replace(
            stage,
            title=self.sub(stage.title),
            command=self.shell(stage.command),
            cwd=cwd,
            log=self.values["log"],
            upload=tuple(Upload(self.sub(u.src), self.path(u.dest, cwd)) for u in stage.upload),
            outputs=tuple(self.path(o, cwd) for o in stage.outputs),
            env={k: self.sub(v) for k, v in stage.env.items()},
            smoke=smoke,
            port=self.sub(stage.port) if stage.port else None,
            verify=self._checks(stage.verify, cwd),
        )

    def _checks(self, checks: tuple[CheckSpec, ...], cwd: str) -> tuple[CheckSpec, ...]:
        out = []
        for c in checks:
            args = dict(c.args)
            for k, v in c.args.items():
                if not isinstance(v, str) or (c.kind == "log_contains" and k == "pattern"):
                    continue  # a regex is taken as written
                v = self.shell(v) if c.kind == "command_ok" and k == "command" else self.sub(v)
                if k in ("path", "pattern") and not posixpath.isabs(v):
                    v = posixpath.join(cwd, v)
                args[k] = v
            out.append(CheckSpec(c.kind, args, c.line))
        return tuple(out)
