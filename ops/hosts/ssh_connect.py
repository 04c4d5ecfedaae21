"""Connecting and authenticating over SSH through paramiko, and keeping the connection.

open_link() connects every hop of a ProxyJump chain (or a ProxyCommand, or plain TCP), checks host keys
(and host certificates) against known_hosts like OpenSSH does, and offers keys in OpenSSH's order
(ssh_keys.py). A Connection keeps one such Link per host, opened lazily and shared by every command;
a dead one is reopened on the next call with exponential backoff (CONNECTED -> RECONNECTING -> CONNECTED),
connecting bounded by connect_timeout.
"""

from __future__ import annotations

import contextlib
import shlex
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, overload

import paramiko

from ops.errors import HostKeyError, HostTimeout, HostUnreachable, UserError
from ops.hosts.base import ConnState, HostInfo
from ops.hosts.known_hosts import KnownHosts
from ops.hosts.ssh_keys import KeyRing, PassphrasePrompt
from ops.hosts.ssh_target import MAX_HOPS, SSHTarget, next_hop
from ops.textsafe import printable, shown

WINDOW = 64 << 20  # receive window per channel: keeps bulk reads streaming
CHUNK = 1 << 20  # local read/write size for command output and transfers
CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes192-ctr", "aes256-ctr")
"""Offered in this order: OpenSSH's default ciphers that paramiko has (it has no chacha20-poly1305), AES-GCM
first: its tag is checked in C, where CTR's HMAC is compared byte by byte in Python, every packet. Never
CBC or 3DES (paramiko's defaults offer both; OpenSSH's do not)."""
MACS = ("hmac-sha2-256-etm@openssh.com", "hmac-sha2-512-etm@openssh.com", "hmac-sha2-256", "hmac-sha2-512",
        "hmac-sha1")
"""For CTR: OpenSSH's default MACs that paramiko has, encrypt-then-MAC first; never MD5 or truncated ones."""
IDLE_WAKEUP_S = 1.0
"""The socket timeout of a connected transport: its thread wakes this often when nothing comes (to send
keepalives, to notice close()). paramiko sets 0.1 s: ten wakeups a second per node, about 0.04% of a core
each in a fleet. The handshake keeps paramiko's, so connecting stays bounded by connect_timeout."""


