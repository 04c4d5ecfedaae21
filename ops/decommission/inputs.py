"""What a decommission is given: its Options (from the CLI or the TUI's form) and the plan's StageStates."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ops.state import StageStateRow


@dataclass
class Options:
    dest: Path
    roots: list[str] = field(default_factory=list)  # --root
    plan_paths: list[str] = field(default_factory=list)
    s3_url: str | None = None
    s3_endpoint: str | None = None
    s3_profile: str | None = None   # AWS profile for S3 (default: the environment's)
    include: set[str] = field(default_factory=set)
    exclude: set[str] = field(default_factory=set)
    streams: int = 4
    dry_run: bool = False
    trust_s3_size: bool = False
    accept_outside_links: bool = False  # a symlink out of the roots is a warning, not NOT SAFE
    python: str = "python3"
    own_env: tuple[str, ...] = ()  # where nodedeck's own environment lies on the node (own_env.own_paths)


@dataclass(frozen=True)
class StageStates:
    """Plan stage states for PROGRESS.md, or why there are none."""

    plan: str | None
    rows: tuple[StageStateRow, ...]  # in the plan's stage order
    note: str = ""
