"""SSHHost: a node over SSH through paramiko, in three parts.

ssh_connect.py connects and authenticates (ProxyJump chains, known_hosts and host certificates as OpenSSH
checks them, keys in OpenSSH's order) and keeps one persistent transport per node, opened lazily and shared
by every command (channels are opened concurrently from any thread), reopened with backoff after a drop;
ssh_sftp.py's SFTPHost, which SSHHost extends, moves files over SFTP sessions pooled on it; this module runs
commands and streaming processes on channels of it. Every call is bounded by its timeout, connecting by
connect_timeout; the target is what OpenSSH resolves from ssh_config (`ssh -G`, ssh_target.py).
"""

from __future__ import annotations

import logging
import re
import shlex
import socket
import threading
import time
from pathlib import Path
from typing import Sequence

import paramiko

from ops.errors import HostError, HostTimeout, UserError
from ops.hosts.base import (
    MAX_OUTPUT,
    AuditHook,
    CommandResult,
    HostInfo,
    HostProcess,
    join_argv,
    sendable,
    shell_path,
    time_cap,
    too_large,
)
from ops.hosts.ssh_connect import CHUNK, IDLE_WAKEUP_S, WINDOW, Connection, Dial, Link, remaining
from ops.hosts.ssh_keys import PassphrasePrompt
from ops.hosts.ssh_sftp import SFTPHost
from ops.hosts.ssh_target import SSHTarget, resolve
from ops.stderr_tail import TAIL_BYTES
from ops.textsafe import last_line

# paramiko logs connection drops at ERROR; nodedeck reports them itself as one line.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
STREAM_WRITE_S = 30.0
"""The longest a write to a streamed process waits for the node to take it (its window: a process that reads
nothing fills it), so no writer, which may hold a lock, waits for ever."""


def command_line(argv: Sequence[str], cwd: str | None = None, env: dict[str, str] | None = None) -> str:
    """The remote shell command line for argv: nothing in argv, cwd or env is interpreted."""
    parts = []
    if cwd:
        parts.append(f"cd -- {shell_path(cwd)} &&")
    if env:
        for k in env:
            if not _ENV_NAME.match(k):
                raise UserError(f"bad environment variable name {k!r}")
        parts.append("env " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()))
    parts.append(join_argv(argv))
    return " ".join(parts)


class _Wakeup:
    """Set when a channel's stdout or stderr gets data or closes, for a reader to wait on.

    Used instead of Channel.fileno(): Channel.close() closes that fd pipe while the transport
    thread may be writing to it, and the EBADF (or a write into whatever reused the fd) ends the
    whole connection (paramiko issues 692, 1700, 2271).
    """

    def __init__(self, chan: paramiko.Channel):
        self._event = threading.Event()
        chan.in_buffer.set_event(self)
        chan.in_stderr_buffer.set_event(self)

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        """Left to wait(): a buffer emptied by one read must not hide the other's data."""

    def wait(self, timeout: float) -> None:
        """Until data or a close came since the last wait, or timeout; the caller then reads all there is."""
        self._event.wait(timeout)
        self._event.clear()


