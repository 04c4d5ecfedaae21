"""SSHHost: a node over SSH through paramiko.

One persistent transport per node, opened lazily and shared by every command
(channels are opened concurrently from any thread); SFTP sessions are pooled
on it. A dead transport is reopened on the next call with exponential backoff
(state CONNECTED -> RECONNECTING -> CONNECTED). Every call is bounded by its
timeout, connecting by connect_timeout. Host keys (and host certificates) are
checked against known_hosts like OpenSSH does; ssh_config is applied as OpenSSH
reads it (ssh_config.py); keys are offered in OpenSSH's order (ssh_keys.py).
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import re
import shlex
import socket
import stat as stat_mod
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence, overload

import paramiko

from ops.errors import HostError, HostKeyError, HostTimeout, HostUnreachable, UserError
from ops.hosts.base import (
    AuditHook,
    CommandResult,
    ConnState,
    FileStat,
    Host,
    HostInfo,
    HostProcess,
    TransferResult,
    join_argv,
    shell_path,
    temp_name,
)
from ops.hosts.known_hosts import KnownHosts
from ops.hosts.ssh_config import SSHTarget, load_ssh_config, next_hop, resolve
from ops.hosts.ssh_keys import KeyRing, PassphrasePrompt
from ops.hosts.ssh_tokens import PROXY_TOKENS, TokenValues, expand
from ops.textsafe import shown

# paramiko logs connection drops at ERROR; nodedeck reports them itself as one line.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

WINDOW = 64 << 20  # receive window per channel: keeps bulk reads streaming
CHUNK = 1 << 20  # local read/write size for transfers
STALL_TIMEOUT = 60.0  # a transfer with no progress for this long has failed
MAX_PREFETCH = 64  # concurrent SFTP read requests, as OpenSSH's sftp uses
MAX_HOPS = 8
OPENSSH_REQUEST = 255 * 1024  # OpenSSH's sftp-server takes reads/writes up to 256 KiB less 1 KiB
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@overload
def _remaining(deadline: float) -> float: ...
@overload
def _remaining(deadline: None) -> None: ...
def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


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


def _socket_reason(e: BaseException, timeout: float | None) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, (socket.timeout, TimeoutError)):
        return f"no answer within {timeout:g}s" if timeout else "timed out"
    if isinstance(e, socket.gaierror):
        return f"cannot resolve host name ({e.strerror})"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror.lower()
    return str(e) or type(e).__name__


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


class _SFTP(paramiko.SFTPClient):
    """An SFTP session whose files use the largest request size the server takes (fewer round trips)."""

    request_size = paramiko.SFTPFile.MAX_REQUEST_SIZE

    def open(self, filename, mode="r", bufsize=-1):
        f = super().open(filename, mode, bufsize)
        f.MAX_REQUEST_SIZE = self.request_size
        return f


class _Link:
    """One live connection: the transports of every hop (final one last) and idle SFTP sessions."""

    def __init__(self, transports: list[paramiko.Transport]):
        self.transports = transports
        self.transport = transports[-1]
        self._idle: list[paramiko.SFTPClient] = []
        self._lock = threading.Lock()
        self.home: str | None = None

    def alive(self) -> bool:
        return all(t.is_active() for t in self.transports)

    def take_sftp(self, timeout: float | None) -> paramiko.SFTPClient:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        chan = self.transport.open_session(window_size=WINDOW, timeout=timeout)
        chan.invoke_subsystem("sftp")
        sftp = _SFTP(chan)
        if "OpenSSH" in (self.transport.remote_version or ""):
            sftp.request_size = OPENSSH_REQUEST
        return sftp

    def give_sftp(self, sftp: paramiko.SFTPClient) -> None:
        with self._lock:
            self._idle.append(sftp)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for s in idle:
            s.close()
        for t in reversed(self.transports):
            t.close()


class SSHHost(Host):
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
        self._config = load_ssh_config(ssh_config)
        self.target: SSHTarget = resolve(target, self._config, port=port)
        self.accept_new_host_key = accept_new_host_key or self.target.accept_new
        self.connect_timeout = self.target.connect_timeout or connect_timeout
        self.keepalive = self.target.keepalive or keepalive
        self._connect_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._link: _Link | None = None
        self._state = ConnState.DISCONNECTED
        self._since = time.time()
        self._last_error: str | None = None
        self._was_connected = False
        self._backoff = 0.0
        self._retry_at = 0.0

    @property
    def label(self) -> str:
        via = f" via {','.join(self.target.proxy_jump)}" if self.target.proxy_jump else ""
        return f"{self.name} ({self.target.address}{via})"

    # -- connection state -------------------------------------------------
    def _set_state(self, state: ConnState, error: str | None = None) -> None:
        with self._state_lock:
            if state != self._state:
                self._state, self._since = state, time.time()
            if error is not None:
                self._last_error = error

    def _lost(self, link: _Link, reason: str) -> None:
        """Forget a dead link; the next call reconnects."""
        with self._state_lock:
            if self._link is not link:
                return
            self._link = None
        link.close()
        self._set_state(ConnState.RECONNECTING, reason)

    def _lost_reason(self, link: _Link) -> str:
        for t in link.transports:
            exc = t.get_exception() if not t.is_active() else None
            if exc is not None and str(exc):
                return f"connection lost ({exc})"
        return "connection lost"

    def info(self) -> HostInfo:
        link = self._link
        if link is not None and not link.alive():
            self._lost(link, self._lost_reason(link))
        with self._state_lock:
            return HostInfo(self.name, self.kind, self._state, self._since, self._last_error)

    def _connection(self, deadline: float | None) -> _Link:
        link = self._link
        if link is not None and link.alive():
            return link
        budget = self.connect_timeout if deadline is None else min(self.connect_timeout, _remaining(deadline))
        connect_deadline = time.monotonic() + budget
        if not self._connect_lock.acquire(timeout=budget):
            raise HostTimeout(f"{self.label}: still connecting after {budget:g}s")
        try:
            link = self._link
            if link is not None:
                if link.alive():
                    return link
                self._lost(link, self._lost_reason(link))
            return self._reconnect(connect_deadline)
        finally:
            self._connect_lock.release()

    def _reconnect(self, deadline: float) -> _Link:
        """Open a link, retrying with backoff when it had been connected before."""
        self._set_state(ConnState.RECONNECTING if self._was_connected else ConnState.CONNECTING)
        while True:
            wait = self._retry_at - time.monotonic()
            if wait > 0:
                if time.monotonic() + wait >= deadline:
                    raise HostUnreachable(f"{self._last_error} (next try in {wait:.1f}s)")
                time.sleep(wait)
            try:
                link = self._open(deadline)
            except (HostKeyError, UserError) as e:  # retrying cannot help
                self._set_state(ConnState.DISCONNECTED, str(e))
                raise
            except HostUnreachable as e:
                self._backoff = min(max(self._backoff * 2, 0.25), 30.0)
                self._retry_at = time.monotonic() + self._backoff
                if not self._was_connected:
                    self._set_state(ConnState.DISCONNECTED, str(e))
                    raise
                self._set_state(ConnState.RECONNECTING, str(e))
                if self._retry_at >= deadline:
                    raise
                continue
            self._backoff, self._retry_at = 0.0, 0.0
            self._was_connected = True
            with self._state_lock:
                self._link = link
            self._set_state(ConnState.CONNECTED)
            return link

    def _open(self, deadline: float) -> _Link:
        transports: list[paramiko.Transport] = []
        try:
            self._open_hop(self.target, transports, deadline, 0)
        except (paramiko.SSHException, EOFError, OSError) as e:  # anything the hop steps did not name
            for t in reversed(transports):
                t.close()
            raise HostUnreachable(f"{self.label}: {_socket_reason(e, _remaining(deadline))}") from e
        except BaseException:
            for t in reversed(transports):
                t.close()
            raise
        return _Link(transports)

    def _open_hop(self, target: SSHTarget, transports: list, deadline: float, depth: int) -> paramiko.Transport:
        """Connect and authenticate one hop (its jump hosts first); append every transport opened."""
        if depth > MAX_HOPS:
            raise HostUnreachable(f"{self.label}: ProxyJump chain longer than {MAX_HOPS} hops (a loop?)")
        label = f"{self.name} ({target.address})" if depth == 0 else f"jump host {target.alias} ({target.address})"
        for field, value in (("HostName", target.hostname), ("User", target.user)):
            if any("\udc80" <= c <= "\udcff" for c in value):   # a byte of the ssh config that is not UTF-8
                raise UserError(f"{shown(label)}: ssh config {field} {shown(value)}: not UTF-8 text, "
                                "which no host name or user name on the wire can be")
        jump = next_hop(target, self._config)
        if jump is not None:
            jump_t = self._open_hop(jump, transports, deadline, depth + 1)
            try:
                sock = jump_t.open_channel(
                    "direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0),
                    window_size=WINDOW, timeout=_remaining(deadline),
                )
            except (paramiko.SSHException, EOFError, OSError) as e:
                raise HostUnreachable(f"{label}: {jump.alias} could not connect to it ({e})") from e
        elif target.proxy_command:
            command = expand(
                target.proxy_command,
                TokenValues(target.hostname, target.alias, target.port, target.user,
                            target.host_key_alias or target.alias),
                PROXY_TOKENS, what=f"ssh config for {target.alias}: ProxyCommand", env=False,
            )
            try:
                sock = paramiko.ProxyCommand("sh -c " + shlex.quote("exec " + command))
            except paramiko.ProxyCommandFailure as e:
                raise HostUnreachable(f"{label}: ProxyCommand failed: {e}") from e
        else:
            wait = _remaining(deadline)
            try:
                sock = socket.create_connection((target.hostname, target.port), timeout=wait)
            except OSError as e:
                raise HostUnreachable(f"{label}: {_socket_reason(e, wait)}") from e
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t = paramiko.Transport(sock, default_window_size=WINDOW)
        transports.append(t)
        wait = max(_remaining(deadline), 0.1)
        t.banner_timeout = t.handshake_timeout = t.auth_timeout = wait
        known = KnownHosts(target.user_known_hosts, target.global_known_hosts)
        opts = t.get_security_options()
        opts.key_types = known.preferred_algorithms(
            target.known_hosts_name, tuple(opts.key_types), tuple(t._key_info)
        )
        try:
            t.start_client(timeout=wait)
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise HostUnreachable(f"{label}: SSH handshake failed: {_socket_reason(e, wait)}") from e
        try:
            key = t.get_remote_server_key()
        except paramiko.SSHException:  # start_client returns without error when it runs out of time
            raise HostUnreachable(f"{label}: SSH handshake failed: no answer within {wait:g}s") from None
        if known.verify(
            target.known_hosts_name, label, key, accept_new=self.accept_new_host_key, principal=target.cert_principal
        ):
            known.add(target.known_hosts_name, key, hashed=target.hash_known_hosts)
        self._authenticate(t, target, label)
        t.set_keepalive(max(1, int(self.keepalive)))
        return t

    def _authenticate(self, t: paramiko.Transport, target: SSHTarget, label: str) -> None:
        """Offer keys in OpenSSH's order (see ssh_keys.py) until the server accepts one."""
        tried = []
        with KeyRing(target.identity_files, target.identities_only, target.identity_agent) as ring:
            for offer in ring.offers():
                key = offer.key if offer.key is not None else ring.load(offer, self.passphrase_prompt)
                if key is None:
                    continue
                try:
                    remaining_methods = t.auth_publickey(target.user, key)
                except paramiko.AuthenticationException:
                    tried.append(offer.label)
                    continue
                except (paramiko.SSHException, EOFError, OSError) as e:
                    raise HostUnreachable(f"{label}: authentication broke off: {_socket_reason(e, None)}") from e
                if t.is_authenticated():
                    return
                ring.problems.append(f"server also wants {','.join(remaining_methods)}, which nodedeck cannot do")
                break
            problems = ring.problems
        detail = f"tried {', '.join(tried)}" if tried else "no usable key"
        if problems:
            detail += "; " + "; ".join(problems)
        raise HostUnreachable(f"{label}: authentication failed for user {target.user} ({detail})")

    def connect(self, timeout: float | None = None) -> None:
        self._connection(None if timeout is None else time.monotonic() + timeout)

    def close(self) -> None:
        with self._connect_lock:
            with self._state_lock:
                link, self._link = self._link, None
            if link is not None:
                link.close()
            self._was_connected = False
            self._backoff, self._retry_at = 0.0, 0.0
            self._set_state(ConnState.DISCONNECTED)

    # -- commands -----------------------------------------------------------
    def run(self, argv, *, timeout=30.0, input=None, cwd=None, env=None) -> CommandResult:
        argv = [str(a) for a in argv]
        if not argv:
            raise UserError("empty command")
        cmdline = command_line(argv, cwd, env)
        self._audit(cmdline)
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        link = self._connection(deadline)
        chan = self._open_channel(link, deadline)
        out, err = bytearray(), bytearray()
        try:
            try:
                chan.exec_command(cmdline)
            except (paramiko.SSHException, EOFError, OSError) as e:
                self._raise_if_lost(link)
                raise HostError(f"{self.label}: could not start {argv[0]}: {e}") from e
            status = self._collect(chan, link, input, deadline, argv, timeout, out, err)
        except HostError as e:   # cut short: keep what the command had sent for the caller to show
            e.partial_stdout, e.partial_stderr = bytes(out), bytes(err)
            raise
        finally:
            chan.close()
        return CommandResult(tuple(argv), status, bytes(out), bytes(err), time.monotonic() - start)

    def _open_channel(self, link: _Link, deadline: float | None) -> paramiko.Channel:
        wait = _remaining(deadline)
        try:
            return link.transport.open_session(window_size=WINDOW, timeout=wait)
        except (paramiko.SSHException, EOFError, OSError) as e:
            self._raise_if_lost(link)
            if "Timeout" in str(e):  # no answer to a channel open: treat the link as dead
                self._lost(link, "no answer to a channel open")
                raise HostTimeout(f"{self.label}: no answer within {wait:g}s") from e
            raise HostError(f"{self.label}: could not open a channel: {e}") from e

    def _raise_if_lost(self, link: _Link) -> None:
        if not link.alive():
            self._raise_lost(link)

    def _raise_lost(self, link: _Link) -> None:
        """Drop the link and raise HostUnreachable (its transports close within moments)."""
        for _ in range(100):
            if not link.alive():
                break
            time.sleep(0.01)
        reason = self._lost_reason(link)
        self._lost(link, reason)
        raise HostUnreachable(f"{self.label}: {reason}")

    def _collect(self, chan, link, input, deadline, argv, timeout, out: bytearray, err: bytearray) -> int:
        """Read stdout and stderr into out and err as they come (no deadlock on big outputs), feeding stdin."""
        pending = memoryview(input) if input else None
        if pending is None:
            chan.shutdown_write()
        wakeup = _Wakeup(chan)

        def drain():
            while chan.recv_ready():
                out.extend(chan.recv(CHUNK))
            while chan.recv_stderr_ready():
                err.extend(chan.recv_stderr(CHUNK))

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
                self._raise_if_lost(link)
            if deadline is not None and time.monotonic() >= deadline:
                raise HostTimeout(f"{argv[0]}: no answer within {timeout:g}s on {self.name}")
            wait = 0.5 if deadline is None else min(0.5, max(0.0, deadline - time.monotonic()))
            if chan.eof_received:  # only the exit status is still to come
                chan.status_event.wait(wait)
            else:
                wakeup.wait(0.005 if pending is not None else wait)
        status = chan.exit_status  # -1 when the channel closed without one
        if status == -1 and (not chan.eof_received or not link.alive()):  # the connection went down
            self._raise_lost(link)
        return status  # -1 also when the command was killed by a signal

    # -- files --------------------------------------------------------------
    @contextmanager
    def _sftp(self, path: str, timeout: float = STALL_TIMEOUT) -> Iterator[paramiko.SFTPClient]:
        """A pooled SFTP session; errors become HostError/HostTimeout/HostUnreachable one-liners."""
        link = self._connection(time.monotonic() + timeout)
        try:
            sftp = link.take_sftp(timeout)
        except (paramiko.SSHException, EOFError, OSError) as e:
            self._raise_if_lost(link)
            raise HostError(f"{self.label}: could not start SFTP: {e}") from e
        sftp.get_channel().settimeout(timeout)
        reusable = False
        try:
            yield sftp
            reusable = True
        except HostError:
            reusable = True
            raise
        except (socket.timeout, TimeoutError) as e:
            self._raise_if_lost(link)
            raise HostTimeout(f"{self.name}:{path}: no progress for {timeout:g}s") from e
        except (paramiko.SSHException, EOFError) as e:
            self._raise_if_lost(link)
            raise HostError(f"{self.name}:{path}: {e}") from e
        except OSError as e:
            self._raise_if_lost(link)
            reusable = True  # a file-level error: the session itself is fine
            raise HostError(f"{self.name}:{path}: {e.strerror or e}") from e
        finally:
            if reusable and link.alive():
                link.give_sftp(sftp)
            else:
                sftp.close()

    def _remote_path(self, path: str) -> str:
        """SFTP paths do not expand ~: do it with the login directory."""
        if path == "~" or path.startswith("~/"):
            return self.home() + path[1:]
        return path

    def home(self) -> str:
        link = self._connection(time.monotonic() + self.connect_timeout)
        if link.home is None:
            with self._sftp("~") as sftp:
                link.home = sftp.normalize(".")
        return link.home

    def stat(self, path: str) -> FileStat | None:
        rpath = self._remote_path(path)
        with self._sftp(path) as sftp:
            try:
                st = sftp.stat(rpath)
            except FileNotFoundError:
                return None
        return FileStat(path, st.st_size, st.st_mtime, st.st_mode & 0o7777, stat_mod.S_ISDIR(st.st_mode))

    def read_range(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        rpath = self._remote_path(path)
        with self._sftp(path) as sftp:
            with sftp.open(rpath, "rb") as f:
                size = f.stat().st_size
                end = size if length is None else min(size, offset + length)
                if end <= offset:
                    return b""
                # readv pipelines the requests; 1 MiB pieces keep paramiko's read() from going quadratic
                pieces = [(o, min(CHUNK, end - o)) for o in range(offset, end, CHUNK)]
                return b"".join(f.readv(pieces, MAX_PREFETCH))

    def _mkdir_parent(self, rpath: str) -> str:
        parent = posixpath.dirname(rpath) or "."
        self.run(["mkdir", "-p", "--", parent], timeout=STALL_TIMEOUT).check()
        return parent

    def _temp_name(self, parent: str, rpath: str) -> str:
        return posixpath.join(parent, temp_name())

    def _discard(self, sftp: paramiko.SFTPClient, tmp: str) -> None:
        try:
            sftp.remove(tmp)
        except (OSError, paramiko.SSHException, EOFError):
            pass

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        rpath = self._remote_path(path)
        self._audit(join_argv(["sftp-write", rpath]))
        tmp = self._temp_name(self._mkdir_parent(rpath), rpath)
        with self._sftp(path) as sftp:
            try:
                with sftp.open(tmp, "wb") as f:
                    f.set_pipelined(True)
                    f.write(data)
                sftp.chmod(tmp, mode)
                sftp.posix_rename(tmp, rpath)
            except BaseException:
                self._discard(sftp, tmp)
                raise

    def push(self, local, remote, *, verify=False) -> TransferResult:
        src = Path(local)
        if not src.is_file():
            raise HostError(f"{src}: not a file")
        st = src.stat()
        rpath = self._remote_path(remote)
        self._audit(join_argv(["sftp-put", str(src), rpath]))
        t0 = time.monotonic()
        tmp = self._temp_name(self._mkdir_parent(rpath), rpath)
        digest = hashlib.sha256() if verify else None
        with open(src, "rb") as lf, self._sftp(remote) as sftp:
            try:
                sent = 0
                with sftp.open(tmp, "wb") as rf:
                    rf.set_pipelined(True)
                    for chunk in iter(lambda: lf.read(CHUNK), b""):
                        rf.write(chunk)
                        sent += len(chunk)
                        if digest is not None:
                            digest.update(chunk)
                sftp.chmod(tmp, st.st_mode & 0o7777)
                size = sftp.stat(tmp).st_size
                if size != sent:
                    raise HostError(f"{self.name}:{remote}: remote size {size} != local size {sent} after upload")
                if digest is not None:
                    theirs = self.sha256(tmp)
                    if theirs != digest.hexdigest():
                        raise HostError(f"{self.name}:{remote}: sha256 on the node differs from {src}")
                sftp.posix_rename(tmp, rpath)
            except BaseException:
                self._discard(sftp, tmp)
                raise
        return TransferResult(
            str(src), remote, size, digest.hexdigest() if digest else None, time.monotonic() - t0
        )

    def fetch(self, remote, local) -> TransferResult:
        dst = Path(local)
        rpath = self._remote_path(remote)
        t0 = time.monotonic()
        dst.parent.mkdir(parents=True, exist_ok=True)
        with self._sftp(remote) as sftp:
            st = sftp.stat(rpath)
            if not stat_mod.S_ISREG(st.st_mode):
                raise HostError(f"{self.name}:{remote}: not a file")
            fd, tmp = tempfile.mkstemp(prefix=".nd-", suffix=".part", dir=dst.parent)
            try:
                with os.fdopen(fd, "wb") as lf, sftp.open(rpath, "rb") as rf:
                    rf.prefetch(st.st_size, MAX_PREFETCH)
                    got = 0
                    while got < st.st_size:
                        chunk = rf.read(min(CHUNK, st.st_size - got))
                        if not chunk:
                            break
                        lf.write(chunk)
                        got += len(chunk)
                if got != st.st_size:
                    raise HostError(f"{self.name}:{remote}: got {got} of {st.st_size} bytes (file changed?)")
                os.chmod(tmp, st.st_mode & 0o7777)
                os.replace(tmp, dst)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        return TransferResult(str(dst), remote, got, None, time.monotonic() - t0)

    # -- long-running processes -----------------------------------------------
    def open_process(self, argv, *, timeout=30.0) -> HostProcess:
        """An exec channel on the persistent transport left open for streaming."""
        argv = [str(a) for a in argv]
        cmdline = command_line(argv)
        self._audit(cmdline)
        deadline = None if timeout is None else time.monotonic() + timeout
        link = self._connection(deadline)
        chan = self._open_channel(link, deadline)
        try:
            chan.exec_command(cmdline)
        except (paramiko.SSHException, EOFError, OSError) as e:
            chan.close()
            self._raise_if_lost(link)
            raise HostError(f"{self.label}: could not start {argv[0]}: {e}") from e
        return _ChannelProcess(self, link, chan)


class _ChannelProcess(HostProcess):
    """A remote command on its own channel; a dead transport reads as the end of output."""

    def __init__(self, host: SSHHost, link: _Link, chan: paramiko.Channel):
        super().__init__()
        self._host, self._link, self._chan = host, link, chan
        self._wakeup = _Wakeup(chan)

    def write(self, data: bytes) -> None:
        try:
            self._chan.sendall(data)
        except (OSError, EOFError, paramiko.SSHException) as e:
            raise HostError(f"{self._host.label}: stream closed: {e}") from e

    def _read_some(self, timeout: float) -> bytes | None:
        chan = self._chan
        if not chan.recv_ready():
            if chan.closed or chan.eof_received or not self._link.alive():
                return b""
            self._wakeup.wait(min(max(0.0, timeout), 0.5))
            if not chan.recv_ready():
                return b"" if chan.closed or chan.eof_received or not self._link.alive() else None
        return chan.recv(CHUNK)

    def stderr_tail(self) -> str:
        if self._chan.eof_received:
            self._chan.status_event.wait(0.5)  # stderr comes before the exit status
        err = bytearray()
        while self._chan.recv_stderr_ready():
            err.extend(self._chan.recv_stderr(CHUNK))
        tail = err.decode(errors="replace").strip().splitlines()
        return tail[-1] if tail else ""

    def close(self) -> None:
        self._chan.close()
