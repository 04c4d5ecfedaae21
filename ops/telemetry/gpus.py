"""GPU telemetry: NVML locally (pynvml), one nvidia-smi script per refresh remotely.

"No GPU", "no driver" and "no nvidia-smi" are normal states: the snapshot says
available=False with a reason. Values the driver reports as [N/A],
[Not Supported] or an error are None; a lost GPU is listed with lost=True.
What nvidia-smi and ps print on a node goes through ops.nodenum: a reading that is
no number of its field (`²`, 1e308, NaN) is None and named in the GPU's error.
"""

from __future__ import annotations

import re
import shlex
import threading
import time
import xml.etree.ElementTree as ET

import psutil
import pynvml

from ops import nodenum
from ops.hosts.base import Host
from ops.telemetry.snapshots import Gpu, GpuProcess, GpuSnapshot, MigInstance

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


# -- local: NVML ------------------------------------------------------------------
class NvmlSession:
    """One NVML initialisation with cached device handles and static fields.

    nvmlInit runs once (per session; the process shares `shared_session()`);
    each refresh reads every needed field once per device. A failed init is
    retried at most every `retry_s` seconds (a driver may be loaded later).
    """

    def __init__(self, retry_s: float = 30.0):
        self.retry_s = retry_s
        self._lock = threading.Lock()
        self._ready = False
        self._reason: str | None = None
        self._failed_at = 0.0
        self._handles: list = []
        self._static: dict[int, tuple[str | None, str | None]] = {}
        self._gpm = _MigUtilisation()

    def _init(self) -> str | None:
        """Initialise NVML if needed; the reason GPUs are unavailable, or None."""
        if self._ready:
            return None
        if self._reason is not None and time.monotonic() - self._failed_at < self.retry_s:
            return self._reason
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as e:
            self._reason = _nvml_unavailable_reason(e)
            self._failed_at = time.monotonic()
            return self._reason
        self._ready = True
        self._reason = None
        self._handles = [None] * count
        return None

    def read(self) -> GpuSnapshot:
        with self._lock:
            reason = self._init()
            if reason is not None:
                return GpuSnapshot(ts=time.time(), available=False, reason=reason, source="nvml")
            if not self._handles:
                return GpuSnapshot(ts=time.time(), available=False, reason="no NVIDIA GPUs found", source="nvml")
            gpus, procs = [], []
            for i in range(len(self._handles)):
                gpu, dev_procs = self._read_device(i)
                gpus.append(gpu)
                procs.extend(dev_procs)
            _fill_commands(procs)
            return GpuSnapshot(ts=time.time(), available=True, gpus=gpus, processes=procs, source="nvml")

    def _read_device(self, i: int) -> tuple[Gpu, list[GpuProcess]]:
        gpu = Gpu(index=i)
        errors: list[str] = []
        try:
            if self._handles[i] is None:
                self._handles[i] = pynvml.nvmlDeviceGetHandleByIndex(i)
            h = self._handles[i]
            if i not in self._static:
                self._static[i] = (_text(pynvml.nvmlDeviceGetName(h)), _text(pynvml.nvmlDeviceGetUUID(h)))
            gpu.name, gpu.uuid = self._static[i]

            def field(fn, *args):
                try:
                    return fn(h, *args)
                except pynvml.NVMLError_GpuIsLost:
                    raise
                except pynvml.NVMLError_NotSupported:
                    return None
                except pynvml.NVMLError as e:
                    errors.append(f"{fn.__name__.removeprefix('nvmlDeviceGet')}: {e}")
                    return None

            util = field(pynvml.nvmlDeviceGetUtilizationRates)
            mem = field(pynvml.nvmlDeviceGetMemoryInfo)
            temp = field(pynvml.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU)
            power = field(pynvml.nvmlDeviceGetPowerUsage)
            limit = field(pynvml.nvmlDeviceGetEnforcedPowerLimit)
            clock = field(pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM)
            running = field(pynvml.nvmlDeviceGetComputeRunningProcesses) or []
            mig = self._read_mig(i, h, errors) if _mig_enabled(h) else None
        except pynvml.NVMLError_GpuIsLost:
            self._handles[i] = None
            return Gpu(index=i, name=gpu.name, uuid=gpu.uuid, lost=True, error="GPU is lost"), []
        except pynvml.NVMLError as e:  # handle, name or uuid unreadable
            self._handles[i] = None
            return Gpu(index=i, error=str(e)), []
        # In MIG mode the GPU's utilisation is not per instance (NVML says NotSupported, or an aggregate): not shown.
        gpu.util_pct = None if util is None or mig is not None else float(util.gpu)
        gpu.mig = mig
        if mem is not None:
            gpu.mem_used_mib = mem.used / 2**20
            gpu.mem_total_mib = mem.total / 2**20
        gpu.temp_c = None if temp is None else float(temp)
        gpu.power_w = None if power is None else power / 1000.0
        gpu.power_limit_w = None if limit is None else limit / 1000.0
        gpu.sm_clock_mhz = None if clock is None else float(clock)
        gpu.error = "; ".join(errors) or None
        procs = [
            GpuProcess(
                pid=int(p.pid),
                gpu_index=i,
                gpu_uuid=gpu.uuid,
                mem_mib=None if getattr(p, "usedGpuMemory", None) is None else p.usedGpuMemory / 2**20,
            )
            for p in running
        ]
        return gpu, procs


    def _read_mig(self, i: int, h, errors: list[str]) -> list[MigInstance]:
        """Every MIG device of GPU i: name, ids and memory from its own handle, utilisation from GPM."""
        out: list[MigInstance] = []
        try:
            slots = pynvml.nvmlDeviceGetMaxMigDeviceCount(h)
        except pynvml.NVMLError as e:
            errors.append(f"MigDeviceCount: {e}")
            return out
        for j in range(slots):
            try:
                mh = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            except pynvml.NVMLError_NotFound:
                continue  # an empty slot
            except pynvml.NVMLError as e:
                errors.append(f"MIG device {j}: {e}")
                continue
            inst = MigInstance(index=j)
            for attr, fn in (("name", pynvml.nvmlDeviceGetName), ("uuid", pynvml.nvmlDeviceGetUUID),
                             ("gpu_instance", pynvml.nvmlDeviceGetGpuInstanceId),
                             ("compute_instance", pynvml.nvmlDeviceGetComputeInstanceId)):
                try:
                    v = fn(mh)
                    setattr(inst, attr, _text(v) if attr in ("name", "uuid") else int(v))
                except pynvml.NVMLError:
                    pass
            try:
                mem = pynvml.nvmlDeviceGetMemoryInfo(mh)
                inst.mem_used_mib, inst.mem_total_mib = mem.used / 2**20, mem.total / 2**20
            except pynvml.NVMLError as e:
                errors.append(f"MIG device {j} memory: {e}")
            out.append(inst)
        self._gpm.fill(i, h, out)
        return out


