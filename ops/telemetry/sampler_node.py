"""The node side of the telemetry sampler: a standalone stdlib script (runs on the node; on `local` too).

nodedeck never installs it: ops.telemetry.sampler streams this file's source into
`python3 -c BOOT` over an exec channel of the node's transport (on `local`, into
nodedeck's own Python in a subprocess). Only the standard library of Python 3.7 or
newer is used, plus NVML through nvidia-ml-py where the node's Python imports it;
where it does not, the GPUs come from the nvidia-smi script the client sends. Do
not import anything from nodedeck here.

Protocol (one line each way, JSON out):
  in, first line: config {"paths": [...], "gpu_script": "...", "nvidia_smi": "...", "nvml": bool}
  out, first line: {"hello": 1, "pid": N, "nvml": bool, "nvml_reason": str|null}
  in: "g" | "h" | "gh"       -> one sample of the GPUs and/or the host
  in: "i SECONDS PARTS"      -> from now on a sample every SECONDS (0 stops)
  out: {"seq": N, "t": unix time, "gpu": {...}?, "host": {...}?}
The gpu part is NVML's {"source": "nvml", "gpus": [...], "processes": [...]} (with "reason" when NVML
cannot answer and there is no nvidia-smi either), or the script's {"source": "nvidia-smi", "rc", "out", "err"}.
End of stdin (the channel closing) ends the script.
"""
import json
import os
import select
import shutil
import subprocess
import sys
import time


# -- host, from /proc and statvfs (the same sources as the one-shot script) -----------------------
def _read(path):
    with open(path) as f:
        return f.read()


def host_sample(paths):
    """Raw host counters; the client derives CPU % and fill rates from consecutive samples."""
    out = {"stat": None, "load": None, "mem": {}, "nproc": None, "disks": [], "disk_errors": []}
    try:
        first = _read("/proc/stat").split("\n", 1)[0]
        if first.startswith("cpu "):
            out["stat"] = [int(v) for v in first.split()[1:]]
    except (OSError, ValueError):
        pass
    try:
        out["load"] = [float(v) for v in _read("/proc/loadavg").split()[:3]]
    except (OSError, ValueError):
        pass
    try:
        for line in _read("/proc/meminfo").splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable", "MemFree", "Buffers", "Cached"):
                parts = rest.split()
                if parts and parts[0].isdigit():
                    out["mem"][key] = int(parts[0]) * 1024
    except OSError:
        pass
    try:
        out["nproc"] = os.sysconf("SC_NPROCESSORS_ONLN")
    except (OSError, ValueError):
        pass
    for p in paths:
        try:
            st = os.statvfs(os.path.expanduser(p))
        except OSError as e:
            out["disk_errors"].append("%s: %s" % (p, e.strerror or e))
            continue
        # as `df -P -B1`: size, used = size - free blocks, available to non-root users
        total = st.f_blocks * st.f_frsize
        out["disks"].append([p, total, total - st.f_bfree * st.f_frsize, st.f_bavail * st.f_frsize])
    return out


# -- GPUs: NVML in-process, else the one-shot nvidia-smi script --------------------------------------
NVML_RETRY_S = 30.0
"""An NVML that could not start (no driver yet, no permission) is asked again this rarely."""
_UNAVAILABLE = (("NVMLError_LibraryNotFound", "NVML library not found (no NVIDIA driver installed)"),
                ("NVMLError_DriverNotLoaded", "NVIDIA driver not loaded"),
                ("NVMLError_NoPermission", "no permission to access the NVIDIA devices"))


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            args = f.read().rstrip(b"\0").split(b"\0")
        text = " ".join(a.decode(errors="replace") for a in args if a)
        if text:
            return text
        return _read("/proc/%d/comm" % pid).strip()
    except OSError:
        return ""


