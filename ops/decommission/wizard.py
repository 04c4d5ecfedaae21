"""The decommission wizard: preserve everything a node holds before it is shut down.

Steps (STEPS), each reporting through one `on_event(Event)` callback:
inventory -> select -> s3 -> sysinfo -> download -> notes -> verdict.
The CLI runs them in order (`Decommission.run()`); the TUI screen calls them
one by one and changes class policies between them. Nothing on the node is
ever changed: every remote command only reads.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Callable

from ops.decommission import ledger
from ops.decommission import s3 as s3mod
from ops.decommission.checksums import HashPipe, node_digests
from ops.decommission.classify import CLASSES
from ops.decommission.durable import Flusher
from ops.decommission.inventory import Entry, Inventory, Root, list_roots, summarize
from ops.decommission.links import OutsideLink, outside_links
from ops.decommission.live import (
    SIDECARS,
    SnapshotRefused,
    is_growing,
    is_sqlite_name,
    own_kind,
    prefix_digest,
    sqlite_sidecars,
    sqlite_snapshot,
)
from ops.decommission.localtree import DestTree
from ops.decommission.manifest import manifest_bytes
from ops.decommission.policy import POLICIES, Action, Policy, default_policy
from ops.decommission.report import progress_markdown
from ops.decommission.results import (
    ClassRow,
    Counts,
    DownloadPlan,
    Excluded,
    Finished,
    Listed,
    Missing,
    Planned,
    Selection,
    StepResult,
    Verdict,
)
from ops.decommission.sysinfo import SystemInfo, capture
from ops.decommission.transfer import (
    Downloader,
    FileJob,
    HostRangeStream,
    OpenSSHStream,
    Progress,
    Stream,
    first_openssh_stream,
    openssh_available,
)
from ops.errors import HostError, HostUnreachable, UserError
from ops.hosts.base import Host
from ops.units import human_bytes


class Step(StrEnum):
    INVENTORY = "inventory"
    SELECT = "select"
    S3 = "s3"
    SYSINFO = "sysinfo"
    DOWNLOAD = "download"
    NOTES = "notes"
    VERDICT = "verdict"


class Kind(StrEnum):
    """Of an Event."""

    START = "start"
    PROGRESS = "progress"
    INFO = "info"
    WARNING = "warning"
    DONE = "done"


STEPS: tuple[tuple[Step, str], ...] = (
    (Step.INVENTORY, "Inventory"),
    (Step.SELECT, "Selection"),
    (Step.S3, "S3 inventory"),
    (Step.SYSINFO, "System info"),
    (Step.DOWNLOAD, "Download + verify"),
    (Step.NOTES, "Notes"),
    (Step.VERDICT, "Verdict"),
)

BYTES_PER_STREAM = 64 << 20  # another stream (one more ssh connection) only for at least this much more to fetch


SPECIAL_KINDS = {"p": "FIFO (named pipe)", "s": "socket", "c": "character device", "b": "block device",
                 "D": "door"}


@dataclass
class Event:
    step: Step
    kind: Kind
    message: str = ""
    done: int | None = None
    total: int | None = None
    unit: str | None = None  # of done/total: bytes | files
    rate: float | None = None  # bytes/s
    data: dict | None = None

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class Options:
    dest: Path
    roots: list[str] = field(default_factory=list)  # --root
    plan_paths: list[str] = field(default_factory=list)
    s3_url: str | None = None
    s3_endpoint: str | None = None
    s3_profile: str | None = None   # AWS profile for S3 (default: the environment's)
    include: set[str] = field(default_factory=set)
    exclude: set[str] = field(default_factory=set)
    streams: int = 4
    dry_run: bool = False
    trust_s3_size: bool = False
    accept_outside_links: bool = False  # a symlink out of the roots is a warning, not NOT SAFE
    python: str = "python3"


@dataclass
class FileState:
    """One inventoried file through the steps."""

    entry: Entry
    action: Action = Action.NONE
    s3: s3mod.S3Match | None = None
    job: FileJob | None = None
    verified: bool = False
    how: str = ""  # sha256 | s3-md5 | s3-size
    reason: str = ""  # why it is not verified
    changed: str = ""  # what changed on the node since the listing
    snapshot: bool = False  # a live SQLite database copied as a snapshot taken on the node

    @property
    def download(self) -> FileJob:
        """Its download job: every file the download step handles has one."""
        if self.job is None:
            raise RuntimeError(f"{self.entry.path}: no download job")
        return self.job


@dataclass
class StageStates:
    """Plan stage states for PROGRESS.md, or why there are none."""

    plan: str | None
    rows: list[dict]
    note: str = ""


class Decommission:
    """One decommission of one node into one destination directory."""

    def __init__(
        self,
        host: Host,
        node_name: str,
        node_root: str,
        options: Options,
        *,
        ssh_argv: list[str] | None = None,
        stage_states: StageStates | None = None,
        on_event: Callable[[Event], None] | None = None,
        cancel: threading.Event | None = None,
    ):
        self.host = host
        self.node = node_name
        self.node_root = node_root
        self.opt = options
        self.dest = Path(options.dest).expanduser().resolve()
        self.ssh_argv = ssh_argv
        self.stage_states = stage_states or StageStates(None, [], "no plan given: stage states unavailable")
        self.on_event = on_event
        self.cancel = cancel or threading.Event()
        both = options.include & options.exclude
        if both:
            raise UserError(f"class {sorted(both)[0]} is both --include'd and --exclude'd")
        self.policies: dict[str, Policy] = {
            c: Policy.PRESERVE if c in options.include else Policy.SKIP if c in options.exclude else default_policy(c)
            for c in CLASSES}
        self.s3_loc = s3mod.parse_s3_url(options.s3_url) if options.s3_url else None
        self._s3_objects: dict[str, s3mod.S3Object] | None = None
        self.inventory: Inventory | None = None
        self.files: dict[str, FileState] = {}
        self.sysinfo: SystemInfo | None = None
        self.problems: list[str] = []  # things that block a SAFE verdict, beyond single files
        self.warnings: list[str] = []
        self.appeared: list[str] = []
        self.links_done: dict[str, str] = {}  # path -> "" when recreated, else the error
        self.outside: list[OutsideLink] = []  # symlinks whose data lies outside every root
        self.sidecars: dict[str, str] = {}  # SQLite -wal/-shm/-journal -> its database
        self._no_snapshot: set[str] = set()  # databases copied as plain files (no snapshot possible)
        self.grown: list[str] = []  # growing files preserved up to their listed length, said so
        self.transfer_note = ""
        self._streams: Callable[[], Stream] | None = None
        self.node_down: str | None = None  # why the node stopped answering, once it did
        self.verdict: Verdict | None = None
        self.started_at = time.time()
        self._tree: DestTree | None = None
        self._proofs: dict[str, ledger.Proof] = {}  # what earlier runs verified (ledger.py)
        self.result: StepResult | None = None  # what the last advance() yielded

    @property
    def tree(self) -> DestTree:
        """The destination, opened (and made) on first use: never in a dry run."""
        if self._tree is None:
            self._tree = DestTree(self.dest)
        return self._tree

    def close(self) -> None:
        """Let go of the destination's directory descriptors."""
        if self._tree is not None:
            self._tree.close()
            self._tree = None

    # -- events ---------------------------------------------------------------
    def emit(self, step: Step, kind: Kind, message: str = "", **kw) -> None:
        if self.on_event is not None:
            self.on_event(Event(step, kind, message, **kw))

    def check_dest(self) -> None:
        """Fail early (creating nothing) when the destination cannot be made or written."""
        p = self.dest
        while not p.exists():
            p = p.parent
        if p != self.dest and not p.is_dir():
            raise UserError(f"--dest {self.dest}: {p} is not a directory")
        if p == self.dest and not p.is_dir():
            raise UserError(f"--dest {self.dest}: not a directory")
        if not os.access(p, os.W_OK | os.X_OK):
            raise UserError(f"--dest {self.dest}: {p} is not writable")

    def _roots(self) -> list[Root]:
        return ([Root(self.node_root, "node")] + [Root(p, "plan") for p in self.opt.plan_paths]
                + [Root(p, "cli") for p in self.opt.roots])

    # -- 1. inventory -----------------------------------------------------------
    def run_inventory(self) -> Inventory:
        self.emit(Step.INVENTORY, Kind.START, f"listing {', '.join(r.given for r in self._roots())} on {self.node}")
        self.check_dest()
        inv = list_roots(self.host, self._roots())
        for r in inv.roots:
            if r.status == "missing":
                if r.origin == "cli":
                    raise UserError(f"--root {r.given}: not found on {self.node}")
                self.warnings.append(f"{r.origin} root {r.given} does not exist on {self.node}")
                self.emit(Step.INVENTORY, Kind.WARNING, self.warnings[-1])
        if not any(r.status == "ok" for r in inv.roots):
            raise UserError(f"nothing to preserve on {self.node}: none of the roots exists")
        self.problems += [f"inventory: {p}" for p in inv.problems]
        for bad in inv.rejected:
            self.emit(Step.INVENTORY, Kind.WARNING, f"{bad.name}: {bad.reason}" if bad.name else bad.reason)
        self.outside = outside_links(inv)
        if self.opt.accept_outside_links:
            for link in self.outside:
                self.warnings.append(f"{link.path}: symlink to {link.target}, outside the roots: the link is "
                                     "recreated, the data it points to is not preserved (accepted)")
                self.emit(Step.INVENTORY, Kind.WARNING, self.warnings[-1])
        for e in inv.special:
            self.warnings.append(f"{e.path}: {SPECIAL_KINDS.get(e.kind, 'special file')} skipped: not preserved "
                                 "(it holds no data to copy)")
            self.emit(Step.INVENTORY, Kind.WARNING, self.warnings[-1])
        self.inventory = inv
        self.files = {e.path: FileState(e) for e in inv.files}
        self.sidecars = sqlite_sidecars(set(self.files))
        s = summarize(inv)
        self.emit(Step.INVENTORY, Kind.DONE,
                  f"{s['files']} files, {human_bytes(s['bytes'])} in {s['dirs']} directories", data=s)
        return inv

    # -- 2. selection -----------------------------------------------------------
    def set_policy(self, cls: str, policy: str) -> None:
        if cls not in CLASSES or policy not in POLICIES:
            raise UserError(f"bad selection {cls}={policy}")
        self.policies[cls] = Policy(policy)

    def selection(self) -> Selection:
        """Per class: policy, files, bytes, and (once resolved) what happens to them."""
        rows = []
        for c in CLASSES:
            mine = [fs for fs in self.files.values() if fs.entry.cls == c]
            n = {a: sum(fs.action == a for fs in mine) for a in Action}
            rows.append(ClassRow(c, self.policies[c], len(mine), sum(fs.entry.size for fs in mine),
                                 n[Action.DOWNLOAD], n[Action.IN_S3], n[Action.EXCLUDED], n[Action.IN_SNAPSHOT],
                                 sum(fs.entry.size for fs in mine if fs.action == Action.DOWNLOAD)))
        return Selection(tuple(rows))

    def run_select(self) -> Selection:
        self.emit(Step.SELECT, Kind.START)
        sel = self.selection()
        chosen = [f"{r.cls} ({r.policy})" for r in sel.present if r.policy != Policy.SKIP]
        skipped = [r.cls for r in sel.present if r.policy == Policy.SKIP]
        msg = "preserving " + (", ".join(chosen) or "nothing")
        if skipped:
            msg += "; excluded: " + ", ".join(skipped)
        self.emit(Step.SELECT, Kind.DONE, msg, data={"classes": sel.to_json()})
        return sel

    # -- 3. S3 ------------------------------------------------------------------
    def run_s3(self) -> None:
        if self.s3_loc is None:
            self.emit(Step.S3, Kind.DONE, "no --s3 given: large artifacts are downloaded")
            self.resolve()
            return
        self.emit(Step.S3, Kind.START, f"listing {self.s3_loc.url}")
        self._match_s3()
        self.resolve()
        counts: dict[str, int] = {}
        for fs in self.files.values():
            if fs.s3 is not None:
                counts[fs.s3.status] = counts.get(fs.s3.status, 0) + 1
        self.emit(Step.S3, Kind.DONE,
                  f"{self.s3_object_count} objects; " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())),
                  data={"objects": self.s3_object_count, "matches": counts})

    def _match_s3(self) -> None:
        """Match every file whose policy depends on S3 and has no match yet."""
        loc = self.s3_loc
        if loc is None:
            return
        client = s3mod.make_client(self.opt.s3_endpoint, self.opt.s3_profile)
        if self._s3_objects is None:
            self._s3_objects = s3mod.list_objects(client, loc)
        todo = [fs.entry for fs in self.files.values()
                if self.policies[fs.entry.cls] == Policy.UNLESS_S3 and fs.s3 is None]
        if not todo:
            return

        def digests(tool: str):
            def on_node(entries: list[Entry]) -> dict[str, str | Exception]:
                got = self._node_digests([(e.node_path, e.size) for e in entries], tool, Step.S3)
                return {e.path: got[e.node_path] for e in entries}
            return on_node

        def head(obj: s3mod.S3Object) -> s3mod.ObjectHead:
            return s3mod.head_object(client, loc.bucket, obj.key)

        for path, match in s3mod.match_files(todo, self._s3_objects, loc, digests("md5sum"), head,
                                             digests("sha256sum")).items():
            self.files[path].s3 = match

    @property
    def s3_object_count(self) -> int:
        return len(self._s3_objects or {})

    def _s3_verified(self, match: s3mod.S3Match | None) -> bool:
        return match is not None and (match.status in s3mod.CONTENT_MATCHES
                                      or (match.status == s3mod.SIZE_ONLY and self.opt.trust_s3_size))

    def resolve(self) -> None:
        """Decide each file's action from its class policy and its S3 match."""
        self._match_s3()
        for fs in self.files.values():
            policy = self.policies[fs.entry.cls]
            if policy == Policy.SKIP:
                fs.action = Action.EXCLUDED
            elif policy == Policy.PRESERVE:
                fs.action = Action.DOWNLOAD
            elif fs.s3 is not None and fs.s3.status in (*s3mod.CONTENT_MATCHES, s3mod.SIZE_ONLY):
                fs.action = Action.IN_S3
            else:
                fs.action = Action.DOWNLOAD
        for side, db in self.sidecars.items():
            if (db not in self._no_snapshot
                    and self.files[side].action == self.files[db].action == Action.DOWNLOAD):
                self.files[side].action = Action.IN_SNAPSHOT

    # -- 4. system info -----------------------------------------------------------
    def run_sysinfo(self) -> None:
        if self.opt.dry_run:
            self.emit(Step.SYSINFO, Kind.DONE, f"would capture system info into {self.dest / 'system-info.txt'}")
            return
        self.emit(Step.SYSINFO, Kind.START, f"capturing system info of {self.node}")
        self.sysinfo = capture(self.host, self.opt.python)
        self.tree.write_top("system-info.txt", self.sysinfo.to_text().encode())
        self.tree.write_top("system-info.json", json.dumps(self.sysinfo.to_json(), indent=2).encode())
        if self.sysinfo.error:  # a record of the node, not one of its files: worth a warning, not a veto
            self.warnings.append(f"system info incomplete: {self.sysinfo.error}")
            self.emit(Step.SYSINFO, Kind.WARNING, self.warnings[-1])
        s = self.sysinfo.summary()
        gpus = f"{len(s['gpus'])} GPU(s)" if s["gpus"] else (s["gpu_note"] or "no GPUs")
        self.emit(Step.SYSINFO, Kind.DONE, f"{gpus}; {s['os'] or 'unknown OS'}; written to system-info.txt", data=s)

    # -- 5. download ------------------------------------------------------------------
    def plan_summary(self) -> DownloadPlan:
        down = [fs for fs in self.files.values() if fs.action == Action.DOWNLOAD]
        return DownloadPlan(len(down), sum(fs.entry.size for fs in down),
                            sum(fs.action == Action.IN_S3 for fs in self.files.values()),
                            sum(fs.action == Action.EXCLUDED for fs in self.files.values()), self.dest)

    def run_download(self) -> None:
        self.resolve()
        plan = self.plan_summary()
        if self.opt.dry_run:
            self.emit(Step.DOWNLOAD, Kind.DONE, f"would download {plan.files} files ({human_bytes(plan.bytes)}) "
                      f"into {self.dest / 'files'}", data=plan.to_json())
            return
        self.emit(Step.DOWNLOAD, Kind.START,
                  f"{plan.files} files, {human_bytes(plan.bytes)} into {self.dest / 'files'}", data=plan.to_json())
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
        pipe = HashPipe(self._hash_on_node)  # the node hashes (what the streams did not) while the rest comes
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
        self.emit(Step.DOWNLOAD, Kind.PROGRESS, "checking the node for changes since the listing")
        with ThreadPoolExecutor(max_workers=1) as pool:  # the node is listed again while the last files flush
            relisted = pool.submit(self._relist)
            pipe.close()
            again = self._verify(states, flusher)
            now = relisted.result()
        if again:  # files were fetched again after that listing: list once more
            now = self._relist()
        self._make_links()
        self._finish_dirs()
        self.tree.tidy_partial()
        self._report_kind_changes()
        self._restat(now)
        self._save_proofs(states)
        ok = sum(fs.verified for fs in states)
        self.emit(Step.DOWNLOAD, Kind.DONE, f"{ok} of {len(states)} files verified by sha256", done=ok,
                  total=len(states), unit="files")

    def _save_proofs(self, states: list[FileState]) -> None:
        """Record every file verified by sha256 in this run (and keep the proofs of files not in it)."""
        proofs = {p: v for p, v in self._proofs.items() if p not in self.files}
        for fs in states:
            if not fs.verified or fs.changed or fs.snapshot or fs.job is None or fs.job.sha256 is None:
                continue
            st = self.tree.lstat(fs.entry.path)
            if st is not None and stat.S_ISREG(st.st_mode):
                proofs[fs.entry.path] = ledger.Proof(fs.job.sha256, ledger.node_key(fs.entry), ledger.local_key(st))
        ledger.save(self.tree, proofs)

    def _snapshot_databases(self) -> None:
        """Each SQLite database to download: one consistent snapshot taken on the node (online backup),
        its sidecars folded in; where none can be taken, a plain copy (said, unless it is no SQLite)."""
        for path, fs in sorted(self.files.items()):
            if fs.action != Action.DOWNLOAD or not is_sqlite_name(path) or path in self._no_snapshot:
                continue
            e = fs.entry
            try:
                data, digest = sqlite_snapshot(self.host, self.opt.python, e.node_path)
            except HostError as err:
                self._no_snapshot.add(path)
                if not (isinstance(err, SnapshotRefused) and str(err) == "not a SQLite database"):
                    self.warnings.append(f"{path}: no snapshot of this SQLite database ({err}): copied as a "
                                         "plain file, which a writer may change during the copy")
                    self.emit(Step.DOWNLOAD, Kind.WARNING, self.warnings[-1])
                continue
            job = FileJob(e.path, e.node_path, e.size, e.mtime_ns, e.mode)
            with self.tree.open_part(path, append=False) as f:
                f.write(data)
            self.tree.finalize(path, e.mode & 0o777, e.mtime_ns)
            for suffix in SIDECARS:  # an earlier run's copies would be applied to the snapshot on open
                self.tree.unlink(path + suffix)
            job.sha256, job.node_sha256, job.state, job.transferred = (hashlib.sha256(data).hexdigest(), digest,
                                                                       "done", len(data))
            fs.job, fs.snapshot = job, True
        self.resolve()

    def _stream_factory(self):
        """How streams are made: local reads, OpenSSH `ssh` when it works non-interactively, else SFTP."""
        if self._streams is None:
            if self.host.kind == "local":
                self.transfer_note = "local copy"
            elif self.ssh_argv and openssh_available():
                first, argv, why = first_openssh_stream(self.ssh_argv)
                if first is not None:
                    self.transfer_note = f"OpenSSH ssh, {self.opt.streams} stream(s)"
                    ready = [first]  # the stream that proved ssh usable is the first one used
                    self._streams = lambda: ready.pop() if ready else OpenSSHStream(argv)
                    return self._streams
                self.warnings.append(f"OpenSSH ssh unusable ({why}): falling back to SFTP")
                self.emit(Step.DOWNLOAD, Kind.WARNING, self.warnings[-1])
            if self.host.kind != "local":
                self.transfer_note = "SFTP through the node connection"
            self._streams = lambda: HostRangeStream(self.host)
        return self._streams

    def _transfer(self, jobs: list[FileJob], what: str, on_done: Callable[[FileJob], None] | None = None) -> None:
        if not jobs:
            return
        total = sum(j.size for j in jobs)

        def update(p: Progress) -> None:
            self.emit(Step.DOWNLOAD, Kind.PROGRESS, f"{what} {p.files}/{p.total_files} files", done=p.bytes,
                      total=max(total, p.bytes), unit="bytes", rate=p.rate)

        progress = Progress(total, len(jobs), update)
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
                    self.emit(Step.DOWNLOAD, Kind.PROGRESS, "hashing the files already here", done=i,
                              total=len(present), unit="files")
        with ThreadPoolExecutor(max_workers=1) as pool:  # the last files flush while the node hashes
            durable = pool.submit(flusher.close)
            self._compare(states)
            again = [fs for fs in states if fs.download.node_sha256 and not fs.verified]
            self._not_durable(states, durable.result())
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
        self._compare(again, retried=True)
        self._not_durable(again, flusher.close())
        return True

    @staticmethod
    def _not_durable(states: list[FileState], errors: dict[str, str]) -> None:
        for fs in states:
            why = errors.get(fs.download.path)
            if why is not None and fs.download.state in ("done", "present"):
                fs.verified, fs.reason = False, f"not durable on the local disk ({why})"

    def _compare(self, states: list[FileState], retried: bool = False) -> None:
        """Local sha256 against the node's (hashed now where the pipe has not already)."""
        have = [fs for fs in states if fs.download.state in ("done", "present")]
        for fs in states:
            if fs.download.state == "failed":
                fs.verified, fs.reason = False, f"download failed: {fs.download.error}"
        need = [fs.download for fs in have if fs.download.node_sha256 is None]
        errors = self._hash_on_node(need, Step.DOWNLOAD) if need else {}
        for fs in have:
            got = fs.download.node_sha256
            if got is None:
                fs.verified, fs.reason = False, f"no sha256 from the node: {errors.get(fs.download.node_path)}"
            elif not fs.snapshot and (n := self._local_size(fs.download)) != fs.entry.size:
                fs.verified = False  # the bytes written here are what counts, whatever the sender says of them
                fs.reason = f"received {n} bytes, {fs.entry.size} listed: the copy here is not the file listed"
            elif got == fs.download.sha256:
                fs.verified, fs.how, fs.reason = True, "sqlite-snapshot" if fs.snapshot else "sha256", ""
            else:
                fs.verified = False
                fs.reason = ("sha256 differs from the node's after downloading again" if retried
                             else "sha256 differs from the node's")
            if fs.download.shrank:
                fs.changed = fs.changed or "shrank during download"

    def _local_size(self, job: FileJob) -> int:
        """The local file's length, as counted while it was written (else as it is on the disk now)."""
        if job.local_size is not None:
            return job.local_size
        st = self.tree.lstat(job.path)
        return -1 if st is None else st.st_size

    def _hash_on_node(self, jobs: list[FileJob], step: Step | None = None) -> dict[str, Exception]:
        """Set each job's node_sha256; the errors of those that got none, by node path."""
        got = self._node_digests([(j.node_path, j.size) for j in jobs if j.limit is None], "sha256sum", step)
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

    def _node_digests(self, items: list[tuple[str, int]], tool: str, step: Step | None) -> dict[str, str | Exception]:
        """Checksums on the node, with progress events of `step` (None: quiet); once the node
        is unreachable, no more tries."""
        if self.node_down:
            return {p: HostUnreachable(self.node_down) for p, _ in items}
        total = sum(n for _, n in items)
        done = [0]
        on_batch: Callable[[int, int], None] | None = None
        if step is not None:
            where = step

            def on_batch(nfiles: int, nbytes: int) -> None:
                done[0] += nbytes
                self.emit(where, Kind.PROGRESS, f"{tool} on the node", done=done[0], total=total, unit="bytes")

        got = node_digests(self.host, items, tool=tool, workers=self.opt.streams, on_batch=on_batch)
        lost = next((v for v in got.values() if isinstance(v, HostUnreachable)), None)
        if lost is not None:
            self.node_down = str(lost)
        return got

    @property
    def listing(self) -> Inventory:
        """The inventory (the first step makes it; every later step reads it)."""
        if self.inventory is None:
            raise UserError("no inventory yet: the inventory step runs first")
        return self.inventory

    def _prepare_dirs(self) -> None:
        for d in self.listing.dirs:
            self.tree.make_writable(d.path)  # made where missing; an earlier run's read-only dir opened up

    def _finish_dirs(self) -> None:
        for d in sorted(self.listing.dirs, key=lambda d: -d.path.count("/")):
            self.tree.set_dir_meta(d.path, d.mode & 0o777, d.mtime_ns)

    def _make_links(self) -> None:
        for link in self.listing.links:
            try:
                self.tree.make_link(link.path, link.target)
                self.links_done[link.path] = ""
            except OSError as e:
                self.links_done[link.path] = f"could not recreate symlink: {e.strerror or e}"

    def _report_kind_changes(self) -> None:
        """Entries of the destination whose kind differs from the node's now: handled, and said."""
        for line in self.tree.changes:
            self.warnings.append(line)
            self.emit(Step.DOWNLOAD, Kind.WARNING, line)
        self.tree.changes.clear()

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

    def _relist(self) -> Inventory | HostError:
        """The roots listed again (nothing else touched: it runs beside the last flush), or why not."""
        try:
            if self.node_down:
                raise HostUnreachable(self.node_down)
            return list_roots(self.host, self._roots())
        except HostError as e:
            return e

    def _restat(self, now: Inventory | HostError) -> None:
        """A file whose size or mtime moved between the listing and `now` (listed after the transfer) changed."""
        if isinstance(now, HostError):
            if isinstance(now, HostUnreachable):
                self.node_down = str(now)
            self.problems.append(f"could not check the node for changes after the download: {now}")
            return
        after = {e.path: e for e in now.files}
        touched: list[FileState] = []
        for path, fs in self.files.items():
            if fs.action in (Action.EXCLUDED, Action.IN_SNAPSHOT) or fs.snapshot:  # a snapshot: consistent as taken
                continue
            if path not in after:
                fs.changed = "deleted on the node during the download"
                continue
            size, mtime = after[path].size, after[path].mtime_ns
            if size > fs.entry.size and fs.job is not None and fs.job.limit is not None:
                self.grown.append(f"{path}: grew during the copy; preserved up to the {fs.entry.size} bytes listed, "
                                  f"the {size - fs.entry.size} bytes written since are not")
                self.warnings.append(self.grown[-1])
                self.emit(Step.DOWNLOAD, Kind.WARNING, self.grown[-1])
            elif size != fs.entry.size:
                fs.changed = f"size changed during download ({fs.entry.size} -> {size} bytes)"
            elif mtime != fs.entry.mtime_ns:
                fs.changed = fs.changed or "modified during download (mtime moved)"
            elif (after[path].inode, after[path].ctime_ns) != (fs.entry.inode, fs.entry.ctime_ns):
                touched.append(fs)  # same size and mtime, yet replaced or rewritten (touch -r, cp -p): or a chmod
        self._rehash_touched(touched)
        self.appeared = sorted(p for p, e in after.items()
                               if p not in self.files and self.policies[e.cls] != Policy.SKIP)

    def _rehash_touched(self, touched: list[FileState]) -> None:
        """Files whose inode or ctime moved while size and mtime stayed: hashed again on the node now; a
        digest that differs from the copy here (or none) means the node's file is not the one copied."""
        local = [fs for fs in touched if fs.job is not None and fs.job.sha256 is not None]
        for fs in touched:
            if fs not in local:
                fs.changed = fs.changed or "replaced or rewritten on the node during the download (new inode/ctime)"
        if not local:
            return
        jobs = [FileJob(fs.entry.path, fs.entry.node_path, fs.entry.size, fs.entry.mtime_ns, fs.entry.mode,
                        limit=fs.download.limit) for fs in local]
        errors = self._hash_on_node(jobs)
        for fs, job in zip(local, jobs):
            if job.node_sha256 is None:
                fs.changed = fs.changed or (f"new inode/ctime on the node during the download, and it could not "
                                            f"be hashed again: {errors.get(job.node_path)}")
            elif job.node_sha256 != fs.download.sha256:
                fs.changed = fs.changed or ("replaced or rewritten on the node during the download (same size and "
                                            "mtime, new inode/ctime, another sha256)")

    # -- 6. notes and 7. verdict ----------------------------------------------------------
    def decide(self) -> Verdict:
        """SAFE only when every selected file is verified locally or in S3 and nothing else is wrong."""
        missing: list[Missing] = []
        excluded: list[Excluded] = []
        for path, fs in sorted(self.files.items()):
            if fs.action == Action.EXCLUDED:
                excluded.append(Excluded(path, fs.entry.cls, fs.entry.size))
                continue
            if fs.action == Action.IN_SNAPSHOT:
                db = self.files[self.sidecars[path]]
                fs.verified, fs.how = db.verified, "sqlite-snapshot"
                fs.reason = "" if db.verified else f"in the snapshot of {db.entry.path}, which is not preserved"
            if fs.action == Action.IN_S3 and fs.s3 is not None:
                fs.how = {s3mod.MD5_MATCH: "s3-md5", s3mod.CHECKSUM_MATCH: "s3-sha256"}.get(fs.s3.status, "s3-size")
                fs.verified = self._s3_verified(fs.s3)
                if not fs.verified:
                    fs.reason = (f"in S3 by size only ({fs.s3.detail}): unverified; pass --trust-s3-size "
                                 f"to accept, or --include {fs.entry.cls} to download")
            if fs.changed and not fs.reason.startswith("changed during download"):
                fs.verified = False
                fs.reason = f"changed during download: {fs.changed}" + (f"; {fs.reason}" if fs.reason else "")
            if not fs.verified and not self.opt.dry_run:
                reason = fs.reason or "not downloaded"
                own = own_kind(path)
                if own:
                    reason += f" (nodedeck's own {own}: stop its stages or `nodedeck` on the node, then run again)"
                missing.append(Missing(reason, path, fs.entry.cls, fs.entry.size))
        if not self.opt.dry_run:
            missing += [Missing(err, p, "symlink") for p, err in sorted(self.links_done.items()) if err]
            missing += [Missing("appeared on the node after the listing: not preserved (run again)", p)
                        for p in self.appeared]
            missing += [Missing(p) for p in self.problems]
            missing += [Missing(bad.reason, bad.name) for bad in self.listing.rejected]
            if not self.opt.accept_outside_links:
                missing += [Missing(f"symlink to {link.target} (on the node: {link.leads_to}), outside the preserved "
                                    "roots: the link is recreated here, the data it points to is not preserved "
                                    f"(add --root {link.leads_to} to keep it, or accept it: --accept-outside-links)",
                                    link.path, "symlink")
                            for link in self.outside]
            if self.cancel.is_set():
                missing.append(Missing("cancelled"))
        states = self.files.values()
        counts = Counts(
            files=sum(fs.action != Action.EXCLUDED for fs in states),
            verified=sum(fs.verified for fs in states if fs.action != Action.EXCLUDED),
            verified_local=sum(fs.verified and fs.action == Action.DOWNLOAD for fs in states),
            verified_s3_md5=sum(fs.verified and fs.how == "s3-md5" for fs in states),
            verified_s3_sha256=sum(fs.verified and fs.how == "s3-sha256" for fs in states),
            s3_size_only=sum(fs.action == Action.IN_S3 and fs.how == "s3-size" for fs in states),
            s3_size_only_trusted=sum(fs.verified and fs.how == "s3-size" for fs in states),
            sqlite_snapshots=sum(fs.snapshot and fs.verified for fs in states),
            in_sqlite_snapshot=sum(fs.action == Action.IN_SNAPSHOT and fs.verified for fs in states),
            grown_logs=len(self.grown),
            excluded=len(excluded),
            missing=len(missing),
        )
        self.verdict = Verdict(not self.opt.dry_run and not missing, self.opt.dry_run, tuple(missing),
                               tuple(excluded), counts, tuple(self.warnings))
        return self.verdict

    def run_notes(self) -> None:
        verdict = self.decide()
        if self.opt.dry_run:
            self.emit(Step.NOTES, Kind.DONE, f"would write PROGRESS.md and manifest.json into {self.dest}")
            return
        self.emit(Step.NOTES, Kind.START)
        self.tree.write_top("manifest.json", manifest_bytes(self, verdict))
        self.tree.write_top("PROGRESS.md", progress_markdown(self, verdict).encode("utf-8", "surrogateescape"))
        self.emit(Step.NOTES, Kind.DONE, f"wrote {self.dest / 'PROGRESS.md'} and manifest.json",
                  data={"safe": verdict.safe})

    def run_verdict(self) -> Verdict:
        v = self.verdict or self.decide()
        self.emit(Step.VERDICT, Kind.DONE, v.headline, data=v.to_json())
        return v

    def advance(self) -> StepResult:
        """Run the next group of steps and return what it yields: the inventory and selection (Listed),
        then the S3 check (Planned), then system info, download, notes and verdict (Finished)."""
        if self.result is None:
            self.run_inventory()
            self.result = Listed(self.run_select(), summarize(self.listing))
        elif isinstance(self.result, Listed):
            self.run_s3()
            self.result = Planned(self.selection(), self.plan_summary())
        elif isinstance(self.result, Planned):
            self.run_sysinfo()
            self.run_download()
            self.run_notes()
            self.result = Finished(self.selection(), self.run_verdict())
            self.close()
        else:
            raise UserError("this decommission is finished: start another to run again")
        return self.result

    def replan(self) -> StepResult:
        """The current result again after a policy change (Planned: the actions decided anew)."""
        if isinstance(self.result, Planned):
            self.resolve()
            self.result = Planned(self.selection(), self.plan_summary())
        elif isinstance(self.result, Listed):
            self.result = Listed(self.selection(), self.result.inventory)
        if self.result is None:
            raise UserError("nothing to plan again: the inventory has not run")
        return self.result

    def run(self, confirm: Callable[[DownloadPlan], bool] | None = None) -> Verdict:
        """Every step in order; `confirm(plan)` is asked before downloading (False stops)."""
        try:
            self.advance()
            planned = self.advance()
            if not isinstance(planned, Planned):   # advance() yields Listed, Planned, Finished in turn
                raise RuntimeError(f"decommission step out of order: {type(planned).__name__}")
            if not self.opt.dry_run and confirm is not None and not confirm(planned.plan):
                raise UserError("stopped before downloading: nothing was changed")
            finished = self.advance()
            if not isinstance(finished, Finished):
                raise RuntimeError(f"decommission step out of order: {type(finished).__name__}")
            return finished.verdict
        finally:
            self.close()
