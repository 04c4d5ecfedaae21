"""LocalHost: the machine nodedeck runs on, through subprocess."""

from __future__ import annotations

import hashlib
import os
import select
import selectors
import shutil
import stat
import subprocess
import tempfile
import threading
import time
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from ops.errors import HostError, HostTimeout, OutputTooLarge
from ops.hosts.base import (
    MAX_OUTPUT,
    CommandResult,
    ConnState,
    FileStat,
    Host,
    HostInfo,
    HostProcess,
    TransferResult,
    join_argv,
    time_cap,
    too_large,
)
from ops.stderr_tail import StderrTail


@contextmanager
def replacing(dst: Path, mode: int) -> Iterator[str]:
    """A temp file beside dst (its parents made) for the caller to fill: then given mode and renamed over dst,
    or removed when anything fails."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".nd-", suffix=".part", dir=dst.parent)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, mode)
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _sha256(path: str | Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _collect(p: subprocess.Popen, input: bytes | None, deadline: float, out: bytearray, err: bytearray,
             cap: int) -> None:
    """Feed p's stdin and read its stdout and stderr into out and err until both end and p exits; TimeoutExpired
    past deadline, OutputTooLarge once either passes cap (the caller kills p)."""
    assert p.stdout is not None and p.stderr is not None
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ, out)
    sel.register(p.stderr, selectors.EVENT_READ, err)
    pending = memoryview(input or b"")
    if p.stdin is not None:
        os.set_blocking(p.stdin.fileno(), False)
        sel.register(p.stdin, selectors.EVENT_WRITE)
    with sel:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(p.args, 0)
            for key, _ in sel.select(left):
                if key.fileobj is p.stdin:
                    try:
                        pending = pending[os.write(key.fd, pending[: 1 << 16]):]
                    except BrokenPipeError:
                        pending = pending[:0]     # it closed its stdin: the rest is not read
                    if not pending:
                        sel.unregister(p.stdin)
                        p.stdin.close()
                    continue
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                key.data.extend(chunk)
                if len(key.data) > cap:
                    del key.data[cap:]
                    raise OutputTooLarge()
    p.wait(max(0.0, deadline - time.monotonic()))


class LocalHost(Host):
    """The local machine; always present as the node named `local`."""

    kind = "local"

    def __init__(self, name: str = "local", audit=None):
        super().__init__(name, audit)
        self._since = time.time()
        self._procs: weakref.WeakSet[_LocalProcess] = weakref.WeakSet()
        self._procs_lock = threading.Lock()

    def run(self, argv: Sequence[str], *, timeout=30.0, input=None, cwd=None, env=None,
            max_output: int = MAX_OUTPUT) -> CommandResult:
        argv = [str(a) for a in argv]
        self._audit(join_argv(argv))
        full_env = None if env is None else {**os.environ, **env}
        t0 = time.monotonic()
        timeout = time_cap(timeout)
        try:
            p = subprocess.Popen(argv, stdin=subprocess.PIPE if input else subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=full_env)
        except FileNotFoundError:
            missing_cwd = cwd is not None and not os.path.isdir(cwd)
            msg = f"{cwd}: no such directory\n" if missing_cwd else f"{argv[0]}: command not found\n"
            return CommandResult(tuple(argv), 127, b"", msg.encode(), time.monotonic() - t0)
        except OSError as e:
            raise HostError(f"{argv[0]}: {e}") from e
        out, err = bytearray(), bytearray()
        with p:   # on the way out: its pipes closed, and waited for
            try:
                _collect(p, input, t0 + timeout, out, err, max_output)
            except subprocess.TimeoutExpired as e:
                late = HostTimeout(f"{argv[0]}: no answer within {timeout:g}s on {self.name}")
                late.partial_stdout, late.partial_stderr = bytes(out), bytes(err)
                raise late from e
            except OutputTooLarge as e:
                raise too_large(self.name, argv[0], max_output, bytes(out), bytes(err)) from e
            finally:
                if p.poll() is None:
                    p.kill()
        return CommandResult(tuple(argv), p.returncode, bytes(out), bytes(err), time.monotonic() - t0)

    def stat(self, path: str) -> FileStat | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return FileStat(path, st.st_size, st.st_mtime, st.st_mode & 0o7777, os.path.isdir(path))

    def read_range(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)     # a FIFO must not block the reader
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise HostError(f"{path}: not a regular file")
            with os.fdopen(fd, "rb") as f:
                f.seek(offset)
                return f.read() if length is None else f.read(length)
        except OSError as e:
            raise HostError(f"{path}: {e.strerror}") from e

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        with replacing(Path(path), mode) as tmp:
            Path(tmp).write_bytes(data)

    def push(self, local, remote, *, verify=False) -> TransferResult:
        src = Path(local)
        if not src.is_file():
            raise HostError(f"{src}: not a file")
        t0 = time.monotonic()
        self._audit(join_argv(["cp", str(src), remote]))
        with replacing(Path(remote), src.stat().st_mode & 0o7777) as tmp:
            shutil.copyfile(src, tmp)
        if (size := os.path.getsize(remote)) != src.stat().st_size:
            raise HostError(f"{remote}: size {size} != {src.stat().st_size} after copy")
        digest = _sha256(src) if verify else None
        if digest is not None and _sha256(remote) != digest:
            raise HostError(f"{remote}: sha256 differs from {src} after copy")
        return TransferResult(str(src), remote, size, digest, time.monotonic() - t0)

    def fetch(self, remote, local) -> TransferResult:
        src = Path(remote)
        if not src.is_file():
            raise HostError(f"{remote}: not a file")
        t0 = time.monotonic()
        with replacing(Path(local), src.stat().st_mode & 0o7777) as tmp:
            shutil.copyfile(src, tmp)
        return TransferResult(str(local), remote, src.stat().st_size, None, time.monotonic() - t0)

    def home(self) -> str:
        return str(Path.home())

    def info(self) -> HostInfo:
        return HostInfo(self.name, self.kind, ConnState.CONNECTED, self._since)

    # -- long-running processes -----------------------------------------
    def open_process(self, argv: Sequence[str], *, timeout: float | None = 30.0) -> HostProcess:
        argv = [str(a) for a in argv]
        self._audit(join_argv(argv))
        try:
            p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        except OSError as e:
            raise HostError(f"{argv[0]}: {e.strerror or e}") from e
        proc = _LocalProcess(p)
        with self._procs_lock:
            self._procs.add(proc)
        return proc

    def close(self) -> None:
        """End the processes open_process started (as closing an SSH host's transport ends its channels)."""
        with self._procs_lock:
            procs = list(self._procs)
        for proc in procs:
            proc.close()


class _LocalProcess(HostProcess):
    """A subprocess with pipes; reads wait in select() so a timeout never blocks past itself, and its stderr is
    read as it comes (StderrTail): a process that writes much there never blocks on a full pipe."""

    def __init__(self, proc: subprocess.Popen):
        super().__init__()
        if proc.stdin is None or proc.stdout is None or proc.stderr is None:
            raise HostError(f"process {proc.pid} started without its pipes")
        self._proc = proc
        self._stdin, self._stdout = proc.stdin, proc.stdout
        self._stderr = StderrTail(proc.stderr)
        os.set_blocking(self._stdout.fileno(), False)

    def write(self, data: bytes) -> None:
        try:
            self._stdin.write(data)
        except (OSError, ValueError) as e:
            raise HostError(f"process {self._proc.pid} is gone: {e}") from e

    def _read_some(self, timeout: float) -> bytes | None:
        fd = self._stdout.fileno()
        if not select.select([fd], [], [], max(0.0, timeout))[0]:
            return None
        try:
            return os.read(fd, 1 << 16)
        except BlockingIOError:
            return None

    def stderr_tail(self) -> str:
        try:
            self._proc.wait(timeout=0.5)  # stdout just ended: the exit follows at once
        except subprocess.TimeoutExpired:
            return self._stderr.last_line()   # still running: what it wrote so far
        return self._stderr.last_line(wait=0.5)

    def close(self) -> None:
        p = self._proc
        for f in (self._stdin, self._stdout):
            try:
                f.close()
            except OSError:
                pass
        if p.poll() is None:
            p.kill()
        p.wait(timeout=5)
