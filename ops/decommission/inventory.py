"""Listing a node's roots with one remote `find`, NUL separated so any name works."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from ops.decommission.classify import CLASSES, classify
from ops.errors import HostError
from ops.hosts.base import Host

# One command for every root. Per root: a header record, the find records
# (two NUL-terminated fields each: "E idx type size mtime mode relpath" and the
# link target), then "X idx rc". Roots may start with ~ (the node user's home).
_INVENTORY_SH = r"""
i=0
for r in "$@"; do
  case $r in "~") r=$HOME ;; "~/"*) r=$HOME/${r#"~/"} ;; esac
  if abs=$(realpath -e -- "$r" 2>/dev/null && printf x); then
    abs=${abs%?x}
    if [ -d "$abs" ]; then
      printf 'R\t%s\tdir\t%s\0' "$i" "$abs"
      find "$abs" -mindepth 1 -printf "E\t$i\t%y\t%s\t%T@\t%m\t%P\0%l\0"
    else
      printf 'R\t%s\tfile\t%s\0' "$i" "$abs"
      find "$abs" -maxdepth 0 -printf "E\t$i\t%y\t%s\t%T@\t%m\t%f\0%l\0"
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
    cls: str = ""

    @property
    def mtime(self) -> float:
        return self.mtime_ns / 1e9


@dataclass
class Inventory:
    roots: list[Root]
    files: list[Entry] = field(default_factory=list)
    dirs: list[Entry] = field(default_factory=list)
    links: list[Entry] = field(default_factory=list)
    special: list[Entry] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

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


def _parse_mtime(text: str) -> int:
    sec, _, frac = text.partition(".")
    return int(sec) * 1_000_000_000 + int((frac + "000000000")[:9])


def list_roots(host: Host, roots: list[Root], *, timeout: float | None = 900) -> Inventory:
    """Inventory every root in one remote command; classify each file."""
    if not roots:
        raise HostError("nothing to inventory: no roots")
    res = host.run([*_QUIET_BASH, _INVENTORY_SH, "nodedeck-inventory", *[r.given for r in roots]], timeout=timeout)
    inv = Inventory(roots=roots)
    fields = res.stdout.split(b"\0")
    i = 0
    entries: list[Entry] = []
    while i < len(fields):
        rec = fields[i].decode("utf-8", "surrogateescape")
        i += 1
        if not rec:
            continue
        tag = rec[:2]
        if tag == "E\t":
            _, idx, kind, size, mtime, mode, rel = rec.split("\t", 6)
            target = fields[i].decode("utf-8", "surrogateescape") if i < len(fields) else ""
            i += 1
            entries.append(Entry(int(idx), rel, kind, int(size), _parse_mtime(mtime), int(mode, 8), target))
        elif tag == "R\t":
            _, idx, kind, path = rec.split("\t", 3)
            root = roots[int(idx)]
            root.path = path
            root.status, root.kind = ("missing", "") if kind == "missing" else ("ok", kind)
        elif tag == "X\t":
            _, idx, rc = rec.split("\t")
            if rc != "0":
                inv.problems.append(f"find under {roots[int(idx)].path} exited {rc}: some entries may be unlisted")
    inv.problems += [line for line in res.stderr.decode(errors="replace").splitlines() if line.strip()]
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
        if e.kind == "f":
            e.cls = classify(e.rel, e.size)
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


def summarize(inv: Inventory) -> dict:
    """Counts and sizes by class, for CLI/JSON/TUI."""
    per = inv.by_class()
    return {
        "roots": [{"given": r.given, "origin": r.origin, "path": r.path, "kind": r.kind, "status": r.status,
                   "label": r.label}
                  for r in inv.roots],
        "files": len(inv.files),
        "bytes": inv.total_bytes,
        "dirs": len(inv.dirs),
        "links": len(inv.links),
        "special": len(inv.special),
        "classes": {c: {"files": n, "bytes": b} for c, (n, b) in per.items()},
        "problems": list(inv.problems),
    }

