"""Where a node's symlinks lead: a link whose target lies outside every listed root keeps no data when it is
recreated here, and the verdict must say so. Where it leads is followed through the listing's links, then,
for those that leave the roots, by the node itself: `/usr/bin/python3` may be a link to `python3.11`, and
only the file it ends at can be kept by adding it as a root."""

from __future__ import annotations

import dataclasses
import posixpath
from dataclasses import dataclass
from typing import Callable

from ops.decommission.inventory import PATH_MAX, Inventory

MAX_HOPS = 40  # as the kernel's MAXSYMLINKS: more is a loop


@dataclass(frozen=True)
class OutsideLink:
    """A listed symlink whose data is not under any root: its manifest path, its target as written, and
    where that leads on the node."""

    path: str
    target: str
    leads_to: str
    cls: str = ""  # the link's class: nodedeck_env when it is part of nodedeck's own environment


def resolve(node_path: str, links: dict[str, str]) -> str | None:
    """`node_path` with every symlink the listing knows followed, component by component (None: a loop, or a path
    longer than PATH_MAX, which no call opens: neither leads to data; the bound keeps the walk linear).

    Links the listing does not hold (outside the roots) are not followed: what matters is whether the path
    leaves the roots, and it has once it is outside them."""
    todo = [c for c in node_path.split("/") if c][::-1]   # the next component last: pop() and extend() are O(1)
    cur = "/"
    hops = 0
    while todo:
        comp = todo.pop()
        if comp == ".":
            continue
        if comp == "..":
            cur = posixpath.dirname(cur)
            continue
        nxt = posixpath.join(cur, comp)
        if len(nxt) >= PATH_MAX:
            return None
        target = links.get(nxt)
        if target is None:
            cur = nxt
            continue
        hops += 1
        if hops > MAX_HOPS:
            return None
        if target.startswith("/"):
            cur = "/"
        todo += [c for c in target.split("/") if c][::-1]
    return cur


def outside_links(inv: Inventory,
                  realpaths: Callable[[list[str]], list[str | None]] | None = None) -> list[OutsideLink]:
    """Every listed symlink that leads outside all the roots listed (their data is not preserved).

    `realpaths` (the node's `realpath` of each path, None where it gives none) follows what lies outside the
    listing: a link that ends inside the roots, at something the listing holds, is not outside; the others
    lead to the file they end at."""
    roots = [r.path.rstrip("/") or "/" for r in inv.roots if r.status == "ok" and r.kind == "dir"]
    files = {r.path for r in inv.roots if r.status == "ok" and r.kind == "file"}
    links = {e.node_path: e.target for e in inv.links}

    def inside(path: str) -> bool:
        return path in files or any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)

    out = []
    for link in inv.links:
        start = posixpath.join(posixpath.dirname(link.node_path), link.target)
        end = resolve(start, links)
        if end is None:  # a loop leads to no data at all
            continue
        if not inside(end):
            out.append(OutsideLink(link.path, link.target, end, link.cls))
    if realpaths is None or not out:
        return out
    listed = {e.node_path for e in (*inv.files, *inv.dirs)} | files | set(roots)
    kept = []
    for found, real in zip(out, realpaths([x.leads_to for x in out])):
        if real is not None and real != found.leads_to:
            if inside(real) and real in listed:  # ends at data the listing holds
                continue
            found = dataclasses.replace(found, leads_to=real)
        kept.append(found)
    return kept
