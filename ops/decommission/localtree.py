"""The destination of a download, reached only through directory file descriptors.

Every path under `--dest` is walked component by component from a descriptor
of `<dest>/files` (or `<dest>/.partial`), opening each directory with
O_NOFOLLOW: a symlink in the destination (one a previous run recreated, or one
planted there) is never traversed, so nothing outside `--dest` is ever written,
chmodded or re-timed. Symlinks are only made (symlinkat) and removed
(unlinkat), never followed.

When the node tree changed kind since an earlier run (a link that is now a
directory, a directory that is now a file, ...) the old local entry is handled
and reported: a link is replaced (it holds no data), a file or directory is
moved aside into `<dest>/.superseded/` so no earlier copy is lost.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ops.errors import UserError

FILES, PARTIAL, SUPERSEDED = "files", ".partial", ".superseded"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a planted FIFO never blocks
HASH_CHUNK = 1 << 20


class UnsafePath(OSError):
    """A node path that cannot name something inside the destination ('', '.', '..')."""


def part_name(path: str) -> str:
    """The short, fixed-length name of a manifest path's partial file (any name length works)."""
    return hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest()[:40] + ".part"


def _components(path: str) -> list[bytes]:
    parts = path.encode("utf-8", "surrogateescape").split(b"/")
    if any(p in (b"", b".", b"..") for p in parts):
        raise UnsafePath(errno.EINVAL, f"unsafe path {path!r}")
    return parts


