"""A node work tree with awkward names for the decommission tests, a byte+mtime snapshot, a wizard run on
this machine, a moto S3 and a node tree with a bucket of the test's own."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from ops.decommission.wizard import Decommission

MiB = 1 << 20
MTIME_NS = 1_600_000_000_123_456_789

SMALL = {
    "run train.sh": b"#!/bin/sh\necho train\n",
    "sub dir/it's \"q\" \u00fc/$(touch pwned) -a.sh": b"echo hi\n",
    "-leading dash.txt": b"dash\n",
    "new\nline.log": b"a log line\n",
    "tab\there.md": b"# notes\n",
    "back\\slash.json": b'{"a": 1}\n',
    "\u00fcn\u00ef/\u00e7\u00f8d\u00e9.yaml": b"k: v\n",
    "star*?[x].txt": b"glob\n",
    "out/drafter/config.json": b'{"architectures": ["LlamaForCausalLMEagle3"]}\n',
    "logs/train.log": b"step 1\nstep 2\n",
    "runs/train/metrics.jsonl": b'{"step": 1, "loss": 3.5, "lr": 0.0001}\n{"step": 2, "loss": 2.25, "lr": 0.0002}\n',
}


def _blob(seed: str, size: int) -> bytes:
    out = bytearray()
    block = hashlib.sha256(seed.encode()).digest()
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block * 64
    return bytes(out[:size])


LARGE = {
    "checkpoints/step-100/model.safetensors": 3 * MiB + 17,
    "data/train.jsonl": MiB + 5,
    "hidden_states/shard_0000.safetensors": 2 * MiB,
}


def make_tree(root: Path, large: dict[str, int] | None = None) -> dict[str, bytes]:
    """Write the tree; returns path -> content of every regular file."""
    files = dict(SMALL)
    for path, size in (LARGE if large is None else large).items():
        files[path] = _blob(path, size)
    for path, data in files.items():
        p = root / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    os.chmod(root / "run train.sh", 0o755)
    os.chmod(root / "-leading dash.txt", 0o600)
    (root / "empty dir").mkdir()
    os.symlink("checkpoints/step-100", root / "latest")
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames + dirnames:
            os.utime(os.path.join(dirpath, name), ns=(MTIME_NS, MTIME_NS), follow_symlinks=False)
    return files


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under root: mode, size, mtime_ns, and sha256 (files) or target (links)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if os.path.islink(p):
                extra = os.readlink(p)
            elif os.path.isfile(p):
                extra = hashlib.sha256(Path(p).read_bytes()).hexdigest()
            else:
                extra = None
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_size if extra is not None else 0, st.st_mtime_ns, extra)
    return out


def run_wizard(root: Path, dest: Path, on_event=None, **opts) -> Decommission:
    """The decommission of node `local` (this machine) rooted at root into dest, run to its verdict;
    opts are the wizard's Options."""
    from ops.decommission.inputs import Options
    from ops.decommission.wizard import Decommission
    from ops.hosts.local import LocalHost

    d = Decommission(LocalHost(), "local", str(root), Options(dest, **opts), on_event=on_event)
    d.run()
    return d


def local_files(dest: Path) -> dict[str, bytes]:
    base = dest / "files"
    return {os.path.relpath(os.path.join(d, f), base): Path(d, f).read_bytes()
            for d, _, fs in os.walk(base) for f in fs if not os.path.islink(os.path.join(d, f))}


def node_and_bucket(tmp_path: Path, request, endpoint: str, large: dict[str, int]):
    """The node's tree (make_tree with `large`) in tmp_path/node, and an empty bucket named after the
    running test on the S3 at endpoint: (root, files, S3 client, bucket)."""
    import boto3

    root = tmp_path / "node"
    root.mkdir()
    files = make_tree(root, large)
    bucket = request.node.name.replace("_", "-")[:50].lower().strip("-")  # S3: lower case, dashes
    s3 = boto3.client("s3", endpoint_url=endpoint)
    s3.create_bucket(Bucket=bucket)
    return root, files, s3, bucket


def store_mixed(s3, bucket: str, key: str, files: dict[str, bytes]) -> None:
    """Under `key` in the bucket: the checkpoint with a plain-MD5 ETag, the first hidden-state shard as a
    two-part multipart upload ("<md5>-2": size only), train.jsonl as other bytes of its size and eval.jsonl
    as other bytes of another size."""
    s3.put_object(Bucket=bucket, Key=key + "checkpoints/step-100/model.safetensors",
                  Body=files["checkpoints/step-100/model.safetensors"])
    shard = key + "hidden_states/shard_0000.safetensors"
    big = files["hidden_states/shard_0000.safetensors"]
    up = s3.create_multipart_upload(Bucket=bucket, Key=shard)
    parts = []
    for n, chunk in enumerate((big[: 5 * MiB], big[5 * MiB:]), 1):
        r = s3.upload_part(Bucket=bucket, Key=shard, PartNumber=n, UploadId=up["UploadId"], Body=chunk)
        parts.append({"PartNumber": n, "ETag": r["ETag"]})
    s3.complete_multipart_upload(Bucket=bucket, Key=shard, UploadId=up["UploadId"],
                                 MultipartUpload={"Parts": parts})
    s3.put_object(Bucket=bucket, Key=key + "data/train.jsonl", Body=b"x" * len(files["data/train.jsonl"]))
    s3.put_object(Bucket=bucket, Key=key + "data/eval.jsonl", Body=b"short")


@pytest.fixture(scope="module")
def moto_s3():
    """A real HTTP S3 (moto) on 127.0.0.1; yields its endpoint URL. Fake credentials in the env."""
    from moto.server import ThreadedMotoServer

    mp = pytest.MonkeyPatch()
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": "/nonexistent",
                 "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}.items():
        mp.setenv(k, v)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()
    mp.undo()
