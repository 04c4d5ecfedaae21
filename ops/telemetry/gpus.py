"""GPU telemetry where NVML is not at hand: one nvidia-smi script and its parsers.

The node sampler (ops/telemetry/sampler_node.py) reads NVML on every node, `local` included. This script
answers in two places: inside the sampler where the node's Python cannot import nvidia-ml-py (it relays the
output), and over the transport, one command per refresh, where the sampler cannot run or answer (no python3 on
the node, one too old, a sampler starting slowly or waiting out its backoff); plan check counts a node's GPUs
with it too. Both outputs are parsed here.

"No GPU", "no driver" and "no nvidia-smi" are normal states: the snapshot says
available=False with a reason. Values the driver reports as [N/A],
[Not Supported] or an error are None; a lost GPU is listed with lost=True.
What nvidia-smi and ps print on a node goes through ops.nodenum: a reading that is
no number of its field (`²`, 1e308, NaN) is None and named in the GPU's error.
"""

from __future__ import annotations

import re
import shlex
import time
import xml.etree.ElementTree as ET

from ops import nodenum
from ops.hosts.base import Host
from ops.telemetry.snapshots import Gpu, GpuProcess, GpuSnapshot, MigInstance
from ops.textsafe import last_line

GPU_FIELDS = (
    "index,uuid,name,utilization.gpu,memory.used,memory.total,"
    "temperature.gpu,power.draw,power.limit,clocks.sm"
)
MIG_FIELD = "mig.mode.current"
"""Queried after GPU_FIELDS when the driver knows it (R450+); a GPU in MIG mode says `Enabled`."""
APP_FIELDS = "gpu_uuid,pid,used_memory,process_name"
_READINGS = (nodenum.GPU_PERCENT, nodenum.MIB, nodenum.MIB, nodenum.TEMP_C, nodenum.WATTS, nodenum.WATTS,
             nodenum.MHZ)
"""The range of each reading of GPU_FIELDS after the index, uuid and name."""
_MARK = "@@nodedeck"


# -- the nvidia-smi script ----------------------------------------------------------------
def gpu_query_script(nvidia_smi: str = "nvidia-smi") -> str:
    """A bash script printing both nvidia-smi queries and full process commands, marked."""
    smi = shlex.quote(nvidia_smi)
    return f"""\
if ! command -v {smi} >/dev/null 2>&1; then echo '{_MARK} missing'; exit 0; fi
out=$({smi} --query-gpu={GPU_FIELDS},{MIG_FIELD} --format=csv,noheader,nounits 2>&1); rc=$?
case "$out" in *"{MIG_FIELD}"*) out=$({smi} --query-gpu={GPU_FIELDS} --format=csv,noheader,nounits 2>&1); rc=$?;; esac
printf '{_MARK} gpu %s\\n%s\\n' "$rc" "$out"
case "$rc" in 6|9|12) exit 0;; esac
apps=$({smi} --query-compute-apps={APP_FIELDS} --format=csv,noheader,nounits 2>&1); rc=$?
printf '{_MARK} apps %s\\n%s\\n' "$rc" "$apps"
pids=$(printf '%s\\n' "$apps" | awk -F', *' '$2 ~ /^[0-9]+$/ {{print $2}}' | sort -un | paste -sd, -)
echo '{_MARK} ps'
[ -n "$pids" ] && ps -ww -o pid=,args= -p "$pids"
if printf '%s\\n' "$out" | grep -q ', Enabled$'; then echo '{_MARK} mig'; {smi} -q -x 2>/dev/null; fi
exit 0
"""


_LOST_RE = re.compile(r"Unable to determine the device handle for GPU\s*([0-9A-Fa-f:.]+)\s*:\s*(.*)", re.I)
_DRIVER_FAIL = "couldn't communicate with the NVIDIA driver"


