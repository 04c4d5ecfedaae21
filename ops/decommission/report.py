"""PROGRESS.md: what the node was doing and what was preserved where, for the person who reads it later."""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING

from ops.decommission.classify import CLASSES
from ops.decommission.policy import Action
from ops.errors import HostError
from ops.units import human_bytes

if TYPE_CHECKING:
    from ops.decommission.results import Verdict
    from ops.decommission.wizard import Decommission

METRICS_TAIL = 64 << 10


def cell(text: object) -> str:
    """Text safe inside a Markdown table cell (pipes escaped, newlines shown as \\n)."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", "\\n").replace("`", "'")


def last_metrics(d: "Decommission") -> list[tuple[str, str]]:
    """(path, last line) of every metrics JSONL found: the local copy when verified, else the node's."""
    out = []
    for path, fs in sorted(d.files.items()):
        name = path.rsplit("/", 1)[-1].lower()
        if not (name.endswith(".jsonl") and "metrics" in name):
            continue
        e = fs.entry
        start = max(0, e.size - METRICS_TAIL)
        try:
            if fs.verified and fs.action == Action.DOWNLOAD:
                with d.tree.open_read(path) as fd:
                    data = os.pread(fd, e.size - start, start)
            elif d.node_down:
                out.append((path, f"(not preserved; node unreachable: {d.node_down})"))
                continue
            else:
                data = d.host.read_range(e.node_path, start)
        except (OSError, HostError) as err:
            out.append((path, f"(unreadable: {err})"))
            continue
        lines = [x for x in data.decode(errors="replace").splitlines() if x.strip()]
        out.append((path, lines[-1] if lines else "(empty)"))
    return out


def _metrics_line(line: str) -> str:
    try:
        obj = json.loads(line)
    except ValueError:
        return f"`{cell(line[:300])}`"
    if not isinstance(obj, dict):
        return f"`{cell(line[:300])}`"
    parts = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
             for k, v in obj.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)]
    return cell(", ".join(parts))


def progress_markdown(d: "Decommission", v: "Verdict") -> str:
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out = [f"# Node {d.node}: decommission notes", "",
           f"Written by nodedeck on {now} into `{cell(d.dest)}`.", "",
           f"**Verdict: {v.headline}**", ""]
    if v.missing:
        out += ["## Not preserved", "", "| path | reason |", "|---|---|"]
        out += [f"| {cell(m.path) or '-'} | {cell(m.reason)} |" for m in v.missing]
        out.append("")

    out += ["## Plan stages", ""]
    st = d.stage_states
    if st.rows:
        out += [f"Plan `{cell(st.plan)}`:", "", "| stage | state | detail | updated |", "|---|---|---|---|"]
        for r in st.rows:
            when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(r["updated_at"])) if r.get("updated_at") else ""
            out.append(f"| {cell(r['stage'])} | {cell(r['state'])} | {cell(r.get('detail') or '')} | {when} |")
    else:
        out.append(f"No plan stage states: {st.note or 'none recorded'}.")
    out.append("")

    out += ["## Last metrics", ""]
    metrics = last_metrics(d)
    out += [f"- `{cell(p)}`: {_metrics_line(line)}" for p, line in metrics] or ["No metrics JSONL files found."]
    out.append("")

    out += ["## What was preserved where", ""]
    out.append(f"Local copy: `{cell(d.dest / 'files')}` ({d.transfer_note or 'no transfer'}); "
               "`manifest.json` lists every file with its sha256 and source.")
    out.append("")
    out += ["| root on the node | kind | under files/ | status |", "|---|---|---|---|"]
    for root in d.listing.roots:
        out.append(f"| `{cell(root.path or root.given)}` | {root.origin} {root.kind} | {cell(root.label or '(top)')} "
                   f"| {cell(root.status)} |")
    out.append("")
    sel = d.selection()
    verified = {c: 0 for c in CLASSES}
    for fs in d.files.values():
        verified[fs.entry.cls] += fs.verified
    out += ["| class | files | size | policy | downloaded | in S3 | excluded | verified |",
            "|---|---|---|---|---|---|---|---|"]
    for row in sel.present:
        out.append(f"| {row.cls} | {row.files} | {human_bytes(row.bytes)} | {row.policy} | {row.download} | "
                   f"{row.in_s3} | {row.excluded} | {verified[row.cls]} |")
    out.append("")
    if v.excluded:
        out.append(f"Excluded by choice: {len(v.excluded)} files, "
                   f"{human_bytes(v.excluded_bytes)} (not preserved anywhere).")
        out.append("")

    out += ["## S3", ""]
    if d.s3_loc is None:
        out.append("No S3 prefix given.")
    else:
        c = v.counts
        out.append(f"Prefix `{cell(d.s3_loc.url)}`: {d.s3_object_count} objects listed. "
                   f"Verified by MD5: {c.verified_s3_md5}, by stored SHA-256: {c.verified_s3_sha256}. "
                   f"Size-only matches (multipart ETag, or encrypted without a SHA-256): "
                   f"{c.s3_size_only} ({c.s3_size_only_trusted} trusted with --trust-s3-size).")
        mism = [(fs, fs.s3) for fs in d.files.values()
                if fs.s3 is not None and fs.s3.status in ("md5-mismatch", "sha256-mismatch", "size-mismatch")]
        if mism:
            out.append("")
            out += [f"- `{cell(fs.entry.path)}`: {cell(m.status)} ({cell(m.detail)}), downloaded instead"
                    if fs.action == Action.DOWNLOAD else f"- `{cell(fs.entry.path)}`: {cell(m.status)}"
                    for fs, m in sorted(mism, key=lambda fm: fm[0].entry.path)]
    out.append("")

    out += ["## System", ""]
    if d.sysinfo is None:
        out.append("Not captured.")
    else:
        s = d.sysinfo.summary()
        gpus = "; ".join(f"{g.get('name')} ({g.get('memory')})" for g in s["gpus"]) or (s["gpu_note"] or "none")
        out += [f"- GPUs: {cell(gpus)}",
                f"- Driver: {s['driver'] or 'n/a'}; CUDA: {s['cuda'] or 'n/a'}; toolkit: {s['cuda_toolkit'] or 'n/a'}",
                f"- CPU: {cell(s['cpu'] or '?')} ({s['cpus'] or '?'} CPUs); RAM: "
                f"{human_bytes(s['ram_bytes']) if s['ram_bytes'] else '?'}",
                f"- OS: {cell(s['os'] or '?')}; kernel {cell(s['kernel'] or '?')}",
                f"- Python: {cell(s['python'] or 'not found')}; {s['packages'] if s['packages'] is not None else 'no'}"
                " packages in pip freeze",
                f"- tmux sessions: {cell(', '.join(s['tmux_sessions']) or 'none')}"]
        out += [f"- Disk `{cell(x['mount'])}`: {human_bytes(x['used'])} used of {human_bytes(x['size'])}"
                for x in s["disks"]]
        out += ["", "Full details: `system-info.txt` (and `system-info.json`)."]
    out.append("")
    if d.warnings:
        out += ["## Warnings", ""] + [f"- {cell(w)}" for w in d.warnings] + [""]
    return "\n".join(out)
