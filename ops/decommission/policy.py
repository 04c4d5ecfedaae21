"""What the user chose for each class of files (Policy), and what is then done with each file (Action).

Both are StrEnums: their values are what the CLI, the JSON events, the manifest and the TUI show.
"""

from __future__ import annotations

from enum import StrEnum

from ops.decommission.classify import ENV_CLASS, is_small


class Policy(StrEnum):
    PRESERVE = "preserve"  # always download
    UNLESS_S3 = "unless-in-s3"  # download unless already stored (and verified) in S3
    SKIP = "skip"  # not preserved, by choice


POLICIES = tuple(Policy)


class Action(StrEnum):
    """What is done with one file."""

    NONE = ""  # not decided yet
    DOWNLOAD = "download"
    IN_S3 = "s3"
    EXCLUDED = "excluded"
    IN_SNAPSHOT = "snapshot"  # a SQLite -wal/-shm folded into its database's snapshot


def default_policy(cls: str) -> Policy:
    """Small classes always, large ones unless in S3, nodedeck's own environment never (`node setup` remakes it)."""
    if cls == ENV_CLASS:
        return Policy.SKIP
    return Policy.PRESERVE if is_small(cls) else Policy.UNLESS_S3
