"""What a node writes to stderr reaches a message as one inert line of bounded length, and is never kept unbounded.

A node is not trusted: the last line of a failing command's stderr (what most messages quote) may be megabytes
long and hold terminal escapes. Every message that quotes it goes through ops.textsafe.last_line: the last
non-blank line, with control and bidi characters as visible escapes, cut to LINE_CHARS with "...".
The node is the loopback sshd (or this machine) running the hostile command itself, or a fake one first on PATH.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ops.agents.discover import discover_remote
from ops.decommission.checksums import node_digests
from ops.decommission.live import SnapshotRefused, prefix_digest, sqlite_snapshot
from ops.decommission.transfer import FileFailed, HostRangeStream, OpenSSHStream, StreamError
from ops.errors import CommandFailed, HostError
from ops.hosts.local import LocalHost
from ops.nodes import get_node, load_nodes, open_host
from ops.telemetry.gpus import parse_gpu_csv, parse_gpu_script_output
from ops.telemetry.hoststats import HostStatsCollector
from ops.telemetry.inference import fetch_metrics
from ops.textsafe import LINE_CHARS, last_line, printable, shown
from tests.support.hostile_node import executable, fake_commands, lying_node_toml


def hostile_err(last_line_bytes: int = 1_000_000) -> str:
    """A shell command writing 2 MB of stderr, then a last non-blank line that starts with OSC 52, a screen clear
    and U+202E, then holds last_line_bytes of y."""
    return ("head -c 2000000 /dev/zero | tr '\\0' x >&2; "
            "printf '\\n\\033]52;c;aGk=\\007\\033[2J\\342\\200\\256' >&2; "
            f"head -c {last_line_bytes} /dev/zero | tr '\\0' y >&2; printf '\\n\\n  \\n' >&2")


HOSTILE_ERR = hostile_err()
SHORT_LINE = 40_000
"""A last line that fits in what a reader of a stream keeps (ops.stderr_tail.TAIL_BYTES): its start is shown.
Of a longer one, the stream's readers keep only its end."""
SHOWN_START = "\\x1b]52;c;aGk=\\x07\\x1b[2J\\u202e"


def inert_and_bounded(text: str, extra: int = 200) -> None:
    assert len(text) <= LINE_CHARS + extra, len(text)
    assert not any(c in text for c in "\x1b\x07\n\r\u202e"), text[:400]


@pytest.fixture
def ssh_node(tmp_path, sshd):
    host = open_host(get_node(load_nodes(lying_node_toml(tmp_path, sshd, root=str(tmp_path / "work"))), "gpu1"))
    yield host
    host.close()


def test_last_line_is_the_last_non_blank_line_inert_and_cut():
    assert last_line(b"first\nsecond  \n\n \r\n") == "second"
    assert last_line("a\r\nprogress 10%\rprogress 99%\n") == "progress 99%"
    assert last_line(b"") == "" and last_line(" \n\t\n") == ""
    assert last_line(b"\xff\xfe bad\n") == "\ufffd\ufffd bad"
    line = last_line(b"ok\n\x1b]52;c;aGk=\x07" + b"y" * 10**6)
    assert line.startswith("\\x1b]52;c;aGk=\\x07yyy") and line.endswith("...") and len(line) == LINE_CHARS
    assert last_line("z" * 1000, 120) == "z" * 117 + "..."
    assert last_line("\u00e9" * LINE_CHARS) == "\u00e9" * LINE_CHARS   # exactly the limit: not cut
    assert printable(b"\xff" * 10**7) == "\ufffd" * (LINE_CHARS - 3) + "..."


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.binary(max_size=3000), st.text(max_size=3000)), st.integers(4, 400))
def test_the_last_line_of_anything_is_inert_and_at_most_limit_characters(data, limit):
    line = last_line(data, limit)
    assert len(line) <= limit and shown(line) == line


@pytest.mark.parametrize("where", ["ssh", "local"])
def test_a_failed_command_is_one_inert_bounded_line(where, request):
    host = request.getfixturevalue("ssh_node") if where == "ssh" else LocalHost()
    with pytest.raises(CommandFailed) as e:
        host.run(["sh", "-c", HOSTILE_ERR + "; exit 3"], timeout=120).check()
    text = str(e.value)
    assert text.startswith("sh exited 3: " + SHOWN_START + "yyy") and text.endswith("...")
    inert_and_bounded(text)


@pytest.mark.parametrize("where", ["ssh", "local"])
@pytest.mark.parametrize("line", [SHORT_LINE, 1_000_000])
def test_the_stderr_of_a_streamed_process_is_one_inert_bounded_line(where, line, request):
    """The process writes all that before its last line on stdout: nothing it writes to stderr may block it."""
    host = request.getfixturevalue("ssh_node") if where == "ssh" else LocalHost()
    proc = host.open_process(["sh", "-c", hostile_err(line) + "; echo done; exit 1"])
    try:
        assert proc.readline(60) == b"done\n" and proc.readline(60) == b""
        tail = proc.stderr_tail()
    finally:
        proc.close()
    assert tail.startswith(SHOWN_START + "yyy") if line == SHORT_LINE else set(tail) == {"y", "."}
    inert_and_bounded(tail, 0)


