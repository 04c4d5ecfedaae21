"""Host telemetry: CPU %, load, RAM and watched disks with fill rate and time to full.

On every node, `local` included, from the node sampler's reading of /proc/stat,
/proc/loadavg, /proc/meminfo, the online CPUs and statvfs per watched path
(raw_from_sample). Where the sampler cannot run or answer (no python3 on the
node, one too old, a start slower than the poll, a sampler waiting out its
backoff), from ONE script per refresh reading the same files and `df -P -B1` for
each path (parse_host_script_output), whose numbers make the same sample. CPU %
comes from the delta of consecutive /proc/stat samples, so the first is None.
"""

from __future__ import annotations

import math
import re
import shlex
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from ops import nodenum
from ops.errors import HostError
from ops.hosts.base import Host, shell_path
from ops.telemetry import sampled
from ops.telemetry.snapshots import DiskUsage, HostSnapshot
from ops.textsafe import last_line, printable
from ops.units import ESTIMATE, human_duration

_MARK = "@@nodedeck"


# -- disk fill rate ------------------------------------------------------------------
class DiskFillTracker:
    """Keeps recent (time, used) samples per path and projects time to full.

    The fill rate is the least-squares slope of used bytes over the samples of
    the last `window_s` seconds (at least `min_span_s` apart end to end), smoothed
    by an exponentially weighted moving average with time constant `smooth_s`, so a
    burst (a checkpoint written, then deleted) does not swing "full in" from days to hours.
    A disk warns when it would be full within `warn_time_to_full_s` or has less
    than `warn_free_pct` percent free.
    """

    def __init__(
        self,
        window_s: float = 900.0,
        min_span_s: float = 5.0,
        warn_time_to_full_s: float = 6 * 3600.0,
        warn_free_pct: float = 5.0,
        max_samples: int = 1024,
        smooth_s: float = 600.0,
    ):
        self.smooth_s = smooth_s
        self._rate: dict[str, tuple[float, float]] = {}
        """path -> (time, smoothed bytes/s) as last observed."""
        self.window_s = window_s
        self.min_span_s = min_span_s
        self.warn_time_to_full_s = warn_time_to_full_s
        self.warn_free_pct = warn_free_pct
        self._samples: dict[str, deque[tuple[float, int]]] = {}
        self._max = max_samples

    def observe(self, path: str, t: float, total: int, used: int, free: int) -> DiskUsage:
        samples = self._samples.setdefault(path, deque(maxlen=self._max))
        if samples and t <= samples[-1][0]:
            samples.clear()  # clock went backwards: start a fresh window
            self._rate.pop(path, None)
        samples.append((t, used))
        while samples and t - samples[0][0] > self.window_s:
            samples.popleft()
        rate = self._smoothed(path, t, self._slope(samples))
        ttf = free / rate if rate is not None and rate > 0 else None
        disk = DiskUsage(path, total, used, free, rate, ttf)
        if total and 100.0 * free / total < self.warn_free_pct:
            disk.warn, disk.warn_reason = True, f"only {100.0 * free / total:.1f}% free"
        elif ttf is not None and ttf < self.warn_time_to_full_s:
            disk.warn, disk.warn_reason = True, (f"full in {human_duration(ttf, ESTIMATE)} at the disk's fill rate "
                                                 "from all writers")
        return disk

    def _smoothed(self, path: str, t: float, slope: float | None) -> float | None:
        """EWMA of the slope over time: weight 1 - exp(-dt / smooth_s) for the newest slope."""
        if slope is None:
            return None
        prev = self._rate.get(path)
        if prev is None or self.smooth_s <= 0:
            rate = slope
        else:
            w = 1.0 - math.exp(-(t - prev[0]) / self.smooth_s)
            rate = prev[1] + w * (slope - prev[1])
        self._rate[path] = (t, rate)
        return rate

    def _slope(self, samples: deque[tuple[float, int]]) -> float | None:
        if len(samples) < 2 or samples[-1][0] - samples[0][0] < self.min_span_s:
            return None
        n = len(samples)
        mt = sum(t for t, _ in samples) / n
        mu = sum(u for _, u in samples) / n
        var = sum((t - mt) ** 2 for t, _ in samples)
        cov = sum((t - mt) * (u - mu) for t, u in samples)
        return cov / var if var > 0 else None


# -- samples ------------------------------------------------------------------------
@dataclass
class _Raw:
    cpu_times: tuple[int, int] | None  # (busy, total) clock ticks
    cpu_count: int | None
    load: tuple[float, float, float] | None
    ram_used: int | None
    ram_total: int | None
    disks: list[tuple[str, int, int, int]]  # path, total, used, free
    disk_errors: list[str]
    invalid: list[str] = field(default_factory=list)
    """What the node printed that is no number of its field (`invalid CPU count ²`): ops.nodenum."""


