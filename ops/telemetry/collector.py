"""NodeTelemetry: the one object the TUI (from a worker thread) and the CLI poll.

Each poll returns a snapshot and feeds the histories. A dead or slow node never
blocks past `timeout`: the poll runs in a helper thread, and when it fails or
overruns, the last good snapshot comes back marked stale with the error (its
`ts` is unchanged, so `age_s` tells how old it is). A poll still hung on a dead
transport is not started twice.

GPUs and host come from the node's resident sampler (ops/telemetry/sampler.py: one
request line on an open channel, a few ms), on `local` as on any node. Where it
cannot answer (no python3 on the node, or one too old; a start slower than the
poll; a sampler that died and waits out its backoff) the one-shot query scripts
do: ops/telemetry/gpus.py and hoststats.py say what each reads.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from typing import Callable, Sequence, TypeVar, cast

from ops.errors import NodedeckError
from ops.hosts.base import Host
from ops.state import StateStore
from ops.telemetry.baseline import Baseline, load_baseline, speedup
from ops.telemetry.gpus import read_remote_gpus
from ops.telemetry.history import History
from ops.telemetry.hoststats import HostStatsCollector, raw_from_sample
from ops.telemetry.inference import InferenceMetrics
from ops.telemetry.sampler import NodeSampler, Sample, SamplerUnavailable, gpu_snapshot
from ops.telemetry.series import DiskFreeKey, GpuField, GpuKey, HostSeries, InferenceSeries, SeriesKey
from ops.telemetry.serverlog import ServerLogMetrics
from ops.telemetry.snapshots import (
    GpuSnapshot,
    HostSnapshot,
    InferenceSnapshot,
    LogSnapshot,
    Snapshot,
    TrainingSnapshot,
)
from ops.telemetry.tail import LogFollower
from ops.telemetry.training import TrainingMetrics

S = TypeVar("S", bound=Snapshot)


class NodeTelemetry:
    """Collectors for one node, with histories (x = unix time, or step for training)."""

    def __init__(
        self,
        host: Host,
        *,
        watch_paths: Sequence[str] = (),
        metrics_url: str | None = None,
        timeout: float = 10.0,
        history_capacity: int = 4096,
        baseline: Baseline | Callable[[], Baseline | None] | None = None,
        nvidia_smi: str = "nvidia-smi",
        nvml: bool = True,
        sampler_python: str | None = None,
        stream_interval: float | None = None,
    ):
        """`nvml=False` makes the node's nvidia-smi answer even where its Python imports nvidia-ml-py;
        `sampler_python` defaults to this nodedeck's own Python on `local` (it has nvidia-ml-py), else python3."""
        self.host = host
        self.timeout = timeout
        self.metrics_url = metrics_url
        self.history: History[SeriesKey] = History(history_capacity)
        self._baseline = baseline
        self._nvidia_smi = nvidia_smi
        self._hoststats = HostStatsCollector(host, watch_paths)
        python = sampler_python or (sys.executable if host.kind == "local" else "python3")
        self.sampler = NodeSampler(host, watch_paths, nvidia_smi=nvidia_smi, nvml=nvml, python=python,
                                   stream_interval=stream_interval)
        """The resident sampler on the node; the one-shot commands answer while it cannot."""
        self.stream_interval = stream_interval
        """When set, the node pushes a sample this often and polls read the newest one (no round trip)."""
        self._scrapers: dict[str, InferenceMetrics] = {}
        self._server_logs: dict[str, tuple[LogFollower, ServerLogMetrics]] = {}
        self._training: dict[str, TrainingMetrics] = {}
        self._logs: dict[str, LogFollower] = {}
        self._last: dict[str, Snapshot] = {}
        self._inflight: dict[str, tuple[threading.Thread, float]] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_node(cls, node, host: Host, **kw) -> "NodeTelemetry":
        """Built from an ops.nodes.NodeConfig (watch_paths, first metrics_url, the node's stored baseline)."""

        def baseline():
            store = StateStore.for_node(node.name)
            try:
                return load_baseline(store)
            finally:
                store.close()

        kw.setdefault("baseline", baseline)
        urls = node.metrics_url
        return cls(host, watch_paths=list(node.watch_paths), metrics_url=urls[0] if urls else None, **kw)

    @property
    def watch_paths(self) -> list[str]:
        return self._hoststats.watch_paths

    # -- guarded polling --------------------------------------------------------
    def _guarded(self, key: str, fn: Callable[[], S], empty: Callable[[], S]) -> S:
        got: list[S] = []
        failed: list[BaseException] = []

        def work():
            try:
                got.append(fn())
            except BaseException as e:  # handed to the caller below
                failed.append(e)
            finally:
                with self._lock:
                    self._inflight.pop(key, None)

        with self._lock:
            running = self._inflight.get(key)
            if running is not None:
                return self._stale(key, empty,
                                   f"previous poll still running after {time.monotonic() - running[1]:.0f}s")
            th = threading.Thread(target=work, name=f"telemetry-{key}", daemon=True)
            self._inflight[key] = (th, time.monotonic())
        th.start()
        th.join(self.timeout + min(2.0, 0.5 * self.timeout))  # let inner timeouts fire first
        if th.is_alive():
            return self._stale(key, empty, f"no answer from {self.host.name} within {self.timeout:g}s")
        if failed:
            exc = failed[0]
            if isinstance(exc, (NodedeckError, OSError)):
                return self._stale(key, empty, str(exc) or type(exc).__name__)
            raise exc
        snap = got[0]
        with self._lock:
            self._last[key] = snap
        return snap

    def _direct(self, key: str, fn: Callable[[], S], empty: Callable[[], S]) -> S:
        """As _guarded for a read that waits on nothing (a sample already received): no thread."""
        try:
            snap = fn()
        except NodedeckError as e:
            return self._stale(key, empty, str(e) or type(e).__name__)
        with self._lock:
            self._last[key] = snap
        return snap

    def _stale(self, key: str, empty: Callable[[], S], error: str) -> S:
        last = cast(S | None, self._last.get(key))   # the key's last snapshot is of the key's kind
        if last is None:
            return dataclasses.replace(empty(), stale=True, error=error)
        return dataclasses.replace(last, stale=True, error=error)

    def last(self, key: str) -> Snapshot | None:
        """The last good snapshot of a poll ("gpus", "host", "inference:URL-or-LOG", "training:PATH", "log:PATH")."""
        with self._lock:
            return self._last.get(key)

    # -- the node's sampler ----------------------------------------------------------
    def _streamed(self, part: str) -> Sample | None:
        """The newest sample the node pushed with `part` ("gpu", "host") while it is fresh, else None."""
        if not self.stream_interval:
            return None
        latest = self.sampler.latest(part)
        if latest is not None and time.monotonic() - latest.received <= 1.5 * self.stream_interval:
            return latest
        return None

    def _sample(self, parts: str) -> Sample | None:
        """A fresh sample from the node's sampler (waiting for its start as long as for an answer), or None:
        then the one-shot command runs."""
        try:
            return self.sampler.request(parts, timeout=min(5.0, self.timeout / 2))
        except SamplerUnavailable:
            return None

    def close(self) -> None:
        """Stop the node's sampler (the host's transport stays the host's)."""
        self.sampler.close()

    # -- GPUs ------------------------------------------------------------------------
    def poll_gpus(self) -> GpuSnapshot:
        """The GPUs; a sample the node pushed (streaming) is read in this thread, anything else in a guarded one."""
        streamed = self._streamed("gpu")

        def read() -> GpuSnapshot:
            sample = streamed or self._sample("g")
            if sample is not None:
                snap = gpu_snapshot(sample.gpu, _local_time(sample))
            else:
                snap = read_remote_gpus(self.host, timeout=self.timeout, nvidia_smi=self._nvidia_smi)
            for g in snap.gpus:
                for f in GpuField:
                    self.history.append(GpuKey(g.index, f), snap.ts, getattr(g, f.value))
            return snap

        if streamed is not None:
            return self._direct("gpus", read, lambda: GpuSnapshot(ts=time.time()))
        return self._guarded("gpus", read, lambda: GpuSnapshot(ts=time.time()))

    # -- host ------------------------------------------------------------------------
    def poll_host(self) -> HostSnapshot:
        """The host; a sample the node pushed (streaming) is read in this thread, anything else in a guarded one."""
        streamed = self._streamed("host")

        def read() -> HostSnapshot:
            sample = streamed or self._sample("h")
            if sample is not None:
                snap = self._hoststats.snapshot(raw_from_sample(sample.host), now=_local_time(sample))
            else:
                snap = self._hoststats.read(timeout=self.timeout)
            for series in HostSeries:
                self.history.append(series, snap.ts, getattr(snap, series.value))
            for d in snap.disks:
                self.history.append(DiskFreeKey(d.path), snap.ts, d.free)
            return snap

        if streamed is not None:
            return self._direct("host", read, lambda: HostSnapshot(ts=time.time()))
        return self._guarded("host", read, lambda: HostSnapshot(ts=time.time()))

    # -- inference server ------------------------------------------------------------------
    def baseline(self) -> Baseline | None:
        b = self._baseline
        return b() if callable(b) else b

    def poll_inference(self, url: str | None = None, *, log_path: str | None = None) -> InferenceSnapshot:
        """From /metrics at url (default: the node's metrics_url), else from the server log at log_path."""
        url = url or (None if log_path else self.metrics_url)

        def read() -> InferenceSnapshot:
            baseline = self.baseline()
            snap: InferenceSnapshot | None
            if url:
                scraper = self._scrapers.get(url)
                if scraper is None:
                    scraper = self._scrapers[url] = InferenceMetrics(self.host, url)
                scraper.baseline = baseline
                snap = scraper.poll(timeout=min(self.timeout, 5.0))
            elif log_path:
                if log_path not in self._server_logs:
                    self._server_logs[log_path] = (LogFollower(self.host, log_path, n=500), ServerLogMetrics())
                follower, parsed = self._server_logs[log_path]
                parsed.feed(follower.poll().new_lines)
                snap = parsed.snapshot()
                if snap is None:
                    return InferenceSnapshot(ts=time.time(), source="log", error=f"no metrics lines in {log_path} yet")
                if baseline is not None:
                    snap.baseline_tokens_per_s = baseline.tokens_per_s
                    snap.speedup_vs_baseline = speedup(snap.gen_tokens_per_s, baseline)
            else:
                return InferenceSnapshot(ts=time.time(), error="no metrics URL configured for this node")
            if not snap.error:
                for series in InferenceSeries:
                    self.history.append(series, snap.ts, getattr(snap, series.value))
            return snap

        key = f"inference:{url or log_path or ''}"
        return self._guarded(key, read, lambda: InferenceSnapshot(ts=time.time(), url=url))

    # -- training --------------------------------------------------------------------
    def poll_training(self, path: str, *, total_steps: int | None = None) -> TrainingSnapshot:
        def read() -> TrainingSnapshot:
            tm = self._training.get(path)
            if tm is None:
                tm = self._training[path] = TrainingMetrics(self.host, path, history=self.history,
                                                            total_steps=total_steps)
            return tm.poll()

        return self._guarded(f"training:{path}", read, lambda: TrainingSnapshot(ts=time.time(), path=path))

    # -- logs --------------------------------------------------------------------
    def follow_log(self, path: str, *, n: int = 200) -> LogSnapshot:
        """The last n lines at first, then what is new; the buffer keeps the recent lines."""

        def read() -> LogSnapshot:
            f = self._logs.get(path)
            if f is None:
                f = self._logs[path] = LogFollower(self.host, path, n=n)
            return f.poll()

        return self._guarded(f"log:{path}", read, lambda: LogSnapshot(ts=time.time(), path=path))


def _local_time(sample: Sample) -> float:
    """When a sample arrived, on this machine's clock (the node's clock may be off)."""
    return time.time() - (time.monotonic() - sample.received)
