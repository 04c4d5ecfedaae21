"""The decommission wizard against a real sshd: OpenSSH streams, resume after the node drops, SFTP fallback."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import subprocess
import sys
import threading
from pathlib import Path

import boto3
import pytest

from ops.decommission.for_node import decommission_on
from ops.decommission.inputs import Options
from ops.decommission.transfer import part_path
from ops.nodes import get_node, load_nodes, open_host
from tests.support.decommission_tree import MiB, local_files, make_tree, snapshot

NODEDECK = str(Path(sys.executable).with_name("nodedeck"))


def _nodes_toml(tmp_path: Path, sshd, root: Path) -> Path:
    p = tmp_path / "nodes.toml"
    p.write_text(
        f'[nodes.tn]\nssh = "testnode"\nssh_config = "{sshd.ssh_config}"\nroot = "{root}"\nconnect_timeout = 2\n'
    )
    return p


def _node_tree(tmp_path: Path, large=None):
    root = tmp_path / "node"
    root.mkdir()
    return root, make_tree(root, large)


def test_cli_over_ssh_preserves_awkward_names_checks_s3_and_changes_nothing(sshd, tmp_path, moto_s3):
    root, files = _node_tree(tmp_path)
    s3 = boto3.client("s3", endpoint_url=moto_s3)
    s3.create_bucket(Bucket="keep")
    s3.put_object(Bucket="keep", Key="runs/hidden_states/shard_0000.safetensors",
                  Body=files["hidden_states/shard_0000.safetensors"])
    before = snapshot(root)
    dest = tmp_path / "dest"
    cfg = _nodes_toml(tmp_path, sshd, root)
    p = subprocess.run(
        [NODEDECK, "--config", str(cfg), "decommission", "tn", "--dest", str(dest), "--yes", "--json",
         "--s3", "s3://keep/runs", "--s3-endpoint", moto_s3],
        capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 0, p.stderr + p.stdout
    events = [json.loads(line) for line in p.stdout.splitlines()]
    verdict = events[-1]
    assert verdict["event"] == "verdict" and verdict["safe"] and verdict["headline"] == "SAFE TO SHUT DOWN"
    assert verdict["counts"]["verified_s3_md5"] == 1
    assert any(e.get("step") == "download" and e["kind"] == "progress" and e.get("rate") is not None for e in events)
    in_s3 = "hidden_states/shard_0000.safetensors"
    expected = {k: v for k, v in files.items() if k != in_s3}
    assert local_files(dest) == expected
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["transfer"].startswith("OpenSSH ssh")
    rec = {f["path"]: f for f in manifest["files"]}
    assert rec[in_s3]["source"] == f"s3://keep/runs/{in_s3}" and rec[in_s3]["verified_by"] == "s3-md5"
    assert rec["new\nline.log"]["verified"]
    assert snapshot(root) == before
    assert not (root / "pwned").exists()


def test_node_dropping_mid_download_then_rerun_resumes_without_refetching(sshd, tmp_path):
    # bigger than what socket buffers still deliver once sshd is gone
    root, files = _node_tree(tmp_path, {"big/a.bin": 24 * MiB, "big/b.bin": 2 * MiB})
    before = snapshot(root)
    node = get_node(load_nodes(_nodes_toml(tmp_path, sshd, root)), "tn")
    dest = tmp_path / "dest"
    dropped = threading.Event()

    def drop(ev):
        if ev.step == "download" and ev.kind == "progress" and (ev.done or 0) > 0 and not dropped.is_set():
            dropped.set()
            sshd.stop()

    host = open_host(node)  # one stream: the biggest file comes first and is cut in its first MiB
    d = decommission_on(host, node, Options(dest, streams=1), on_event=drop)
    d.run()
    host.close()
    assert dropped.is_set() and not d.verdict.safe
    partial = {p: part_path(dest, p).stat().st_size for p in files if part_path(dest, p).exists()}
    assert "big/a.bin" in partial and all(0 < n < len(files[p]) for p, n in partial.items())
    reasons = " ".join(m.reason for m in d.verdict.missing)
    assert "download failed: connection lost" in reasons

    sshd.start()
    host = open_host(node)
    d2 = decommission_on(host, node, Options(dest, streams=2))
    d2.run()
    host.close()
    assert d2.verdict.safe, d2.verdict.missing
    assert local_files(dest) == files
    for p, have in partial.items():
        job = d2.files[p].job
        assert job.offset == have and job.transferred == len(files[p]) - have
    done_before = {p for p, fs in d.files.items() if fs.job and fs.job.state == "done"}
    assert all(d2.files[p].job.transferred == 0 for p in done_before)
    assert snapshot(root) == before


def test_sftp_fallback_resumes_a_partial_file(sshd, tmp_path):
    root, files = _node_tree(tmp_path, {"checkpoints/step-1/model.pt": 2 * MiB})
    node = get_node(load_nodes(_nodes_toml(tmp_path, sshd, root)), "tn")
    dest = tmp_path / "dest"
    ckpt = "checkpoints/step-1/model.pt"
    part = part_path(dest, ckpt)
    part.parent.mkdir(parents=True)
    part.write_bytes(files[ckpt][:MiB + 3])
    host = open_host(node)
    d = decommission_on(host, node, Options(dest))
    d.ssh_argv = None  # as when no OpenSSH client is installed here
    d.run()
    host.close()
    assert d.verdict.safe, d.verdict.missing
    assert d.transfer_note == "SFTP through the node connection"
    assert local_files(dest) == files
    assert d.files[ckpt].job.transferred == len(files[ckpt]) - (MiB + 3)


def test_sftp_fallback_takes_names_that_are_not_utf8(sshd, tmp_path):
    root, files = _node_tree(tmp_path, {"big.bin": MiB + 1})
    odd = {b"caf\xe9.bin": b"latin-1 name\n", b"z\xff\xfe/inner.txt": b"inside\n"}
    for name, data in odd.items():
        p = os.path.join(os.fsencode(root), name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
    node = get_node(load_nodes(_nodes_toml(tmp_path, sshd, root)), "tn")
    dest = tmp_path / "dest"
    host = open_host(node)
    d = decommission_on(host, node, Options(dest, streams=1))  # one stream: the odd names come between others
    d.ssh_argv = None
    d.run()
    host.close()
    assert d.transfer_note == "SFTP through the node connection"
    assert d.verdict.safe, d.verdict.missing
    for name, data in odd.items():
        with open(os.path.join(os.fsencode(dest / "files"), name), "rb") as f:
            assert f.read() == data
    assert local_files(dest) == {**files, **{n.decode("utf-8", "surrogateescape"): v for n, v in odd.items()}}


def test_openssh_streams_hash_on_the_node_in_the_same_read(sshd, tmp_path, monkeypatch):
    import ops.decommission.verify as verify

    root, files = _node_tree(tmp_path)
    node = get_node(load_nodes(_nodes_toml(tmp_path, sshd, root)), "tn")
    dest = tmp_path / "dest"
    ckpt = "checkpoints/step-100/model.safetensors"
    part = part_path(dest, ckpt)
    part.parent.mkdir(parents=True)
    part.write_bytes(files[ckpt][:MiB])  # resumed: the node hashes its first MiB again, without sending it
    hashed_after: list[str] = []
    real = verify.node_digests

    def second_pass(host, items, **kw):
        hashed_after.extend(p for p, _ in items)
        return real(host, items, **kw)

    monkeypatch.setattr(verify, "node_digests", second_pass)
    host = open_host(node)
    d = decommission_on(host, node, Options(dest, streams=2))
    d.run()
    host.close()
    assert d.transfer_note.startswith("OpenSSH ssh")
    assert d.verdict.safe, d.verdict.missing
    assert hashed_after == []  # every digest came with the bytes
    assert d.files[ckpt].job.transferred == len(files[ckpt]) - MiB
    assert local_files(dest) == files


@pytest.mark.parametrize("python", [True, False], ids=["python-sender", "shell-sender"])
def test_both_node_senders_answer_alike(sshd, tmp_path, python):
    """Resume, a limit, a file that shrinks before it is read, a missing file: same answers from both loops."""
    from ops.decommission.localtree import DestTree
    from ops.decommission.transfer import Downloader, FileJob, OpenSSHStream, TransferProgress, openssh_argv

    root = tmp_path / "node"
    root.mkdir()
    data = {"whole.bin": os.urandom(3 * MiB + 5), "resumed.bin": os.urandom(MiB + 7), "log.txt": b"a\n" * 1000,
            "shrinks.bin": os.urandom(2 * MiB), "odd \udce9\n name": b"odd\n"}  # not UTF-8
    for name, blob in data.items():
        (root / name).write_bytes(blob)
    dest = tmp_path / "dest"
    tree = DestTree(dest)
    part = part_path(dest, "resumed.bin")
    part.write_bytes(data["resumed.bin"][:MiB])
    jobs = {n: FileJob(n, str(root / n), len(b), 0, 0o644) for n, b in data.items()}
    jobs["log.txt"].limit = 600  # a growing log: only the length listed
    jobs["gone.bin"] = FileJob("gone.bin", str(root / "gone.bin"), 10, 0, 0o644)
    (root / "shrinks.bin").write_bytes(data["shrinks.bin"][:MiB])  # shorter than listed when it is read
    node = get_node(load_nodes(_nodes_toml(tmp_path, sshd, root)), "tn")
    host = open_host(node)
    argv = openssh_argv(host.target)
    host.close()
    Downloader(lambda: OpenSSHStream(argv, python=python), tree, streams=2).run(
        list(jobs.values()), TransferProgress(0, len(jobs), None))
    expect = {"whole.bin": data["whole.bin"], "resumed.bin": data["resumed.bin"], "log.txt": data["log.txt"][:600],
              "shrinks.bin": data["shrinks.bin"][:MiB], "odd \udce9\n name": b"odd\n"}
    for name, blob in expect.items():
        job = jobs[name]
        assert job.state == "done", (name, job.error)
        assert (dest / "files" / name).read_bytes() == blob
        assert job.sha256 == job.node_sha256 == hashlib.sha256(blob).hexdigest(), name
    assert jobs["shrinks.bin"].node_size == MiB  # what the node held when asked
    assert jobs["resumed.bin"].transferred == len(data["resumed.bin"]) - MiB
    assert jobs["gone.bin"].state == "failed" and "missing" in jobs["gone.bin"].error
    tree.close()


DIGEST = hashlib.sha256(b"a\n" * 300).hexdigest()
DD_LINE = "600 bytes copied, 0.000123 s, 4.9 MB/s"


@pytest.mark.parametrize("report, expect", [
    (f"1+1 records in\n1+1 records out\n{DD_LINE}\nrc 0\n{DIGEST}  -\n", f"600 0 {DIGEST}"),
    # GNU dd writes its line, then the newline: the digest can come in between (seen once under load)
    (f"1+1 records in\n1+1 records out\n{DD_LINE}{DIGEST}  -\n\nrc 0\n", f"600 0 {DIGEST}"),
    (f"{DIGEST}  -\n1+1 records in\n1+1 records out\n{DD_LINE}\nrc 0\n", f"600 0 {DIGEST}"),
    (f"{DD_LINE}\nrc 1\n", "600 1 -"),                       # no digest: none is made up
    (f"{DD_LINE}\nrc 0\nabc  -\n", "600 0 -"),              # not a digest
    ("dd: error reading '/x': Input/output error\nrc 1\n", "0 1 -"),
], ids=["in-order", "digest-inside-dd-line", "digest-first", "no-digest", "short-digest", "dd-failed"])
def test_shell_sender_reads_dd_and_sha256sum_however_their_writes_interleave(report, expect):
    from ops.decommission.transfer import _TALLY_SH

    out = subprocess.run(["bash", "-c", _TALLY_SH + 'tally <<< "$1"', "tally", report.rstrip("\n")],
                         capture_output=True, text=True, check=True).stdout
    assert out == expect + "\n"


def test_unusable_openssh_falls_back_to_sftp_and_says_why(sshd, tmp_path):
    root, files = _node_tree(tmp_path, {"big.bin": MiB})
    node = get_node(load_nodes(_nodes_toml(tmp_path, sshd, root)), "tn")
    host = open_host(node)
    d = decommission_on(host, node, Options(tmp_path / "dest"))
    d.ssh_argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=3", "-p", "1", "127.0.0.1"]  # refused
    d.run()
    host.close()
    assert d.verdict.safe, d.verdict.missing
    assert d.transfer_note == "SFTP through the node connection"
    assert any(w.startswith("OpenSSH ssh unusable (") for w in d.verdict.warnings)
    assert local_files(tmp_path / "dest") == files


def test_the_openssh_streams_read_the_ssh_config_ssh_host_read(sshd, tmp_path, monkeypatch):
    """`ssh_config = "~/..."` is the password database's home (README), for the streams too: they expanded `~`
    with $HOME and read another file (or none) than the one the node's connection was resolved from."""
    from ops.decommission.transfer import openssh_argv
    from ops.hosts.ssh_target import resolve

    monkeypatch.setenv("HOME", str(tmp_path / "not-the-home"))
    home = pwd.getpwuid(os.getuid()).pw_dir
    argv = openssh_argv(resolve("testnode", "~/" + os.path.relpath(sshd.ssh_config, home)))
    assert os.path.realpath(argv[argv.index("-F") + 1]) == os.path.realpath(sshd.ssh_config)
