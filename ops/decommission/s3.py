"""Which node files are already stored in S3: by key and size, and by MD5 where the ETag is one.

A file's key is `<prefix>/<manifest path>`. A plain ETag (32 hex digits) is the
object's MD5 for single-part uploads; a multipart ETag (`<hex>-<parts>`) is
not, so those objects match on size only and are reported as such.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterable

from ops.errors import HostError, HostUnreachable, UserError

_PLAIN_ETAG = re.compile(r"^[0-9a-f]{32}$")

# how a node file stands against the object stored under its key
MD5_MATCH = "md5"
SIZE_ONLY = "size-only"
MD5_MISMATCH = "md5-mismatch"
SIZE_MISMATCH = "size-mismatch"
ABSENT = "absent"


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


def make_client(endpoint_url: str | None = None):
    """A boto3 S3 client that only sends/validates checksums where S3 requires them."""
    import boto3
    from botocore.config import Config

    cfg = Config(
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        retries={"max_attempts": 5, "mode": "standard"},
        connect_timeout=15,
        read_timeout=60,
    )
    return boto3.client("s3", endpoint_url=endpoint_url or None, config=cfg)


def list_objects(client, loc: S3Location) -> dict[str, S3Object]:
    """Every object under the prefix, keyed by its path relative to the prefix."""
    from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

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
    files: Iterable,
    objects: dict[str, S3Object],
    loc: S3Location,
    node_md5: Callable[[list], dict[str, str | Exception]],
) -> dict[str, S3Match]:
    """Match each file (an inventory Entry) against the object under its key.

    `node_md5(entries)` computes MD5s on the node for the entries whose object
    has a plain ETag and the same size: path -> hex digest, or the error.
    """
    result: dict[str, S3Match] = {}
    need_md5 = []
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
            need_md5.append(f)
    digests = node_md5(need_md5) if need_md5 else {}
    for f in need_md5:
        obj = objects[f.path]
        got = digests.get(f.path)
        if isinstance(got, str) and got == obj.md5:
            result[f.path] = S3Match(f.path, MD5_MATCH, obj.key, obj.size, obj.etag, got)
        elif isinstance(got, str):
            result[f.path] = S3Match(f.path, MD5_MISMATCH, obj.key, obj.size, obj.etag, got,
                                     detail=f"node md5 {got} != ETag {obj.md5}")
        else:
            result[f.path] = S3Match(f.path, MD5_MISMATCH, obj.key, obj.size, obj.etag,
                                     detail=f"md5 on node failed: {got}")
    return result