def host_query_script(paths: Sequence[str]) -> str:
    """One bash script printing /proc/stat, loadavg, meminfo, nproc and df per path."""
    lines = [
        f"echo '{_MARK} stat'; head -n 1 /proc/stat",
        f"echo '{_MARK} loadavg'; cat /proc/loadavg",
        f"echo '{_MARK} meminfo'; grep -E '^(MemTotal|MemAvailable|MemFree|Buffers|Cached):' /proc/meminfo",
        f"echo '{_MARK} nproc'; getconf _NPROCESSORS_ONLN",
    ]
    for p in paths:
        lines.append(f"echo {shlex.quote(f'{_MARK} df {p}')}; df -P -B1 -- {shell_path(p)} 2>&1")
    lines.append("exit 0")
    return "\n".join(lines) + "\n"


_DF_RE = re.compile(r"^(.*?\S)\s+([0-9]+)\s+([0-9]+)\s+([0-9]+)\s+([0-9]+)%\s+(.*)$", re.ASCII)
"""A `df -P` row. The filesystem ends at a non-space: each run of spaces is tried once, not from each of its
positions (quadratic in a row of spaces the node sent)."""


def parse_host_script_output(text: str, paths: Sequence[str]) -> _Raw:
    """The script's sections as the sampler's host part, then a _Raw; every number through ops.nodenum (what is
    none is left out, and named in `invalid`)."""
    sections: dict[str, list[str]] = {}
    cur = None
    for line in text.splitlines():
        if line.startswith(_MARK + " "):
            cur = line[len(_MARK) + 1 :]
            sections[cur] = []
        elif cur is not None:
            sections[cur].append(line)
    invalid: list[str] = []

    def num(f: nodenum.Whole | nodenum.Real, raw: str) -> float | None:
        try:
            return f.parse(raw)
        except nodenum.Invalid as e:
            invalid.append(str(e))
            return None

    part: dict = {"mem": {}, "disks": [], "disk_errors": []}
    stat = sections.get("stat", [])
    if stat and stat[0].startswith("cpu "):
        ticks = [num(nodenum.CPU_TICKS, v) for v in stat[0].split()[1:9]]
        part["stat"] = [int(v) for v in ticks if v is not None] if None not in ticks else None
    la = sections.get("loadavg", [])
    if la:
        part["load"] = [x for v in la[0].split()[:3] if (x := num(nodenum.LOAD, v)) is not None]
    for line in sections.get("meminfo", []):
        k, _, v = line.partition(":")
        words = v.split()
        kib = num(nodenum.KIB.named(k.strip()), words[0]) if words else None
        if kib is not None:
            part["mem"][k.strip()] = int(kib) * 1024
    nproc = sections.get("nproc", [])
    cpu_count = num(nodenum.CPU_COUNT, nproc[0]) if nproc else None
    part["nproc"] = None if cpu_count is None else int(cpu_count)
    for p in paths:
        rows = [r for r in sections.get(f"df {p}", []) if not r.startswith("Filesystem ")]
        m = _DF_RE.match(rows[-1]) if rows else None
        sizes = [int(n) for i in (2, 3, 4) if m and (n := num(nodenum.BYTES.named(f"df size at {p}"), m.group(i)))
                 is not None]
        if len(sizes) == 3:
            part["disks"].append([p, *sizes])
        elif not m:
            msg = rows[0].strip() if rows else "no df output"
            part["disk_errors"].append(f"{p}: {msg.split(': ')[-1] if msg.startswith('df:') else msg}")
    raw = _raw_from_sample(part)
    raw.invalid = invalid
    return raw


def raw_from_sample(d: object) -> _Raw:
    """The host part of a sampler sample (ops/telemetry/sampler_node.py) as a _Raw; the node's word, so every
    field is checked: HostError naming the first wrong one."""
    try:
        return _raw_from_sample(sampled_host(d))
    except sampled.BadSample as e:
        raise HostError(f"the node's sampler sent a malformed host sample: {e}") from None


