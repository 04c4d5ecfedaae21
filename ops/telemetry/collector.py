"""NodeTelemetry: the one object the TUI (from a worker thread) and the CLI poll.

Each poll returns a snapshot and feeds the histories. A dead or slow node never
blocks past `timeout`: the poll runs in a helper thread, and when it fails or
overruns, the last good snapshot comes back marked stale with the error (its
`ts` is unchanged, so `age_s` tells how old it is). A poll still hung on a dead
transport is not started twice.

On a remote node GPUs and host come from the resident node sampler
(ops/telemetry/sampler.py: one request line on an open channel, a few ms);
while it is starting or unavailable, from the one-shot query scripts.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable, Sequence, TypeVar, cast

from ops.errors import NodedeckError
from ops.hosts.base import Host
from ops.state import StateStore
from ops.telemetry.baseline import Baseline, load_baseline, speedup
from ops.telemetry.gpus import NvmlSession, read_remote_gpus, shared_session
from ops.telemetry.history import History
from ops.telemetry.hoststats import HostStatsCollector, raw_from_sample
from ops.telemetry.inference import InferenceMetrics
from ops.telemetry.sampler import NodeSampler, Sample, SamplerUnavailable, gpu_snapshot
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

INFERENCE_SERIES = ("gen_tokens_per_s", "accept_len", "running_reqs", "queued_reqs", "kv_cache_usage",
                    "speedup_vs_baseline")


def training_key(path: str, field: str) -> str:
    """History series name of one training metric of one metrics file."""
    return f"training:{path}:{field}"


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
        gpu_source: str = "auto",
        nvidia_smi: str = "nvidia-smi",
        nvml: NvmlSession | None = None,
        sampler: bool | None = None,
        sampler_python: str = "python3",
        stream_interval: float | None = None,
    ):
        if gpu_source not in ("auto", "nvml", "nvidia-smi"):
            raise ValueError(f"gpu_source must be auto, nvml or nvidia-smi, not {gpu_source!r}")
        self.host = host
        self.timeout = timeout
        self.metrics_url = metrics_url
        self.history = History(history_capacity)
        self._baseline = baseline
        self._gpu_source = ("nvml" if host.kind == "local" else "nvidia-smi") if gpu_source == "auto" else gpu_source
        self._nvidia_smi = nvidia_smi
        self._nvml = nvml
        self._hoststats = HostStatsCollector(host, watch_paths)
        use_sampler = host.kind != "local" if sampler is None else sampler
        self.sampler: NodeSampler | None = (
            NodeSampler(
                host,
                watch_paths,
                nvidia_smi=nvidia_smi,
                nvml=gpu_source != "nvidia-smi",
                python=sampler_python,
                stream_interval=stream_interval,
            )
            if use_sampler
            else None
        )
        """The resident sampler on the node (remote nodes); one-shot commands when it is unavailable."""
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
        if self.sampler is None or not self.stream_interval:
            return None
        latest = self.sampler.latest(part)
        if latest is not None and time.monotonic() - latest.received <= 1.5 * self.stream_interval:
            return latest
        return None

    def _sample(self, parts: str) -> Sample | None:
        """A fresh sample from the node's sampler, or None: then the one-shot command runs."""
        if self.sampler is None:
            return None
        try:
            return (self._streamed("gpu" if parts == "g" else "host")
                    or self.sampler.request(parts, timeout=min(5.0, self.timeout / 2)))
        except SamplerUnavailable:
            return None

    def close(self) -> None:
        """Stop the node's sampler (the host's transport stays the host's)."""
        if self.sampler is not None:
            self.sampler.close()

    # -- GPUs ------------------------------------------------------------------------
    def poll_gpus(self) -> GpuSnapshot:
        """The GPUs; a sample the node pushed (streaming) is read in this thread, anything else in a guarded one."""
        streamed = None if self._gpu_source == "nvml" else self._streamed("gpu")

        def read() -> GpuSnapshot:
            sample = streamed or (None if self._gpu_source == "nvml" else self._sample("g"))
            if self._gpu_source == "nvml":
                snap = (self._nvml or shared_session()).read()
            elif sample is not None and sample.gpu is not None:
                snap = gpu_snapshot(sample.gpu, _local_time(sample))
            else:
                snap = read_remote_gpus(self.host, timeout=self.timeout, nvidia_smi=self._nvidia_smi)
            for g in snap.gpus:
                self.history.append(f"gpu{g.index}.util", snap.ts, g.util_pct)
                self.history.append(f"gpu{g.index}.mem_pct", snap.ts, g.mem_pct)
                self.history.append(f"gpu{g.index}.power_w", snap.ts, g.power_w)
                self.history.append(f"gpu{g.index}.temp_c", snap.ts, g.temp_c)
            return snap

        def empty() -> GpuSnapshot:
            return GpuSnapshot(ts=time.time(), source=self._gpu_source)

        if streamed is not None and streamed.gpu is not None:
            return self._direct("gpus", read, empty)
        return self._guarded("gpus", read, empty)

    # -- host ------------------------------------------------------------------------
    def poll_host(self) -> HostSnapshot:
        """The host; a sample the node pushed (streaming) is read in this thread, anything else in a guarded one."""
        streamed = self._streamed("host")

        def read() -> HostSnapshot:
            sample = streamed or self._sample("h")
            if sample is not None and sample.host is not None:
                snap = self._hoststats.snapshot(raw_from_sample(sample.host), now=_local_time(sample))
            else:
                snap = self._hoststats.read(timeout=self.timeout)
            self.history.append("host.cpu_pct", snap.ts, snap.cpu_pct)
            self.history.append("host.ram_pct", snap.ts, snap.ram_pct)
            for d in snap.disks:
                self.history.append(f"disk:{d.path}.free", snap.ts, d.free)
            return snap

        if streamed is not None and streamed.host is not None:
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
                for name in INFERENCE_SERIES:
                    self.history.append(f"inference.{name}", snap.ts, getattr(snap, name))
            return snap

        key = f"inference:{url or log_path or ''}"
        return self._guarded(key, read, lambda: InferenceSnapshot(ts=time.time(), url=url))

    # -- training --------------------------------------------------------------------
    def poll_training(self, path: str, *, total_steps: int | None = None) -> TrainingSnapshot:
        def read() -> TrainingSnapshot:
            tm = self._training.get(path)
            if tm is None:
                tm = self._training[path] = TrainingMetrics(
                    self.host, path, history=self.history, prefix=training_key(path, ""), total_steps=total_steps
                )
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
