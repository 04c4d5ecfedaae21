"""Listing a node's roots with one remote `find`, NUL separated so any name works."""

from __future__ import annotations

import itertools
import posixpath
import re
from dataclasses import dataclass, field

from ops import nodenum
from ops.decommission.classify import CLASSES, ENV_CLASS, classify
from ops.decommission.own_env import under
from ops.errors import HostError
from ops.hosts.base import Host
from ops.textsafe import LINE_CHARS, printable, shown
from ops.units import human_bytes

# One command for every root. Per root: a header record, the find records
# (two NUL-terminated fields each: "E idx type size mtime ctime inode mode relpath"
# and the link target), then "X idx rc". inode and ctime are what a copy cannot keep
# (`touch -r`, `cp -p` keep size and mtime): the re-listing after a download compares
# them. Roots may start with ~ (the node user's home).
_INVENTORY_SH = r"""
i=0
for r in "$@"; do
  case $r in "~") r=$HOME ;; "~/"*) r=$HOME/${r#"~/"} ;; esac
  if abs=$(realpath -e -- "$r" 2>/dev/null && printf x); then
    abs=${abs%?x}
    if [ -d "$abs" ]; then
      printf 'R\t%s\tdir\t%s\0' "$i" "$abs"
      find "$abs" -mindepth 1 -printf "E\t$i\t%y\t%s\t%T@\t%C@\t%i\t%m\t%P\0%l\0"
    else
      printf 'R\t%s\tfile\t%s\0' "$i" "$abs"
      find "$abs" -maxdepth 0 -printf "E\t$i\t%y\t%s\t%T@\t%C@\t%i\t%m\t%f\0%l\0"
    fi
    printf 'X\t%s\t%s\0' "$i" "$?"
  else
    printf 'R\t%s\tmissing\t%s\0' "$i" "$r"
  fi
  i=$((i+1))
done
"""


# bash started by an sshd session reads ~/.bashrc (Debian's SSH_SOURCE_BASHRC), and so does a bash
# the login shell execs; without the SSH_CLIENT variables it does not: one `pyenv init` (0.1 s) less.
_QUIET_BASH = ("env", "-u", "SSH_CLIENT", "-u", "SSH2_CLIENT", "bash", "-c")


@dataclass
class Root:
    given: str
    origin: str  # node | plan | cli
    status: str = "unlisted"  # ok | missing | inside <root> | unlisted
    kind: str = ""  # dir | file
    path: str = ""  # resolved absolute path on the node
    label: str = ""  # prefix of this root's files in the manifest ("" for the first root)


@dataclass
class Entry:
    """One thing found under a root."""

    root: int
    rel: str
    kind: str  # f file, d dir, l symlink, p/s/c/b special
    size: int
    mtime_ns: int
    mode: int
    target: str = ""
    path: str = ""  # label/rel: the manifest path, the local layout and the S3 key
    node_path: str = ""
    cls: str = ""  # a file's class; a directory's or link's only when it is nodedeck's own environment
    ctime_ns: int = 0
    inode: int = 0

    @property
    def mtime(self) -> float:
        return self.mtime_ns / 1e9


@dataclass(frozen=True)
class Rejected:
    """A record of the listing that cannot be preserved: the name it gave (may be '') and why."""

    name: str
    reason: str


class BadRecord(ValueError):
    """One record of the node's listing that does not parse or names nothing safe."""


LISTING_BYTES = 1 << 30
MAX_STDERR_PROBLEMS = 100
"""The most lines of the listing's stderr kept as problems (any one blocks a SAFE verdict); the rest are counted."""
"""The most of a listing kept: about ten million files (a node with more is listed in parts, by root)."""
PATH_MAX = 4096  # Linux: open() by name takes at most this many bytes, the NUL included
NAME_MAX = 255  # bytes in one name: no local filesystem takes more


@dataclass
class Inventory:
    roots: list[Root]
    files: list[Entry] = field(default_factory=list)
    dirs: list[Entry] = field(default_factory=list)
    links: list[Entry] = field(default_factory=list)
    special: list[Entry] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)  # records that name nothing preservable

    def by_class(self) -> dict[str, tuple[int, int]]:
        """class -> (file count, bytes), every class present (zeros where empty)."""
        out: dict[str, list[int]] = {c: [0, 0] for c in CLASSES}
        for f in self.files:
            out[f.cls][0] += 1
            out[f.cls][1] += f.size
        return {c: (n, b) for c, (n, b) in out.items()}

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


_SECONDS = nodenum.Whole("time", -(10**12), 10**12)
_FRACTION = nodenum.Whole("time", 0, 10**30)


def _parse_time(text: str) -> int:
    """find's `%T@` (seconds, a point, ten digits of fraction) in nanoseconds; its numbers through ops.nodenum."""
    sec, dot, frac = text.partition(".")
    if _SECONDS.get(sec) is None or dot and _FRACTION.get(frac) is None or frac[:1] in ("+", "-"):
        raise BadRecord(f"time {text[:40]!r} is not a number of seconds")
    ns = abs(int(sec)) * 1_000_000_000 + int((frac + "000000000")[:9])
    return -ns if sec.startswith("-") else ns