def _value(v: str, field: nodenum.Real = nodenum.MIB) -> tuple[float | None, str | None]:
    """A numeric nvidia-smi CSV value, or (None, the bracketed text) for [N/A] and friends, or (None,
    `invalid <value>`) for one no GPU gives (NaN, infinite, negative, out of the field's range, `²`)."""
    v = v.strip()
    if not v or v.startswith("["):
        return None, (v or None)
    try:
        return field.parse(v), None
    except nodenum.Invalid as e:
        return None, f"invalid {e.raw}"


def parse_gpu_csv(text: str) -> tuple[list[Gpu], str | None]:
    """Parse --query-gpu=GPU_FIELDS rows; returns (gpus, reason-if-unavailable)."""
    gpus: list[Gpu] = []
    lost_msgs: list[str] = []
    unread: list[int] = []   # positions in gpus of those whose index is no number
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        m = _LOST_RE.search(line)
        if m:
            lost_msgs.append(f"GPU {m.group(1)}: {m.group(2).strip().rstrip('.')}")
            continue
        if _DRIVER_FAIL in line:
            return [], "NVIDIA driver not reachable (nvidia-smi could not communicate with the driver)"
        if line.startswith("No devices were found"):
            return [], "no NVIDIA GPUs found"
        parts = [p.strip() for p in line.split(",")]
        if len(parts) not in (10, 11) or not parts[0][:1].isdigit():
            continue  # a warning or other chatter nvidia-smi mixes in
        mig_mode = parts.pop() if len(parts) == 11 else None
        idx, uuid, name = nodenum.GPU_INDEX.get(parts[0]), parts[1], parts[2]
        values: list[float | None] = []
        notes = [] if idx is not None else [str(nodenum.Invalid(nodenum.GPU_INDEX.name, parts[0]))]
        for label, field, v in zip(GPU_FIELDS.split(",")[3:], _READINGS, parts[3:]):
            num, note = _value(v, field)
            values.append(num)
            if note is not None and note not in ("[N/A]", "[Not Supported]"):
                notes.append(f"{label}: {note}")
        lost = any("lost" in n.lower() for n in notes) or "lost" in uuid.lower()
        if idx is None:
            unread.append(len(gpus))
        gpus.append(
            Gpu(
                index=-1 if idx is None else idx,   # an index the node gave as no number: the first free one below
                uuid=None if uuid.startswith("[") else uuid,
                name=None if name.startswith("[") else name,
                util_pct=values[0],
                mem_used_mib=values[1],
                mem_total_mib=values[2],
                temp_c=values[3],
                power_w=values[4],
                power_limit_w=values[5],
                sm_clock_mhz=values[6],
                lost=lost,
                error="GPU is lost" if lost else ("; ".join(notes) or None),
                mig=[] if mig_mode == "Enabled" else None,   # its instances come from `nvidia-smi -q -x`
            )
        )
        if mig_mode == "Enabled":
            gpus[-1].util_pct = None   # not per instance: never shown for a MIG GPU
    # A lost GPU has no row; NVML still counts it, so it holds the first missing index (as a GPU whose index
    # nvidia-smi printed as no number does).
    taken = {g.index for g in gpus}
    free = (i for i in range(len(gpus) + len(lost_msgs)) if i not in taken)
    for at in unread:
        gpus[at].index = next(free)
    for msg in lost_msgs:
        gpus.append(Gpu(index=next(free), lost=True, error=msg))
    gpus.sort(key=lambda g: g.index)
    if not gpus:
        return [], f"nvidia-smi reported no GPUs{': ' + line if (line := last_line(text)) else ''}"
    return gpus, None