def sampled_host(d: object) -> dict:
    """The host part with its types checked (what _raw_from_sample takes as given)."""
    if not isinstance(d, dict):
        raise sampled.BadSample(f"expected an object, got {type(d).__name__}")
    for key in ("stat", "load", "disks", "disk_errors"):
        if not isinstance(d.get(key, []), (list, type(None))):
            raise sampled.BadSample(f"{key}: expected an array")
    for i, v in enumerate(d.get("stat") or []):
        sampled.whole({"v": v}, "v", f"stat[{i}]", field=nodenum.CPU_TICKS)
    for i, v in enumerate(d.get("load") or []):
        if not nodenum.is_number(v) or nodenum.LOAD.get(v) is None:
            raise sampled.BadSample(f"load[{i}]: {nodenum.describe(v)} is not a load average")
    mem = d.get("mem") or {}
    if not isinstance(mem, dict):
        raise sampled.BadSample("mem: expected an object")
    for k in mem:
        sampled.whole(mem, k, "mem", field=nodenum.BYTES)
    sampled.whole(d, "nproc", "", optional=True, field=nodenum.CPU_COUNT)
    for i, disk in enumerate(d.get("disks") or []):
        if not (isinstance(disk, list) and len(disk) == 4 and isinstance(disk[0], str)):
            raise sampled.BadSample(f"disks[{i}]: expected [path, total, used, free]")
        for j, key in enumerate(("total", "used", "free"), 1):
            sampled.whole({key: disk[j]}, key, f"disks[{i}]", field=nodenum.BYTES)
    if not all(isinstance(e, str) for e in d.get("disk_errors") or []):
        raise sampled.BadSample("disk_errors: expected text")
    return d


def _raw_from_sample(d: dict) -> _Raw:
    """A host part whose values are checked (the sampler's, or the numbers the script printed) as a _Raw."""
    cpu = None
    vals = d.get("stat")
    if vals and len(vals) >= 4:
        total = sum(vals[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
        cpu = (total - vals[3] - (vals[4] if len(vals) > 4 else 0), total)
    mem = d.get("mem") or {}
    ram_total = mem.get("MemTotal")
    avail = mem.get("MemAvailable")
    if avail is None and ram_total is not None:  # kernels before 3.14
        avail = mem.get("MemFree", 0) + mem.get("Buffers", 0) + mem.get("Cached", 0)
    load = d.get("load")
    return _Raw(
        cpu_times=cpu,
        cpu_count=d.get("nproc"),
        load=tuple(load) if load and len(load) == 3 else None,
        ram_used=None if ram_total is None or avail is None else ram_total - avail,
        ram_total=ram_total,
        disks=[(p, int(t), int(u), int(f)) for p, t, u, f in d.get("disks") or []],
        disk_errors=[printable(e) for e in d.get("disk_errors") or []],
    )


class HostStatsCollector:
    """Samples a host's CPU/RAM/disks; keeps state for CPU deltas and fill rates."""

    def __init__(self, host: Host, watch_paths: Sequence[str] = (), *, tracker: DiskFillTracker | None = None):
        self.host = host
        self.watch_paths = list(watch_paths)
        self.tracker = tracker or DiskFillTracker()
        self._prev_cpu: tuple[int, int] | None = None
        self._last_cpu_pct: float | None = None

    def read(self, *, timeout: float = 10.0) -> HostSnapshot:
        """One sample through the host script (where the node's sampler cannot answer)."""
        res = self.host.run_script(host_query_script(self.watch_paths), timeout=timeout)
        if not res.ok:
            raise HostError(f"host query failed: {last_line(res.stderr) or f'exit status {res.returncode}'}")
        return self.snapshot(parse_host_script_output(res.text, self.watch_paths))

    def snapshot(self, raw: _Raw, now: float | None = None) -> HostSnapshot:
        """A snapshot from one raw sample (the sampler's or the script's)."""
        now = time.time() if now is None else now
        cpu_pct = None
        if raw.cpu_times is not None:
            if self._prev_cpu is not None:
                d_busy = raw.cpu_times[0] - self._prev_cpu[0]
                d_total = raw.cpu_times[1] - self._prev_cpu[1]
                if d_total > 0 and d_busy >= 0:
                    cpu_pct = self._last_cpu_pct = round(100.0 * d_busy / d_total, 1)
                elif d_total == 0:  # polled again within one clock tick: nothing new to say
                    cpu_pct = self._last_cpu_pct
                    raw.cpu_times = self._prev_cpu
            self._prev_cpu = raw.cpu_times
        disks = [self.tracker.observe(p, now, total, used, free) for p, total, used, free in raw.disks]
        return HostSnapshot(
            ts=now,
            error="; ".join([*raw.disk_errors, *raw.invalid]) or None,
            cpu_pct=cpu_pct,
            cpu_count=raw.cpu_count,
            load1=raw.load[0] if raw.load else None,
            load5=raw.load[1] if raw.load else None,
            load15=raw.load[2] if raw.load else None,
            ram_used=raw.ram_used,
            ram_total=raw.ram_total,
            disks=disks,
        )
