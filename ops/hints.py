"""Hints: the `nodedeck ...` command lines printed for the user to paste, with what selected their context.

A hint pasted into another shell must act on the same workspace, nodes file, plan, node and plan variables
as the command (or dashboard) that printed it. `CliContext` is that context as a typed record; it renders
its own flags, shell-quoted, and every hint of the CLI and the dashboard is built by it:

    nodedeck [--work DIR] [--config FILE] WORDS...                       (command)
    nodedeck [--work DIR] [--config FILE] WORDS... --plan FILE [--node N] [--var K=V]...   (on_plan)
    nodedeck [--work DIR] [--config FILE] WORDS... FILE [--node N] [--var K=V]...          (plan_file)

`current()` is the context this process was started in: the CLI records the flags it was given (`given`),
and the workspace is the active one (a workspace found upward from the current directory, or made by
`nodedeck demo`, is named with --work too, so the hint works from any directory).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from ops import workspace

PROG = "nodedeck"


@dataclass(frozen=True)
class CliContext:
    """What selected a command's nodes, state, plan and node: its flags, as a pasted hint must repeat them."""

    work: str | None = None
    """The workspace directory (--work), absolute."""
    config: str | None = None
    """A nodes.toml named with --config (not the workspace's own), absolute."""
    plan: str | None = None
    """The plan file (--plan, or FILE), absolute; a plan with no file keeps its name."""
    node: str | None = None
    """The node given with --node (None: the plan's, else local, as without the flag)."""
    vars: tuple[tuple[str, str], ...] = ()
    """Plan variables set with --var, in the order given."""

    def root_flags(self) -> list[str]:
        """The options before the command: the workspace and the nodes file."""
        flags = ["--work", self.work] if self.work else []
        return flags + (["--config", self.config] if self.config else [])

    def plan_flags(self) -> list[str]:
        """--node and --var (the plan itself goes as --plan or as FILE, by command)."""
        flags = ["--node", self.node] if self.node else []
        for name, value in self.vars:
            flags += ["--var", f"{name}={value}"]
        return flags

    def command(self, *words: str) -> str:
        """`nodedeck [root flags] WORDS...`, for a command that names its node itself (`node setup gpu1`)."""
        return shlex.join([PROG, *self.root_flags(), *words])

    def on_plan(self, *words: str, then: Sequence[str] = ()) -> str:
        """`nodedeck [root flags] WORDS... --plan FILE [--node N] [--var K=V]... THEN...` (`stage start ID`)."""
        return shlex.join([PROG, *self.root_flags(), *words, *self._plan("--plan"), *self.plan_flags(), *then])

    def plan_file(self, *words: str, then: Sequence[str] = ()) -> str:
        """`nodedeck [root flags] WORDS... FILE [--node N] [--var K=V]... THEN...` (`plan run`, `plan show`)."""
        return shlex.join([PROG, *self.root_flags(), *words, *self._plan(), *self.plan_flags(), *then])

    def _plan(self, flag: str | None = None) -> list[str]:
        plan = self.plan or "FILE"
        return [flag, plan] if flag else [plan]

    def for_plan(self, path: str | None, name: str, node: str | None) -> CliContext:
        """This context running the plan at `path` (named `name` when it has no file) on `node`."""
        plan = os.path.abspath(path) if path and "<" not in path else name
        return replace(self, plan=plan, node=node if node is not None else self.node)


def _absolute(path: str | None) -> str | None:
    return os.path.abspath(os.path.expanduser(path)) if path else None


_GIVEN = CliContext()
"""What the CLI was given (set by `given`); the workspace is read when a hint is made."""


def given(*, config: str | None = None, plan: str | None = None, node: str | None = None,
          variables: Iterable[str] | None = None) -> None:
    """Record the flags this process was started with (the CLI calls it once per command)."""
    global _GIVEN
    pairs = tuple((name, value) for name, sep, value in (v.partition("=") for v in variables or ()) if sep)
    _GIVEN = CliContext(None, _absolute(config), _absolute(plan), node, pairs)


def current() -> CliContext:
    """The context of this process: the flags it was given and the active workspace."""
    ws = workspace.current()
    return replace(_GIVEN, work=str(ws.root) if ws is not None else None)
