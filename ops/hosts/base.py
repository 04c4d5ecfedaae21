"""The Host interface every node implementation follows.

Commands are always argv lists; a shell is only involved on the remote side,
where the argv is quoted with shlex so no argument is ever interpreted.

What a node sends is bytes (CommandResult.stdout and .stderr, HostProcess lines, files read); it becomes text
through `node_text` (UTF-8, a byte that is not UTF-8 as U+FFFD: never an error) and a path through `node_path`
(a name that is not UTF-8 is refused in one line: nodedeck sends paths as UTF-8, in command lines and over SFTP,
and keeps them in SQLite, and none of those takes such a name). A name nodedeck must still handle (a file to
preserve) travels as bytes: ops/decommission reads those names with surrogateescape and sends them on stdin.
"""

from __future__ import annotations

import enum
import re
import shlex
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Sequence, overload

from ops.errors import CommandFailed, HostError, HostTimeout, OutputTooLarge
from ops.textsafe import shown
from ops.units import human_bytes

MAX_OUTPUT = 64 << 20
"""The most of a command's stdout, and of its stderr, nodedeck keeps (Host.run's default max_output): a command
that prints more is stopped (OutputTooLarge). Callers that expect more (a listing of a big tree) say so."""
MAX_COMMAND_S = 86400.0
"""The longest any command on a node may run: Host.run's timeout when the caller gives none."""
MAX_LINE_BYTES = 16 << 20
"""The longest line a streamed process (HostProcess.readline) may send."""

AuditHook = Callable[[str, str], None]
"""Called with (host name, command line) for every command sent to a host."""


class ConnState(str, enum.Enum):
    CONNECTED = "connected"
    CONNECTING = "connecting"
    RECONNECTING = "reconnecting"
    DISCONNECTED = "disconnected"


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def text(self) -> str:
        return node_text(self.stdout)

    def check(self) -> "CommandResult":
        """Return self, or raise CommandFailed when the command exited non-zero."""
        if self.returncode != 0:
            raise CommandFailed(self.argv, self.returncode, self.stderr)
        return self


@dataclass(frozen=True)
class FileStat:
    path: str
    size: int
    mtime: float
    mode: int
    is_dir: bool


@dataclass(frozen=True)
class TransferResult:
    local: str
    remote: str
    size: int
    sha256: str | None
    duration_s: float


@dataclass
class HostInfo:
    """What the UI shows about a host's connection."""

    name: str
    kind: str
    state: ConnState
    since: float = field(default_factory=time.time)
    last_error: str | None = None


def time_cap(timeout: float | None) -> float:
    """A command's timeout: the one given, else MAX_COMMAND_S (no command on a node runs unbounded)."""
    return MAX_COMMAND_S if timeout is None else min(timeout, MAX_COMMAND_S)


def too_large(host: str, program: str, cap: int, out: bytes, err: bytes) -> OutputTooLarge:
    """The one-line error for a command that printed more than cap bytes, keeping at most cap of each stream."""
    e = OutputTooLarge(f"{program}: printed more than {human_bytes(cap)} on {host}: stopped (nodedeck keeps at "
                       "most that of a command's output)")
    e.partial_stdout, e.partial_stderr = out[:cap], err[:cap]
    return e


def node_text(data: bytes) -> str:
    """What a node sent, as text: UTF-8, each byte that is not as U+FFFD (never an error)."""
    return data.decode("utf-8", "replace")


def not_utf8(host: str, what: str, raw: bytes | str) -> HostError:
    """The one-line error for a path on host that is not UTF-8 (raw: its bytes, or text with surrogateescape)."""
    text = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
    return HostError(f"{host}: {what} {shown(text[:300])} is not UTF-8: nodedeck sends and keeps paths as UTF-8 "
                     "(set root in nodes.toml to an absolute UTF-8 path, or rename it)")


def node_path(host: str, what: str, raw: bytes) -> str:
    """raw, a path a node printed, as text; HostError (not_utf8) when it is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise not_utf8(host, what, raw) from None


def sendable(host: str, what: str, text: str) -> str:
    """text, which goes to a node as UTF-8 (a command line, an SFTP path); HostError when it holds a name that
    came back with surrogateescape (not UTF-8), which no UTF-8 encoder takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise not_utf8(host, what, text) from None
    return text


def temp_name() -> str:
    """A short hidden file name for an atomic write beside a file: fits however long that file's name is."""
    return f".nd-{uuid.uuid4().hex[:12]}.part"


@overload
def pop_line(buf: bytearray) -> bytes | None: ...
@overload
def pop_line(buf: bytearray, at_end: Literal[True]) -> bytes: ...
def pop_line(buf: bytearray, at_end: bool = False) -> bytes | None:
    """The first line in buf with its newline, taken out of it; None while no whole line is there,
    unless at_end (nothing more will come): then whatever is left, b"" when nothing."""
    i = buf.find(b"\n")
    if i < 0 and not at_end:
        return None
    n = i + 1 if i >= 0 else len(buf)
    line = bytes(buf[:n])
    del buf[:n]
    return line


