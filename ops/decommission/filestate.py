"""FileState: one inventoried file through the wizard's steps (the live record each step updates)."""

from __future__ import annotations

from dataclasses import dataclass

from ops.decommission.inventory import Entry
from ops.decommission.policy import Action
from ops.decommission.results import Fix
from ops.decommission.s3 import S3Match
from ops.decommission.transfer import FileJob
from ops.decommission.verification import Verification


@dataclass
class FileState:
    """One inventoried file through the steps."""

    entry: Entry
    action: Action = Action.NONE
    s3: S3Match | None = None
    job: FileJob | None = None
    verified: bool = False
    verification: Verification | None = None  # how it is (or would be) verified; None until known
    reason: str = ""  # why it is not verified
    fix: Fix | None = None  # how the user may settle that
    changed: str = ""  # what changed on the node since the listing
    snapshot: bool = False  # a live SQLite database copied as a snapshot taken on the node

    @property
    def download(self) -> FileJob:
        """Its download job: every file the download step handles has one."""
        if self.job is None:
            raise RuntimeError(f"{self.entry.path}: no download job")
        return self.job
