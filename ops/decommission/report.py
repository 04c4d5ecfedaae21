"""PROGRESS.md: what the node was doing and what was preserved where, for the person who reads it later."""

from __future__ import annotations

import time

from ops import hints, nodejson
from ops.decommission.classify import CLASSES
from ops.decommission.policy import Action
from ops.decommission.results import DecommissionResult
from ops.units import human_bytes


def cell(text: object) -> str:
    """Text safe inside a Markdown table cell (pipes escaped, newlines shown as \\n)."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", "\\n").replace("`", "'")


def _metrics_line(line: str) -> str:
    try:
        obj = nodejson.loads(line)
    except ValueError:
        return f"`{cell(line[:300])}`"
    if not isinstance(obj, dict):
        return f"`{cell(line[:300])}`"
    parts = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
             for k, v in obj.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)]
    return cell(", ".join(parts))


def progress_markdown(r: DecommissionResult) -> str:
    v = r.verdict
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(r.finished_at))
    out = [f"# Node {r.node}: decommission notes", "",
           f"Written by nodedeck on {now} into `{cell(r.dest)}`.", "",
           f"**Verdict: {v.headline}**", ""]
    if v.missing:
        out += ["## Not preserved", "", "| path | reason |", "|---|---|"]
        out += [f"| {cell(m.path) or '-'} | {cell(m.said)} |" for m in v.missing]
        out.append("")

    out += ["## Plan stages", ""]
    st = r.stage_states
    if st.rows:
        out += [f"Plan `{cell(st.plan)}`:", "", "| stage | state | detail | updated |", "|---|---|---|---|"]
        for stage in st.rows:
            when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(stage.updated_at)) if stage.updated_at else ""
            out.append(f"| {cell(stage.stage)} | {cell(stage.state)} | {cell(stage.detail or '')} | {when} |")
    else:
        out.append(f"No plan stage states: {st.note or 'none recorded'}.")
    out.append("")

    out += ["## Last metrics", ""]
    out += [f"- `{cell(m.path)}`: {_metrics_line(m.line)}" for m in r.metrics] or ["No metrics JSONL files found."]
    out.append("")

    out += ["## What was preserved where", ""]
    out.append(f"Local copy: `{cell(r.dest / 'files')}` ({r.transfer_note or 'no transfer'}); "
               "`manifest.json` lists every file with its sha256 and source.")
    out.append("")
    out += ["| root on the node | kind | under files/ | status |", "|---|---|---|---|"]
    for root in r.inventory.roots:
        out.append(f"| `{cell(root.path or root.given)}` | {root.origin} {root.kind} | {cell(root.label or '(top)')} "
                   f"| {cell(root.status)} |")
    out.append("")
    verified = {c: 0 for c in CLASSES}
    for f in r.files:
        verified[f.cls] += f.verified
    out += ["| class | files | size | policy | downloaded | in S3 | excluded | verified |",
            "|---|---|---|---|---|---|---|---|"]
    for row in r.selection.present:
        out.append(f"| {row.cls} | {row.files} | {human_bytes(row.bytes)} | {row.policy} | {row.download} | "
                   f"{row.in_s3} | {row.excluded} | {verified[row.cls]} |")
    out.append("")
    if v.by_choice:
        out.append(f"Excluded by choice: {len(v.by_choice)} files, "
                   f"{human_bytes(sum(x.size for x in v.by_choice))} (not preserved anywhere).")
        out.append("")
    if v.own_env:
        setup = hints.current().command("node", "setup", r.node)
        out.append(f"Left out: nodedeck's own environment on the node, {len(v.own_env)} files, "
                   f"{human_bytes(sum(x.size for x in v.own_env))} (`{setup}` makes it again; "
                   "`--include nodedeck_env` preserves it).")
        out.append("")

    out += ["## S3", ""]
    if r.s3_url is None:
        out.append("No S3 prefix given.")
    else:
        c = v.counts
        out.append(f"Prefix `{cell(r.s3_url)}`: {r.s3_objects} objects listed. "
                   f"Verified by MD5: {c.verified_s3_md5}, by stored SHA-256: {c.verified_s3_sha256}. "
                   f"Size-only matches (multipart ETag, or encrypted without a SHA-256): "
                   f"{c.s3_size_only} ({c.s3_size_only_trusted} trusted with --trust-s3-size).")
        mism = [(f, f.s3) for f in r.files
                if f.s3 is not None and f.s3.status in ("md5-mismatch", "sha256-mismatch", "size-mismatch")]
        if mism:
            out.append("")
            out += [f"- `{cell(f.path)}`: {cell(m.status)} ({cell(m.detail)}), downloaded instead"
                    if f.action == Action.DOWNLOAD else f"- `{cell(f.path)}`: {cell(m.status)}"
                    for f, m in mism]
    out.append("")

    out += ["## System", ""]
    s = r.sysinfo
    if s is None:
        out.append("Not captured.")
    else:
        gpus = "; ".join(f"{g.name} ({g.memory})" for g in s.gpus) or (s.gpu_note or "none")
        out += [f"- GPUs: {cell(gpus)}",
                f"- Driver: {s.driver or 'n/a'}; CUDA: {s.cuda or 'n/a'}; toolkit: {s.cuda_toolkit or 'n/a'}",
                f"- CPU: {cell(s.cpu or '?')} ({s.cpus or '?'} CPUs); RAM: "
                f"{human_bytes(s.ram_bytes) if s.ram_bytes else '?'}",
                f"- OS: {cell(s.os or '?')}; kernel {cell(s.kernel or '?')}",
                f"- Python: {cell(s.python or 'not found')}; {s.packages if s.packages is not None else 'no'}"
                " packages in pip freeze",
                f"- tmux sessions: {cell(', '.join(s.tmux_sessions) or 'none')}"]
        out += [f"- Disk `{cell(x.mount)}`: {human_bytes(x.used)} used of {human_bytes(x.size)}" for x in s.disks]
        out += ["", "Full details: `system-info.txt` (and `system-info.json`)."]
    out.append("")
    if r.warnings:
        out += ["## Warnings", ""] + [f"- {cell(w)}" for w in r.warnings] + [""]
    return "\n".join(out)