def _number(field: nodenum.Whole, text: str, base: int = 10) -> int:
    """A number of the listing through ops.nodenum; base 8: find's octal mode."""
    value = None
    if base == 10:
        value = field.get(text)
    elif text and len(text) <= 6 and all(c in "01234567" for c in text):
        value = field.get(int(text, 8))
    if value is None:
        raise BadRecord(f"{field.name} {text[:40]!r} is not a number")
    return value


def _safe_rel(rel: str) -> None:
    """A relative path naming something inside its root, each name one a local filesystem takes."""
    if rel.startswith("/"):
        raise BadRecord("an absolute name, not one inside its root")
    for part in rel.encode("utf-8", "surrogateescape").split(b"/"):
        if part in (b"", b".", b".."):
            raise BadRecord(f"a name with {part.decode() or 'an empty'!r} component: not inside its root")
        if len(part) > NAME_MAX:
            raise BadRecord(f"one name of {len(part)} bytes: longer than the {NAME_MAX} a file name can hold")


def _entry(rec: str, target: str, roots: list[Root]) -> Entry:
    parts = rec.split("\t", 8)
    if len(parts) != 9:
        raise BadRecord(f"short record {rec[:60]!r}")
    _, idx, kind, size, mtime, ctime, ino, mode, rel = parts
    root = _number(nodenum.INDEX.named("root index"), idx)
    if root >= len(roots):
        raise BadRecord(f"root {root} was never asked for")
    _safe_rel(rel)
    if len(kind) != 1:
        raise BadRecord(f"type {kind[:20]!r} is not one find gives")
    return Entry(root, rel, kind, _number(nodenum.BYTES, size), _parse_time(mtime), _number(nodenum.MODE, mode, 8),
                 target, ctime_ns=_parse_time(ctime), inode=_number(nodenum.INODE, ino))


def _name_of(rec: str) -> str:
    """The name a record gives, for its report ('' when it gives none)."""
    parts = rec.split("\t", 8)
    return parts[8] if len(parts) == 9 and parts[0] == "E" else ""


def _root_record(rec: str, roots: list[Root]) -> None:
    parts = rec.split("\t", 3)
    if len(parts) != 4:
        raise BadRecord(f"short record {rec[:60]!r}")
    _, idx, kind, path = parts
    at = nodenum.INDEX.get(idx)
    if at is None or at >= len(roots):
        raise BadRecord(f"bad root index {idx[:20]!r} in {rec[:60]!r}")
    root = roots[at]
    if kind == "missing":
        root.status, root.kind = "missing", ""
    elif kind in ("dir", "file") and path.startswith("/"):
        root.path, root.status, root.kind = path, "ok", kind
    else:
        raise BadRecord(f"bad root record {rec[:60]!r}")


def _stderr_problems(err: bytes) -> list[str]:
    """The listing's stderr lines (each a problem: find could not read something), inert and bounded: the first
    MAX_STDERR_PROBLEMS non-blank ones, then one saying how much more there is. Time linear in err (the search
    runs in C), memory in what is kept."""
    lines = re.finditer(rb"\S[^\n]*", err)   # a non-blank line, from its first non-blank byte
    said = [printable(err[m.start() : min(m.end(), m.start() + 4 * (LINE_CHARS + 1))].rstrip())
            for m in itertools.islice(lines, MAX_STDERR_PROBLEMS)]
    if (more := next(lines, None)) is not None:
        said.append(f"the listing's stderr goes on ({human_bytes(len(err) - more.start())} more, not shown here)")
    return said


