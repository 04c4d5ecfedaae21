"""FileState: one inventoried file through the wizard's steps (the live record each step updates)."""

from __future__ import annotations

from dataclasses import dataclass

from ops.decommission.inventory import Entry
from ops.decommission.policy import Action
from ops.decommission.s3 import S3Match
from ops.decommission.transfer import FileJob


@dataclass
class FileState:
    """One inventoried file through the steps."""

    entry: Entry
    action: Action = Action.NONE
    s3: S3Match | None = None
    job: FileJob | None = None
    verified: bool = False
    how: str = ""  # sha256 | sqlite-snapshot | s3-md5 | s3-sha256 | s3-size
    reason: str = ""  # why it is not verified
    changed: str = ""  # what changed on the node since the listing
    snapshot: bool = False  # a live SQLite database copied as a snapshot taken on the node

    @property
    def download(self) -> FileJob:
        """Its download job: every file the download step handles has one."""
        if self.job is None:
            raise RuntimeError(f"{self.entry.path}: no download job")
        return self.job