class Nvml:
    """NVML through nvidia-ml-py (`nv`), as nvitop's libnvml reads it: every reading goes through query(), which
    turns "not supported" into None, so a reading a device lacks is one value whatever the device.

    nvmlInit runs once (again after `retry_s` while it fails: a driver may be loaded later); handles, names and
    uuids are cached; a sample reads every field once per device. A GPU in MIG mode lists its instances (memory
    from their own handles, utilisation from GPM on Hopper and later) instead of its aggregate utilisation.
    """

    def __init__(self, nv, retry_s=NVML_RETRY_S):
        self.nv = nv
        self.retry_s = retry_s
        self.handles = None
        self.static = {}
        self.reason = None
        """Why NVML cannot answer (None while it can)."""
        self.failed_at = None
        self.gpm_prev = {}  # (gpu, gpu instance) -> its GPM sample of the previous GPU sample
        self.no_gpm = set()  # GPUs (or a binding) without GPM: asked once

    def ready(self):
        """Whether NVML answers, initialising it when it is not (at most every retry_s); else `reason` says why."""
        if self.handles is not None:
            return True
        if self.failed_at is not None and time.monotonic() - self.failed_at < self.retry_s:
            return False
        try:
            self.nv.nvmlInit()
            self.handles = [None] * self.nv.nvmlDeviceGetCount()
        except self.nv.NVMLError as e:
            self.reason, self.failed_at = _unavailable(self.nv, e), time.monotonic()
            return False
        self.reason = None
        return True

    def query(self, fn, *args, errors=None):
        """fn(*args), or None where the device does not support it; any other NVML error is None too, named in
        `errors` when given. A lost GPU raises NVMLError_GpuIsLost."""
        try:
            return fn(*args)
        except self.nv.NVMLError_GpuIsLost:
            raise
        except self.nv.NVMLError_NotSupported:
            return None
        except self.nv.NVMLError as e:
            if errors is not None:
                errors.append("%s: %s" % (fn.__name__.replace("nvmlDeviceGet", "", 1), e))
            return None

    def sample(self):
        """The GPUs and their processes, or None while NVML cannot answer."""
        if not self.ready():
            return None
        gpus, procs = [], []
        for i in range(len(self.handles)):
            gpu, running = self.device(i)
            gpus.append(gpu)
            for p in running:
                used = getattr(p, "usedGpuMemory", None)
                procs.append({"pid": int(p.pid), "gpu_index": i, "gpu_uuid": gpu.get("uuid"),
                              "mem_mib": None if used is None else used / 2**20})
        commands = {}
        for p in procs:
            if p["pid"] not in commands:
                commands[p["pid"]] = _cmdline(p["pid"])
            p["command"] = commands[p["pid"]]
        return {"source": "nvml", "gpus": gpus, "processes": procs}

    def device(self, i):
        """GPU i's fields, and the processes running on it."""
        nv, errors = self.nv, []
        name = uuid = None
        try:
            if self.handles[i] is None:
                self.handles[i] = nv.nvmlDeviceGetHandleByIndex(i)
            h = self.handles[i]
            if i not in self.static:
                self.static[i] = (_text(nv.nvmlDeviceGetName(h)), _text(nv.nvmlDeviceGetUUID(h)))
            name, uuid = self.static[i]
            util = self.query(nv.nvmlDeviceGetUtilizationRates, h, errors=errors)
            mem = self.query(nv.nvmlDeviceGetMemoryInfo, h, errors=errors)
            temp = self.query(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU, errors=errors)
            power = self.query(nv.nvmlDeviceGetPowerUsage, h, errors=errors)
            limit = self.query(nv.nvmlDeviceGetEnforcedPowerLimit, h, errors=errors)
            clock = self.query(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM, errors=errors)
            running = self.query(nv.nvmlDeviceGetComputeRunningProcesses, h, errors=errors) or []
            mig = self.mig(i, h, errors) if self.mig_mode(h) else None
        except nv.NVMLError_GpuIsLost:
            self.handles[i] = None
            return {"index": i, "name": name, "uuid": uuid, "lost": True, "error": "GPU is lost"}, []
        except nv.NVMLError as e:  # handle, name or uuid unreadable
            self.handles[i] = None
            return {"index": i, "error": str(e)}, []
        return {
            "index": i, "name": name, "uuid": uuid,
            # in MIG mode the GPU's utilisation is not per instance (NotSupported, or an aggregate): not shown
            "util_pct": None if util is None or mig is not None else float(util.gpu),
            "mem_used_mib": None if mem is None else mem.used / 2**20,
            "mem_total_mib": None if mem is None else mem.total / 2**20,
            "temp_c": None if temp is None else float(temp),
            "power_w": None if power is None else power / 1000.0,
            "power_limit_w": None if limit is None else limit / 1000.0,
            "sm_clock_mhz": None if clock is None else float(clock),
            "mig": mig,
            "error": "; ".join(errors) or None,
        }, running

    def mig_mode(self, h):
        """Whether the GPU runs in MIG mode (a GPU, or a binding, without MIG does not)."""
        get_mode = getattr(self.nv, "nvmlDeviceGetMigMode", None)
        mode = None if get_mode is None else self.query(get_mode, h)  # (current, pending)
        return mode is not None and mode[0] == getattr(self.nv, "NVML_DEVICE_MIG_ENABLE", 1)

    def mig(self, i, h, errors):
        """Every MIG device of GPU i: name, ids and memory from its own handle, utilisation from GPM."""
        nv, out = self.nv, []
        empty_slot = getattr(nv, "NVMLError_NotFound", ())
        for j in range(self.query(nv.nvmlDeviceGetMaxMigDeviceCount, h, errors=errors) or 0):
            try:
                mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            except empty_slot:
                continue
            except nv.NVMLError as e:
                errors.append("MIG device %d: %s" % (j, e))
                continue
            inst = {"index": j, "name": _text(self.query(nv.nvmlDeviceGetName, mh)),
                    "uuid": _text(self.query(nv.nvmlDeviceGetUUID, mh)),
                    "gpu_instance": _int(self.query(nv.nvmlDeviceGetGpuInstanceId, mh)),
                    "compute_instance": _int(self.query(nv.nvmlDeviceGetComputeInstanceId, mh)), "util_pct": None}
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(mh)
                inst["mem_used_mib"], inst["mem_total_mib"] = mem.used / 2**20, mem.total / 2**20
            except nv.NVMLError as e:
                errors.append("MIG device %d memory: %s" % (j, e))
            out.append(inst)
        self.gpm(i, h, out)
        return out

    def gpm(self, i, h, instances):
        """Each instance's graphics-engine activity (percent, NVML GPM) between the previous sample of its GPU
        instance and this one; None on the first."""
        nv = self.nv
        if i in self.no_gpm:
            return
        try:
            if not nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
                self.no_gpm.add(i)
                return
        except (AttributeError, nv.NVMLError):  # a binding or a driver before GPM
            self.no_gpm.add(i)
            return
        for inst in instances:
            key = (i, inst["gpu_instance"])
            if key[1] is None:
                continue
            try:
                sample = nv.nvmlGpmSampleAlloc()
            except nv.NVMLError:
                continue
            try:
                nv.nvmlGpmMigSampleGet(h, key[1], sample)
            except nv.NVMLError:
                nv.nvmlGpmSampleFree(sample)
                continue
            prev = self.gpm_prev.pop(key, None)
            self.gpm_prev[key] = sample
            if prev is None:
                continue
            try:
                inst["util_pct"] = _gpm_graphics_util(nv, prev, sample)
            except nv.NVMLError:
                pass
            finally:
                nv.nvmlGpmSampleFree(prev)
        live = set((i, m["gpu_instance"]) for m in instances)
        for key in [k for k in self.gpm_prev if k[0] == i and k not in live]:  # instances destroyed since
            nv.nvmlGpmSampleFree(self.gpm_prev.pop(key))