def list_roots(host: Host, roots: list[Root], *, own: tuple[str, ...] = (), timeout: float | None = 900) -> Inventory:
    """Inventory every root in one remote command; classify each file. A record that does not parse,
    or names something outside its root, is rejected with its reason: the others are kept. Whatever lies
    in `own` (absolute resolved paths on the node: nodedeck's own environment, own_env.py) is in its class."""
    if not roots:
        raise HostError("nothing to inventory: no roots")
    res = host.run([*_QUIET_BASH, _INVENTORY_SH, "nodedeck-inventory", *[r.given for r in roots]], timeout=timeout,
                   max_output=LISTING_BYTES)
    inv = Inventory(roots=roots)
    fields = res.stdout.split(b"\0")
    i = 0
    entries: list[Entry] = []
    while i < len(fields):
        rec = fields[i].decode("utf-8", "surrogateescape")
        i += 1
        if not rec:
            continue
        try:
            if rec.startswith("E\t"):
                target = fields[i].decode("utf-8", "surrogateescape") if i < len(fields) else ""
                i += 1
                entries.append(_entry(rec, target, roots))
            elif rec.startswith("R\t"):
                _root_record(rec, roots)
            elif rec.startswith("X\t"):
                parts = rec.split("\t")
                at = nodenum.INDEX.get(parts[1]) if len(parts) == 3 else None
                if at is None or at >= len(roots):
                    raise BadRecord(f"short record {rec[:60]!r}")
                if parts[2] != "0":
                    inv.problems.append(f"find under {roots[at].path} exited {shown(parts[2][:20])}: "
                                        "some entries may be unlisted")
            else:
                raise BadRecord(f"unknown record {rec[:60]!r}")
        except BadRecord as bad:
            inv.rejected.append(Rejected(_name_of(rec), f"the node's listing has a malformed record: {bad}"))
    inv.problems += _stderr_problems(res.stderr)
    if res.returncode != 0 and not any(r.status != "unlisted" for r in roots):
        raise HostError(f"inventory failed on {host.name}: exit {res.returncode}")
    for r in roots:
        if r.status == "unlisted":
            inv.problems.append(f"{r.given}: not listed (inventory output ended early)")
    _nest_roots(roots)
    _label_roots(roots, entries)
    for e in entries:
        root = roots[e.root]
        if root.status != "ok":
            continue
        e.path = posixpath.join(root.label, e.rel) if root.label else e.rel
        e.node_path = root.path if root.kind == "file" else posixpath.join(root.path, e.rel)
        if under(e.node_path, own):
            e.cls = ENV_CLASS
        if e.kind == "f":
            longest = len(e.node_path.encode("utf-8", "surrogateescape"))
            if longest >= PATH_MAX:
                inv.rejected.append(Rejected(e.path, f"its path on the node is {longest} bytes, longer than the "
                                                     f"node's PATH_MAX ({PATH_MAX}): no command can open it by name "
                                                     "(move it higher up on the node, then run again)"))
                continue
            e.cls = e.cls or classify(e.rel, e.size)
            inv.files.append(e)
        elif e.kind == "d":
            inv.dirs.append(e)
        elif e.kind == "l":
            inv.links.append(e)
        else:
            inv.special.append(e)
    return inv


def _nest_roots(roots: list[Root]) -> None:
    """A root inside (or equal to) an earlier listed root is already covered by it."""
    for j, rj in enumerate(roots):
        if rj.status != "ok":
            continue
        for ri in roots[:j]:
            if ri.status == "ok" and (rj.path == ri.path or rj.path.startswith(ri.path.rstrip("/") + "/")):
                rj.status = f"inside {ri.path}"
                break


def _label_roots(roots: list[Root], entries: list[Entry]) -> None:
    """The first directory root at the top of the layout; the other roots under their
    base name (a file root under its directory's), made unique."""
    ok = [r for r in roots if r.status == "ok"]
    top = next((r for r in ok if r.kind == "dir"), None)
    taken = {e.rel.split("/", 1)[0] for e in entries if top is not None and roots[e.root] is top}
    by_dir: dict[str, str] = {}
    for r in ok:
        if r is top:
            continue
        named = posixpath.dirname(r.path) if r.kind == "file" else r.path
        if named not in by_dir:
            base = posixpath.basename(named.rstrip("/")) or "root"
            label, n = base, 2
            while label in taken:
                label, n = f"{base}-{n}", n + 1
            taken.add(label)
            by_dir[named] = label
        r.label = by_dir[named]


@dataclass(frozen=True)
class RootRecord:
    """A root as it was listed: what was given, where it resolved, where its files go under files/."""

    given: str
    origin: str
    path: str
    kind: str
    status: str
    label: str

    def to_json(self) -> dict:
        return {"given": self.given, "origin": self.origin, "path": self.path, "kind": self.kind,
                "status": self.status, "label": self.label}


@dataclass(frozen=True)
class ClassTotal:
    cls: str
    files: int
    bytes: int


@dataclass(frozen=True)
class InventorySummary:
    """Counts and sizes of a listing, by class: for the CLI, the TUI, the events and the manifest."""

    roots: tuple[RootRecord, ...]
    files: int
    bytes: int
    dirs: int
    links: int
    special: int
    classes: tuple[ClassTotal, ...]  # every class, zeros where empty
    problems: tuple[str, ...]
    rejected: tuple[Rejected, ...]

    def to_json(self) -> dict:
        return {
            "roots": [r.to_json() for r in self.roots],
            "files": self.files,
            "bytes": self.bytes,
            "dirs": self.dirs,
            "links": self.links,
            "special": self.special,
            "classes": {c.cls: {"files": c.files, "bytes": c.bytes} for c in self.classes},
            "problems": list(self.problems),
            "rejected": [{"name": r.name, "reason": r.reason} for r in self.rejected],
        }


def summarize(inv: Inventory) -> InventorySummary:
    """Counts and sizes by class, for CLI/JSON/TUI."""
    return InventorySummary(
        roots=tuple(RootRecord(r.given, r.origin, r.path, r.kind, r.status, r.label) for r in inv.roots),
        files=len(inv.files),
        bytes=inv.total_bytes,
        dirs=len(inv.dirs),
        links=len(inv.links),
        special=len(inv.special),
        classes=tuple(ClassTotal(c, n, b) for c, (n, b) in inv.by_class().items()),
        problems=tuple(inv.problems),
        rejected=tuple(inv.rejected),
    )