def test_a_failed_agent_scan_on_the_node_is_one_inert_bounded_line(tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text(f"#!/bin/sh\n{HOSTILE_ERR}\nexit 1\n")
    (fake / "python3").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    with pytest.raises(HostError) as e:
        discover_remote(LocalHost(), home=str(tmp_path))
    assert SHOWN_START in str(e.value)
    inert_and_bounded(str(e.value))


def test_a_failed_gpu_query_is_one_inert_bounded_line():
    err = "x" * 10**6 + "\n\x1b]52;c;aGk=\x07\x1b[2J\u202e" + "y" * 10**6 + "\n"
    snap = parse_gpu_script_output(1, "", err)
    assert snap.error is not None and SHOWN_START in snap.error
    inert_and_bounded(snap.error)
    gpus, reason = parse_gpu_csv(err)
    assert gpus == [] and reason is not None and SHOWN_START in reason
    inert_and_bounded(reason)


def test_a_download_stream_that_dies_says_ssh_s_last_line_inert_and_bounded():
    with pytest.raises(StreamError) as e:
        OpenSSHStream(["sh", "-c", hostile_err(SHORT_LINE) + "; exit 255", "fake-ssh"])
    assert str(e.value).startswith(SHOWN_START + "yyy")
    inert_and_bounded(str(e.value), 0)
    with pytest.raises(StreamError) as e:
        OpenSSHStream(["sh", "-c", "yes 'endless stderr' | head -n 1500000 >&2; exit 255", "fake-ssh"])
    assert str(e.value) == "endless stderr"   # of its 22 MB, 64 KiB were kept in memory (none on disk)


def test_what_failing_tools_on_the_node_say_reaches_each_message_inert_and_bounded(tmp_path, sshd):
    """curl, sha256sum, the snapshot's python and the byte reader's bash on the node fail, writing HOSTILE_ERR."""
    hostile = f"#!/bin/sh\n{HOSTILE_ERR}\nexit 1\n"
    bash = ('#!/bin/sh\nfor a in "$@"; do case "$a" in nodedeck-prefix|nodedeck-read) '
            f"{HOSTILE_ERR}; exit 1;; esac; done\nexec /bin/bash \"$@\"\n")
    fake_commands(sshd, tmp_path / "fakebin", {"curl": hostile, "sha256sum": hostile, "python-liar": hostile,
                                               "bash": bash})
    odd = os.fsencode(str(tmp_path)) + b"/odd-\xff-name"   # not UTF-8: read through the node's bash
    with open(odd, "wb") as f:
        f.write(b"data")
    host = open_host(get_node(load_nodes(lying_node_toml(tmp_path, sshd, root=str(tmp_path / "work"))), "gpu1"))
    said = []
    try:
        with pytest.raises(HostError) as e:
            fetch_metrics(host, "http://127.0.0.1:9/metrics")
        said.append(str(e.value))
        digest_error = str(node_digests(host, [(str(tmp_path), 1)])[str(tmp_path)])   # its first line: x...
        with pytest.raises(SnapshotRefused) as e:
            sqlite_snapshot(host, "python-liar", str(tmp_path / "db.sqlite"))
        said.append(str(e.value))
        with pytest.raises(HostError) as e:
            prefix_digest(host, str(tmp_path / "db.sqlite"), 10)
        said.append(str(e.value))
        stream = HostRangeStream(host)
        stream.send(os.fsdecode(odd), 0)
        with pytest.raises(FileFailed) as e:
            list(stream.receive().chunks)
        said.append(str(e.value))
    finally:
        host.close()
    for text in said:
        assert SHOWN_START in text, text[:400]
        inert_and_bounded(text)
    assert digest_error.startswith("xxx") and digest_error.endswith("...")
    inert_and_bounded(digest_error)


def test_a_failed_host_query_is_one_inert_bounded_line(tmp_path, monkeypatch):
    executable(tmp_path / "bash", f"#!/bin/sh\n{HOSTILE_ERR}\nexit 1\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(HostError) as e:
        HostStatsCollector(LocalHost()).read()
    assert SHOWN_START in str(e.value)
    inert_and_bounded(str(e.value))


def test_a_node_digest_that_is_no_hex_digest_is_that_file_s_error_not_a_crash(tmp_path, sshd):
    liar = ("#!/usr/bin/python3\nimport sys\nfor p in sys.argv[3:]:\n"
            "    sys.stdout.buffer.write(b'\\xff' * 64 + b'  ' + p.encode() + b'\\0')\n")
    fake_commands(sshd, tmp_path / "fakebin", {"sha256sum": liar})
    host = open_host(get_node(load_nodes(lying_node_toml(tmp_path, sshd, root=str(tmp_path / "work"))), "gpu1"))
    try:
        got = node_digests(host, [(str(tmp_path), 1)])
    finally:
        host.close()
    assert isinstance(got[str(tmp_path)], HostError), got