def _gpm_graphics_util(nv, first, second):
    """NVML_GPM_METRIC_GRAPHICS_UTIL (percent) between two GPM samples, or None."""
    req = nv.c_nvmlGpmMetricsGet_t()
    req.version = nv.NVML_GPM_METRICS_GET_VERSION
    req.numMetrics = 1
    req.sample1, req.sample2 = first, second
    req.metrics[0].metricId = nv.NVML_GPM_METRIC_GRAPHICS_UTIL
    got = nv.nvmlGpmMetricsGet(req).metrics[0]
    return float(got.value) if got.nvmlReturn == nv.NVML_SUCCESS else None


def _unavailable(nv, e):
    """Why NVML cannot start, in words."""
    for name, words in _UNAVAILABLE:
        if isinstance(e, getattr(nv, name, ())):
            return words
    return "NVML unavailable: %s" % e


def _text(v):
    if v is None:
        return None
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _int(v):
    return None if v is None else int(v)


_SMI_MISSING = "@@nodedeck missing\n"


def smi_sample(script, nvidia_smi):
    """The one-shot nvidia-smi script's raw output; the client parses it like the fallback.

    Without nvidia-smi on the PATH the answer is the script's own "missing" mark,
    found without starting a shell.
    """
    if shutil.which(nvidia_smi) is None:
        return {"source": "nvidia-smi", "rc": 0, "out": _SMI_MISSING, "err": ""}
    p = subprocess.run(["bash", "-c", script], stdin=subprocess.DEVNULL, capture_output=True)
    return {"source": "nvidia-smi", "rc": p.returncode,
            "out": p.stdout.decode(errors="replace"), "err": p.stderr.decode(errors="replace")}