class SSHHost(SFTPHost):
    """A node reached over SSH; `target` is an ssh_config alias or user@host[:port].

    passphrase_prompt(path) -> passphrase or None is asked for an encrypted key no
    agent holds (the CLI sets it only on a terminal); without it such a key is
    skipped with one line saying to add it to ssh-agent.
    """

    kind = "ssh"

    def __init__(
        self,
        name: str,
        target: str,
        *,
        port: int | None = None,
        ssh_config: str | Path | None = None,
        accept_new_host_key: bool = False,
        audit: AuditHook | None = None,
        connect_timeout: float = 10.0,
        keepalive: float = 15.0,
        passphrase_prompt: PassphrasePrompt | None = None,
    ):
        super().__init__(name, audit)
        self.passphrase_prompt = passphrase_prompt
        self.target: SSHTarget = resolve(target, ssh_config, port=port)
        self.accept_new_host_key = accept_new_host_key or self.target.accept_new
        self.connect_timeout = self.target.connect_timeout or connect_timeout
        self.keepalive = self.target.keepalive or keepalive
        self._conn = Connection(self._dial)

    @property
    def label(self) -> str:
        via = f" via {','.join(self.target.proxy_jump)}" if self.target.proxy_jump else ""
        return f"{self.name} ({self.target.address}{via})"

    def _dial(self) -> Dial:
        return Dial(self.name, self.label, self.target, self.accept_new_host_key,
                    self.connect_timeout, self.keepalive, self.passphrase_prompt)

    # -- connection -----------------------------------------------------------
    def info(self) -> HostInfo:
        return self._conn.info(self.name, self.kind)

    def connect(self, timeout: float | None = None) -> None:
        self._conn.link(None if timeout is None else time.monotonic() + timeout)

    def close(self) -> None:
        self._conn.close()

    # -- commands -----------------------------------------------------------
    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = 30.0,
        input: bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        max_output: int = MAX_OUTPUT,
    ) -> CommandResult:
        args = [str(a) for a in argv]
        if not args:
            raise UserError("empty command")
        start = time.monotonic()
        timeout = time_cap(timeout)
        deadline = start + timeout
        link, chan = self._start(args, command_line(args, cwd, env), deadline)
        out, err = bytearray(), bytearray()
        try:
            status = self._collect(chan, link, input, deadline, args[0], timeout, out, err, max_output)
        except HostError as e:   # cut short: keep what the command had sent for the caller to show
            e.partial_stdout, e.partial_stderr = bytes(out), bytes(err)
            raise
        finally:
            chan.close()
        return CommandResult(tuple(args), status, bytes(out), bytes(err), time.monotonic() - start)

    def _start(self, args: list[str], cmdline: str, deadline: float | None) -> tuple[Link, paramiko.Channel]:
        """A channel of the link running cmdline (audited first); HostError when it does not start."""
        self._audit(sendable(self.name, "the command line", cmdline))
        link = self._conn.link(deadline)
        chan = self._open_channel(link, deadline)
        try:
            chan.exec_command(cmdline)
        except (paramiko.SSHException, EOFError, OSError) as e:
            chan.close()
            self._conn.raise_if_lost(link)
            raise HostError(f"{self.label}: could not start {args[0]}: {e}") from e
        return link, chan

    def _open_channel(self, link: Link, deadline: float | None) -> paramiko.Channel:
        wait = remaining(deadline)
        try:
            return link.transport.open_session(window_size=WINDOW, timeout=wait)
        except (paramiko.SSHException, EOFError, OSError) as e:
            self._conn.raise_if_lost(link)
            if "Timeout" in str(e):  # no answer to a channel open: treat the link as dead
                self._conn.lost(link, "no answer to a channel open")
                raise HostTimeout(f"{self.label}: no answer within {wait:g}s") from e
            raise HostError(f"{self.label}: could not open a channel: {e}") from e

    def _collect(self, chan: paramiko.Channel, link: Link, input: bytes | None, deadline: float, program: str,
                 timeout: float, out: bytearray, err: bytearray, cap: int) -> int:
        """Read stdout and stderr into out and err as they come (no deadlock on big outputs), feeding stdin;
        OutputTooLarge once either passes cap (the caller closes the channel: the command gets SIGPIPE)."""
        pending = memoryview(input) if input else None
        if pending is None:
            chan.shutdown_write()
        wakeup = _Wakeup(chan)

        def drain() -> None:
            while chan.recv_ready():
                out.extend(chan.recv(CHUNK))
            while chan.recv_stderr_ready():
                err.extend(chan.recv_stderr(CHUNK))
            if len(out) > cap or len(err) > cap:
                e = too_large(self.name, program, cap, bytes(out), bytes(err))
                del out[cap:], err[cap:]
                raise e

        while True:
            drain()
            while pending and chan.send_ready():  # as much as the remote window takes now
                try:
                    n = chan.send(bytes(pending[: 1 << 15]))  # one packet's worth
                except OSError:
                    n = 0
                pending = pending[n:] if n else pending[:0]  # 0: the command closed its stdin
            if pending is not None and not pending:
                pending = None
                try:
                    chan.shutdown_write()
                except OSError:
                    pass
            if chan.closed or (chan.eof_received and chan.exit_status_ready()):
                drain()
                break
            if not link.alive():
                self._conn.raise_if_lost(link)
            if time.monotonic() >= deadline:
                raise HostTimeout(f"{program}: no answer within {timeout:g}s on {self.name}")
            wait = min(0.5, max(0.0, deadline - time.monotonic()))
            if chan.eof_received:  # only the exit status is still to come
                chan.status_event.wait(wait)
            else:
                wakeup.wait(0.005 if pending is not None else wait)
        status = chan.exit_status  # -1 when the channel closed without one
        if status == -1 and (not chan.eof_received or not link.alive()):  # the connection went down
            self._conn.raise_lost(link)
        return status  # -1 also when the command was killed by a signal

    # -- long-running processes -----------------------------------------------
    def open_process(self, argv: Sequence[str], *, timeout: float | None = 30.0) -> HostProcess:
        """An exec channel on the persistent transport left open for streaming."""
        args = [str(a) for a in argv]
        link, chan = self._start(args, command_line(args), None if timeout is None else time.monotonic() + timeout)
        return _ChannelProcess(self, link, chan)


class _ChannelProcess(HostProcess):
    """A remote command on its own channel; a dead transport reads as the end of output. Its stderr is taken
    from the channel at each read, keeping the last TAIL_BYTES (memory stays bounded and the window open)."""

    def __init__(self, host: SSHHost, link: Link, chan: paramiko.Channel):
        super().__init__()
        self._host, self._link, self._chan = host, link, chan
        self._wakeup = _Wakeup(chan)
        self._err = b""
        chan.settimeout(STREAM_WRITE_S)   # for sendall alone: reads only take what is there

    def write(self, data: bytes) -> None:
        try:
            self._chan.sendall(data)
        except (socket.timeout, TimeoutError):
            raise HostTimeout(f"{self._host.label}: the process took no input for {STREAM_WRITE_S:g} s") from None
        except (OSError, EOFError, paramiko.SSHException) as e:
            raise HostError(f"{self._host.label}: stream closed: {e}") from e

    def _take_stderr(self) -> None:
        while self._chan.recv_stderr_ready():
            self._err = (self._err + self._chan.recv_stderr(CHUNK))[-TAIL_BYTES:]

    def _read_some(self, timeout: float) -> bytes | None:
        chan = self._chan
        self._take_stderr()
        if not chan.recv_ready():
            if chan.closed or chan.eof_received or not self._link.alive():
                return b""
            self._wakeup.wait(min(max(0.0, timeout), IDLE_WAKEUP_S))   # data, EOF, close and a lost link set it
            self._take_stderr()
            if not chan.recv_ready():
                return b"" if chan.closed or chan.eof_received or not self._link.alive() else None
        return chan.recv(CHUNK)

    def stderr_tail(self) -> str:
        if self._chan.eof_received:
            self._chan.status_event.wait(0.5)  # stderr comes before the exit status
        self._take_stderr()
        return last_line(self._err)

    def close(self) -> None:
        self._chan.close()
