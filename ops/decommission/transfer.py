"""Downloading node files with resume, parallel streams and sha256 on both ends in the same pass.

Each file lands as `<dest>/.partial/<short name>.part` and is renamed to
`<dest>/files/<path>` once complete (mode and mtime from the listing), all
through `localtree.DestTree` (directory descriptors, never a link followed).
A rerun appends to an existing .part from its size; the bytes already there
are hashed locally, not fetched again.

Two kinds of stream fetch the bytes:
- OpenSSHStream: one `ssh` process per stream running a small read-only loop
  on the node: for each request (offset, limit, path) it answers a header, exactly
  the promised bytes (`dd` from the offset; zero padding if the file shrank)
  and a trailer with the real count and the sha256 of the file's bytes up to
  there, computed on the node from the very read that fed the stream (`tee`
  into `sha256sum`; a resumed file's first part is read again for the hash
  only). The local side hashes while writing, from the page-aligned buffer the
  bytes came into, written with O_DIRECT where the filesystem allows (direct.py):
  no second pass on either end, no copy into the page cache. Requests are pipelined.
- HostRangeStream: `Host.stat` + `Host.read_range` chunks (SFTP on SSHHost,
  plain reads on LocalHost): the fallback, and the local copy. Its files are
  hashed on the node afterwards (checksums.py).
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import queue
import select
import shutil
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, cast

from ops import nodenum
from ops.decommission.direct import ALIGN, PartWriter, aligned_buffer
from ops.decommission.localtree import FILES, PARTIAL, DestTree, part_name
from ops.errors import HostError
from ops.hosts.base import Host, join_argv, pop_line
from ops.hosts.ssh_target import SSHTarget
from ops.stderr_tail import StderrTail
from ops.textsafe import last_line, printable

CHUNK = 1 << 20
RANGE_CHUNK = 8 << 20
WINDOW = 8  # requests in flight per stream, at most...
STALL_S = 120.0
"""An ssh stream whose node sends nothing for this long, while an answer is awaited, has failed (a node that is
connected and alive but silent: ssh's keepalives cannot tell)."""
POLL_S = 0.5  # how often a read waiting on the node looks at the cancel event
WINDOW_BYTES = 4 << 20  # ...while they add up to less than this: big files stay free for other streams
RESTARTS = 3  # times one file may be found shorter than its partial download before it fails

# Read-only sender loop run on the node by each OpenSSH stream. The file's bytes go to
# the stream (fd 3) and, through `tee`, to sha256sum; dd's count, its exit status and the
# digest come back through fd 4 into $r, which bash reads to its end (the hash included).
# dd and sha256sum write to fd 4 at the same time, and GNU dd writes its `bytes copied` line and
# the newline after it in two writes, so the digest can land between them: `tally` looks for it
# at the end of any line, not on a line of its own.
_TALLY_SH = r"""
tally() {  # dd's report, `rc N` and sha256sum's `<digest>  -` on stdin -> `got rc digest`
  local line h got=0 rc=1 sha=-
  while IFS= read -r line; do
    case $line in *" bytes"*" copied"*) got=${line%% *} ;; esac
    case $line in "rc "*) rc=${line#rc } ;; esac
    case $line in *"  -") h=${line%  -}; h=${h: -64}
      case $h in *[!0-9a-f]*) ;; *) [ ${#h} -eq 64 ] && sha=$h ;; esac ;;
    esac
  done
  case $got in ''|*[!0-9]*) got=0 ;; esac
  printf '%s %s %s\n' "$got" "$rc" "$sha"
}
"""
_SENDER_SH = _TALLY_SH + r"""
for t in dd stat head tee sha256sum; do
  command -v $t >/dev/null || { echo "the node has no $t" >&2; exit 3; }
done
printf 'NDK READY\n'
exec 3>&1
while IFS= read -r -d '' off && IFS= read -r -d '' lim && IFS= read -r -d '' p; do
  if [ ! -f "$p" ]; then printf 'NDK ERR missing or not a regular file\n'; continue; fi
  if [ ! -r "$p" ]; then printf 'NDK ERR permission denied\n'; continue; fi
  sz=$(stat -c %s -- "$p" 2>/dev/null) || { printf 'NDK ERR cannot stat\n'; continue; }
  end=$sz; if [ -n "$lim" ] && [ "$lim" -lt "$sz" ]; then end=$lim; fi
  n=$((end > off ? end - off : 0))
  printf 'NDK OK %s %s\n' "$sz" "$n"
  if [ "$off" -eq 0 ]; then
    r=$( { LC_ALL=C dd if="$p" bs=1M iflag=count_bytes count="$n" 2>&4 | tee >(sha256sum >&4) >&3
           echo "rc ${PIPESTATUS[0]}" >&4; } 4>&1 )
  else
    r=$( { LC_ALL=C dd if="$p" bs=1M iflag=skip_bytes,count_bytes skip="$off" count="$n" 2>&4 \
             | tee >( { head -c "$off" -- "$p"; cat; } | sha256sum >&4) >&3
           echo "rc ${PIPESTATUS[0]}" >&4; } 4>&1 )
  fi
  read -r got rc sha <<< "$(tally <<< "$r")"
  if [ "$got" -lt "$n" ]; then head -c $((n - got)) /dev/zero; fi
  printf 'NDK END %s %s %s\n' "$got" "$rc" "$sha"
done
"""


# The same loop in Python, used where the node has python3: one read feeds the stream and the
# hash (fewer copies than dd | tee | sha256sum), same requests, same answers.
_SENDER_PY = r"""
import fcntl, hashlib, os, stat, sys
inp, OUT = sys.stdin.buffer, 1
BUF = bytearray(1 << 20)
try:  # a pipe as large as a read: sshd takes each read whole, not 64 KiB per wake-up (Linux)
    fcntl.fcntl(OUT, 1031, len(BUF))  # F_SETPIPE_SZ
except OSError:
    pass
os.write(OUT, b"NDK READY\n")

def put(data):
    view = memoryview(data)
    while view:
        view = view[os.write(OUT, view):]

def field():
    got = bytearray()
    while True:
        c = inp.read(1)
        if not c:
            return None
        if c == b"\0":
            return bytes(got)
        got += c

while True:
    off, lim, p = field(), field(), field()
    if p is None:
        break
    off = int(off)
    try:
        st = os.stat(p)
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):
        put(b"NDK ERR missing or not a regular file\n")
        continue
    try:
        fd = os.open(p, os.O_RDONLY)
    except OSError as e:
        put(b"NDK ERR permission denied\n" if e.errno == 13 else b"NDK ERR cannot open\n")
        continue
    size = os.fstat(fd).st_size
    end = min(size, int(lim)) if lim else size
    n = max(end - off, 0)
    put(b"NDK OK %d %d\n" % (size, n))
    h, got, rc, view = hashlib.sha256(), 0, 0, memoryview(BUF)
    try:
        pos = 0
        while pos < off:  # a resumed file: its first part is hashed, not sent
            k = os.readv(fd, [view[:min(len(BUF), off - pos)]])
            if not k:
                break
            h.update(view[:k])
            pos += k
        os.lseek(fd, off, 0)
        while got < n:
            k = os.readv(fd, [view[:min(len(BUF), n - got)]])
            if not k:
                break
            h.update(view[:k])
            put(view[:k])
            got += k
    except OSError:
        rc = 1
    os.close(fd)
    left = n - got
    while left:  # the file shrank: zeros keep the promise, the trailer says what was real
        put(bytes(min(left, len(BUF))))
        left -= min(left, len(BUF))
    put(b"NDK END %d %d %s\n" % (got, rc, h.hexdigest().encode()))
"""

# Starts the Python loop where the node has python3, else the shell loop. The system python3 comes
# first: it needs nothing but the standard library, and a pyenv or conda shim first in PATH costs a
# shell script's start-up (0.1 s here) on every stream.
_SENDER = ('for py in /usr/bin/python3 python3; do command -v "$py" >/dev/null 2>&1 && exec "$py" -c "$1"; done; '
           'exec bash -c "$2"')


class StreamError(HostError):
    """The stream itself broke (connection lost): every request in flight failed."""


class FileFailed(HostError):
    """One file could not be read on the node; the stream goes on."""


class MalformedAnswer(Exception):
    """The sender's answer for one file is not the protocol's: that file fails, the stream is cut (what follows
    cannot be trusted to be in step), the other files go on over a new one."""


def _count(what: str, text: str, most: int | None = None) -> int:
    """A byte count from the node (ops.nodenum: ASCII digits, a size), and at most `most` where that is known."""
    n = nodenum.BYTES.get(text) if text.isascii() and text.isdigit() else None
    if n is None or (most is not None and n > most):
        raise MalformedAnswer(f"malformed answer from the node: {what} {text[:40]!r}")
    return n


@dataclass
class Response:
    size: int  # the node file's size when it was sent
    count: int  # bytes that follow: max(size - offset, 0)
    chunks: Iterator[bytes | memoryview]  # each valid until the next is taken
    real: int | None = None  # set once chunks are consumed: bytes that came from the file
    node_sha256: str | None = None  # set once chunks are consumed, where the stream hashes on the node
    aligned: bool = False  # every chunk starts page-aligned in memory (it can be written with O_DIRECT)


class Stream(ABC):
    """One connection answering (path, offset) requests in order."""

    @abstractmethod
    def send(self, path: str, offset: int, limit: int | None = None) -> None:
        """Ask for path's bytes from offset up to limit (None: to its end when sent)."""

    @abstractmethod
    def receive(self) -> Response: ...

    def close(self) -> None:
        pass


# Reading one file on the node through `Host.run` with its name on stdin: for names SFTP
# cannot carry (paramiko sends text paths as UTF-8, so a name that is not UTF-8 fails there).
_STAT_SH = 'IFS= read -r -d "" p; [ -f "$p" ] || exit 3; exec stat -c %s -- "$p"'
_READ_SH = ('IFS= read -r -d "" p; exec dd if="$p" bs=1M iflag=skip_bytes,count_bytes '
            'skip="$1" count="$2" status=none')


def _utf8(path: str) -> bool:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class HostRangeStream(Stream):
    """Bytes through Host.stat/read_range: works on every Host."""

    def __init__(self, host: Host, chunk: int = RANGE_CHUNK):
        self.host = host
        self.chunk = chunk
        self._queue: deque[tuple[str, int, int | None]] = deque()

    def send(self, path: str, offset: int, limit: int | None = None) -> None:
        self._queue.append((path, offset, limit))

    def _by_run(self, path: str) -> bool:
        return self.host.kind != "local" and not _utf8(path)

    def _size(self, path: str) -> int | None:
        if not self._by_run(path):
            st = self.host.stat(path)
            return None if st is None or st.is_dir else st.size
        res = self.host.run(["bash", "-c", _STAT_SH, "nodedeck-stat"], input=_name(path))
        out = res.stdout.strip()
        return nodenum.BYTES.get(out) if res.returncode == 0 else None

    def _read(self, path: str, offset: int, length: int) -> bytes:
        if not self._by_run(path):
            return self.host.read_range(path, offset, length)
        res = self.host.run(["bash", "-c", _READ_SH, "nodedeck-read", str(offset), str(length)],
                            input=_name(path), timeout=120 + length / (1 << 20))
        if res.returncode != 0:
            raise FileFailed(last_line(res.stderr) or f"read failed (exit {res.returncode})")
        return res.stdout

    def receive(self) -> Response:
        path, offset, limit = self._queue.popleft()
        try:
            size = self._size(path)
        except HostError as e:
            raise StreamError(str(e)) from e
        if size is None:
            raise FileFailed("missing or not a regular file")
        count = max(min(size, size if limit is None else limit) - offset, 0)
        resp = Response(size, count, iter(()))

        def chunks() -> Iterator[bytes | memoryview]:
            got = 0
            while got < count:
                try:
                    data = self._read(path, offset + got, min(self.chunk, count - got))
                except FileFailed:
                    raise
                except HostError as e:
                    raise StreamError(str(e)) from e
                if not data:  # the file shrank
                    break
                got += len(data)
                yield data
            resp.real = got

        resp.chunks = chunks()
        return resp


def _name(path: str) -> bytes:
    return path.encode("utf-8", "surrogateescape") + b"\0"


class OpenSSHStream(Stream):
    """An `ssh` process running the sender loop; requests are pipelined."""

    def __init__(self, ssh_argv: list[str], python: bool = True, cancel: threading.Event | None = None):
        """`python`: the Python sender where the node has python3 (else, and with False, the shell one); a read
        waiting on the node ends (StreamError) once `cancel` is set, or after STALL_S without a byte."""
        self._cancel = cancel
        sender = (["sh", "-c", _SENDER, "nodedeck-sender", _SENDER_PY, _SENDER_SH] if python
                  else ["bash", "-c", _SENDER_SH])
        self.proc = subprocess.Popen(
            [*ssh_argv, join_argv(sender)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
        )
        if self.proc.stdin is None or self.proc.stdout is None or self.proc.stderr is None:
            raise RuntimeError("ssh started without its pipes")
        self._err = StderrTail(self.proc.stderr)   # what ssh (and the node's sender) say, bounded
        self._in = self.proc.stdin
        self._out = cast(io.FileIO, self.proc.stdout)   # bufsize=0: the raw pipe, which has readinto
        self._fd = self._out.fileno()
        try:  # fewer, larger reads from ssh (Linux; the default pipe holds 64 KiB)
            fcntl.fcntl(self._fd, fcntl.F_SETPIPE_SZ, CHUNK)
        except (OSError, AttributeError):
            pass
        self._buf = bytearray()  # read past the last header/payload
        self._asked: deque[tuple[int, int | None]] = deque()  # (offset, limit) of each request not yet answered
        self._chunk = aligned_buffer(CHUNK)  # payloads land here, written from here with O_DIRECT
        hello = self._readline()  # the node answers once it runs: the connection is proven usable
        if hello != b"NDK READY\n":
            err = self._lost()
            self.close()
            raise err if not hello else StreamError(f"unexpected answer from the node: {hello[:60]!r}")

    def _lost(self) -> StreamError:
        self.proc.poll()
        return StreamError(self._err.last_line(wait=1.0) or "connection lost")

    def send(self, path: str, offset: int, limit: int | None = None) -> None:
        head = f"{offset}\0{'' if limit is None else limit}\0".encode()
        try:
            self._in.write(head + path.encode("utf-8", "surrogateescape") + b"\0")
        except (BrokenPipeError, OSError):
            raise self._lost() from None
        self._asked.append((offset, limit))

    def _line(self) -> list[str]:
        line = self._readline()
        if not line.startswith(b"NDK ") or not line.endswith(b"\n"):
            raise self._lost() if not line else StreamError(f"stream out of step: {line[:60]!r}")
        return line[4:-1].decode(errors="replace").split(" ", 2)

    def _wait(self) -> None:
        """Until ssh's stdout has bytes or has ended; StreamError once cancelled or after STALL_S of silence."""
        deadline = time.monotonic() + STALL_S
        while not select.select([self._fd], [], [], min(POLL_S, max(0.0, deadline - time.monotonic())))[0]:
            if self._cancel is not None and self._cancel.is_set():
                raise StreamError("cancelled")
            if time.monotonic() >= deadline:
                raise StreamError(f"the node sent nothing for {STALL_S:g} s")

    def _readline(self) -> bytes:
        while (line := pop_line(self._buf)) is None:
            if len(self._buf) >= 4096:
                data = b""
            else:
                self._wait()
                data = os.read(self._fd, 1 << 16)
            if not data:
                return pop_line(self._buf, at_end=True)
            self._buf += data
        return line

    def _payload(self, n: int) -> memoryview:
        """Exactly n (<= CHUNK) payload bytes, in a buffer reused by the next call."""
        view = memoryview(self._chunk)
        got = min(len(self._buf), n)
        if got:
            view[:got] = self._buf[:got]
            del self._buf[:got]
        while got < n:
            self._wait()
            k = self._out.readinto(view[got:n])
            if not k:
                raise self._lost()
            got += k
        return view[:n]

    def receive(self) -> Response:
        head = self._line()
        offset, limit = self._asked.popleft() if self._asked else (0, None)
        if head[0] == "ERR":
            raise FileFailed(printable(" ".join(head[1:])))
        if head[0] != "OK" or len(head) != 3:
            raise MalformedAnswer(f"malformed answer from the node: {' '.join(head)[:60]!r}")
        size = _count("size", head[1])
        end = size if limit is None else min(size, limit)
        count = _count("byte count", head[2], max(end - offset, 0))
        if count != max(end - offset, 0):
            raise MalformedAnswer(f"malformed answer from the node: {count} bytes for a file of {size} "
                                  f"from offset {offset}")
        resp = Response(size, count, iter(()), aligned=True)

        def chunks() -> Iterator[bytes | memoryview]:
            left = count
            while left:
                data = self._payload(min(CHUNK, left))
                left -= len(data)
                yield data
            tail = self._line()
            if tail[0] != "END":
                raise StreamError(f"stream out of step: {printable(' '.join(tail))}")
            if len(tail) != 3 or " " not in tail[2]:
                raise MalformedAnswer(f"malformed answer from the node: {' '.join(tail)[:60]!r}")
            real, (rc, sha) = _count("real byte count", tail[1], count), tail[2].split(" ", 1)
            if rc != "0" and real < count:
                raise FileFailed(f"read error on the node (dd exit {rc}) after {real} bytes")
            resp.real = real
            resp.node_sha256 = sha if len(sha) == 64 else None

        resp.chunks = chunks()
        return resp

    def close(self) -> None:
        try:
            self._in.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._out.close()


def openssh_available() -> bool:
    return shutil.which("ssh") is not None


FAST_CIPHERS = ("-o", "Ciphers=^aes128-gcm@openssh.com,aes256-gcm@openssh.com")
"""AES-GCM first (hardware AES): ~1.5x chacha20-poly1305, OpenSSH's default first choice, measured here."""


def first_openssh_stream(ssh_argv: list[str], cancel: threading.Event | None = None,
                         ) -> tuple[OpenSSHStream | None, list[str], str]:
    """A first stream, started with AES-GCM preferred (else OpenSSH's own order): it is the probe too.

    Returns (the stream, the argv that made it, "") or (None, [], why no stream could start).
    """
    why = ""
    for argv in ([ssh_argv[0], *FAST_CIPHERS, *ssh_argv[1:]], ssh_argv):
        try:
            return OpenSSHStream(argv, cancel=cancel), argv, ""
        except (HostError, OSError) as e:
            why = str(e)
    return None, [], why


# -- local layout ---------------------------------------------------------------
def local_path(dest: Path, path: str) -> Path:
    """Where a manifest path's file ends up (for display and tests: I/O goes through DestTree)."""
    return dest / FILES / path


def part_path(dest: Path, path: str) -> Path:
    """Where a manifest path's partial download lives (a short name, whatever the path's length)."""
    return dest / PARTIAL / part_name(path)


@dataclass
class FileJob:
    """One file to bring down, and what happened to it."""

    path: str  # manifest path: files/<path> locally
    node_path: str
    size: int  # at listing
    mtime_ns: int
    mode: int
    state: str = "pending"  # pending | done | present | failed
    sha256: str | None = None  # of the local file
    node_sha256: str | None = None  # computed on the node: in the read that fed the stream, or afterwards
    offset: int = 0  # where this run's transfer started
    transferred: int = 0  # bytes that came over the wire in this run
    node_size: int | None = None  # size the node reported when sending
    error: str = ""
    shrank: bool = False
    limit: int | None = None  # fetch only this many bytes (a growing log: the length listed)
    local_size: int | None = None  # bytes of the local file, counted here as they were written (or lstat'ed)
    restarts: int = 0  # times the node's file was found shorter than the partial download here


class TransferProgress:
    """Thread-safe byte/file counters with a rate over the last few seconds."""

    def __init__(self, total_bytes: int, total_files: int, on_update: Callable[["TransferProgress"], None] | None,
                 every: float = 0.2):
        self.total_bytes, self.total_files = total_bytes, total_files
        self.bytes = 0
        self.files = 0
        self._lock = threading.Lock()
        self._on_update = on_update
        self._every = every
        self._last_emit = 0.0
        self._samples: deque[tuple[float, int]] = deque()  # (time, bytes) from the first byte on

    def add(self, nbytes: int = 0, nfiles: int = 0, force: bool = False) -> None:
        with self._lock:
            self.bytes += nbytes
            self.files += nfiles
            now = time.monotonic()
            if nbytes:
                self._samples.append((now, self.bytes))
            while len(self._samples) > 2 and now - self._samples[0][0] > 3.0:
                self._samples.popleft()
            due = force or now - self._last_emit >= self._every
            if due:
                self._last_emit = now
        if due and self._on_update is not None:
            self._on_update(self)

    @property
    def rate(self) -> float:
        """Bytes/s over the last ~3 s (0 until bytes have come twice)."""
        with self._lock:
            if len(self._samples) < 2:
                return 0.0
            (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0


class Downloader:
    """Runs FileJobs over N streams made by `stream_factory`, into a DestTree."""

    def __init__(self, stream_factory: Callable[[], Stream], tree: DestTree, streams: int = 4,
                 cancel: threading.Event | None = None, on_done: Callable[[FileJob], None] | None = None):
        self.stream_factory = stream_factory
        self.tree = tree
        self.streams = max(1, streams)
        self.cancel = cancel or threading.Event()
        self.on_done = on_done  # called (in a stream thread) as each file lands complete
        self.last_error = ""

    def run(self, jobs: list[FileJob], progress: TransferProgress) -> None:
        """Fetch every job (biggest first); each ends done or failed with an error."""
        todo: queue.SimpleQueue[FileJob] = queue.SimpleQueue()
        for job in sorted(jobs, key=lambda j: -j.size):
            todo.put(job)
        workers = [threading.Thread(target=self._worker, args=(todo, progress), daemon=True)
                   for _ in range(min(self.streams, len(jobs)))]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        for job in jobs:
            if job.state == "pending":
                job.state = "failed"
                job.error = job.error or f"not transferred: {self.last_error or 'cancelled'}"

    def _worker(self, todo: queue.SimpleQueue, progress: TransferProgress) -> None:
        pending: deque[FileJob] = deque()  # requested, answers not yet taken
        stream: Stream | None = None
        reconnects = 1
        try:
            while not self.cancel.is_set():
                try:
                    if stream is None:
                        stream = self.stream_factory()
                        for j in pending:
                            self._request(stream, j)
                    while len(pending) < WINDOW and sum(j.size for j in pending) < WINDOW_BYTES:
                        try:
                            job = todo.get_nowait()
                        except queue.Empty:
                            break
                        pending.append(job)
                        self._request(stream, job)
                    if not pending:
                        return
                    job = pending[0]
                    try:
                        again = self._receive(stream, job, progress)
                    except HostError:
                        raise
                    except Exception as e:  # noqa: BLE001 - this file fails (this machine's disk, a name
                        # no local call takes, ...); the stream is cut mid-answer, the other files go on
                        job.state, job.error = "failed", _local_error(job, e)
                        pending.popleft()
                        stream.close()
                        stream = None
                        continue
                    pending.popleft()
                    if again:
                        pending.append(job)
                        self._request(stream, job)
                except HostError as e:  # the stream broke, or could not start
                    if stream is not None:
                        stream.close()
                        stream = None
                    self.last_error = str(e)
                    if not pending:  # never started: the files stay queued for the streams that did
                        return
                    if reconnects <= 0:
                        for j in pending:
                            j.state, j.error = "failed", f"connection lost: {e}"
                        return
                    reconnects -= 1
            for j in pending:
                j.state, j.error = "failed", "cancelled"
        finally:
            if stream is not None:
                stream.close()

    def _request(self, stream: Stream, job: FileJob) -> None:
        job.offset = self.tree.part_size(job.path) or 0
        stream.send(job.node_path, job.offset, job.limit)

    def _receive(self, stream: Stream, job: FileJob, progress: TransferProgress) -> bool:
        """Take the next response into job's .part; True when it must be requested again."""
        try:
            resp = stream.receive()
        except FileFailed as e:
            job.state, job.error = "failed", str(e)
            return False
        job.node_size = resp.size
        if resp.size < job.offset:  # the node file is now shorter than our partial: start over (bounded)
            for _ in resp.chunks:
                pass
            self.tree.drop_part(job.path)
            job.restarts += 1
            if job.restarts > RESTARTS:
                job.state, job.error = "failed", f"kept shrinking below what was here ({resp.size} bytes)"
                return False
            return True
        h = self.tree.hash_part(job.path) if job.offset else hashlib.sha256()  # what is here is not fetched
        sent_before = job.transferred
        direct = resp.aligned and resp.count >= ALIGN  # a smaller file has no page to write directly
        with self.tree.open_part(job.path, append=bool(job.offset), direct=direct) as f:
            out = PartWriter(f)
            try:
                for data in resp.chunks:
                    if self.cancel.is_set():
                        raise StreamError("cancelled")
                    out.write(data, resp.aligned)
                    h.update(data)
                    job.transferred += len(data)
                    progress.add(len(data))
            except FileFailed as e:  # what came is not the file's bytes: keep nothing
                job.state, job.error = "failed", str(e)
                self.tree.drop_part(job.path)
                return False
            except MalformedAnswer:  # nor is this
                self.tree.drop_part(job.path)
                raise
            except StreamError:  # keep what came for the next run, unless nothing did
                if f.tell() == 0:
                    self.tree.drop_part(job.path)
                raise
            real = resp.real if resp.real is not None else resp.count
            if real < resp.count:  # padding after a shrink: drop it, hash what is real
                f.truncate(job.offset + real)
                job.shrank = True
        if job.shrank:
            h = self.tree.hash_part(job.path)
        job.local_size = job.offset + min(real, job.transferred - sent_before)
        self.tree.finalize(job.path, job.mode & 0o777, job.mtime_ns)
        job.sha256, job.state = h.hexdigest(), "done"
        job.node_sha256 = resp.node_sha256
        progress.add(nfiles=1)
        if self.on_done is not None:
            self.on_done(job)
        return False


def _local_error(job: FileJob, e: Exception) -> str:
    if isinstance(e, MalformedAnswer):
        return str(e)
    if isinstance(e, OSError):
        return f"writing {job.path!r} locally: {e.strerror or e}"
    return f"{job.path!r}: {type(e).__name__}: {e}"


def _config_quote(path: Path) -> str:
    return '"' + str(path).replace('"', '\\"') + '"'


def openssh_argv(target: SSHTarget, connect_timeout: float = 15) -> list[str]:
    """`ssh` options that reach the same node SSHHost does (target: its ops.hosts.ssh_target.SSHTarget).

    The alias stays the destination and the same config file is read (`~` from the password database), so
    ProxyJump and the like apply; port, user, keys and known_hosts are given
    explicitly. Never interactive; host keys must already be known (SSHHost
    has checked, and recorded, them).
    """
    argv = ["ssh"]
    if target.config is not None:
        argv += ["-F", target.config]
    argv += [
        "-p", str(target.port), "-l", target.user,
        "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
        "-o", "ControlMaster=no", "-o", "ControlPath=none",
        "-o", f"ConnectTimeout={max(1, int(target.connect_timeout or connect_timeout))}",
        "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4",
        "-o", "LogLevel=ERROR",
    ]
    if target.user_known_hosts:
        argv += ["-o", "UserKnownHostsFile=" + " ".join(_config_quote(p) for p in target.user_known_hosts)]
    if target.global_known_hosts:
        argv += ["-o", "GlobalKnownHostsFile=" + " ".join(_config_quote(p) for p in target.global_known_hosts)]
    if target.host_key_alias:
        argv += ["-o", f"HostKeyAlias={target.host_key_alias}"]
    for key in target.identity_files:
        if key.is_file():
            argv += ["-i", str(key)]
    if target.identities_only:
        argv += ["-o", "IdentitiesOnly=yes"]
    return [*argv, target.alias]
