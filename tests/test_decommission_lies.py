"""Issue 31 items 4-7: no SAFE verdict on a wrong copy, whatever the node answers (fake commands first on its
PATH behind a real sshd), and no traceback or endless loop on a malformed answer."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from ops.decommission import transfer
from ops.decommission.events import Step, WizardEvent
from ops.decommission.for_node import decommission_on
from ops.decommission.inputs import Options
from ops.decommission.inventory import MAX_STDERR_PROBLEMS, Root, list_roots
from ops.decommission.wizard import Decommission
from ops.nodes import get_node, load_nodes, open_host
from tests.support.decommission_tree import MiB
from tests.support.hostile_node import fake_commands, wrapper

FILES = {"notes.md": b"hello\n", "ckpt/model.bin": os.urandom(2 * MiB + 3)}


def _node(tmp_path: Path, sshd, files=FILES) -> tuple[Path, object]:
    root = tmp_path / "node"
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.tn]\nssh = "testnode"\nssh_config = "{sshd.ssh_config}"\nroot = "{root}"\n'
                   "connect_timeout = 2\n")
    return root, get_node(load_nodes(cfg), "tn")


def _run(node, dest: Path, on_event=None, timeout: float = 90, **opts) -> Decommission:
    """The decommission to its verdict in a thread, which must end within `timeout` (every loop is bounded)."""
    host = open_host(node)
    cancel = threading.Event()
    d = decommission_on(host, node, Options(dest, **opts), on_event=on_event, cancel=cancel)
    errors: list[BaseException] = []

    def go():
        try:
            d.run()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(timeout)
    ended = not t.is_alive()
    if not ended:
        cancel.set()
        t.join(30)
    host.close()
    assert ended, f"the decommission did not end within {timeout} s"
    if errors:
        raise errors[0]
    return d


def _missing(d: Decommission) -> dict[str, str]:
    return {m.path: m.reason for m in d.verdict.missing}


# -- 4. the bytes received here are counted and hashed here -----------------------------------------
_LIAR_SENDER = r'''
import hashlib, sys
MODE = {mode!r}
inp, out = sys.stdin.buffer, sys.stdout.buffer
out.write(b"NDK READY\n"); out.flush()

def field():
    got = bytearray()
    while (c := inp.read(1)) not in (b"", b"\0"):
        got += c
    return None if c == b"" else bytes(got)

while True:
    off, lim, p = field(), field(), field()
    if p is None:
        break
    real = open(p, "rb").read()
    if MODE == "stall":   # says nothing more, until ssh goes (its stdin ends)
        inp.read()
        break
    if MODE == "stall-body":
        out.write(b"NDK OK %d %d\n" % (len(real), len(real)) + real[:1]); out.flush()
        inp.read()
        break
    if MODE == "empty":
        body = b""
    elif MODE == "substitute":
        body = b"sixteen  bytes!\n" if len(real) < 100 else real
    else:  # negative: a size no file has
        out.write(b"NDK OK -7 0\nNDK END 0 0 %s\n" % hashlib.sha256(b"").hexdigest().encode()); out.flush()
        continue
    out.write(b"NDK OK %d %d\n" % (len(body), len(body)) + body)
    out.write(b"NDK END %d 0 %s\n" % (len(body), hashlib.sha256(body).hexdigest().encode()))
    out.flush()
'''


def _lying_sender(sshd, tmp_path: Path, mode: str) -> None:
    prog = tmp_path / "liar.py"
    prog.write_text(_LIAR_SENDER.format(mode=mode))
    fake_commands(sshd, tmp_path / "fakebin", {"sh": wrapper("sh", "nodedeck-sender", prog)})


@pytest.mark.parametrize("mode", ["empty", "substitute"])
def test_a_copy_of_other_bytes_than_listed_is_not_safe(sshd, tmp_path, mode):
    """`NDK OK 0 0` with the sha256 of nothing, or a 16-byte body for a 6-byte file: its hash matches what the
    sender says, but the bytes written here are not the size listed."""
    root, node = _node(tmp_path, sshd)
    _lying_sender(sshd, tmp_path, mode)
    dest = tmp_path / "dest"
    d = _run(node, dest)
    assert d.transfer_note.startswith("OpenSSH ssh")  # the lying sender answered
    assert not d.verdict.safe
    reason = _missing(d)["notes.md"]
    got = 0 if mode == "empty" else 16
    assert f"received {got} bytes" in reason and "6 listed" in reason, reason
    rec = {f["path"]: f for f in json.loads((dest / "manifest.json").read_text())["files"]}
    assert rec["notes.md"]["verified"] is False and rec["notes.md"]["size"] == 6
    if mode == "substitute":
        assert d.files["ckpt/model.bin"].verified  # the honest answers still count


def test_a_negative_size_fails_that_file_and_ends(sshd, tmp_path):
    root, node = _node(tmp_path, sshd)
    _lying_sender(sshd, tmp_path, "negative")
    d = _run(node, tmp_path / "dest", timeout=60)
    missing = _missing(d)
    assert set(missing) >= {"notes.md", "ckpt/model.bin"}
    assert "malformed answer" in missing["notes.md"], missing


@pytest.mark.parametrize("mode", ["stall", "stall-body"])
def test_a_node_that_stops_sending_fails_its_files_within_the_stall_timeout(sshd, tmp_path, monkeypatch, mode):
    """Connected and alive, it answers nothing (or stops mid-file): each stream gives up after STALL_S."""
    monkeypatch.setattr(transfer, "STALL_S", 2.0)
    root, node = _node(tmp_path, sshd)
    _lying_sender(sshd, tmp_path, mode)
    d = _run(node, tmp_path / "dest", timeout=60)
    assert not d.verdict.safe
    assert all("the node sent nothing for 2 s" in _missing(d)[p] for p in FILES), _missing(d)


def test_cancel_ends_a_download_from_a_node_that_stopped_sending(sshd, tmp_path):
    root, node = _node(tmp_path, sshd)
    _lying_sender(sshd, tmp_path, "stall")
    host = open_host(node)
    cancel = threading.Event()
    downloading = threading.Event()
    d = decommission_on(host, node, Options(tmp_path / "dest"), cancel=cancel,
                        on_event=lambda e: downloading.set() if e.step is Step.DOWNLOAD else None)
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    try:
        assert downloading.wait(60), "the download never started"
        time.sleep(1)   # its streams wait on the silent node
        cancel.set()
        t.join(10)
        assert not t.is_alive(), "cancel did not end a download stuck on a silent node"
    finally:
        cancel.set()
        t.join(30)
        host.close()


# -- 5. a file replaced during the download, its size and mtime kept ---------------------------------
@pytest.mark.parametrize("how", ["renamed-over", "rewritten-in-place"])
def test_a_file_replaced_with_its_size_and_mtime_kept_is_not_safe(sshd, tmp_path, how):
    root, node = _node(tmp_path, sshd)
    target = root / "ckpt/model.bin"
    other = os.urandom(len(FILES["ckpt/model.bin"]))

    def replace(ev: WizardEvent) -> None:  # after the bytes came, before the node is listed again
        if ev.message == "checking the node for changes since the listing":
            st = target.stat()
            if how == "renamed-over":
                tmp = target.with_name("new.tmp")
                tmp.write_bytes(other)
                os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))  # touch -r, as cp -p, rsync -t, tar do
                os.replace(tmp, target)
            else:
                target.write_bytes(other)
                os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))

    dest = tmp_path / "dest"
    d = _run(node, dest, on_event=replace)
    assert (dest / "files/ckpt/model.bin").read_bytes() == FILES["ckpt/model.bin"]  # what it was: now stale
    assert not d.verdict.safe
    assert "changed during download" in _missing(d)["ckpt/model.bin"]


def test_a_file_touched_but_not_changed_is_still_safe(sshd, tmp_path):
    """ctime moves (chmod back and forth) with the same bytes: hashed again on the node, found equal."""
    root, node = _node(tmp_path, sshd)
    target = root / "ckpt/model.bin"

    def touch(ev: WizardEvent) -> None:
        if ev.message == "checking the node for changes since the listing":
            mode = target.stat().st_mode
            os.chmod(target, 0o600)
            os.chmod(target, mode)

    d = _run(node, tmp_path / "dest", on_event=touch)
    assert d.verdict.safe, d.verdict.missing


# -- 6. a symlink whose target is not preserved -------------------------------------------------------
def test_a_link_out_of_the_roots_is_named_and_not_safe(sshd, tmp_path):
    root, node = _node(tmp_path, sshd)
    scratch = tmp_path / "scratch" / "ckpt"
    scratch.mkdir(parents=True)
    (scratch / "weights.bin").write_bytes(b"w" * 1000)
    os.symlink(scratch, root / "checkpoints")             # absolute, outside the root
    os.symlink("../scratch/ckpt", root / "rel-out")       # relative, climbing out
    os.symlink("ckpt/model.bin", root / "latest")         # inside: the data is preserved
    os.symlink("checkpoints/weights.bin", root / "via")   # through a link that leaves the root
    dest = tmp_path / "dest"
    d = _run(node, dest)
    assert not d.verdict.safe
    missing = _missing(d)
    for link in ("checkpoints", "rel-out", "via"):
        assert "outside the preserved roots" in missing[link], missing
    assert str(scratch) in missing["checkpoints"]
    assert "latest" not in missing
    links = {x["path"]: x for x in json.loads((dest / "manifest.json").read_text())["links"]}
    assert links["checkpoints"]["target_preserved"] is False and links["latest"]["target_preserved"] is True

    d2 = _run(node, tmp_path / "dest2", accept_outside_links=True)  # the user accepts, explicitly
    assert d2.verdict.safe, d2.verdict.missing
    assert any("checkpoints" in w and "not preserved" in w for w in d2.verdict.warnings)


# -- 7. a malformed listing: per-file reasons, the rest goes on ---------------------------------------
_LIAR_LISTING = r'''
import os, subprocess, sys
args = sys.argv[1:]
i = args.index("nodedeck-inventory")
env = {k: v for k, v in os.environ.items() if k not in ("SSH_CLIENT", "SSH2_CLIENT")}  # as `env -u` would
real = subprocess.run(["/usr/bin/bash", "-c", args[i - 1], *args[i:]], capture_output=True, env=env).stdout
long = "/".join(["d" * 200] * 22) + "/deep.txt"
bad = [b"E\t0\tf\t12", b"E\t0\tf\tbig\t1.0\t1.0\t5\t644\tnonnumeric.txt", b"E\t9\tf\t5\t1.0\t1.0\t5\t644\tnoroot.txt",
       b"E\t0\tf\t5\t1.0\t1.0\t5\t644\t../../etc/escape.txt", b"E\t0\tf\t5\t1.0\t1.0\t5\t644\t/abs/olute.txt",
       b"E\t0\tf\t5\t1.0\t1.0\t5\t644\t" + b"n" * 300 + b".txt", b"E\t0\tf\t5\t1.0\t1.0\t5\t644\t" + long.encode(),
       b"R\tx\tdir\t/nowhere", b"X\t0"]
out = bytearray()
for rec in bad:
    out += rec + b"\0" + (b"\0" if rec.startswith(b"E") else b"")
sys.stdout.buffer.write(real.replace(b"X\t0\t0\0", bytes(out) + b"X\t0\t0\0", 1))
'''


def test_a_malformed_listing_is_reported_per_record_and_the_rest_is_preserved(sshd, tmp_path):
    root, node = _node(tmp_path, sshd)
    prog = tmp_path / "lister.py"
    prog.write_text(_LIAR_LISTING)
    fake_commands(sshd, tmp_path / "fakebin", {"env": wrapper("env", "nodedeck-inventory", prog)})
    dest = tmp_path / "dest"
    d = _run(node, dest)
    assert not d.verdict.safe
    assert all(d.files[p].verified for p in FILES)
    reasons = " | ".join(m.reason for m in d.verdict.missing)
    for expect in ("short record", "size 'big'", "root 9", "'..'", "absolute", "304 bytes", "PATH_MAX",
                   "root index 'x'", "short record 'X"):
        assert expect in reasons, (expect, reasons)
    assert not (tmp_path / "etc").exists() and not Path("/abs/olute.txt").exists()
    rejected = [m for m in d.verdict.missing if "malformed record" in m.reason or "PATH_MAX" in m.reason]
    assert len(rejected) == 9, d.verdict.missing


_NOISY_LISTING = r'''
import os, subprocess, sys
args = sys.argv[1:]
i = args.index("nodedeck-inventory")
env = {k: v for k, v in os.environ.items() if k not in ("SSH_CLIENT", "SSH2_CLIENT")}  # as `env -u` would
sys.stdout.buffer.write(subprocess.run(["/usr/bin/bash", "-c", args[i - 1], *args[i:]], capture_output=True,
                                       env=env).stdout)
err = sys.stderr.buffer
err.write(b"".join(b"find: '/x/%d': Permission denied\n" % n for n in range(200_000)))
err.write(b"\n" * 100_000 + b"\x1b]52;c;aGk=\x07" + b"z" * 1_000_000 + b"\n")
'''


def test_a_listing_s_endless_stderr_blocks_safe_in_a_bounded_number_of_inert_lines(sshd, tmp_path):
    """Each stderr line of the listing is a problem (no SAFE verdict); 200,000 of them, blank lines and a 1 MB
    line with escapes: the first MAX_STDERR_PROBLEMS, each inert and cut, then one line saying there is more."""
    root, node = _node(tmp_path, sshd)
    prog = tmp_path / "lister.py"
    prog.write_text(_NOISY_LISTING)
    fake_commands(sshd, tmp_path / "fakebin", {"env": wrapper("env", "nodedeck-inventory", prog)})
    host = open_host(node)
    try:
        inv = list_roots(host, [Root(str(root), "node")])
    finally:
        host.close()
    assert {e.path for e in inv.files} == set(FILES)
    assert inv.problems[:2] == ["find: '/x/0': Permission denied", "find: '/x/1': Permission denied"]
    assert len(inv.problems) == MAX_STDERR_PROBLEMS + 1, len(inv.problems)
    assert inv.problems[-1].startswith("the listing's stderr goes on") and "MiB" in inv.problems[-1]
    assert all(len(p) <= 300 and "\x1b" not in p for p in inv.problems)


def test_a_path_longer_than_the_node_opens_says_so(sshd, tmp_path):
    """A file deeper than PATH_MAX (find lists it; no open() by name takes it): its own reason, not 'missing'."""
    root, node = _node(tmp_path, sshd)
    fd = os.open(root, os.O_RDONLY)
    for _ in range(22):
        os.mkdir("d" * 200, dir_fd=fd)
        nfd = os.open("d" * 200, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    wfd = os.open("deep.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(wfd, b"deep\n")
    os.close(wfd)
    os.close(fd)
    d = _run(node, tmp_path / "dest")
    deep = next(p for p in _missing(d) if p.endswith("deep.txt"))
    reason = _missing(d)[deep]
    assert "longer than the node's PATH_MAX" in reason and "missing or not a regular file" not in reason, reason
    assert all(d.files[p].verified for p in FILES)
    shutil.rmtree(root)



# -- issue 41 item 11: a SQLite snapshot counts only as a sound database consistent with the listing -------
_LIAR_SNAPSHOT = r'''
import hashlib, os, sqlite3, sys
MODE = {mode!r}
if MODE == "empty":
    data = b""
else:
    p = sys.stdin.buffer.read().rstrip(b"\0")
    src = sqlite3.connect("file:" + os.fsdecode(p) + "?mode=ro", uri=True)
    dst = sqlite3.connect(":memory:")
    if MODE == "tiny":  # a sound database, but not this one: one small table
        dst.execute("CREATE TABLE t (a)")
    else:
        src.backup(dst)
    data = bytearray(dst.serialize())
    if MODE == "corrupt":  # its last page zeroed: the sha256 still matches what is sent
        size = int.from_bytes(data[16:18], "big")
        data[-size:] = bytes(size)
    data = bytes(data)
sys.stdout.buffer.write(hashlib.sha256(data).hexdigest().encode() + b"\n" + data)
'''


def _database(path: Path, rows: int = 300) -> None:
    import sqlite3

    db = sqlite3.connect(path)
    db.execute("CREATE TABLE events (n INTEGER, text TEXT)")
    db.executemany("INSERT INTO events VALUES (?, ?)", [(i, "x" * 600) for i in range(rows)])
    db.commit()
    db.close()


@pytest.mark.parametrize("mode, why", [("empty", "0 bytes"), ("tiny", "fewer bytes than"),
                                       ("corrupt", "integrity_check")])
def test_a_sqlite_snapshot_that_is_not_the_database_listed_is_not_safe(sshd, tmp_path, mode, why):
    """The node's python answers the snapshot request with nothing, with another (sound) database, or with a
    damaged one, each with the sha256 of what it sent: the bytes that landed here are checked as a database."""
    root, node = _node(tmp_path, sshd)
    _database(root / "state.db")
    listed = (root / "state.db").stat().st_size
    assert listed > 150_000
    prog = tmp_path / "liar_snapshot.py"
    prog.write_text(_LIAR_SNAPSHOT.format(mode=mode))
    liar = tmp_path / "fakebin" / "python3"  # named as the node's python: a login shell's PATH may put pyenv first
    fake_commands(sshd, liar.parent, {"python3": (
        '#!/bin/bash\ncase "$2" in *"src.backup(dst)"*) exec /usr/bin/python3 ' + str(prog) + ' ;; esac\n'
        'exec /usr/bin/python3 "$@"\n')})
    dest = tmp_path / "dest"
    d = _run(node, dest, python=str(liar))
    assert not d.verdict.safe
    reason = _missing(d)["state.db"]
    assert "snapshot" in reason and why in reason, reason
    assert all(d.files[p].verified for p in FILES)
    rec = {f["path"]: f for f in json.loads((dest / "manifest.json").read_text())["files"]}
    assert rec["state.db"]["verified"] is False
    assert not (dest / "files" / "state.db").exists()  # a copy that is not the database never lands as it


def test_an_honest_snapshot_still_reaches_safe(sshd, tmp_path):
    root, node = _node(tmp_path, sshd)
    _database(root / "state.db")
    d = _run(node, tmp_path / "dest")
    assert d.verdict.safe, d.verdict.missing
    assert d.files["state.db"].snapshot and d.files["state.db"].verified


# -- issue 41 item 12: a grown file is SAFE only when the bytes copied are still the node's first bytes ------
def test_a_growing_log_rewritten_in_place_is_not_safe_and_a_rerun_copies_it(sshd, tmp_path):
    """`dd conv=notrunc` of new, longer content over a log after its bytes came: it grew, but its first bytes
    are no longer the ones copied (only an append keeps them)."""
    old = b"".join(b"old step %06d\n" % i for i in range(4000))
    new = b"".join(b"NEW STEP %06d\n" % i for i in range(5000))
    root, node = _node(tmp_path, sshd, {**FILES, "logs/train.log": old})
    log = root / "logs/train.log"

    def rewrite(ev: WizardEvent) -> None:
        if ev.message == "checking the node for changes since the listing":
            fd = os.open(log, os.O_WRONLY)  # no O_TRUNC: as dd conv=notrunc
            os.write(fd, new)
            os.close(fd)

    dest = tmp_path / "dest"
    d = _run(node, dest, on_event=rewrite)
    assert not d.verdict.safe
    reason = _missing(d)["logs/train.log"]
    assert "rewritten" in reason and f"first {len(old)} bytes" in reason, reason
    assert not any("train.log: grew during the copy" in w for w in d.verdict.warnings)
    assert all(d.files[p].verified for p in FILES)

    d2 = _run(node, dest)  # the file as it is now, downloaded again
    assert d2.verdict.safe, d2.verdict.missing
    assert (dest / "files/logs/train.log").read_bytes() == new


def test_a_growing_log_only_appended_to_stays_safe(sshd, tmp_path):
    old = b"".join(b"step %06d\n" % i for i in range(4000))
    root, node = _node(tmp_path, sshd, {**FILES, "logs/train.log": old})

    def append(ev: WizardEvent) -> None:
        if ev.message == "checking the node for changes since the listing":
            with open(root / "logs/train.log", "ab") as f:
                f.write(b"step more\n" * 100)

    dest = tmp_path / "dest"
    d = _run(node, dest, on_event=append)
    assert d.verdict.safe, d.verdict.missing
    assert any(f"logs/train.log: grew during the copy; preserved up to the {len(old)} bytes listed" in w
               for w in d.verdict.warnings)
    assert (dest / "files/logs/train.log").read_bytes() == old
