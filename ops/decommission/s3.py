"""Which node files are already stored in S3: by key and size, then by content where S3 allows it.

A file's key is `<prefix>/<manifest path>`. A plain ETag (32 hex digits) is the object's MD5
only for single-part uploads stored in plaintext or with SSE-S3; a multipart ETag
(`<hex>-<parts>`) never is. For SSE-KMS and SSE-C objects the ETag is not an MD5 at all: those
are compared through the full-object SHA-256 checksum S3 stores (HeadObject with
ChecksumMode=ENABLED) and otherwise reported as matching by size only.
"""

from __future__ import annotations

import base64
import binascii
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable

from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError, ProfileNotFound

from ops.decommission.inventory import Entry
from ops.errors import HostError, HostUnreachable, UserError

_PLAIN_ETAG = re.compile(r"^[0-9a-f]{32}$")

# how a node file stands against the object stored under its key
MD5_MATCH = "md5"
SIZE_ONLY = "size-only"
MD5_MISMATCH = "md5-mismatch"
CHECKSUM_MATCH = "sha256"          # the stored full-object SHA-256 equals the node file's
CHECKSUM_MISMATCH = "sha256-mismatch"
SIZE_MISMATCH = "size-mismatch"
ABSENT = "absent"
CONTENT_MATCHES = (MD5_MATCH, CHECKSUM_MATCH)
"""Statuses that prove the stored bytes are the node file's."""

ETAG_IS_MD5 = (None, "AES256")
"""Server-side encryption under which a single-part ETag is the MD5 (none, SSE-S3)."""
_CHECKSUMS = ("SHA256", "SHA1", "CRC32", "CRC32C", "CRC64NVME")


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # "" or ending in "/"

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def key(self, path: str) -> str:
        return self.prefix + path

    def object_url(self, path: str) -> str:
        return f"s3://{self.bucket}/{self.key(path)}"


def parse_s3_url(url: str) -> S3Location:
    m = re.match(r"^s3://([^/]+)/?(.*)$", url or "")
    if not m or not m.group(1):
        raise UserError(f"--s3 {url!r}: expected s3://bucket[/prefix]")
    prefix = m.group(2).strip("/")
    return S3Location(m.group(1), prefix + "/" if prefix else "")


@dataclass(frozen=True)
class S3Object:
    key: str
    size: int
    etag: str

    @property
    def md5(self) -> str | None:
        """The MD5 the ETag carries, or None for multipart (and other non-MD5) ETags."""
        return self.etag if _PLAIN_ETAG.match(self.etag) else None

    @property
    def parts(self) -> int | None:
        m = re.match(r"^[0-9a-f]{32}-(\d+)$", self.etag)
        return int(m.group(1)) if m else None


@dataclass(frozen=True)
class S3Match:
    path: str
    status: str
    key: str
    s3_size: int | None = None
    etag: str | None = None
    node_md5: str | None = None
    detail: str = ""


@dataclass(frozen=True)
class ObjectHead:
    """What HeadObject tells about an object's content: its encryption and stored checksums."""

    encryption: str | None                                  # None, "AES256", "aws:kms", "aws:kms:dsse", "SSE-C"
    checksums: dict[str, str] = field(default_factory=dict)  # full-object only: "SHA256" -> base64 value

    @property
    def etag_is_md5(self) -> bool:
        return self.encryption in ETAG_IS_MD5


def head_object(client, bucket: str, key: str) -> ObjectHead:
    """HeadObject with ChecksumMode=ENABLED; an SSE-C object (S3 answers 400 without its key) says so.

    Raises botocore's ClientError for any other refusal.
    """
    try:
        r = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    except ClientError as e:
        if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 400:
            return ObjectHead("SSE-C")
        raise
    if r.get("SSECustomerAlgorithm"):
        return ObjectHead("SSE-C")
    full = r.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT"
    sums = {a: r[f"Checksum{a}"] for a in _CHECKSUMS
            if full and r.get(f"Checksum{a}") and "-" not in r[f"Checksum{a}"]}
    return ObjectHead(r.get("ServerSideEncryption"), sums)


def make_client(endpoint_url: str | None = None, profile: str | None = None):
    """A boto3 S3 client (of the named AWS profile, if given) that only sends/validates checksums
    where S3 requires them. UserError for an unknown profile."""
    import boto3  # lazy: boto3 takes 0.2 s to import, and only a decommission to S3 needs it
    from botocore.config import Config  # lazy: 0.15 s to import, only for a decommission to S3

    cfg = Config(
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        retries={"max_attempts": 5, "mode": "standard"},
        connect_timeout=15,
        read_timeout=60,
    )
    try:
        session = boto3.session.Session(profile_name=profile) if profile else boto3.session.Session()
    except ProfileNotFound as e:
        raise UserError(f"--s3-profile {profile}: no such profile in the AWS config files") from e
    return session.client("s3", endpoint_url=endpoint_url or None, config=cfg)


