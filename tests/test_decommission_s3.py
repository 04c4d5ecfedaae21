"""S3 matching against moto over real HTTP: plain-MD5 ETags verify, multipart ETags match by size only."""

from __future__ import annotations

import json

import pytest

from cli.main import main
from ops.decommission import s3 as s3mod
from tests.support.decommission_tree import MiB, local_files, node_and_bucket, run_wizard, store_mixed

LARGE = {
    "checkpoints/step-100/model.safetensors": 2 * MiB + 1,  # put_object: plain MD5 ETag
    "hidden_states/shard_0000.safetensors": 6 * MiB + 7,  # multipart: "<md5>-2"
    "data/train.jsonl": MiB,  # in S3 with other bytes of the same size
    "data/eval.jsonl": MiB // 2,  # in S3 with another size
    "hidden_states/shard_0001.safetensors": MiB,  # absent
}


@pytest.fixture
def stored(tmp_path, moto_s3, request):
    root, files, s3, bucket = node_and_bucket(tmp_path, request, moto_s3, LARGE)
    key = "runs/r1/"
    store_mixed(s3, bucket, key, files)
    s3.put_object(Bucket=bucket, Key=key + "logs/train.log", Body=files["logs/train.log"])
    return root, files, f"s3://{bucket}/runs/r1", moto_s3


def test_md5_and_multipart_matches_are_told_apart(stored, tmp_path):
    root, files, url, endpoint = stored
    dest = tmp_path / "dest"
    d = run_wizard(root, dest, s3_url=url, s3_endpoint=endpoint)
    status = {p: fs.s3.status for p, fs in d.files.items() if fs.s3 is not None}
    assert status == {
        "checkpoints/step-100/model.safetensors": s3mod.MD5_MATCH,
        "hidden_states/shard_0000.safetensors": s3mod.SIZE_ONLY,
        "data/train.jsonl": s3mod.MD5_MISMATCH,
        "data/eval.jsonl": s3mod.SIZE_MISMATCH,
        "hidden_states/shard_0001.safetensors": s3mod.ABSENT,
    }
    assert d.files["hidden_states/shard_0000.safetensors"].s3.detail == "size matches; 2-part upload"
    v = d.verdict
    assert not v.safe
    assert [(m.path, m.reason.split(":")[0]) for m in v.missing] == [
        ("hidden_states/shard_0000.safetensors", "in S3 by size only (size matches; 2-part upload)")]
    assert "--trust-s3-size" in v.missing[0].said and "--" not in v.missing[0].reason  # each face says how
    assert v.counts.verified_s3_md5 == 1 and v.counts.s3_size_only == 1
    in_s3 = {"checkpoints/step-100/model.safetensors", "hidden_states/shard_0000.safetensors"}
    assert local_files(dest) == {p: b for p, b in files.items() if p not in in_s3}
    rec = {f["path"]: f for f in json.loads((dest / "manifest.json").read_text())["files"]}
    ck = rec["checkpoints/step-100/model.safetensors"]
    assert ck["verified_by"] == "s3-md5" and ck["md5"]
    assert ck["source"].endswith("runs/r1/checkpoints/step-100/model.safetensors")
    assert rec["hidden_states/shard_0000.safetensors"]["verified"] is False
    progress = (dest / "PROGRESS.md").read_text()
    assert "Size-only matches (multipart ETag, or encrypted without a SHA-256): 1 (0 trusted" in progress


def test_trust_s3_size_accepts_multipart_and_include_downloads_it(stored, tmp_path):
    root, files, url, endpoint = stored
    d = run_wizard(root, tmp_path / "d1", s3_url=url, s3_endpoint=endpoint, trust_s3_size=True)
    assert d.verdict.safe, d.verdict.missing
    assert d.verdict.counts.s3_size_only_trusted == 1
    d = run_wizard(root, tmp_path / "d2", s3_url=url, s3_endpoint=endpoint, include={"hidden_states"})
    assert d.verdict.safe, d.verdict.missing
    assert (tmp_path / "d2/files/hidden_states/shard_0000.safetensors").read_bytes() == \
        files["hidden_states/shard_0000.safetensors"]


def test_cli_s3_errors_are_one_line(stored, tmp_path, capsys):
    root, _, url, endpoint = stored
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{root}"\n')
    rc = main(["--config", str(cfg), "decommission", "local", "--dest", str(tmp_path / "d"), "--dry-run",
               "--s3", "s3://no-such-bucket/x", "--s3-endpoint", endpoint])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("nodedeck: s3://no-such-bucket/x/: NoSuchBucket") and err.count("\n") == 1
    rc = main(["--config", str(cfg), "decommission", "local", "--dest", str(tmp_path / "d"), "--dry-run",
               "--json", "--s3", url, "--s3-endpoint", endpoint])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert rc == 1 and lines[-1]["dry_run"] and not (tmp_path / "d").exists()
    s3_done = next(x for x in lines if x.get("step") == "s3" and x["kind"] == "done")
    assert s3_done["data"]["matches"] == {"md5": 1, "size-only": 1, "md5-mismatch": 1, "size-mismatch": 1,
                                          "absent": 1}
