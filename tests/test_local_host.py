"""LocalHost: the same Host contract as SSHHost, on this machine."""

from __future__ import annotations

import hashlib
import os
import shlex
import time

import pytest

from ops.errors import CommandFailed, HostError, HostTimeout
from ops.hosts.base import ConnState
from ops.hosts.local import LocalHost
from tests.test_ssh_host import ODD_NAMES


def test_run_status_streams_cwd_env_input_and_audit(tmp_path):
    audit = []
    host = LocalHost(audit=lambda h, c: audit.append((h, c)))
    r = host.run(["sh", "-c", 'echo "$X" in "$(pwd)"; echo err >&2; exit 3'], cwd=str(tmp_path), env={"X": "v a l"})
    assert (r.returncode, r.text, r.stderr, r.ok) == (3, f"v a l in {tmp_path}\n", b"err\n", False)
    with pytest.raises(CommandFailed, match="sh exited 3: err"):
        r.check()
    assert host.run(["cat"], input=b"\0bytes\xff").stdout == b"\0bytes\xff"
    assert host.run(["cat"]).stdout == b""  # stdin is closed, not inherited
    missing = host.run(["no-such-command-xyz"])
    assert (missing.returncode, missing.stderr) == (127, b"no-such-command-xyz: command not found\n")
    assert audit[0] == ("local", "sh -c 'echo \"$X\" in \"$(pwd)\"; echo err >&2; exit 3'")
    assert host.info().state == ConnState.CONNECTED and host.info().kind == "local"


def test_timeout_and_odd_names(tmp_path):
    host = LocalHost()
    t0 = time.monotonic()
    with pytest.raises(HostTimeout, match="sleep: no answer within 0.3s on local"):
        host.run(["sleep", "30"], timeout=0.3)
    assert time.monotonic() - t0 < 3

    out = host.run(["printf", "%s\\0", *ODD_NAMES]).check().stdout
    assert out.split(b"\0")[:-1] == [n.encode() for n in ODD_NAMES]
    host.run(["touch", "--", *ODD_NAMES], cwd=str(tmp_path)).check()
    assert sorted(os.listdir(tmp_path)) == sorted(ODD_NAMES)
    assert not (tmp_path / "pwned").exists()
    script = "printf %s " + " ".join(shlex.quote(n) for n in ODD_NAMES[:4])
    assert host.run_script(script).check().text == "".join(ODD_NAMES[:4])


def test_files(tmp_path):
    host = LocalHost()
    assert host.stat(str(tmp_path / "missing")) is None
    target = tmp_path / "a" / "b c" / "file.bin"
    data = os.urandom(100_000)
    host.write_file(str(target), data, mode=0o600)
    assert target.read_bytes() == data and (target.stat().st_mode & 0o777) == 0o600
    host.write_file(str(target), b"new")
    assert target.read_bytes() == b"new" and os.listdir(target.parent) == ["file.bin"]
    st = host.stat(str(target))
    assert (st.size, st.is_dir) == (3, False) and host.stat(str(tmp_path / "a")).is_dir

    big = tmp_path / "big"
    big.write_bytes(data)
    assert host.read_range(str(big), 10, 5) == data[10:15]
    assert host.read_range(str(big), 99_990) == data[99_990:]
    assert host.read_range(str(big), 200_000, 10) == b""
    with pytest.raises(HostError):
        host.read_range(str(tmp_path / "missing"))

    os.chmod(big, 0o751)
    dest = tmp_path / "x" / "y" / "pushed"
    r = host.push(big, str(dest), verify=True)
    assert dest.read_bytes() == data and (dest.stat().st_mode & 0o777) == 0o751
    assert r.size == len(data) and r.sha256 == hashlib.sha256(data).hexdigest()
    with pytest.raises(HostError, match="not a file"):
        host.push(tmp_path / "missing", str(dest))
    back = tmp_path / "back" / "f"
    assert host.fetch(str(dest), back).size == len(data) and back.read_bytes() == data
    with pytest.raises(HostError, match="not a file"):
        host.fetch(str(tmp_path / "missing"), back)
    assert host.sha256(str(back)) == hashlib.sha256(data).hexdigest()
    assert host.home() == os.path.expanduser("~")
