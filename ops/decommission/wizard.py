"""The decommission wizard: preserve everything a node holds before it is shut down.

Steps (STEPS), each reporting through one `on_event(WizardEvent)` callback:
inventory -> select -> s3 -> sysinfo -> download -> notes -> verdict.
The CLI runs them in order (`Decommission.run()`); the TUI screen calls them
one by one and changes class policies between them. Nothing on the node is
ever changed: every remote command only reads. What each step does lives in
its own module (selection, download, verify, verdict); the wizard holds the
run's state and the sequence.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Callable

from ops.decommission import s3 as s3mod
from ops.decommission.classify import CLASSES
from ops.decommission.download import Download
from ops.decommission.events import Emitter, EventKind, NotesWritten, OnEvent, S3Listed, Step, Unit
from ops.decommission.filestate import FileState
from ops.decommission.inputs import Options, StageStates
from ops.decommission.inventory import Entry, Inventory, Root, list_roots, summarize
from ops.decommission.links import OutsideLink, outside_links
from ops.decommission.live import sqlite_sidecars
from ops.decommission.localtree import DestTree
from ops.decommission.manifest import manifest_bytes
from ops.decommission.own_env import node_realpaths
from ops.decommission.policy import Policy, default_policy
from ops.decommission.report import progress_markdown
from ops.decommission.results import (
    DecommissionResult,
    DirRecord,
    DownloadPlan,
    Finished,
    LinkRecord,
    Listed,
    Planned,
    SafetyVerdict,
    Selection,
    StepResult,
)
from ops.decommission.selection import download_plan, resolve, selection
from ops.decommission.sysinfo import SystemInfo, capture
from ops.decommission.verdict import Findings, decide, file_records, last_metrics
from ops.decommission.verify import NodeHasher, changes_since
from ops.errors import HostError, HostUnreachable, UserError
from ops.hosts.base import Host
from ops.units import human_bytes

STEPS: tuple[tuple[Step, str], ...] = (
    (Step.INVENTORY, "Inventory"),
    (Step.SELECT, "Selection"),
    (Step.S3, "S3 inventory"),
    (Step.SYSINFO, "System info"),
    (Step.DOWNLOAD, "Download + verify"),
    (Step.NOTES, "Notes"),
    (Step.VERDICT, "Verdict"),
)

SPECIAL_KINDS = {"p": "FIFO (named pipe)", "s": "socket", "c": "character device", "b": "block device",
                 "D": "door"}


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
        on_event: OnEvent | None = None,
        cancel: threading.Event | None = None,
    ):
        self.host = host
        self.node = node_name
        self.node_root = node_root
        self.opt = options
        self.dest = Path(options.dest).expanduser().resolve()
        self.ssh_argv = ssh_argv
        self.stage_states = stage_states or StageStates(None, (), "no plan given: stage states unavailable")
        self.emit = Emitter(on_event)
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
        self.own: tuple[str, ...] = ()  # nodedeck's own environment on the node, its paths resolved there
        self.sidecars: dict[str, str] = {}  # SQLite -wal/-shm/-journal -> its database
        self.no_snapshot: set[str] = set()  # databases copied as plain files (no snapshot possible)
        self.grown: list[str] = []  # growing files preserved up to their listed length, said so
        self.transfer_note = ""
        self.hasher = NodeHasher(host, options.streams, self.emit)
        self.verdict: SafetyVerdict | None = None
        self.started_at = time.time()
        self._tree: DestTree | None = None
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

    @property
    def node_down(self) -> str | None:
        """Why the node stopped answering, once it did."""
        return self.hasher.node_down

    def warn(self, step: Step, line: str) -> None:
        """A warning: kept for the verdict and the notes, and reported."""
        self.warnings.append(line)
        self.emit(step, EventKind.WARNING, line)

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

    @property
    def listing(self) -> Inventory:
        """The inventory (the first step makes it; every later step reads it)."""
        if self.inventory is None:
            raise UserError("no inventory yet: the inventory step runs first")
        return self.inventory

    # -- 1. inventory -----------------------------------------------------------
    def run_inventory(self) -> Inventory:
        given = ", ".join(r.given for r in self._roots())
        self.emit(Step.INVENTORY, EventKind.START, f"listing {given} on {self.node}")
        self.check_dest()
        self.own = tuple(p for p in node_realpaths(self.host, list(self.opt.own_env)) if p)
        inv = list_roots(self.host, self._roots(), own=self.own)
        for r in inv.roots:
            if r.status == "missing":
                if r.origin == "cli":
                    raise UserError(f"--root {r.given}: not found on {self.node}")
                self.warn(Step.INVENTORY, f"{r.origin} root {r.given} does not exist on {self.node}")
        if not any(r.status == "ok" for r in inv.roots):
            raise UserError(f"nothing to preserve on {self.node}: none of the roots exists")
        self.problems += [f"inventory: {p}" for p in inv.problems]
        for bad in inv.rejected:
            self.emit(Step.INVENTORY, EventKind.WARNING, f"{bad.name}: {bad.reason}" if bad.name else bad.reason)
        self.outside = outside_links(inv, lambda paths: node_realpaths(self.host, paths))
        if self.opt.accept_outside_links:
            for link in filter(self.kept, self.outside):
                self.warn(Step.INVENTORY, f"{link.path}: symlink to {link.target}, outside the roots: the link is "
                          "recreated, the data it points to is not preserved (accepted)")
        for e in inv.special:
            self.warn(Step.INVENTORY, f"{e.path}: {SPECIAL_KINDS.get(e.kind, 'special file')} skipped: not "
                      "preserved (it holds no data to copy)")
        self.inventory = inv
        self.files = {e.path: FileState(e) for e in inv.files}
        self.sidecars = sqlite_sidecars(set(self.files))
        s = summarize(inv)
        self.emit(Step.INVENTORY, EventKind.DONE,
                  f"{s.files} files, {human_bytes(s.bytes)} in {s.dirs} directories", data=s)
        return inv

    def kept(self, item: Entry | OutsideLink) -> bool:
        """A directory or link made here: not one of a class left out (nodedeck's own environment, by default)."""
        return not item.cls or self.policies[item.cls] != Policy.SKIP

    # -- 2. selection -----------------------------------------------------------
    def set_policy(self, cls: str, policy: Policy) -> None:
        if cls not in CLASSES:
            raise UserError(f"bad selection {cls}={policy}")
        self.policies[cls] = policy

    def selection(self) -> Selection:
        """Per class: policy, files, bytes, and (once resolved) what happens to them."""
        return selection(self.files, self.policies)

    def run_select(self) -> Selection:
        self.emit(Step.SELECT, EventKind.START)
        sel = self.selection()
        chosen = [f"{r.cls} ({r.policy})" for r in sel.present if r.policy != Policy.SKIP]
        skipped = [r.cls for r in sel.present if r.policy == Policy.SKIP]
        msg = "preserving " + (", ".join(chosen) or "nothing")
        if skipped:
            msg += "; excluded: " + ", ".join(skipped)
        self.emit(Step.SELECT, EventKind.DONE, msg, data=sel)
        return sel

    # -- 3. S3 ------------------------------------------------------------------
    def run_s3(self) -> None:
        if self.s3_loc is None:
            self.emit(Step.S3, EventKind.DONE, "no --s3 given: large artifacts are downloaded")
            self.resolve()
            return
        self.emit(Step.S3, EventKind.START, f"listing {self.s3_loc.url}")
        self._match_s3()
        self.resolve()
        counts: dict[str, int] = {}
        for fs in self.files.values():
            if fs.s3 is not None:
                counts[fs.s3.status] = counts.get(fs.s3.status, 0) + 1
        self.emit(Step.S3, EventKind.DONE,
                  f"{self.s3_object_count} objects; " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())),
                  data=S3Listed(self.s3_object_count, tuple(counts.items())))

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

        def digests(tool: str) -> Callable[[list[Entry]], dict[str, str | Exception]]:
            def on_node(entries: list[Entry]) -> dict[str, str | Exception]:
                got = self.hasher.digests([(e.node_path, e.size) for e in entries], tool, Step.S3)
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

    def resolve(self) -> None:
        """Decide each file's action from its class policy and its S3 match."""
        self._match_s3()
        resolve(self.files, self.policies, self.sidecars, self.no_snapshot)

    # -- 4. system info -----------------------------------------------------------
    def run_sysinfo(self) -> None:
        if self.opt.dry_run:
            self.emit(Step.SYSINFO, EventKind.DONE, f"would capture system info into {self.dest / 'system-info.txt'}")
            return
        self.emit(Step.SYSINFO, EventKind.START, f"capturing system info of {self.node}")
        self.sysinfo = capture(self.host, self.opt.python)
        self.tree.write_top("system-info.txt", self.sysinfo.to_text().encode())
        self.tree.write_top("system-info.json", json.dumps(self.sysinfo.to_json(), indent=2).encode())
        if self.sysinfo.error:  # a record of the node, not one of its files: worth a warning, not a veto
            self.warn(Step.SYSINFO, f"system info incomplete: {self.sysinfo.error}")
        s = self.sysinfo.summary()
        gpus = f"{len(s.gpus)} GPU(s)" if s.gpus else (s.gpu_note or "no GPUs")
        self.emit(Step.SYSINFO, EventKind.DONE, f"{gpus}; {s.os or 'unknown OS'}; written to system-info.txt",
                  data=s)

    # -- 5. download ------------------------------------------------------------------
    def plan_summary(self) -> DownloadPlan:
        return download_plan(self.files, self.dest)

    def run_download(self) -> None:
        self.resolve()
        plan = self.plan_summary()
        if self.opt.dry_run:
            self.emit(Step.DOWNLOAD, EventKind.DONE, f"would download {plan.files} files ({human_bytes(plan.bytes)}) "
                      f"into {self.dest / 'files'}", data=plan)
            return
        self.emit(Step.DOWNLOAD, EventKind.START,
                  f"{plan.files} files, {human_bytes(plan.bytes)} into {self.dest / 'files'}", data=plan)
        download = Download(self.host, self.tree, self.listing, self.files, self.opt, self.hasher, self.emit,
                            lambda line: self.warn(Step.DOWNLOAD, line), self.cancel, ssh_argv=self.ssh_argv,
                            no_snapshot=self.no_snapshot, resolve=self.resolve, relist=self._relist,
                            kept=self.kept)
        try:
            states, now = download.run()
        finally:
            self.transfer_note = download.transfer_note
        self.links_done = download.links_done
        changes = changes_since(self.files, now, self.policies, self.hasher)
        for line in changes.grown:
            self.grown.append(line)
            self.warn(Step.DOWNLOAD, line)
        if changes.problem:
            self.problems.append(changes.problem)
        self.appeared = changes.appeared
        download.save_proofs(states)
        ok = sum(fs.verified for fs in states)
        self.emit(Step.DOWNLOAD, EventKind.DONE, f"{ok} of {len(states)} files verified by sha256", done=ok,
                  total=len(states), unit=Unit.FILES)

    def _relist(self) -> Inventory | HostError:
        """The roots listed again (nothing else touched: it runs beside the last flush), or why not."""
        try:
            if self.node_down:
                raise HostUnreachable(self.node_down)
            return list_roots(self.host, self._roots(), own=self.own)
        except HostError as e:
            return e

    # -- 6. notes and 7. verdict ----------------------------------------------------------
    def decide(self) -> SafetyVerdict:
        """SAFE only when every selected file is verified locally or in S3 and nothing else is wrong."""
        self.verdict = decide(self.files, self.sidecars, Findings(
            dry_run=self.opt.dry_run, trust_s3_size=self.opt.trust_s3_size,
            accept_outside_links=self.opt.accept_outside_links, links_done=dict(self.links_done),
            appeared=tuple(self.appeared), problems=tuple(self.problems), rejected=tuple(self.listing.rejected),
            outside=tuple(filter(self.kept, self.outside)), cancelled=self.cancel.is_set(), grown=len(self.grown),
            warnings=tuple(self.warnings)))
        return self.verdict

    def outcome(self, verdict: SafetyVerdict) -> DecommissionResult:
        """The run, frozen, with its verdict: what the notes are rendered from (reads the metrics' last lines)."""
        inv = self.listing
        outside = {link.path for link in self.outside}
        loc = self.s3_loc
        return DecommissionResult(
            node=self.node,
            dest=self.dest,
            started_at=self.started_at,
            finished_at=time.time(),
            verdict=verdict,
            inventory=summarize(inv),
            selection=self.selection(),
            policies=tuple(self.policies.items()),
            files=file_records(self.files, self.sidecars, loc.object_url if loc is not None else None),
            links=tuple(LinkRecord(x.path, x.target, self.links_done.get(x.path) == "", x.path not in outside)
                        for x in filter(self.kept, inv.links)),
            dirs=tuple(DirRecord(x.path, x.mode, x.mtime_ns) for x in filter(self.kept, inv.dirs)),
            stage_states=self.stage_states,
            metrics=last_metrics(self.files, lambda: self.tree, self.host, self.node_down),
            transfer_note=self.transfer_note,
            s3_url=loc.url if loc is not None else None,
            s3_objects=self.s3_object_count,
            sysinfo=self.sysinfo.summary() if self.sysinfo is not None else None,
            warnings=tuple(self.warnings),
        )

    def run_notes(self) -> None:
        verdict = self.decide()
        if self.opt.dry_run:
            self.emit(Step.NOTES, EventKind.DONE, f"would write PROGRESS.md and manifest.json into {self.dest}")
            return
        self.emit(Step.NOTES, EventKind.START)
        result = self.outcome(verdict)
        self.tree.write_top("manifest.json", manifest_bytes(result))
        self.tree.write_top("PROGRESS.md", progress_markdown(result).encode("utf-8", "surrogateescape"))
        self.emit(Step.NOTES, EventKind.DONE, f"wrote {self.dest / 'PROGRESS.md'} and manifest.json",
                  data=NotesWritten(verdict.safe))

    def run_verdict(self) -> SafetyVerdict:
        v = self.verdict or self.decide()
        self.emit(Step.VERDICT, EventKind.DONE, v.headline, data=v)
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

    def run(self, confirm: Callable[[DownloadPlan], bool] | None = None) -> SafetyVerdict:
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
