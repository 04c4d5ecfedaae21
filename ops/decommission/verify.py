"""Verifying what was copied: sha256 on the node against the copy here, and what changed on the node
since it was listed (size, mtime, or a new inode/ctime with the same size and mtime)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from ops.decommission.checksums import node_digests
from ops.decommission.events import Emitter, EventKind, Step, Unit
from ops.decommission.filestate import FileState
from ops.decommission.inventory import Inventory
from ops.decommission.live import prefix_digest
from ops.decommission.localtree import DestTree
from ops.decommission.policy import Action, Policy
from ops.decommission.transfer import FileJob
from ops.decommission.verification import Verification
from ops.errors import HostError, HostUnreachable
from ops.hosts.base import Host


class NodeHasher:
    """Checksums on the node, with progress events; once the node is unreachable, no more tries."""

    def __init__(self, host: Host, workers: int, emit: Emitter):
        self.host = host
        self.workers = workers
        self.emit = emit
        self.node_down: str | None = None  # why the node stopped answering, once it did

    def digests(self, items: list[tuple[str, int]], tool: str, step: Step | None) -> dict[str, str | Exception]:
        """`tool` (md5sum | sha256sum) of each (node path, size), with progress events of `step` (None: quiet)."""
        if self.node_down:
            return {p: HostUnreachable(self.node_down) for p, _ in items}
        total = sum(n for _, n in items)
        done = [0]
        on_batch: Callable[[int, int], None] | None = None
        if step is not None:
            where = step

            def on_batch(nfiles: int, nbytes: int) -> None:
                done[0] += nbytes
                self.emit(where, EventKind.PROGRESS, f"{tool} on the node", done=done[0], total=total,
                          unit=Unit.BYTES)

        got = node_digests(self.host, items, tool=tool, workers=self.workers, on_batch=on_batch)
        lost = next((v for v in got.values() if isinstance(v, HostUnreachable)), None)
        if lost is not None:
            self.node_down = str(lost)
        return got

    def hash_jobs(self, jobs: list[FileJob], step: Step | None = None) -> dict[str, Exception]:
        """Set each job's node_sha256; the errors of those that got none, by node path."""
        got = self.digests([(j.node_path, j.size) for j in jobs if j.limit is None], "sha256sum", step)
        for j in jobs:
            if j.limit is not None:  # a growing file: the bytes up to the length listed
                try:
                    got[j.node_path] = prefix_digest(self.host, j.node_path, j.limit)
                except HostError as e:
                    got[j.node_path] = e
        for j in jobs:
            digest = got.get(j.node_path)
            if isinstance(digest, str):
                j.node_sha256 = digest
        return {p: v for p, v in got.items() if not isinstance(v, str)}


def local_size(tree: DestTree, job: FileJob) -> int:
    """The local file's length, as counted while it was written (else as it is on the disk now)."""
    if job.local_size is not None:
        return job.local_size
    st = tree.lstat(job.path)
    return -1 if st is None else st.st_size


def compare(states: list[FileState], tree: DestTree, hasher: NodeHasher, retried: bool = False) -> None:
    """Local sha256 against the node's (hashed now where the pipe has not already)."""
    have = [fs for fs in states if fs.download.state in ("done", "present")]
    for fs in states:
        if fs.download.state == "failed":
            fs.verified, fs.reason = False, f"download failed: {fs.download.error}"
    need = [fs.download for fs in have if fs.download.node_sha256 is None]
    errors = hasher.hash_jobs(need, Step.DOWNLOAD) if need else {}
    for fs in have:
        got = fs.download.node_sha256
        if got is None:
            fs.verified, fs.reason = False, f"no sha256 from the node: {errors.get(fs.download.node_path)}"
        elif not fs.snapshot and (n := local_size(tree, fs.download)) != fs.entry.size:
            fs.verified = False  # the bytes written here are what counts, whatever the sender says of them
            fs.reason = f"received {n} bytes, {fs.entry.size} listed: the copy here is not the file listed"
        elif got == fs.download.sha256:
            fs.verified, fs.reason = True, ""
            fs.verification = Verification.SQLITE_SNAPSHOT if fs.snapshot else Verification.SHA256
        else:
            fs.verified = False
            fs.reason = ("sha256 differs from the node's after downloading again" if retried
                         else "sha256 differs from the node's")
        if fs.download.shrank:
            fs.changed = fs.changed or "shrank during download"


def not_durable(states: list[FileState], errors: dict[str, str]) -> None:
    """Files the local disk could not make durable (fsync failed) are not verified."""
    for fs in states:
        why = errors.get(fs.download.path)
        if why is not None and fs.download.state in ("done", "present"):
            fs.verified, fs.reason = False, f"not durable on the local disk ({why})"


