"""The download step: every file to download copied into the destination (resumed where an earlier run
left it), verified by sha256 against the node, fetched again once on a mismatch; then the symlinks and the
directories' metadata, and a listing of the node again to find what changed meanwhile."""

from __future__ import annotations

import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from ops.decommission import ledger
from ops.decommission.checksums import HashPipe
from ops.decommission.durable import Flusher
from ops.decommission.events import Emitter, EventKind, Step, Unit
from ops.decommission.filestate import FileState
from ops.decommission.inputs import Options
from ops.decommission.inventory import Entry, Inventory
from ops.decommission.live import (
    SIDECARS,
    SnapshotRefused,
    is_growing,
    is_sqlite_name,
    snapshot_fault,
    sqlite_snapshot,
)
from ops.decommission.localtree import DestTree, hash_fd
from ops.decommission.policy import Action
from ops.decommission.transfer import (
    Downloader,
    FileJob,
    HostRangeStream,
    OpenSSHStream,
    Stream,
    TransferProgress,
    first_openssh_stream,
    openssh_available,
)
from ops.decommission.verify import NodeHasher, compare, not_durable
from ops.errors import HostError
from ops.hosts.base import Host

BYTES_PER_STREAM = 64 << 20  # another stream (one more ssh connection) only for at least this much more to fetch