@overload
def remaining(deadline: float) -> float: ...
@overload
def remaining(deadline: None) -> None: ...
def remaining(deadline: float | None) -> float | None:
    """Seconds left until a time.monotonic() deadline (0 when past), None without one."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def socket_reason(e: BaseException, timeout: float | None) -> str:
    """A socket or SSH error as a few lowercase words (what the server said in it: inert, cut)."""
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, (socket.timeout, TimeoutError)):
        return f"no answer within {timeout:g}s" if timeout else "timed out"
    if isinstance(e, socket.gaierror):
        return f"cannot resolve host name ({e.strerror})"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror.lower()
    return printable(str(e) or type(e).__name__)


class Link:
    """One live connection: the transports of every hop (final one last) and idle SFTP sessions (a deque: its
    appends and pops are thread-safe)."""

    def __init__(self, transports: list[paramiko.Transport]):
        self.transports = transports
        self.transport = transports[-1]
        self.idle_sftp: deque[paramiko.SFTPClient] = deque()
        self.home: str | None = None

    def alive(self) -> bool:
        return all(t.is_active() for t in self.transports)

    def lost_reason(self) -> str:
        """Why the link is down, as the first dead transport says."""
        for t in self.transports:
            exc = t.get_exception() if not t.is_active() else None
            if exc is not None and str(exc):
                return f"connection lost ({printable(exc)})"
        return "connection lost"

    def close(self) -> None:
        while self.idle_sftp:
            with contextlib.suppress(IndexError):   # another thread took the last one
                self.idle_sftp.pop().close()
        for t in reversed(self.transports):
            t.close()


@dataclass(frozen=True)
class Dial:
    """Everything open_link needs, as the host has it when it connects."""

    name: str
    label: str
    target: SSHTarget
    accept_new_host_key: bool
    connect_timeout: float
    keepalive: float
    passphrase_prompt: PassphrasePrompt | None


def open_link(dial: Dial, deadline: float) -> Link:
    """Connect and authenticate every hop to dial.target; raises HostUnreachable, HostKeyError, UserError."""
    transports: list[paramiko.Transport] = []
    try:
        _open_hop(dial, dial.target, transports, deadline, 0)
    except BaseException as e:
        for t in reversed(transports):
            t.close()
        if isinstance(e, (paramiko.SSHException, EOFError, OSError)):   # anything the hop steps did not name
            raise HostUnreachable(f"{dial.label}: {socket_reason(e, remaining(deadline))}") from e
        raise
    return Link(transports)


def _open_hop(
    dial: Dial, target: SSHTarget, transports: list[paramiko.Transport], deadline: float, depth: int
) -> paramiko.Transport:
    """Connect and authenticate one hop (its jump hosts first); append every transport opened."""
    if depth > MAX_HOPS:
        raise HostUnreachable(f"{dial.label}: ProxyJump chain longer than {MAX_HOPS} hops (a loop?)")
    label = f"{dial.name} ({target.address})" if depth == 0 else f"jump host {target.alias} ({target.address})"
    for field, value in (("HostName", target.hostname), ("User", target.user)):
        if any("\udc80" <= c <= "\udcff" for c in value):   # a byte of the ssh config that is not UTF-8
            raise UserError(f"{shown(label)}: ssh config {field} {shown(value)}: not UTF-8 text, "
                            "which no host name or user name on the wire can be")
    jump = next_hop(target)
    sock: socket.socket | paramiko.Channel | paramiko.ProxyCommand
    if jump is not None:
        jump_t = _open_hop(dial, jump, transports, deadline, depth + 1)
        try:
            sock = jump_t.open_channel(
                "direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0),
                window_size=WINDOW, timeout=remaining(deadline),
            )
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise HostUnreachable(f"{label}: {jump.alias} could not connect to it ({e})") from e
    elif target.proxy_command:
        try:
            sock = paramiko.ProxyCommand("sh -c " + shlex.quote(target.proxy_command_line()))
        except paramiko.ProxyCommandFailure as e:
            raise HostUnreachable(f"{label}: ProxyCommand failed: {e}") from e
    else:
        wait = remaining(deadline)
        try:
            sock = socket.create_connection((target.hostname, target.port), timeout=wait)
        except OSError as e:
            raise HostUnreachable(f"{label}: {socket_reason(e, wait)}") from e
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t = paramiko.Transport(sock, default_window_size=WINDOW)
    transports.append(t)
    wait = max(remaining(deadline), 0.1)
    t.banner_timeout = t.handshake_timeout = t.auth_timeout = wait
    known = KnownHosts(target.user_known_hosts, target.global_known_hosts)
    opts = t.get_security_options()
    # Transport._key_info: the host key types paramiko can verify (tests/test_dependency_pins.py)
    opts.key_types = known.preferred_algorithms(target.known_hosts_name, tuple(opts.key_types), tuple(t._key_info))
    opts.ciphers = tuple(c for c in CIPHERS if c in opts.ciphers)
    opts.digests = tuple(m for m in MACS if m in opts.digests)
    try:
        t.start_client(timeout=wait)
    except (paramiko.SSHException, EOFError, OSError) as e:
        raise HostUnreachable(f"{label}: SSH handshake failed: {socket_reason(e, wait)}") from e
    try:
        key = t.get_remote_server_key()
    except paramiko.SSHException:  # start_client returns without error when it runs out of time
        raise HostUnreachable(f"{label}: SSH handshake failed: no answer within {wait:g}s") from None
    if known.verify(
        target.known_hosts_name, label, key, accept_new=dial.accept_new_host_key, principal=target.cert_principal
    ):
        known.add(target.known_hosts_name, key, hashed=target.hash_known_hosts)
    _authenticate(t, target, label, dial.passphrase_prompt)
    t.set_keepalive(max(1, int(dial.keepalive)))
    sock.settimeout(IDLE_WAKEUP_S)   # the transport thread reads with it (tests/test_dependency_pins.py)
    return t


def _authenticate(t: paramiko.Transport, target: SSHTarget, label: str, prompt: PassphrasePrompt | None) -> None:
    """Offer keys in OpenSSH's order (see ssh_keys.py) until the server accepts one."""
    tried = []
    with KeyRing(target.identity_files, target.identities_only, target.identity_agent) as ring:
        for offer in ring.offers():
            key = offer.key if offer.key is not None else ring.load(offer, prompt)
            if key is None:
                continue
            try:
                remaining_methods = t.auth_publickey(target.user, key)
            except paramiko.AuthenticationException:
                tried.append(offer.label)
                continue
            except (paramiko.SSHException, EOFError, OSError) as e:
                raise HostUnreachable(f"{label}: authentication broke off: {socket_reason(e, None)}") from e
            if t.is_authenticated():
                return
            ring.problems.append(f"server also wants {','.join(remaining_methods)}, which nodedeck cannot do")
            break
        problems = ring.problems
    detail = f"tried {', '.join(tried)}" if tried else "no usable key"
    if problems:
        detail += "; " + "; ".join(problems)
    raise HostUnreachable(f"{label}: authentication failed for user {target.user} ({detail})")


