"""Answers a node can give that broke a reader: each is now invalid input with a bounded, inert line, never an
exception out of the reader (found by an audit of every node read, 2026-12-07; each test failed before its fix)."""

from __future__ import annotations

import os
import re

import paramiko
import pytest

from ops.decommission.sysinfo import capture
from ops.errors import HostError
from ops.hosts.local import LocalHost
from ops.nodes import get_node, load_nodes, open_host
from ops.plan.records import CheckSpec
from ops.run.checks import CheckContext, run_check
from ops.telemetry.gpus import parse_gpu_script_output
from ops.telemetry.hoststats import raw_from_sample
from ops.telemetry.inference import parse_samples
from ops.telemetry.serverlog import parse_log_line
from tests.support.hostile_node import executable, fake_commands, lying_node_toml


def test_a_system_info_section_the_script_never_asked_for_is_ignored(tmp_path, monkeypatch):
    """The node can read the marker from the script it was sent and answer with a section of its own."""
    executable(tmp_path / "bash", "#!/usr/bin/python3\nimport os, re, sys\n"
               "m = re.search(r'NDK-[0-9a-f]{16}', ' '.join(sys.argv)).group()\n"
               "print(f'{m} BEGIN bogus\\nhello\\n{m} END bogus 0', flush=True)\n"
               "os.execv('/bin/bash', ['bash', *sys.argv[1:]])\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    info = capture(LocalHost())
    assert "bogus" not in info.sections and info.sections


def test_a_gpu_query_marker_line_with_nothing_after_it_is_no_section():
    snap = parse_gpu_script_output(0, "@@nodedeck \nGPU 0\n@@nodedeck   \n")
    assert snap.error is not None and "GPU query failed" in snap.error


def test_a_sampled_host_part_with_null_disk_lists_has_no_disks():
    raw = raw_from_sample({"stat": [1, 2, 3, 4], "disks": None, "disk_errors": None})
    assert raw.disks == [] and raw.disk_errors == []


@pytest.mark.parametrize("stamp", ["2024-99-99 00:00:00", "2024-02-30 12:00:00", "2023-02-29 01:02:03"])
def test_a_server_log_line_with_an_impossible_date_has_no_time(stamp):
    rec = parse_log_line(f"[{stamp} TP0] Decode batch. #running-req: 1, #token: 10, gen throughput (token/s): 5.0")
    assert rec is None or rec.logged_at is None


def test_a_metrics_page_that_is_not_prometheus_says_so_in_a_bounded_line():
    with pytest.raises(HostError) as e:
        parse_samples("good_metric 1\n" + "x{" * 1_500_000 + "\n")
    assert "not in Prometheus text format" in str(e.value) and len(str(e.value)) < 400


def test_an_http_check_whose_node_prints_megabytes_of_digits_is_one_short_line(tmp_path, sshd):
    fake_commands(sshd, tmp_path / "fakebin", {"curl": "#!/bin/sh\nhead -c 8000000 /dev/zero | tr '\\0' 2\n"})
    host = open_host(get_node(load_nodes(lying_node_toml(tmp_path, sshd, root=str(tmp_path / "work"))), "gpu1"))
    try:
        r = run_check(CheckSpec("http_ok", {"url": "http://127.0.0.1:9/", "timeout": 5.0}), CheckContext(host))
    finally:
        host.close()
    assert not r.ok and len(r.text) < 300, r.text[:400]


def test_an_sftp_stat_without_attributes_is_a_one_line_error(tmp_path, sshd, monkeypatch):
    """A node's sftp-server may answer a stat with no attribute flags: paramiko then leaves size and mode None."""
    (tmp_path / "f").write_bytes(b"data")
    host = open_host(get_node(load_nodes(lying_node_toml(tmp_path, sshd, root=str(tmp_path / "work"))), "gpu1"))
    monkeypatch.setattr(paramiko.SFTPClient, "stat", lambda self, path: paramiko.SFTPAttributes())
    monkeypatch.setattr(paramiko.SFTPFile, "stat", lambda self: paramiko.SFTPAttributes())
    try:
        for call in (lambda: host.stat(str(tmp_path / "f")), lambda: host.read_range(str(tmp_path / "f")),
                     lambda: host.fetch(str(tmp_path / "f"), tmp_path / "got")):
            with pytest.raises(HostError, match=re.escape("sent no size, mode or time")):
                call()
    finally:
        host.close()


def test_writing_to_a_node_process_that_reads_nothing_fails_within_the_write_timeout(tmp_path, sshd, monkeypatch):
    """sshd stops granting window once the process's stdin pipe is full: sendall would wait for ever (the
    sampler and the setup lock write while holding their locks)."""
    from ops.hosts import ssh

    monkeypatch.setattr(ssh, "STREAM_WRITE_S", 2.0)
    host = open_host(get_node(load_nodes(lying_node_toml(tmp_path, sshd, root=str(tmp_path / "work"))), "gpu1"))
    proc = host.open_process(["sleep", "60"])
    try:
        with pytest.raises(HostError, match="took no input for 2 s"):
            for _ in range(64):
                proc.write(b"x" * (1 << 20))
    finally:
        proc.close()
        host.close()


def test_a_server_that_answers_no_ssh_banner_is_one_bounded_line(tmp_path):
    """paramiko quotes the 100th line that was no banner whole in its error: a node may make it megabytes."""
    import socket
    import threading

    from ops.errors import HostUnreachable
    from ops.hosts.ssh import SSHHost

    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def answer() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.sendall(b"hello\r\n" * 99 + b"\x1b]52;c;aGk=\x07" + b"z" * 1_000_000 + b"\r\n")
            while conn.recv(1 << 16):   # until the client goes
                pass

    threading.Thread(target=answer, daemon=True).start()
    (tmp_path / "ssh_config").write_text("")
    host = SSHHost("gpu1", "nd@127.0.0.1", port=port, ssh_config=tmp_path / "ssh_config")
    try:
        with pytest.raises(HostUnreachable) as e:
            host.connect(timeout=20)
    finally:
        host.close()
        srv.close()
    assert "\x1b" not in str(e.value) and len(str(e.value)) < 500, str(e.value)[:300]
