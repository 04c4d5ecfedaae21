"""A workspace: one directory whose nodes.toml, state and plan variables every command shares.

A `nodedeck.toml` marks it, found like git finds its repository: `--work DIR` (a global option),
else $NODEDECK_WORK, else the nearest `nodedeck.toml` in the current directory or above it.

    # nodedeck.toml
    [workspace]
    nodes = "nodes.toml"        # the nodes file (relative to this file); default: the user's
    state = "state"             # where the nodes' state lives; default: "state"
    [vars]                      # plan variables every plan of the workspace gets (--var still wins)
    train = "/opt/venv/bin/nodedeck-train"

`nodedeck demo` writes one in its work dir, so after the demo `nodedeck plan show
assets/plans/demo.toml` (run inside demo-work, or with `--work demo-work`) sees the demo's state.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ops.errors import UserError
from ops.inputfile import toml_value_error

FILE = "nodedeck.toml"
_KEYS = {"nodes", "state"}
MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class Workspace:
    root: Path
    nodes: Path | None
    state: Path
    vars: Mapping[str, str] = field(default_factory=dict)

    @property
    def file(self) -> Path:
        return self.root / FILE

    def activate(self) -> None:
        """Make this process (and what it starts) use the workspace's state."""
        global _ACTIVE
        _ACTIVE = self
        os.environ["XDG_STATE_HOME"] = str(self.state)


def plan_vars(ws: "Workspace | None", plan_known: Mapping[str, str], given: Mapping[str, str]) -> dict[str, str]:
    """The variable overrides for a plan: the workspace's (those the plan has), then --var (which wins)."""
    base = {k: v for k, v in (ws.vars if ws else {}).items() if k in plan_known}
    return {**base, **given}


def current() -> "Workspace | None":
    """The workspace activated for this process by the CLI (None outside one)."""
    return _ACTIVE


_ACTIVE: "Workspace | None" = None


def _line(text: str, key: str) -> int:
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith(key):
            return n
    return 1


def load(path: Path) -> Workspace:
    """The workspace a nodedeck.toml describes; a bad one is a one-line `file:line` UserError."""
    try:
        if not path.is_file():
            raise UserError(f"{path}: not a regular file")
        if path.stat().st_size > MAX_BYTES:
            raise UserError(f"{path}: larger than 1 MiB: not a workspace file")
        text = path.read_text()
        data = tomllib.loads(text)
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: {e}") from None
    except ValueError as e:
        raise UserError(toml_value_error(text, path, e)) from None
    for key in data:
        if key not in ("workspace", "vars"):
            raise UserError(f"{path}:{_line(text, key)}: unknown table {key!r} (expected [workspace] and [vars])")
    ws = data.get("workspace", {})
    variables = data.get("vars", {})
    if not isinstance(ws, dict) or not isinstance(variables, dict):
        raise UserError(f"{path}: [workspace] and [vars] must be tables")
    for key, value in ws.items():
        if key not in _KEYS:
            raise UserError(f"{path}:{_line(text, key)}: unknown key {key!r} in [workspace] (known: nodes, state)")
        if not isinstance(value, str) or not value.strip():
            raise UserError(f"{path}:{_line(text, key)}: {key} must be a non-empty path")
    for key, value in variables.items():
        if not isinstance(value, str):
            raise UserError(f"{path}:{_line(text, key)}: [vars] {key} must be a string")
    root = path.parent.resolve()
    nodes = root / ws["nodes"] if "nodes" in ws else None
    return Workspace(root, nodes, root / ws.get("state", "state"), dict(variables))


def find(start: Path | None = None) -> Workspace | None:
    """The workspace of --work / $NODEDECK_WORK is resolved by `resolve`; this is the upward search."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        candidate = d / FILE
        if candidate.is_file():
            _check_owner(candidate)
            return load(candidate)
    return None


def _check_owner(path: Path) -> None:
    """A nodedeck.toml found upward must be the user's (or root's): one planted in a shared parent such
    as /tmp would otherwise choose the nodes, state and plan variables (commands) of every run below it."""
    owner = path.stat().st_uid
    if owner not in (os.getuid(), 0):
        raise UserError(f"{path}: owned by another user (uid {owner}): not used; name the workspace with "
                        f"--work DIR to trust it, or remove the file")


def resolve(work: str | None) -> Workspace | None:
    """--work DIR, else $NODEDECK_WORK, else the nearest nodedeck.toml upward; None when there is none."""
    named = work or os.environ.get("NODEDECK_WORK")
    if named:
        d = Path(named).expanduser()
        if not (d / FILE).is_file():
            raise UserError(f"{d}: no {FILE} there (a workspace dir has one; `nodedeck demo` writes it)")
        return load(d / FILE)
    return find()


def write(root: Path, *, nodes: str, state: str = "state", variables: Mapping[str, str] | None = None) -> Path:
    """Write root/nodedeck.toml (used by `nodedeck demo`)."""
    lines = ["# a nodedeck workspace: every nodedeck command run in this directory (or below, or with",
             f"# --work {root}) uses these nodes and this state", "[workspace]",
             f"nodes = {_toml(nodes)}", f"state = {_toml(state)}"]
    if variables:
        lines.append("[vars]")
        lines += [f"{k} = {_toml(v)}" for k, v in dict(variables).items()]
    path = root / FILE
    path.write_text("\n".join(lines) + "\n")
    return path


def _toml(s: str) -> str:
    return json.dumps(s)      # a JSON string is a valid TOML basic string
