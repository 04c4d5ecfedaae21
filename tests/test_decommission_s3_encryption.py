"""S3 objects as they are stored in the field: SSE-KMS/SSE-C ETags are not MD5s, stored full-object
checksums, AWS profiles. Against moto's S3 over real HTTP (HeadObject with ChecksumMode=ENABLED)."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import Stubber

from cli.main import main
from ops.decommission import s3 as s3mod
from tests.support.decommission_tree import MiB, node_and_bucket, run_wizard

LARGE = {
    "checkpoints/kms-sha256/model.safetensors": MiB + 3,     # SSE-KMS with a stored SHA-256: compared by it
    "checkpoints/kms-crc32/model.safetensors": MiB + 5,      # SSE-KMS with only a CRC32: size only
    "checkpoints/kms-other/model.safetensors": MiB + 7,      # SSE-KMS, SHA-256 of other bytes of the same size
    "checkpoints/sse-s3/model.safetensors": MiB + 9,         # SSE-S3: the ETag is the MD5
}


@pytest.fixture
def stored(tmp_path, moto_s3, request):
    root, files, s3, bucket = node_and_bucket(tmp_path, request, moto_s3, LARGE)
    kms = boto3.client("kms", endpoint_url=moto_s3)
    key_id = kms.create_key()["KeyMetadata"]["KeyId"]
    p = "runs/r1/"
    kms_args = {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": key_id}
    s3.put_object(Bucket=bucket, Key=p + "checkpoints/kms-sha256/model.safetensors",
                  Body=files["checkpoints/kms-sha256/model.safetensors"], ChecksumAlgorithm="SHA256", **kms_args)
    s3.put_object(Bucket=bucket, Key=p + "checkpoints/kms-crc32/model.safetensors",
                  Body=files["checkpoints/kms-crc32/model.safetensors"], ChecksumAlgorithm="CRC32", **kms_args)
    s3.put_object(Bucket=bucket, Key=p + "checkpoints/kms-other/model.safetensors",
                  Body=b"y" * (MiB + 7), ChecksumAlgorithm="SHA256", **kms_args)
    s3.put_object(Bucket=bucket, Key=p + "checkpoints/sse-s3/model.safetensors",
                  Body=files["checkpoints/sse-s3/model.safetensors"], ServerSideEncryption="AES256")
    return root, files, f"s3://{bucket}/runs/r1", moto_s3


def test_kms_objects_are_compared_by_their_stored_checksum_not_the_etag(stored, tmp_path):
    root, files, url, endpoint = stored
    d = run_wizard(root, tmp_path / "dest", s3_url=url, s3_endpoint=endpoint)
    s = {p: fs.s3 for p, fs in d.files.items() if fs.s3 is not None and p in LARGE}
    assert {p: m.status for p, m in s.items()} == {
        "checkpoints/kms-sha256/model.safetensors": s3mod.CHECKSUM_MATCH,
        "checkpoints/kms-crc32/model.safetensors": s3mod.SIZE_ONLY,     # its ETag looks like an MD5: not trusted
        "checkpoints/kms-other/model.safetensors": s3mod.CHECKSUM_MISMATCH,
        "checkpoints/sse-s3/model.safetensors": s3mod.MD5_MATCH,
    }
    assert s["checkpoints/kms-crc32/model.safetensors"].detail == (
        "size matches; aws:kms object: its ETag is not an MD5 and S3 stores CRC32 "
        "(a SHA-256 checksum is needed to compare)")
    assert "!= stored SHA-256" in s["checkpoints/kms-other/model.safetensors"].detail
    v = d.verdict
    assert v.counts.verified_s3_sha256 == 1 and v.counts.verified_s3_md5 == 1
    missing = {m.path: m.reason for m in v.missing}
    assert missing["checkpoints/kms-crc32/model.safetensors"].startswith("in S3 by size only (size matches; aws:kms")
    rec = {f["path"]: f for f in json.loads((tmp_path / "dest" / "manifest.json").read_text())["files"]}
    assert rec["checkpoints/kms-sha256/model.safetensors"]["verified_by"] == "s3-sha256"
    # the mismatching object was not trusted: the node's file was downloaded instead
    assert (tmp_path / "dest/files/checkpoints/kms-other/model.safetensors").read_bytes() == \
        files["checkpoints/kms-other/model.safetensors"]


def test_head_object_reads_encryption_and_full_object_checksums(stored):
    _, _, url, endpoint = stored
    loc = s3mod.parse_s3_url(url)
    client = s3mod.make_client(endpoint)
    h = s3mod.head_object(client, loc.bucket, loc.key("checkpoints/kms-sha256/model.safetensors"))
    assert h.encryption == "aws:kms" and not h.etag_is_md5 and set(h.checksums) == {"SHA256"}
    assert s3mod.head_object(client, loc.bucket, loc.key("checkpoints/sse-s3/model.safetensors")).etag_is_md5


def test_sse_c_object_answers_400_without_its_key():
    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(client) as stub:
        stub.add_client_error("head_object", service_error_code="400", http_status_code=400)
        assert s3mod.head_object(client, "b", "k") == s3mod.ObjectHead("SSE-C")
    with Stubber(client) as stub:
        stub.add_response("head_object", {"ContentLength": 5, "ETag": '"abc"', "SSECustomerAlgorithm": "AES256"})
        assert s3mod.head_object(client, "b", "k").encryption == "SSE-C"
    with Stubber(client) as stub:     # a composite (per-part) checksum is not the file's
        stub.add_response("head_object", {"ContentLength": 5, "ChecksumSHA256": "AAAA-3", "ChecksumType": "COMPOSITE"})
        assert s3mod.head_object(client, "b", "k").checksums == {}


def _cfg(tmp_path, root):
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{root}"\n')
    return cfg


def test_s3_profile_option_selects_the_profile(stored, tmp_path, monkeypatch, capsys):
    root, _, url, endpoint = stored
    creds = tmp_path / "credentials"
    creds.write_text("[field-test]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    args = ["--config", str(_cfg(tmp_path, root)), "decommission", "local", "--dest", str(tmp_path / "d"),
            "--dry-run", "--json", "--s3", url, "--s3-endpoint", endpoint]
    assert main(args) == 2                                    # no credentials without the profile
    assert "no AWS credentials" in capsys.readouterr().err
    assert main(args + ["--s3-profile", "field-test"]) == 1   # a dry run never says SAFE
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    done = next(x for x in lines if x.get("step") == "s3" and x["kind"] == "done")
    assert done["data"]["objects"] == 4
    assert main(args + ["--s3-profile", "no-such-profile"]) == 2
    err = capsys.readouterr().err
    assert err == "nodedeck: --s3-profile no-such-profile: no such profile in the AWS config files\n"
