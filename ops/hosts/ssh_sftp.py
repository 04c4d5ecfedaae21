"""Files on an SSH host over SFTP: sessions pooled on the host's link, atomic writes and uploads (temp
name, chmod, rename), pipelined reads and downloads. Every operation is bounded by STALL_TIMEOUT without
progress; its errors are HostError, HostTimeout or HostUnreachable one-liners.
"""

from __future__ import annotations

import contextlib
import hashlib
import posixpath
import socket
import stat as stat_mod
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import paramiko

from ops.errors import HostError, HostTimeout
from ops.hosts.base import FileStat, Host, TransferResult, join_argv, not_utf8, sendable, temp_name
from ops.hosts.local import replacing
from ops.hosts.ssh_connect import CHUNK, WINDOW, Connection, Link

STALL_TIMEOUT = 60.0  # a transfer with no progress for this long has failed
MAX_PREFETCH = 64  # concurrent SFTP read requests, as OpenSSH's sftp uses
OPENSSH_REQUEST = 255 * 1024  # OpenSSH's sftp-server takes reads/writes up to 256 KiB less 1 KiB


class _SFTP(paramiko.SFTPClient):
    """An SFTP session whose files use the largest request size the server takes (fewer round trips)."""

    request_size = paramiko.SFTPFile.MAX_REQUEST_SIZE

    def open(self, filename, mode="r", bufsize=-1):
        f = super().open(filename, mode, bufsize)
        f.MAX_REQUEST_SIZE = self.request_size
        return f


def _attrs(st: paramiko.SFTPAttributes, where: str) -> paramiko.SFTPAttributes:
    """st, when the node's SFTP server sent its size, mode and time (a reply may carry none: paramiko leaves None)."""
    if st.st_size is None or st.st_mode is None or st.st_mtime is None:
        raise HostError(f"{where}: the node's SFTP server sent no size, mode or time for it")
    return st


def _session(link: Link, timeout: float | None) -> paramiko.SFTPClient:
    """An idle SFTP session of link, else a new one."""
    with contextlib.suppress(IndexError):
        return link.idle_sftp.pop()
    chan = link.transport.open_session(window_size=WINDOW, timeout=timeout)
    chan.invoke_subsystem("sftp")
    sftp = _SFTP(chan)
    if "OpenSSH" in (link.transport.remote_version or ""):
        sftp.request_size = OPENSSH_REQUEST
    return sftp