def join_argv(argv: Sequence[str]) -> str:
    """Quote an argv for a POSIX shell so that nothing in it is interpreted."""
    return shlex.join([str(a) for a in argv])


def shell_path(path: str) -> str:
    """Quote a path on the node for its shell, letting a leading ~ mean $HOME there."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


class Host(ABC):
    """A machine nodedeck can run commands on and move files to and from."""

    kind: str = "abstract"

    def __init__(self, name: str, audit: AuditHook | None = None):
        self.name = name
        self.audit = audit

    def _audit(self, command: str) -> None:
        if self.audit is not None:
            self.audit(self.name, command)

    # -- commands -------------------------------------------------------
    @abstractmethod
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
        """Run argv on the host and wait for it; raises HostTimeout past timeout (None: MAX_COMMAND_S), and
        OutputTooLarge (the command stopped) once it printed more than max_output bytes on stdout or stderr."""

    def run_script(self, script: str, *, timeout: float | None = 30.0) -> CommandResult:
        """Run a bash script; callers build it from join_argv() pieces."""
        return self.run(["bash", "-c", script], timeout=timeout)

    # -- files ----------------------------------------------------------
    @abstractmethod
    def stat(self, path: str) -> FileStat | None:
        """Stat a path, or None when it does not exist."""

    @abstractmethod
    def read_range(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """Read up to length bytes from offset (all of the rest when None)."""

    @abstractmethod
    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Write a file atomically (temp name, then rename), creating parent dirs."""

    @abstractmethod
    def push(self, local: str | Path, remote: str, *, verify: bool = False) -> TransferResult:
        """Upload one file: mkdir -p the parent, temp name, rename, keep mode, check size."""

    @abstractmethod
    def fetch(self, remote: str, local: str | Path) -> TransferResult:
        """Download one file to a local path (temp name, then rename)."""

    @abstractmethod
    def home(self) -> str:
        """The home directory of the user on the host."""

    def sha256(self, path: str, timeout: float | None = 600) -> str:
        """sha256 of a file, computed on the host.

        The file goes to sha256sum's stdin: with a name, sha256sum escapes names holding a newline
        or a backslash (a leading `\\` before the digest), which is easy to misread.
        """
        out = self.run(["sh", "-c", 'exec sha256sum < "$1"', "sh", path], timeout=timeout).check().text
        digest = out.split(" ", 1)[0]
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise HostError(f"{self.name}:{path}: sha256sum printed {out[:80]!r}, not a sha256 digest")
        return digest

    # -- connection -----------------------------------------------------
    @abstractmethod
    def info(self) -> HostInfo:
        """Connection state for display."""

    def connect(self, timeout: float | None = None) -> None:
        """Be connected (a host without a connection always is). Raises HostError (HostUnreachable, HostKeyError)
        after one attempt bounded by `timeout` and the connect timeout."""

    def close(self) -> None:
        """Release connections; the host may be used again afterwards."""

    # -- long-running processes -----------------------------------------
    def open_process(self, argv: Sequence[str], *, timeout: float | None = 30.0) -> "HostProcess":
        """Start argv and leave it running with stdin/stdout streamed (see HostProcess).

        timeout bounds the start only. Raises HostError when the host cannot start it.
        """
        raise HostError(f"{self.name}: this kind of host cannot run a streaming process")


# -- long-running processes with streamed stdin/stdout (used by the telemetry sampler) ----------
class HostProcess(ABC):
    """A command left running on a host: write to its stdin, read its stdout by lines.

    readline() returns one line (with its newline), b"" once the process closed its
    stdout, or raises HostTimeout when no full line came within the timeout, OutputTooLarge
    for a line longer than MAX_LINE_BYTES (what came of it is dropped).
    """

    def __init__(self) -> None:
        self._buf = bytearray()

    @abstractmethod
    def write(self, data: bytes) -> None:
        """Send bytes to the process's stdin; raises HostError when it is gone."""

    @abstractmethod
    def _read_some(self, timeout: float) -> bytes | None:
        """Some stdout bytes, b"" at end of output, None when nothing came within timeout."""

    @abstractmethod
    def stderr_tail(self) -> str:
        """The last line the process wrote to stderr, for error messages (ops.textsafe.last_line), or ""."""

    @abstractmethod
    def close(self) -> None:
        """Stop the process (closing its stdin and the stream) without waiting long."""

    def readline(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while (line := pop_line(self._buf)) is None:
            if len(self._buf) > MAX_LINE_BYTES:
                self._buf.clear()
                raise OutputTooLarge(f"the process sent a line of more than {MAX_LINE_BYTES >> 20} MiB")
            left = deadline - time.monotonic()
            if left <= 0:
                raise HostTimeout(f"no line from the process within {timeout:g}s")
            chunk = self._read_some(left)
            if chunk == b"":
                return pop_line(self._buf, at_end=True)  # a last line without newline, or b"" at the end
            if chunk:
                self._buf.extend(chunk)
        return line
