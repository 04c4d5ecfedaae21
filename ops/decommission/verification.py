"""Verification: how a preserved file is (or, unverified, would be) proven to match the node's."""

from __future__ import annotations

from enum import StrEnum


class Verification(StrEnum):
    """The check that proves one file; its value is the manifest's `verified_by`."""

    SHA256 = "sha256"                    # downloaded; the copy's sha256 equals the node's
    SQLITE_SNAPSHOT = "sqlite-snapshot"  # a live database's snapshot (or a -wal/-shm folded into one)
    S3_MD5 = "s3-md5"                    # in S3; the plain ETag is the node file's md5
    S3_SHA256 = "s3-sha256"              # in S3; the stored full-object SHA-256 is the node file's
    S3_SIZE = "s3-size"                  # in S3 by size only (verified only with --trust-s3-size)