class SFTPHost(Host):
    """The file operations of SSHHost, over SFTP on its connection (`_conn`); each write is audited."""

    _conn: Connection
    connect_timeout: float

    @contextmanager
    def session(self, path: str, timeout: float = STALL_TIMEOUT) -> Iterator[paramiko.SFTPClient]:
        """A pooled SFTP session; errors become HostError/HostTimeout/HostUnreachable one-liners."""
        name = self.name
        link = self._conn.link(time.monotonic() + timeout)
        try:
            sftp = _session(link, timeout)
        except (paramiko.SSHException, EOFError, OSError) as e:
            self._conn.raise_if_lost(link)
            raise HostError(f"{self._conn.label}: could not start SFTP: {e}") from e
        sftp.get_channel().settimeout(timeout)
        reusable = False
        try:
            yield sftp
            reusable = True
        except HostError:
            reusable = True
            raise
        except (socket.timeout, TimeoutError) as e:
            self._conn.raise_if_lost(link)
            raise HostTimeout(f"{name}:{path}: no progress for {timeout:g}s") from e
        except (paramiko.SSHException, EOFError) as e:
            self._conn.raise_if_lost(link)
            raise HostError(f"{name}:{path}: {e}") from e
        except OSError as e:
            self._conn.raise_if_lost(link)
            reusable = True  # a file-level error: the session itself is fine
            raise HostError(f"{name}:{path}: {e.strerror or e}") from e
        finally:
            if reusable and link.alive():
                link.idle_sftp.append(sftp)
            else:
                sftp.close()

    def home(self) -> str:
        """The login directory (asked once per link)."""
        link = self._conn.link(time.monotonic() + self.connect_timeout)
        if link.home is None:
            with self.session("~") as sftp:
                try:
                    link.home = sftp.normalize(".")
                except UnicodeDecodeError as e:   # paramiko decodes the name strictly: it is not UTF-8
                    raise not_utf8(self.name, "the home directory", e.object) from None
        return link.home

    def remote_path(self, path: str) -> str:
        """SFTP paths do not expand ~: do it with the login directory. HostError for a path that is not UTF-8
        (paramiko sends a path as UTF-8)."""
        if path == "~" or path.startswith("~/"):
            path = self.home() + path[1:]
        return sendable(self.name, "the path", path)

    def stat(self, path: str) -> FileStat | None:
        rpath = self.remote_path(path)
        with self.session(path) as sftp:
            try:
                st = _attrs(sftp.stat(rpath), f"{self.name}:{path}")
            except FileNotFoundError:
                return None
        return FileStat(path, st.st_size, st.st_mtime, st.st_mode & 0o7777, stat_mod.S_ISDIR(st.st_mode))

    def read_range(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        rpath = self.remote_path(path)
        with self.session(path) as sftp:
            with sftp.open(rpath, "rb") as f:
                size = _attrs(f.stat(), f"{self.name}:{path}").st_size
                end = size if length is None else min(size, offset + length)
                if end <= offset:
                    return b""
                # readv pipelines the requests; 1 MiB pieces keep paramiko's read() from going quadratic
                pieces = [(o, min(CHUNK, end - o)) for o in range(offset, end, CHUNK)]
                return b"".join(f.readv(pieces, MAX_PREFETCH))

    @contextmanager
    def _replacing(self, path: str, rpath: str, mode: int) -> Iterator[tuple[paramiko.SFTPClient, str]]:
        """A session and a temp name beside rpath (its directory made) for the caller to fill: then given mode and
        renamed over rpath, or removed when anything fails."""
        parent = posixpath.dirname(rpath) or "."
        self.run(["mkdir", "-p", "--", parent], timeout=STALL_TIMEOUT).check()
        tmp = posixpath.join(parent, temp_name())
        with self.session(path) as sftp:
            try:
                yield sftp, tmp
                sftp.chmod(tmp, mode)
                sftp.posix_rename(tmp, rpath)
            except BaseException:
                with contextlib.suppress(OSError, paramiko.SSHException, EOFError):
                    sftp.remove(tmp)
                raise

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        rpath = self.remote_path(path)
        self._audit(join_argv(["sftp-write", rpath]))
        with self._replacing(path, rpath, mode) as (sftp, tmp), sftp.open(tmp, "wb") as f:
            f.set_pipelined(True)
            f.write(data)

    def push(self, local: str | Path, remote: str, *, verify: bool = False) -> TransferResult:
        name = self.name
        src = Path(local)
        if not src.is_file():
            raise HostError(f"{src}: not a file")
        st = src.stat()
        rpath = self.remote_path(remote)
        self._audit(join_argv(["sftp-put", str(src), rpath]))
        t0 = time.monotonic()
        digest = hashlib.sha256() if verify else None
        with open(src, "rb") as lf, self._replacing(remote, rpath, st.st_mode & 0o7777) as (sftp, tmp):
            sent = 0
            with sftp.open(tmp, "wb") as rf:
                rf.set_pipelined(True)
                for chunk in iter(lambda: lf.read(CHUNK), b""):
                    rf.write(chunk)
                    sent += len(chunk)
                    if digest is not None:
                        digest.update(chunk)
            size = sftp.stat(tmp).st_size
            if size != sent:
                raise HostError(f"{name}:{remote}: remote size {size} != local size {sent} after upload")
            if digest is not None and self.sha256(tmp) != digest.hexdigest():
                raise HostError(f"{name}:{remote}: sha256 on the node differs from {src}")
        return TransferResult(
            str(src), remote, size, digest.hexdigest() if digest else None, time.monotonic() - t0
        )

    def fetch(self, remote: str, local: str | Path) -> TransferResult:
        name = self.name
        dst = Path(local)
        rpath = self.remote_path(remote)
        t0 = time.monotonic()
        with self.session(remote) as sftp:
            st = _attrs(sftp.stat(rpath), f"{name}:{remote}")
            if not stat_mod.S_ISREG(st.st_mode):
                raise HostError(f"{name}:{remote}: not a file")
            with replacing(dst, st.st_mode & 0o7777) as tmp:
                with open(tmp, "wb") as lf, sftp.open(rpath, "rb") as rf:
                    rf.prefetch(st.st_size, MAX_PREFETCH)
                    got = 0
                    while got < st.st_size:
                        chunk = rf.read(min(CHUNK, st.st_size - got))
                        if not chunk:
                            break
                        lf.write(chunk)
                        got += len(chunk)
                if got != st.st_size:
                    raise HostError(f"{name}:{remote}: got {got} of {st.st_size} bytes (file changed?)")
        return TransferResult(str(dst), remote, got, None, time.monotonic() - t0)