def list_objects(client, loc: S3Location) -> dict[str, S3Object]:
    """Every object under the prefix, keyed by its path relative to the prefix."""
    out: dict[str, S3Object] = {}
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=loc.bucket, Prefix=loc.prefix):
            for obj in page.get("Contents", []):
                key = obj["Key"]
                if key.endswith("/"):
                    continue
                out[key[len(loc.prefix):]] = S3Object(key, int(obj["Size"]), obj.get("ETag", "").strip('"'))
    except NoCredentialsError as e:
        raise UserError(f"{loc.url}: no AWS credentials (set AWS_PROFILE or AWS_ACCESS_KEY_ID)") from e
    except EndpointConnectionError as e:
        raise HostUnreachable(f"{loc.url}: {e}") from e
    except ClientError as e:
        err = e.response.get("Error", {})
        raise UserError(f"{loc.url}: {err.get('Code', 'error')}: {err.get('Message', e)}") from e
    except BotoCoreError as e:
        raise HostError(f"{loc.url}: {e}") from e
    return out


def match_files(
    files: Iterable[Entry],
    objects: dict[str, S3Object],
    loc: S3Location,
    node_md5: Callable[[list[Entry]], dict[str, str | Exception]],
    head: Callable[[S3Object], ObjectHead],
    node_sha256: Callable[[list[Entry]], dict[str, str | Exception]],
) -> dict[str, S3Match]:
    """Match each inventoried file against the object under its key.

    For an object of the file's size with a plain ETag, `head(obj)` says how it is encrypted:
    plaintext and SSE-S3 compare the ETag with `node_md5(entries)`; SSE-KMS and SSE-C compare
    a stored full-object SHA-256 with `node_sha256(entries)`, else match by size only. Both
    digest functions run on the node: path -> hex digest, or the error.
    """
    result: dict[str, S3Match] = {}
    candidates: list[Entry] = []
    for f in files:
        obj = objects.get(f.path)
        key = loc.key(f.path)
        if obj is None:
            result[f.path] = S3Match(f.path, ABSENT, key)
        elif obj.size != f.size:
            result[f.path] = S3Match(f.path, SIZE_MISMATCH, key, obj.size, obj.etag,
                                     detail=f"S3 has {obj.size} bytes, node {f.size}")
        elif obj.md5 is None:
            parts = f"{obj.parts}-part upload" if obj.parts else "non-MD5 ETag"
            result[f.path] = S3Match(f.path, SIZE_ONLY, key, obj.size, obj.etag, detail=f"size matches; {parts}")
        else:
            candidates.append(f)
    heads = _heads(head, [objects[f.path] for f in candidates])
    need_md5: list[Entry] = []
    need_sha: list[tuple[Entry, ObjectHead]] = []
    for f in candidates:
        obj, h = objects[f.path], heads[objects[f.path].key]
        if isinstance(h, Exception):
            result[f.path] = S3Match(f.path, SIZE_ONLY, obj.key, obj.size, obj.etag,
                                     detail=f"size matches; HeadObject failed: {h}")
        elif h.etag_is_md5:
            need_md5.append(f)
        elif "SHA256" in h.checksums:
            need_sha.append((f, h))
        else:
            stored = ", ".join(sorted(h.checksums)) or "no full-object checksum"
            result[f.path] = S3Match(f.path, SIZE_ONLY, obj.key, obj.size, obj.etag,
                                     detail=f"size matches; {h.encryption} object: its ETag is not an MD5 and S3 "
                                            f"stores {stored} (a SHA-256 checksum is needed to compare)")
    md5s = node_md5(need_md5) if need_md5 else {}
    for f in need_md5:
        obj = objects[f.path]
        result[f.path] = _compared(f.path, obj, md5s.get(f.path), obj.md5, MD5_MATCH, MD5_MISMATCH, "md5", "ETag")
    shas = node_sha256([f for f, _ in need_sha]) if need_sha else {}
    for f, h in need_sha:
        obj = objects[f.path]
        stored_sha = _b64_to_hex(h.checksums["SHA256"])
        result[f.path] = _compared(f.path, obj, shas.get(f.path), stored_sha, CHECKSUM_MATCH, CHECKSUM_MISMATCH,
                                   "sha256", "stored SHA-256")
    return result


def _heads(head: Callable[[S3Object], ObjectHead], objs: list[S3Object]) -> dict[str, ObjectHead | Exception]:
    """HeadObject of each object, a few at a time: key -> head, or the error."""
    def one(obj: S3Object):
        try:
            return head(obj)
        except (BotoCoreError, ClientError) as e:   # that object falls back to size only
            return e
    with ThreadPoolExecutor(max_workers=8) as pool:
        return dict(zip((o.key for o in objs), pool.map(one, objs)))


def _compared(path, obj: S3Object, got, want: str | None, ok: str, bad: str, algo: str, what: str) -> S3Match:
    if isinstance(got, str) and got == want:
        return S3Match(path, ok, obj.key, obj.size, obj.etag, got if algo == "md5" else None)
    if isinstance(got, str):
        return S3Match(path, bad, obj.key, obj.size, obj.etag, got if algo == "md5" else None,
                       detail=f"node {algo} {got} != {what} {want}")
    return S3Match(path, bad, obj.key, obj.size, obj.etag, detail=f"{algo} on node failed: {got}")


def _b64_to_hex(value: str) -> str | None:
    try:
        return base64.b64decode(value, validate=True).hex()
    except (binascii.Error, ValueError):
        return None