def _kind(st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    if stat.S_ISDIR(st.st_mode):
        return "directory"
    if stat.S_ISREG(st.st_mode):
        return "file"
    return "special file"


def _open_subdir(parent: int, name: str, what: Path) -> int:
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
    except FileExistsError:
        pass
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            kind = _kind(os.stat(name, dir_fd=parent, follow_symlinks=False))
            raise UserError(f"--dest {what.parent}: {what} is a {kind}, not a directory: refusing to use it") from e
        raise


class DestTree:
    """`<dest>/files` and `<dest>/.partial`, used without ever following a link below `dest`."""

    def __init__(self, dest: Path):
        self.dest = dest
        dest.mkdir(parents=True, exist_ok=True)  # dest itself is the user's choice (already resolved)
        self.fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.files_fd = _open_subdir(self.fd, FILES, dest / FILES)
        self.partial_fd = _open_subdir(self.fd, PARTIAL, dest / PARTIAL)
        self.changes: list[str] = []  # kind changes found and handled, one line each
        self._lock = threading.Lock()
        self._stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        self._aside = 0

    def close(self) -> None:
        for fd in (self.files_fd, self.partial_fd, self.fd):
            os.close(fd)

    # -- directories ---------------------------------------------------------------
    @contextmanager
    def directory(self, path: str, create: bool = True) -> Iterator[int]:
        """A descriptor of files/<path> (path '' is files/ itself), made as needed, never through a link.

        An entry of another kind in the way is handled (see the module docstring) when creating;
        without `create`, a missing or other-kind component raises FileNotFoundError/NotADirectoryError.
        """
        fd = os.dup(self.files_fd)
        try:
            done: list[bytes] = []
            for name in _components(path) if path else []:
                fd = self._step(fd, name, done, create)
                done.append(name)
            yield fd
        finally:
            os.close(fd)

    def _step(self, fd: int, name: bytes, done: list[bytes], create: bool) -> int:
        for _ in range(3):
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                return nfd
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                if not create:
                    raise NotADirectoryError(errno.ENOTDIR, "not a directory", _text(done + [name])) from e
                self.clear(fd, name, _text(done + [name]), "a directory")
        raise OSError(errno.EAGAIN, "directory kept changing", _text(done + [name]))

    def clear(self, dir_fd: int, name: bytes, shown: str, now: str) -> None:
        """Take the entry `name` out of the way of a `now` (a kind) from the node: a link is removed,
        anything else moved into .superseded; either way reported in `changes`."""
        st = _lstat_at(dir_fd, name)
        if st is None:
            return
        kind = _kind(st)
        if kind == "symlink":
            os.unlink(name, dir_fd=dir_fd)
            self._note(f"{shown}: was a symlink in the destination, now {now} on the node: link replaced")
            return
        with self._lock:
            self._aside += 1
            aside = f"{self._stamp}-{self._aside}"
        try:
            os.mkdir(SUPERSEDED, 0o700, dir_fd=self.fd)
        except FileExistsError:
            pass
        sfd = os.open(SUPERSEDED, _DIR_FLAGS, dir_fd=self.fd)
        try:
            os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=sfd)
        finally:
            os.close(sfd)
        self._note(f"{shown}: was a {kind} in the destination, now {now} on the node: "
                   f"the earlier copy moved to {SUPERSEDED}/{aside}")

    def _note(self, line: str) -> None:
        with self._lock:
            self.changes.append(line)

    def set_dir_meta(self, path: str, mode: int, mtime_ns: int) -> None:
        """chmod and utime of files/<path> through its own descriptor (nothing when it is not a directory)."""
        try:
            with self.directory(path, create=False) as fd:
                os.chmod(fd, mode)
                os.utime(fd, ns=(mtime_ns, mtime_ns))
        except (FileNotFoundError, NotADirectoryError):
            pass

    def make_writable(self, path: str) -> None:
        """A read-only directory left by an earlier run gets owner write access back (until finish)."""
        with self.directory(path) as fd:
            mode = os.fstat(fd).st_mode & 0o777
            if mode & 0o700 != 0o700:
                os.chmod(fd, mode | 0o700)

    # -- finished files --------------------------------------------------------------
    def lstat(self, path: str) -> os.stat_result | None:
        """lstat of files/<path>, or None when it (or a directory on its way) is not there."""
        parent, name = _split(path)
        try:
            with self.directory(parent, create=False) as fd:
                return _lstat_at(fd, name)
        except (FileNotFoundError, NotADirectoryError):
            return None

    @contextmanager
    def open_read(self, path: str) -> Iterator[int]:
        """A read descriptor of the regular file files/<path> (ELOOP when it is a link)."""
        parent, name = _split(path)
        with self.directory(parent, create=False) as dfd:
            fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise IsADirectoryError(errno.EISDIR, "not a regular file", path)
            yield fd
        finally:
            os.close(fd)

    def hash_local(self, path: str) -> "hashlib._Hash":
        with self.open_read(path) as fd:
            return hash_fd(fd)

    def unlink(self, path: str) -> None:
        parent, name = _split(path)
        try:
            with self.directory(parent, create=False) as fd:
                os.unlink(name, dir_fd=fd)
        except (FileNotFoundError, NotADirectoryError):
            pass

    def make_link(self, path: str, target: str) -> None:
        """files/<path> becomes a symlink to target (an existing same link is kept)."""
        parent, name = _split(path)
        with self.directory(parent) as fd:
            st = _lstat_at(fd, name)
            if st is not None and stat.S_ISLNK(st.st_mode):
                if os.readlink(name, dir_fd=fd) == os.fsencode(target):
                    return
                os.unlink(name, dir_fd=fd)
            elif st is not None:
                self.clear(fd, name, path, "a symlink")
            os.symlink(os.fsencode(target), name, dir_fd=fd)

    # -- partial files ---------------------------------------------------------------
    def part_size(self, path: str) -> int | None:
        """Size of path's partial file; None when there is none (anything but a regular file is removed)."""
        name = part_name(path)
        st = _lstat_at(self.partial_fd, name)
        if st is None:
            return None
        if not stat.S_ISREG(st.st_mode):
            self._remove_part_entry(name, st)
            return None
        return st.st_size

    def _remove_part_entry(self, name: str, st: os.stat_result) -> None:
        if stat.S_ISDIR(st.st_mode):
            self.clear(self.partial_fd, name.encode(), f"{PARTIAL}/{name}", "a partial file")
        else:
            os.unlink(name, dir_fd=self.partial_fd)

    def open_part(self, path: str, append: bool, direct: bool = False):
        """path's partial file for writing (appending to what is there, or from empty); `direct`:
        with O_DIRECT where the filesystem takes it (direct.PartWriter writes to it)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        flags |= os.O_APPEND if append else os.O_TRUNC
        fd = -1
        if direct:
            try:
                fd = os.open(part_name(path), flags | os.O_DIRECT, 0o600, dir_fd=self.partial_fd)
            except OSError as e:
                if e.errno != errno.EINVAL:  # EINVAL: this filesystem has no O_DIRECT
                    raise
        if fd < 0:
            fd = os.open(part_name(path), flags, 0o600, dir_fd=self.partial_fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise IsADirectoryError(errno.EISDIR, "not a regular file", f"{PARTIAL}/{part_name(path)}")
        os.lseek(fd, 0, os.SEEK_END)
        return os.fdopen(fd, "ab" if append else "wb", buffering=0)

    @contextmanager
    def read_part(self, path: str) -> Iterator[int]:
        """A read descriptor of path's partial file."""
        fd = os.open(part_name(path), _READ_FLAGS, dir_fd=self.partial_fd)
        try:
            yield fd
        finally:
            os.close(fd)

    def hash_part(self, path: str) -> "hashlib._Hash":
        with self.read_part(path) as fd:
            return hash_fd(fd)

    def drop_part(self, path: str) -> None:
        try:
            os.unlink(part_name(path), dir_fd=self.partial_fd)
        except FileNotFoundError:
            pass

    def file_to_part(self, path: str) -> None:
        """An incomplete finished file (an earlier run's) becomes the partial file to resume."""
        parent, name = _split(path)
        with self.directory(parent, create=False) as fd:
            os.rename(name, part_name(path), src_dir_fd=fd, dst_dir_fd=self.partial_fd)

    def finalize(self, path: str, mode: int, mtime_ns: int) -> None:
        """Move path's complete partial file to files/<path> with the node's mode and mtime."""
        name = part_name(path)
        fd = os.open(name, _READ_FLAGS, dir_fd=self.partial_fd)
        try:
            os.chmod(fd, mode)
            os.utime(fd, ns=(mtime_ns, mtime_ns))
        finally:
            os.close(fd)
        parent, base = _split(path)
        with self.directory(parent) as dfd:
            st = _lstat_at(dfd, base)
            if st is not None and not stat.S_ISREG(st.st_mode):
                self.clear(dfd, base, path, "a file")
            os.rename(name, base, src_dir_fd=self.partial_fd, dst_dir_fd=dfd)

    def tidy_partial(self) -> None:
        """Remove empty directories under .partial (an older layout's), and .partial when it is empty."""
        for _, _, _, dfd in os.fwalk(".", topdown=False, dir_fd=self.partial_fd):
            for name in os.listdir(dfd):
                try:
                    os.rmdir(name, dir_fd=dfd)
                except OSError:
                    pass
        if not os.listdir(self.partial_fd):
            try:
                os.rmdir(PARTIAL, dir_fd=self.fd)
            except OSError:
                pass

    def write_top(self, name: str, data: bytes) -> None:
        """Write <dest>/<name> atomically (a temporary file renamed over it; links never followed)."""
        tmp = f".{name}.tmp"
        try:
            os.unlink(tmp, dir_fd=self.fd)
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=self.fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)


def read_top(tree: DestTree, name: str, limit: int = 256 << 20) -> bytes | None:
    """<dest>/<name>'s bytes (a regular file, never through a link), or None when there is none."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=tree.fd)
    except (FileNotFoundError, OSError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        out = bytearray()
        while len(out) < limit and (chunk := os.read(fd, 1 << 20)):
            out += chunk
        return bytes(out)
    finally:
        os.close(fd)


def _lstat_at(dir_fd: int, name: str | bytes) -> os.stat_result | None:
    """lstat of `name` in the directory dir_fd, or None when there is no such entry."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def parent_of(path: str) -> str:
    """The directory of a manifest path ('' for files/ itself)."""
    return _split(path)[0]


def _split(path: str) -> tuple[str, bytes]:
    parts = _components(path)
    return "/".join(p.decode("utf-8", "surrogateescape") for p in parts[:-1]), parts[-1]


def _text(parts: list[bytes]) -> str:
    return b"/".join(parts).decode("utf-8", "surrogateescape")


def hash_fd(fd: int) -> "hashlib._Hash":
    h = hashlib.sha256()
    while True:
        data = os.read(fd, HASH_CHUNK)
        if not data:
            return h
        h.update(data)