class Connection:
    """A host's one Link: opened on first use, reopened with backoff after a drop; safe from any thread.

    `dial()` says how to connect, read at each (re)connect (a passphrase prompt set later counts)."""

    def __init__(self, dial: Callable[[], Dial]):
        self._dial = dial
        self._connect_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._link: Link | None = None
        self._state = ConnState.DISCONNECTED
        self._since = time.time()
        self._last_error: str | None = None
        self._was_connected = False
        self._backoff = 0.0
        self._retry_at = 0.0

    @property
    def label(self) -> str:
        """The host as messages name it."""
        return self._dial().label

    def _set_state(self, state: ConnState, error: str | None = None) -> None:
        with self._state_lock:
            if state != self._state:
                self._state, self._since = state, time.time()
            if error is not None:
                self._last_error = error

    def lost(self, link: Link, reason: str) -> None:
        """Forget a dead link; the next call reconnects."""
        with self._state_lock:
            if self._link is not link:
                return
            self._link = None
        link.close()
        self._set_state(ConnState.RECONNECTING, reason)

    def info(self, name: str, kind: str) -> HostInfo:
        link = self._link
        if link is not None and not link.alive():
            self.lost(link, link.lost_reason())
        with self._state_lock:
            return HostInfo(name, kind, self._state, self._since, self._last_error)

    def link(self, deadline: float | None) -> Link:
        """The live link, connecting (within connect_timeout and the deadline) when there is none."""
        link = self._link
        if link is not None and link.alive():
            return link
        dial = self._dial()
        budget = dial.connect_timeout if deadline is None else min(dial.connect_timeout, remaining(deadline))
        connect_deadline = time.monotonic() + budget
        if not self._connect_lock.acquire(timeout=budget):
            raise HostTimeout(f"{dial.label}: still connecting after {budget:g}s")
        try:
            link = self._link
            if link is not None:
                if link.alive():
                    return link
                self.lost(link, link.lost_reason())
            return self._reconnect(dial, connect_deadline)
        finally:
            self._connect_lock.release()

    def _reconnect(self, dial: Dial, deadline: float) -> Link:
        """Open a link, retrying with backoff when it had been connected before."""
        self._set_state(ConnState.RECONNECTING if self._was_connected else ConnState.CONNECTING)
        while True:
            wait = self._retry_at - time.monotonic()
            if wait > 0:
                if time.monotonic() + wait >= deadline:
                    raise HostUnreachable(f"{self._last_error} (next try in {wait:.1f}s)")
                time.sleep(wait)
            try:
                link = open_link(dial, deadline)
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

    def raise_if_lost(self, link: Link) -> None:
        if not link.alive():
            self.raise_lost(link)

    def raise_lost(self, link: Link) -> None:
        """Drop the link and raise HostUnreachable (its transports close within moments)."""
        for _ in range(100):
            if not link.alive():
                break
            time.sleep(0.01)
        reason = link.lost_reason()
        self.lost(link, reason)
        raise HostUnreachable(f"{self.label}: {reason}")

    def close(self) -> None:
        with self._connect_lock:
            with self._state_lock:
                link, self._link = self._link, None
            if link is not None:
                link.close()
            self._was_connected = False
            self._backoff, self._retry_at = 0.0, 0.0
            self._set_state(ConnState.DISCONNECTED)