class Download:
    """One run of the download step over `files` whose actions are decided (`resolve` decides them again)."""

    def __init__(
        self,
        host: Host,
        tree: DestTree,
        listing: Inventory,
        files: dict[str, FileState],
        options: Options,
        hasher: NodeHasher,
        emit: Emitter,
        warn: Callable[[str], None],
        cancel: threading.Event,
        *,
        ssh_argv: list[str] | None,
        no_snapshot: set[str],
        resolve: Callable[[], None],
        relist: Callable[[], Inventory | HostError],
        kept: Callable[[Entry], bool],
    ):
        self.host = host
        self.tree = tree
        self.listing = listing
        self.files = files
        self.opt = options
        self.hasher = hasher
        self.emit = emit
        self.warn = warn  # a warning: recorded by the wizard and reported
        self.cancel = cancel
        self.ssh_argv = ssh_argv
        self.no_snapshot = no_snapshot  # databases copied as plain files (no snapshot possible)
        self.resolve = resolve  # decide the actions again (after the databases' snapshots)
        self.relist = relist  # the roots listed again (nothing else touched), or why not
        self.kept = kept  # a directory or link to make here (not one of a class left out)
        self.transfer_note = ""
        self.links_done: dict[str, str] = {}  # path -> "" when recreated, else the error
        self._streams: Callable[[], Stream] | None = None
        self._proofs: dict[str, ledger.Proof] = {}  # what earlier runs verified (ledger.py)

    def run(self) -> tuple[list[FileState], Inventory | HostError]:
        """Download and verify; the files it handled, and the node listed again after (or why not)."""
        self._prepare_dirs()
        self._snapshot_databases()
        self._proofs = ledger.load(self.tree)
        states = [fs for fs in self.files.values() if fs.action == Action.DOWNLOAD]
        for fs in states:
            if fs.snapshot:
                continue
            e = fs.entry
            fs.job = FileJob(e.path, e.node_path, e.size, e.mtime_ns, e.mode, limit=e.size if is_growing(e) else None)
            self._adopt_local(fs.job, e)
        pipe = HashPipe(self.hasher.hash_jobs)  # the node hashes (what the streams did not) while the rest comes
        flusher = Flusher(self.tree)  # and the disk writes each file as it lands
        for fs in states:
            if fs.download.state == "present" and fs.download.node_sha256 is None:
                pipe.put(fs.download)
            if fs.download.state in ("present", "done"):  # done: a database snapshot
                flusher.put(fs.download.path)

        def landed(job: FileJob) -> None:
            flusher.put(job.path)
            if job.node_sha256 is None:
                pipe.put(job)

        self._transfer([fs.download for fs in states if fs.download.state == "pending"], "downloading", on_done=landed)
        self.emit(Step.DOWNLOAD, EventKind.PROGRESS, "checking the node for changes since the listing")
        with ThreadPoolExecutor(max_workers=1) as pool:  # the node is listed again while the last files flush
            relisted = pool.submit(self.relist)
            pipe.close()
            again = self._verify(states, flusher)
            now = relisted.result()
        if again:  # files were fetched again after that listing: list once more
            now = self.relist()
        self._make_links()
        self._finish_dirs()
        self.tree.tidy_partial()
        for line in self.tree.changes:  # destination entries whose kind differs from the node's: handled, said
            self.warn(line)
        self.tree.changes.clear()
        return states, now

    def save_proofs(self, states: list[FileState]) -> None:
        """Record every file verified by sha256 in this run (and keep the proofs of files not in it)."""
        proofs = {p: v for p, v in self._proofs.items() if p not in self.files}
        for fs in states:
            if not fs.verified or fs.changed or fs.snapshot or fs.job is None or fs.job.sha256 is None:
                continue
            st = self.tree.lstat(fs.entry.path)
            if st is not None and stat.S_ISREG(st.st_mode):
                proofs[fs.entry.path] = ledger.Proof(fs.job.sha256, ledger.node_key(fs.entry), ledger.local_key(st))
        ledger.save(self.tree, proofs)

    def _prepare_dirs(self) -> None:
        for d in filter(self.kept, self.listing.dirs):
            self.tree.make_writable(d.path)  # made where missing; an earlier run's read-only dir opened up

    def _finish_dirs(self) -> None:
        for d in sorted(filter(self.kept, self.listing.dirs), key=lambda d: -d.path.count("/")):
            self.tree.set_dir_meta(d.path, d.mode & 0o777, d.mtime_ns)

    def _make_links(self) -> None:
        for link in filter(self.kept, self.listing.links):
            try:
                self.tree.make_link(link.path, link.target)
                self.links_done[link.path] = ""
            except OSError as e:
                self.links_done[link.path] = f"could not recreate symlink: {e.strerror or e}"

    def _adopt_local(self, job: FileJob, entry: Entry) -> None:
        """Reuse what an earlier run left: a complete file is checked (unless an earlier run proved it and
        neither side changed since: then it is not hashed again), a shorter one resumed."""
        st = self.tree.lstat(job.path)
        if st is not None and stat.S_ISREG(st.st_mode):
            if st.st_size == job.size:
                self.tree.drop_part(job.path)
                job.state, job.local_size = "present", st.st_size
                proof = self._proofs.get(job.path)
                if (proof is not None and proof.node == ledger.node_key(entry)
                        and proof.local == ledger.local_key(st)):
                    job.sha256 = job.node_sha256 = proof.sha256
                return
            if st.st_size < job.size and self.tree.part_size(job.path) is None:
                self.tree.file_to_part(job.path)
            else:
                self.tree.unlink(job.path)
        size = self.tree.part_size(job.path)
        if size is not None and size > job.size:
            self.tree.drop_part(job.path)

    def _snapshot_databases(self) -> None:
        """Each SQLite database to download: one consistent snapshot taken on the node (online backup),
        its sidecars folded in; where none can be taken, a plain copy (said, unless it is no SQLite)."""
        for path, fs in sorted(self.files.items()):
            if fs.action != Action.DOWNLOAD or not is_sqlite_name(path) or path in self.no_snapshot:
                continue
            e = fs.entry
            try:
                data, digest = sqlite_snapshot(self.host, self.opt.python, e.node_path)
            except HostError as err:
                self.no_snapshot.add(path)
                if not (isinstance(err, SnapshotRefused) and str(err) == "not a SQLite database"):
                    self.warn(f"{path}: no snapshot of this SQLite database ({err}): copied as a "
                              "plain file, which a writer may change during the copy")
                continue
            job = FileJob(e.path, e.node_path, e.size, e.mtime_ns, e.mode)
            fs.job, fs.snapshot = job, True
            with self.tree.open_part(path, append=False) as f:
                f.write(data)
            with self.tree.read_part(path) as fd:  # the bytes that landed here, checked as a database here
                fault = snapshot_fault(fd, e.size)
                landed = hash_fd(fd).hexdigest()
            if fault is not None:  # whatever the node says of its hash: not this database
                self.tree.drop_part(path)
                job.state, job.error = "failed", fault
                continue
            self.tree.finalize(path, e.mode & 0o777, e.mtime_ns)
            for suffix in SIDECARS:  # an earlier run's copies would be applied to the snapshot on open
                self.tree.unlink(path + suffix)
            job.sha256, job.node_sha256, job.state, job.transferred = landed, digest, "done", len(data)
        self.resolve()

    def _stream_factory(self) -> Callable[[], Stream]:
        """How streams are made: local reads, OpenSSH `ssh` when it works non-interactively, else SFTP."""
        if self._streams is None:
            if self.host.kind == "local":
                self.transfer_note = "local copy"
            elif self.ssh_argv and openssh_available():
                first, argv, why = first_openssh_stream(self.ssh_argv, self.cancel)
                if first is not None:
                    self.transfer_note = f"OpenSSH ssh, {self.opt.streams} stream(s)"
                    ready: list[Stream] = [first]  # the stream that proved ssh usable is the first one used
                    self._streams = lambda: ready.pop() if ready else OpenSSHStream(argv, cancel=self.cancel)
                    return self._streams
                self.warn(f"OpenSSH ssh unusable ({why}): falling back to SFTP")
            if self.host.kind != "local":
                self.transfer_note = "SFTP through the node connection"
            self._streams = lambda: HostRangeStream(self.host)
        return self._streams

    def _transfer(self, jobs: list[FileJob], what: str, on_done: Callable[[FileJob], None] | None = None) -> None:
        if not jobs:
            return
        total = sum(j.size for j in jobs)

        def update(p: TransferProgress) -> None:
            self.emit(Step.DOWNLOAD, EventKind.PROGRESS, f"{what} {p.files}/{p.total_files} files", done=p.bytes,
                      total=max(total, p.bytes), unit=Unit.BYTES, rate=p.rate)

        progress = TransferProgress(total, len(jobs), update)
        streams = max(1, min(self.opt.streams, -(-total // BYTES_PER_STREAM)))
        Downloader(self._stream_factory(), self.tree, streams, self.cancel, on_done).run(jobs, progress)
        progress.add(force=True)

    def _verify(self, states: list[FileState], flusher: Flusher) -> bool:
        """sha256 on the node vs local, once every file is durable; a mismatch is downloaded again once.

        True when files were downloaded again."""
        present = [fs.download for fs in states if fs.download.state == "present" and fs.download.sha256 is None]
        if present:
            with ThreadPoolExecutor(max_workers=2) as pool:
                digests = pool.map(lambda j: self.tree.hash_local(j.path).hexdigest(), present)
                for i, (job, digest) in enumerate(zip(present, digests), 1):
                    job.sha256 = digest
                    self.emit(Step.DOWNLOAD, EventKind.PROGRESS, "hashing the files already here", done=i,
                              total=len(present), unit=Unit.FILES)
        with ThreadPoolExecutor(max_workers=1) as pool:  # the last files flush while the node hashes
            durable = pool.submit(flusher.close)
            compare(states, self.tree, self.hasher)
            again = [fs for fs in states if fs.download.node_sha256 and not fs.verified]
            not_durable(states, durable.result())
        if not again or self.cancel.is_set():
            return False
        for fs in again:
            job = fs.download
            self.tree.unlink(job.path)
            self.tree.drop_part(job.path)
            job.state, job.error, job.shrank, job.node_sha256, job.local_size = "pending", "", False, None, None
        flusher = Flusher(self.tree)
        self._transfer([fs.download for fs in again], "downloading again after a sha256 mismatch:",
                       on_done=lambda job: flusher.put(job.path))
        compare(again, self.tree, self.hasher, retried=True)
        not_durable(again, flusher.close())
        return True
