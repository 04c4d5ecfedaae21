"""The nodes.toml a test's dashboard or CLI reads when given none, and a plan on the local node."""

from __future__ import annotations

import uuid
from pathlib import Path

from ops.nodes import default_config_path


def write_nodes_toml(text: str) -> Path:
    """`text` as the default nodes.toml (under the test's own XDG_CONFIG_HOME, see conftest); its path."""
    path = default_config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def local_plan(tmp_path: Path, text: str, prefix: str) -> tuple[Path, str]:
    """The local node rooted at tmp_path/work in the default nodes.toml, and the plan `text` with NAME
    replaced by a fresh name in tmp_path/plan.toml: (the plan's path, its name, for kill_plan_sessions)."""
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    write_nodes_toml(f'[nodes.local]\nroot = "{tmp_path / "work"}"\n')
    plan = tmp_path / "plan.toml"
    plan.write_text(text.replace("NAME", name))
    return plan, name