def parse_mig_xml(text: str, gpus: list[Gpu]) -> str | None:
    """Fill each MIG GPU's instances (ids, memory) from `nvidia-smi -q -x`; the problem, or None.

    nvidia-smi has no per-instance utilisation: it stays None.
    """
    start = text.find("<?xml")
    try:
        root = ET.fromstring(text[start:] if start >= 0 else text)
    except ET.ParseError as e:
        return f"MIG instances unreadable (nvidia-smi -q -x: {e})"
    by_uuid = {g.uuid: g for g in gpus if g.uuid}
    for el in root.iter("gpu"):
        g = by_uuid.get((el.findtext("uuid") or "").strip())
        if g is None or g.mig is None:
            continue
        for pos, d in enumerate(el.iter("mig_device")):
            used, _ = _value((d.findtext("fb_memory_usage/used") or "").replace("MiB", ""))
            total, _ = _value((d.findtext("fb_memory_usage/total") or "").replace("MiB", ""))
            index = _int(d.findtext("index"))
            g.mig.append(MigInstance(
                index=pos if index is None else index, gpu_instance=_int(d.findtext("gpu_instance_id")),
                compute_instance=_int(d.findtext("compute_instance_id")),
                uuid=(d.findtext("uuid") or "").strip() or None, mem_used_mib=used, mem_total_mib=total))
    return None


def _int(v: str | None) -> int | None:
    return nodenum.INDEX.get(v) if v else None


def parse_apps_csv(text: str, gpus: list[Gpu]) -> list[GpuProcess]:
    """The processes' rows; a row whose pid is no pid (ops.nodenum) is chatter, not a process."""
    by_uuid = {g.uuid: g.index for g in gpus if g.uuid}
    procs = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",", 3)]
        pid = nodenum.PID.get(parts[1]) if len(parts) == 4 else None
        if pid is None:
            continue
        mem, _ = _value(parts[2])
        procs.append(
            GpuProcess(pid=pid, gpu_index=by_uuid.get(parts[0]), gpu_uuid=parts[0], mem_mib=mem, command=parts[3])
        )
    return procs


def parse_gpu_script_output(rc: int, stdout: str, stderr: str = "") -> GpuSnapshot:
    """Turn the output of gpu_query_script() into a snapshot."""
    now = time.time()
    sections: dict[str, tuple[int | None, list[str]]] = {}
    current = None
    for line in stdout.splitlines():
        if line.startswith(_MARK + " "):
            head = line[len(_MARK) + 1 :].split()
            current = head[0] if head else None   # a marker naming nothing: no section
            if current is not None:
                sections[current] = (nodenum.EXIT_STATUS.get(head[1]) if len(head) > 1 else None, [])
        elif current is not None:
            sections[current][1].append(line)
    if "missing" in sections or rc == 127 or "command not found" in stderr:
        return GpuSnapshot(ts=now, available=False, reason="nvidia-smi not found on the node", source="nvidia-smi")
    if "gpu" not in sections:
        detail = last_line(stderr) or f"exit status {rc}"
        return GpuSnapshot(ts=now, error=f"GPU query failed: {detail}", source="nvidia-smi")
    gpu_rc, gpu_lines = sections["gpu"]
    gpus, reason = parse_gpu_csv("\n".join(gpu_lines))
    if reason is not None:
        return GpuSnapshot(ts=now, available=False, reason=reason, source="nvidia-smi")
    apps = parse_apps_csv("\n".join(sections.get("apps", (0, []))[1]), gpus)
    commands = {}
    for line in sections.get("ps", (0, []))[1]:
        pid_text, _, args = line.strip().partition(" ")
        pid = nodenum.PID.get(pid_text)
        if pid is not None and args.strip():
            commands[pid] = args.strip()
    for p in apps:
        p.command = commands.get(p.pid, p.command)
    mig_error = parse_mig_xml("\n".join(sections["mig"][1]), gpus) if "mig" in sections else None
    if mig_error:
        for g in gpus:
            if g.mig is not None:
                g.error = "; ".join(x for x in (g.error, mig_error) if x)
    return GpuSnapshot(ts=now, available=True, gpus=gpus, processes=apps, source="nvidia-smi")


def read_remote_gpus(host: Host, *, timeout: float = 10.0, nvidia_smi: str = "nvidia-smi") -> GpuSnapshot:
    """The script run once over the host's transport; raises HostError/HostTimeout when the node fails."""
    res = host.run_script(gpu_query_script(nvidia_smi), timeout=timeout)
    return parse_gpu_script_output(res.returncode, res.text, res.stderr.decode(errors="replace"))