@dataclass
class Changes:
    """What the listing after the download found: growing files preserved up to their listed length,
    files that appeared (in a preserved class), or why the node could not be listed again."""

    grown: list[str] = field(default_factory=list)
    appeared: list[str] = field(default_factory=list)
    problem: str = ""


def changes_since(files: Mapping[str, FileState], now: Inventory | HostError, policies: Mapping[str, Policy],
                  hasher: NodeHasher) -> Changes:
    """A file whose size or mtime moved between the listing and `now` (listed after the transfer) changed;
    one whose inode or ctime moved is hashed again. Marks each such FileState; returns the rest."""
    if isinstance(now, HostError):
        if isinstance(now, HostUnreachable):
            hasher.node_down = str(now)
        return Changes(problem=f"could not check the node for changes after the download: {now}")
    out = Changes()
    after = {e.path: e for e in now.files}
    touched: list[FileState] = []
    grown: list[tuple[FileState, int]] = []
    for path, fs in files.items():
        if fs.action in (Action.EXCLUDED, Action.IN_SNAPSHOT) or fs.snapshot:  # a snapshot: consistent as taken
            continue
        if path not in after:
            fs.changed = "deleted on the node during the download"
            continue
        size, mtime = after[path].size, after[path].mtime_ns
        if size > fs.entry.size and fs.job is not None and fs.job.limit is not None:
            grown.append((fs, size))  # appended to, or rewritten longer: its first bytes tell which
        elif size != fs.entry.size:
            fs.changed = f"size changed during download ({fs.entry.size} -> {size} bytes)"
        elif mtime != fs.entry.mtime_ns:
            fs.changed = fs.changed or "modified during download (mtime moved)"
        elif (after[path].inode, after[path].ctime_ns) != (fs.entry.inode, fs.entry.ctime_ns):
            touched.append(fs)  # same size and mtime, yet replaced or rewritten (touch -r, cp -p): or a chmod
    _rehash(touched, hasher, TOUCHED)
    _rehash([fs for fs, _ in grown], hasher, GROWN)
    for fs, size in grown:
        if not fs.changed:
            out.grown.append(f"{fs.entry.path}: grew during the copy; preserved up to the {fs.entry.size} bytes "
                             f"listed (the node's first {fs.entry.size} bytes hashed again: the same), the "
                             f"{size - fs.entry.size} bytes written since are not")
    out.appeared = sorted(p for p, e in after.items() if p not in files and policies[e.cls] != Policy.SKIP)
    return out


@dataclass(frozen=True)
class _Why:
    """What to say of a file hashed again after the download: none to compare, none came, another digest."""

    no_copy: str
    no_digest: str
    differs: str


TOUCHED = _Why("replaced or rewritten on the node during the download (new inode/ctime)",
               "new inode/ctime on the node during the download, and it could not be hashed again: {error}",
               "replaced or rewritten on the node during the download (same size and mtime, new inode/ctime, "
               "another sha256)")
GROWN = _Why("grew during the download, and there is no copy here to compare its first {size} bytes with",
             "grew during the download, and its first {size} bytes could not be hashed again: {error}",
             "rewritten on the node during the download, not only appended to: its first {size} bytes there are "
             "no longer the ones copied here (run the decommission again to copy it as it is now)")


def _rehash(states: list[FileState], hasher: NodeHasher, why: _Why) -> None:
    """The node's bytes of each file up to the length copied, hashed again on the node now: a digest that
    differs from the copy here (or none) means the node's file is not (or no longer starts with) the one copied."""
    local = [fs for fs in states if fs.job is not None and fs.job.sha256 is not None]
    for fs in states:
        if fs.job is None or fs.job.sha256 is None:   # not in local (a list scan per file: quadratic)
            fs.changed = fs.changed or why.no_copy.format(size=fs.entry.size)
    if not local:
        return
    jobs = [FileJob(fs.entry.path, fs.entry.node_path, fs.entry.size, fs.entry.mtime_ns, fs.entry.mode,
                    limit=fs.download.limit) for fs in local]
    errors = hasher.hash_jobs(jobs)
    for fs, job in zip(local, jobs):
        if job.node_sha256 is None:
            fs.changed = fs.changed or why.no_digest.format(size=fs.entry.size, error=errors.get(job.node_path))
        elif job.node_sha256 != fs.download.sha256:
            fs.changed = fs.changed or why.differs.format(size=fs.entry.size)
