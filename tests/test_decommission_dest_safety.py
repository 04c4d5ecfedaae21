"""Adversarial: nothing a decommission writes, chmods or re-times lies outside --dest.

The node tree changes kind between two runs (a symlink becomes a directory and
back), names are hostile (newline, backslash, non-UTF-8 bytes), symlinks point
outside, and leftovers planted in the destination point outside too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from ops.decommission.inputs import Options
from ops.decommission.transfer import part_path
from ops.decommission.wizard import Decommission
from ops.hosts.local import LocalHost
from tests.support.decommission_tree import run_wizard

HOSTILE = [b"new\nline.bin", b"back\\slash.bin", b"caf\xe9-latin1.bin", b"-dash \xff\xfe.bin"]


def _victim(tmp_path: Path) -> tuple[Path, dict]:
    """A directory outside --dest with files the download must never touch; and its snapshot."""
    victim = tmp_path / "victim"
    victim.mkdir()
    for name in [b"x.bin", *HOSTILE]:
        p = os.path.join(os.fsencode(victim), name)
        with open(p, "wb") as f:
            f.write(b"precious " + name)
        os.chmod(p, 0o640)
        os.utime(p, ns=(10**18, 10**18))
    os.chmod(victim, 0o750)
    os.utime(victim, ns=(10**18, 10**18))
    return victim, _snap(victim)


def _snap(top: Path) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(os.fsencode(top)):
        for name in [b"."] + dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            digest = hashlib.sha256(open(p, "rb").read()).hexdigest() if os.path.isfile(p) else None
            out[os.path.relpath(p, os.fsencode(top))] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return out


def _fill(d: Path, tag: bytes) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name in [b"x.bin", *HOSTILE]:
        with open(os.path.join(os.fsencode(d), name), "wb") as f:
            f.write(tag + name)


def test_symlink_then_directory_on_the_node_never_writes_through_the_local_link(tmp_path):
    victim, before = _victim(tmp_path)
    root = tmp_path / "node"
    root.mkdir()
    (root / "keep.txt").write_text("k\n")
    os.symlink(str(victim), root / "a")  # run 1: `a` is a link pointing outside
    os.symlink("/etc", root / "etc-link")
    dest = tmp_path / "dest"
    d1 = run_wizard(root, dest, accept_outside_links=True)  # their data is not preserved: accepted here
    assert d1.verdict.safe, d1.verdict.missing
    assert os.readlink(dest / "files/a") == str(victim)  # recreated as a link, never traversed
    assert os.readlink(dest / "files/etc-link") == "/etc"

    (root / "a").unlink()  # run 2: `a` is a real directory with hostile names
    _fill(root / "a", b"node ")
    os.chmod(root / "a", 0o700)
    d2 = run_wizard(root, dest, accept_outside_links=True)  # etc-link still leads out

    assert _snap(victim) == before, "a file outside --dest was written, chmodded or re-timed"
    local = dest / "files/a"
    assert local.is_dir() and not local.is_symlink()
    for name in [b"x.bin", *HOSTILE]:
        with open(os.path.join(os.fsencode(local), name), "rb") as f:
            assert f.read() == b"node " + name
    assert d2.verdict.safe, d2.verdict.missing
    said = " ".join(d2.verdict.to_json()["warnings"])
    assert "a: was a symlink in the destination, now a directory on the node" in said


def test_directory_then_symlink_on_the_node_moves_the_old_copy_aside(tmp_path):
    victim, before = _victim(tmp_path)
    root = tmp_path / "node"
    _fill(root / "a", b"v1 ")
    dest = tmp_path / "dest"
    assert run_wizard(root, dest).verdict.safe
    shutil.rmtree(root / "a")
    os.symlink(str(victim), root / "a")
    d2 = run_wizard(root, dest, accept_outside_links=True)  # the victim's data is not preserved: accepted here
    assert d2.verdict.safe, d2.verdict.missing
    assert os.readlink(dest / "files/a") == str(victim)
    assert _snap(victim) == before
    warnings = d2.verdict.to_json()["warnings"]
    moved = [w for w in warnings if w.startswith("a: was a directory in the destination, now a symlink")]
    assert moved, warnings
    aside = dest / moved[0].rsplit("moved to ", 1)[1]
    assert (aside / "x.bin").read_bytes() == b"v1 x.bin"  # the earlier copy is kept, not deleted


def test_file_and_directory_swapping_kinds_are_handled(tmp_path):
    root = tmp_path / "node"
    _fill(root / "a", b"dir ")
    (root / "b").write_bytes(b"file b")
    dest = tmp_path / "dest"
    assert run_wizard(root, dest).verdict.safe
    shutil.rmtree(root / "a")
    (root / "a").write_bytes(b"now a file")
    (root / "b").unlink()
    _fill(root / "b", b"now a dir ")
    d = run_wizard(root, dest)
    assert d.verdict.safe, d.verdict.missing
    assert (dest / "files/a").read_bytes() == b"now a file"
    assert (dest / "files/b/x.bin").read_bytes() == b"now a dir x.bin"
    said = " ".join(d.verdict.to_json()["warnings"])
    assert "a: was a directory in the destination, now a file" in said
    assert "b: was a file in the destination, now a directory" in said


def test_planted_links_in_the_destination_are_never_followed(tmp_path):
    victim, before = _victim(tmp_path)
    root = tmp_path / "node"
    _fill(root / "d", b"node, longer than precious ")
    dest = tmp_path / "dest"
    # a partial download and a finished file that are links to files outside --dest
    part = part_path(dest, "d/x.bin")
    part.parent.mkdir(parents=True)
    os.symlink(victim / "x.bin", part)
    (dest / "files/d").mkdir(parents=True)
    os.symlink(os.path.join(os.fsencode(victim), HOSTILE[2]), os.path.join(os.fsencode(dest / "files/d"), HOSTILE[2]))
    d = run_wizard(root, dest)
    assert _snap(victim) == before
    assert d.verdict.safe, d.verdict.missing
    assert (dest / "files/d/x.bin").read_bytes() == b"node, longer than precious x.bin"
    assert not os.path.islink(os.path.join(os.fsencode(dest / "files/d"), HOSTILE[2]))


def test_a_files_directory_that_is_a_link_is_refused(tmp_path):
    victim, before = _victim(tmp_path)
    root = tmp_path / "node"
    _fill(root, b"node ")
    dest = tmp_path / "dest"
    dest.mkdir()
    os.symlink(victim, dest / "files")
    d = Decommission(LocalHost(), "local", str(root), Options(dest))
    try:
        d.run()
    except Exception as e:  # noqa: BLE001 - any refusal is fine, as long as it is a clear one
        assert "files" in str(e) and "symlink" in str(e)
    else:
        raise AssertionError("a --dest/files that is a link was used")
    assert _snap(victim) == before


def test_long_names_are_preserved(tmp_path):
    root = tmp_path / "node"
    root.mkdir()
    names = ["n" * 241 + ".bin", "m" * 255, "\u00e9" * 127]  # 244, 255 and 254 bytes
    for n in names:
        (root / n).write_bytes(n.encode()[:50])
    d = run_wizard(root, tmp_path / "dest")
    assert d.verdict.safe, d.verdict.missing
    for n in names:
        assert (tmp_path / "dest/files" / n).read_bytes() == n.encode()[:50]


def test_fifos_and_sockets_skipped_are_said_on_the_console_and_in_the_json_verdict(tmp_path, capsys):
    import json
    import socket

    from cli.main import main

    root = tmp_path / "node"
    root.mkdir()
    (root / "a.txt").write_text("a\n")
    os.mkfifo(root / "queue.fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "server.sock"))
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{root}"\n')
    try:
        rc = main(["--config", str(cfg), "decommission", "local", "--dest", str(tmp_path / "d1"), "--yes"])
        out = capsys.readouterr().out
        assert rc == 0
        for line in ("queue.fifo: FIFO (named pipe) skipped", "server.sock: socket skipped"):
            assert out.count(line) == 2, out  # when found, and again with the verdict
        rc = main(["--config", str(cfg), "decommission", "local", "--dest", str(tmp_path / "d2"), "--yes", "--json"])
        verdict = json.loads(capsys.readouterr().out.splitlines()[-1])
    finally:
        sock.close()
    assert rc == 0 and verdict["safe"]
    assert sorted(w.split(":")[0] for w in verdict["warnings"]) == ["queue.fifo", "server.sock"]
