"""The node side of the telemetry sampler: a standalone stdlib script (runs on the node).

nodedeck never installs it: ops.telemetry.sampler streams this file's source into
`python3 -c BOOT` over an exec channel of the existing SSH transport. Only the
standard library is used, plus NVML through nvidia-ml-py when the node's Python
can import it. Do not import anything from nodedeck here.

Protocol (one line each way, JSON out):
  in, first line: config {"paths": [...], "gpu_script": "...", "nvml": bool}
  out, first line: {"hello": 1, "pid": N, "nvml": bool, "nvml_reason": str|null}
  in: "g" | "h" | "gh"       -> one sample of the GPUs and/or the host
  in: "i SECONDS PARTS"      -> from now on a sample every SECONDS (0 stops)
  out: {"seq": N, "t": unix time, "gpu": {...}?, "host": {...}?}
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
    """NVML initialised once; static fields cached; every field read once per sample."""

    def __init__(self):
        import pynvml  # lazy: the node's python3 may lack nvidia-ml-py (ImportError: no NVML, the caller says so)

        self.nv = pynvml
        pynvml.nvmlInit()
        self.handles = [None] * pynvml.nvmlDeviceGetCount()
        self.static = {}

    def mig_on(self):
        """Whether any GPU is in MIG mode (then nvidia-smi, which reports the instances, answers)."""
        get_mode = getattr(self.nv, "nvmlDeviceGetMigMode", None)
        if get_mode is None:
            return False
        for i in range(len(self.handles)):
            try:
                if self.handles[i] is None:
                    self.handles[i] = self.nv.nvmlDeviceGetHandleByIndex(i)
                if get_mode(self.handles[i])[0] == 1:  # (current, pending); 1 = NVML_DEVICE_MIG_ENABLE
                    return True
            except self.nv.NVMLError:
                continue
        return False

    def sample(self):
        """The GPUs read in-process, or None when a GPU is in MIG mode."""
        if self.mig_on():
            return None
        nv = self.nv
        gpus, procs = [], []
        for i in range(len(self.handles)):
            gpu = {"index": i}
            errors = []
            try:
                if self.handles[i] is None:
                    self.handles[i] = nv.nvmlDeviceGetHandleByIndex(i)
                h = self.handles[i]
                if i not in self.static:
                    self.static[i] = (_text(nv.nvmlDeviceGetName(h)), _text(nv.nvmlDeviceGetUUID(h)))
                gpu["name"], gpu["uuid"] = self.static[i]

                def field(fn, *args):
                    try:
                        return fn(h, *args)
                    except nv.NVMLError_GpuIsLost:
                        raise
                    except nv.NVMLError_NotSupported:
                        return None
                    except nv.NVMLError as e:
                        errors.append("%s: %s" % (fn.__name__.replace("nvmlDeviceGet", "", 1), e))
                        return None

                util = field(nv.nvmlDeviceGetUtilizationRates)
                mem = field(nv.nvmlDeviceGetMemoryInfo)
                temp = field(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
                power = field(nv.nvmlDeviceGetPowerUsage)
                limit = field(nv.nvmlDeviceGetEnforcedPowerLimit)
                clock = field(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM)
                running = field(nv.nvmlDeviceGetComputeRunningProcesses) or []
            except nv.NVMLError_GpuIsLost:
                self.handles[i] = None
                gpus.append({"index": i, "name": gpu.get("name"), "uuid": gpu.get("uuid"), "lost": True,
                             "error": "GPU is lost"})
                continue
            except nv.NVMLError as e:
                self.handles[i] = None
                gpus.append({"index": i, "error": str(e)})
                continue
            gpu["util_pct"] = None if util is None else float(util.gpu)
            if mem is not None:
                gpu["mem_used_mib"] = mem.used / 2**20
                gpu["mem_total_mib"] = mem.total / 2**20
            gpu["temp_c"] = None if temp is None else float(temp)
            gpu["power_w"] = None if power is None else power / 1000.0
            gpu["power_limit_w"] = None if limit is None else limit / 1000.0
            gpu["sm_clock_mhz"] = None if clock is None else float(clock)
            gpu["error"] = "; ".join(errors) or None
            gpus.append(gpu)
            for p in running:
                used = getattr(p, "usedGpuMemory", None)
                procs.append({"pid": int(p.pid), "gpu_index": i, "gpu_uuid": gpu["uuid"],
                              "mem_mib": None if used is None else used / 2**20})
        commands = {}
        for p in procs:
            if p["pid"] not in commands:
                commands[p["pid"]] = _cmdline(p["pid"])
            p["command"] = commands[p["pid"]]
        return {"source": "nvml", "gpus": gpus, "processes": procs}


def _text(v):
    if v is None:
        return None
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def smi_sample(script, nvidia_smi):
    """The one-shot nvidia-smi script's raw output; the client parses it like the fallback.

    Without nvidia-smi on the PATH the answer is the script's own "missing" mark,
    found without starting a shell.
    """
    if shutil.which(nvidia_smi) is None:
        return {"source": "nvidia-smi", "rc": 0, "out": "@@nodedeck missing\n", "err": ""}
    p = subprocess.run(["bash", "-c", script], stdin=subprocess.DEVNULL, capture_output=True)
    return {"source": "nvidia-smi", "rc": p.returncode,
            "out": p.stdout.decode(errors="replace"), "err": p.stderr.decode(errors="replace")}


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
            nvml = Nvml()
        except ImportError:
            reason = "nvidia-ml-py not importable on the node"
        except Exception as e:  # pynvml.NVMLError and friends: no driver, no permission
            reason = "NVML unavailable: %s" % e
    out = sys.stdout
    out.write(json.dumps({"hello": 1, "pid": os.getpid(), "nvml": nvml is not None, "nvml_reason": reason}) + "\n")
    out.flush()
    seq = 0
    interval, parts, next_at = 0.0, "", None

    def emit(what):
        nonlocal seq
        seq += 1
        sample = {"seq": seq, "t": time.time()}
        if "g" in what:
            gpu = None
            if nvml is not None:
                try:
                    gpu = nvml.sample()
                except Exception:  # an NVML binding without a call this driver needs: nvidia-smi answers
                    gpu = None
            sample["gpu"] = gpu or smi_sample(cfg["gpu_script"], cfg.get("nvidia_smi", "nvidia-smi"))
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