def gpu_sample(nvml, cfg):
    """NVML's reading; else the nvidia-smi script's output (a node without nvidia-ml-py, a binding that does not
    fit its driver); with neither, why NVML cannot answer."""
    if nvml is not None:
        try:
            got = nvml.sample()
        except Exception:  # an NVML binding without a call this driver needs: nvidia-smi answers
            got = None
        if got is not None:
            return got
    smi = smi_sample(cfg["gpu_script"], cfg.get("nvidia_smi", "nvidia-smi"))
    if smi["out"] == _SMI_MISSING and nvml is not None and nvml.reason:
        return {"source": "nvml", "reason": nvml.reason, "gpus": [], "processes": []}
    return smi


# -- the loop ------------------------------------------------------------------------------
class Lines:
    """Lines from fd 0 read with os.read (select() then sees exactly what is unread)."""

    def __init__(self):
        self.buf = b""
        self.eof = False

    def next(self, timeout):
        """A line (without newline), "" on timeout, None at end of input."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buf:
            if self.eof:
                return None
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([0], [], [], left)[0]:
                return ""
            chunk = os.read(0, 65536)
            if not chunk:
                self.eof = True
                if not self.buf:
                    return None
                self.buf += b"\n"
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode(errors="replace").strip() or ""


def main():
    lines = Lines()
    first = lines.next(None)
    if not first:
        return
    cfg = json.loads(first)
    nvml, reason = None, None
    if cfg.get("nvml"):
        try:
            import pynvml  # lazy: the node's python3 may lack nvidia-ml-py (ImportError: no NVML, said below)

            nvml = Nvml(pynvml)
            nvml.ready()
            reason = nvml.reason
        except ImportError:
            reason = "nvidia-ml-py not importable on the node"
        except Exception as e:  # a binding that breaks on this driver: nvidia-smi answers
            nvml, reason = None, "NVML unavailable: %s" % e
    out = sys.stdout
    out.write(json.dumps({"hello": 1, "pid": os.getpid(), "nvml": reason is None and nvml is not None,
                          "nvml_reason": reason}) + "\n")
    out.flush()
    seq = 0
    interval, parts, next_at = 0.0, "", None

    def emit(what):
        nonlocal seq
        seq += 1
        sample = {"seq": seq, "t": time.time()}
        if "g" in what:
            sample["gpu"] = gpu_sample(nvml, cfg)
        if "h" in what:
            sample["host"] = host_sample(cfg.get("paths", []))
        out.write(json.dumps(sample, separators=(",", ":")) + "\n")
        out.flush()

    while True:
        wait = None if next_at is None else max(0.0, next_at - time.monotonic())
        line = lines.next(wait)
        if line is None or line == "q":
            return
        if line.startswith("i "):
            fields = line.split()
            interval = float(fields[1])
            parts = fields[2] if len(fields) > 2 else "gh"
            next_at = time.monotonic() if interval > 0 else None
        elif line:
            emit(line)
        if next_at is not None and time.monotonic() >= next_at:
            emit(parts)
            next_at += interval
            if next_at < time.monotonic():  # fell behind (slow NVML, suspended): do not burst
                next_at = time.monotonic() + interval


if __name__ == "__main__":
    try:
        main()
    except (BrokenPipeError, KeyboardInterrupt):
        pass