def _mig_enabled(h) -> bool:
    """Whether the GPU runs in MIG mode (GPUs without MIG answer NotSupported)."""
    try:
        return pynvml.nvmlDeviceGetMigMode(h)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
    except pynvml.NVMLError:
        return False


class _MigUtilisation:
    """Per-MIG-instance utilisation from NVML's GPM (Hopper and later): the graphics-engine activity
    between this refresh's sample of each GPU instance and the previous one (None on the first)."""

    def __init__(self):
        self._prev: dict[tuple[int, int], object] = {}
        self._unsupported: set[int] = set()

    def fill(self, i: int, h, instances: list[MigInstance]) -> None:
        if i in self._unsupported:
            return
        try:
            if not pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
                self._unsupported.add(i)
                return
        except pynvml.NVMLError:
            self._unsupported.add(i)
            return
        for inst in instances:
            if inst.gpu_instance is None:
                continue
            key = (i, inst.gpu_instance)
            try:
                sample = pynvml.nvmlGpmSampleAlloc()
            except pynvml.NVMLError:
                continue
            try:
                pynvml.nvmlGpmMigSampleGet(h, inst.gpu_instance, sample)
            except pynvml.NVMLError:
                pynvml.nvmlGpmSampleFree(sample)
                continue
            prev = self._prev.pop(key, None)
            self._prev[key] = sample
            if prev is None:
                continue
            try:
                inst.util_pct = _gpm_graphics_util(prev, sample)
            except pynvml.NVMLError:
                pass
            finally:
                pynvml.nvmlGpmSampleFree(prev)
        live = {(i, m.gpu_instance) for m in instances}
        for key in [k for k in self._prev if k[0] == i and k not in live]:   # instances destroyed since
            pynvml.nvmlGpmSampleFree(self._prev.pop(key))


def _gpm_graphics_util(first, second) -> float | None:
    """NVML_GPM_METRIC_GRAPHICS_UTIL (percent) between two GPM samples."""
    req = pynvml.c_nvmlGpmMetricsGet_t()
    req.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    req.numMetrics = 1
    req.sample1 = first
    req.sample2 = second
    req.metrics[0].metricId = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
    got = pynvml.nvmlGpmMetricsGet(req).metrics[0]
    return float(got.value) if got.nvmlReturn == pynvml.NVML_SUCCESS else None


def _nvml_unavailable_reason(e: Exception) -> str:
    if isinstance(e, pynvml.NVMLError_LibraryNotFound):
        return "NVML library not found (no NVIDIA driver installed)"
    if isinstance(e, pynvml.NVMLError_DriverNotLoaded):
        return "NVIDIA driver not loaded"
    if isinstance(e, pynvml.NVMLError_NoPermission):
        return "no permission to access the NVIDIA devices"
    return f"NVML unavailable: {e}"


def _text(v) -> str | None:
    if v is None:
        return None
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _fill_commands(procs: list[GpuProcess]) -> None:
    cache: dict[int, str] = {}
    for p in procs:
        if p.pid not in cache:
            try:
                proc = psutil.Process(p.pid)
                cache[p.pid] = " ".join(proc.cmdline()) or proc.name()
            except (psutil.Error, OSError):
                cache[p.pid] = ""
        p.command = cache[p.pid]


_SHARED = NvmlSession()


def shared_session() -> NvmlSession:
    """The process-wide NVML session (nvmlInit once per process)."""
    return _SHARED


# -- remote: nvidia-smi ----------------------------------------------------------------
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
        tail = text.strip().splitlines()
        return [], f"nvidia-smi reported no GPUs{': ' + tail[-1] if tail else ''}"
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
            current = head[0]
            sections[current] = (nodenum.EXIT_STATUS.get(head[1]) if len(head) > 1 else None, [])
        elif current is not None:
            sections[current][1].append(line)
    if "missing" in sections or rc == 127 or "command not found" in stderr:
        return GpuSnapshot(ts=now, available=False, reason="nvidia-smi not found on the node", source="nvidia-smi")
    if "gpu" not in sections:
        detail = (stderr.strip().splitlines() or [f"exit status {rc}"])[-1]
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
    """One command over the host's transport; raises HostError/HostTimeout when the node fails."""
    res = host.run_script(gpu_query_script(nvidia_smi), timeout=timeout)
    return parse_gpu_script_output(res.returncode, res.text, res.stderr.decode(errors="replace"))
