"""NodeSampler: a resident sampler on the node, reached over the existing transport.

One exec channel runs `python3 -c BOOT`; BOOT reads the source of
ops/telemetry/sampler_node.py from stdin and runs it (nothing is installed on the
node). Each request is one line on that channel and its answer one JSON line:
no new command, no new shell, no nvidia-smi start when NVML is importable there.
A reader thread keeps the newest sample, so `stream(interval)` makes the node push
samples and `latest()` returns the newest without any round trip.

A request starts the sampler in the background and waits for it no longer than
for an answer; while it is not running by then (no python3 on the node, one too
old for the script, died, stopped answering, still starting) the request raises
SamplerUnavailable and the caller uses the one-shot commands. A failed sampler is
started again after a backoff that doubles up to `max_backoff_s` (10 minutes when
the node has no Python).
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ops import nodejson, nodenum
from ops.errors import HostError, OutputTooLarge
from ops.hosts.base import Host, HostProcess
from ops.telemetry import sampled
from ops.telemetry.gpus import gpu_query_script, parse_gpu_script_output
from ops.telemetry.snapshots import GpuSnapshot

NODE_SCRIPT = Path(__file__).with_name("sampler_node.py")
NO_PYTHON_EXIT = 127
READ_WAIT_S = 30.0
"""The reader waits this long for a line before it waits again (a close wakes it at once): a wait that
ends without a line is a wakeup with nothing to do, once a second per node at 1.0."""
NO_PYTHON_RETRY_S = 600.0
"""A node without Python is asked again this rarely (it may get one later)."""


class SamplerUnavailable(HostError):
    """The sampler cannot answer now; use the one-shot commands."""


def boot_command(python: str, script: bytes) -> list[str]:
    """argv that starts python reading `script` (len bytes) from stdin, or exits 127 without python."""
    boot = (
        "import os,sys\n"
        f"n={len(script)};b=b''\n"
        "while len(b)<n:\n"
        " c=os.read(0,n-len(b))\n"
        " if not c:sys.exit(3)\n"
        " b+=c\n"
        "exec(compile(b,'nodedeck-sampler','exec'))\n"
    )
    py = shlex.quote(python)
    missing = shlex.quote(f"nodedeck sampler: {python} not found on the node")
    sh = (f"command -v {py} >/dev/null 2>&1 || {{ echo {missing} >&2; exit {NO_PYTHON_EXIT}; }}; "
          f"exec {py} -u -c {shlex.quote(boot)}")
    return ["sh", "-c", sh]


@dataclass
class Sample:
    """One line from the sampler: its sequence number, node time, and the parts asked for."""

    seq: int
    t: float
    gpu: dict | None = None
    host: dict | None = None
    received: float = field(default_factory=time.monotonic)


def gpu_snapshot(part: object, ts: float) -> GpuSnapshot:
    """A GpuSnapshot from a sample's gpu part (NVML fields, why NVML cannot answer, or the nvidia-smi script
    output), every field checked (ops.telemetry.sampled): HostError naming the first wrong one."""
    try:
        if not isinstance(part, dict):
            raise sampled.BadSample(f"expected an object, got {type(part).__name__}")
        if part.get("source") == "nvidia-smi":
            snap = parse_gpu_script_output(*sampled.script_part(part))
            snap.ts = ts
            return snap
        reason = sampled.text(part, "reason", "")
        gpus, procs = sampled.gpus(part)
    except sampled.BadSample as e:
        raise HostError(f"the node's sampler sent a malformed GPU sample: {e}") from None
    if reason is not None:
        return GpuSnapshot(ts=ts, available=False, reason=reason, source="nvml")
    if not gpus:
        return GpuSnapshot(ts=ts, available=False, reason="no NVIDIA GPUs found", source="nvml")
    return GpuSnapshot(ts=ts, available=True, gpus=gpus, processes=procs, source="nvml")


def _stream_line(interval: float, parts: str) -> bytes:
    return f"i {interval:g} {parts}\n".encode()


class NodeSampler:
    """The client end of one node's sampler; safe to call from several threads."""

    def __init__(
        self,
        host: Host,
        watch_paths: Sequence[str] = (),
        *,
        nvidia_smi: str = "nvidia-smi",
        nvml: bool = True,
        python: str = "python3",
        max_backoff_s: float = 60.0,
        stream_interval: float | None = None,
    ):
        self.host = host
        self.watch_paths = list(watch_paths)
        self.python = python
        self.max_backoff_s = max_backoff_s
        self._config = {"paths": self.watch_paths, "gpu_script": gpu_query_script(nvidia_smi), "nvidia_smi": nvidia_smi,
                        "nvml": nvml}
        self._lock = threading.Lock()  # start/stop and writes
        self._cond = threading.Condition()  # new samples
        self._proc: HostProcess | None = None
        self._reader: threading.Thread | None = None
        self._latest: Sample | None = None
        self._latest_part: dict[str, Sample] = {}
        self._received = 0
        self._backoff = 0.0
        self._retry_at = 0.0
        self.reason: str | None = None
        """Why the sampler is not running (None while it is)."""
        self.nvml: bool | None = None
        """Whether the running sampler reads GPUs through NVML (None before it started)."""
        self.pid: int | None = None
        """The sampler's process id on the node."""
        self.starts = 0
        self.start_timeout = 30.0
        self._starter: threading.Thread | None = None
        self._epoch = 0  # close() bumps it: a start still under way then discards its process
        # sent to every new sampler
        self._stream_line = _stream_line(stream_interval, "gh") if stream_interval else None

    # -- lifecycle -------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._proc is not None

    def start(self, timeout: float = 30.0) -> None:
        """Start the sampler now and wait for its greeting (polls start it in the background).

        Raises SamplerUnavailable when it cannot start (or the backoff says not yet).
        """
        with self._lock:
            if self._proc is not None:
                return
            wait = self._retry_at - time.monotonic()
            if wait > 0:
                raise SamplerUnavailable(f"{self.reason} (next try in {wait:.0f}s)")
            epoch = self._epoch
        script = NODE_SCRIPT.read_bytes()
        try:
            proc = self.host.open_process(boot_command(self.python, script), timeout=timeout)
        except HostError as e:
            with self._lock:
                self._failed(str(e))
            raise SamplerUnavailable(self.reason) from e
        try:
            proc.write(script + json.dumps(self._config).encode() + b"\n")
            hello = nodejson.loads(proc.readline(timeout) or b"null")
            if not isinstance(hello, dict) or hello.get("hello") != 1:
                raise HostError("no greeting")
        except (HostError, ValueError) as e:
            detail = proc.stderr_tail()
            proc.close()
            with self._lock:
                self._failed(f"sampler did not start: {detail or e}",
                             no_python=detail.endswith("not found on the node"))
            raise SamplerUnavailable(self.reason) from e
        with self._lock:
            if self._proc is not None or self._epoch != epoch:  # another start won, or close() came meanwhile
                proc.close()
                return
            self.nvml, self.pid = bool(hello.get("nvml")), hello.get("pid")
            self._proc, self.reason = proc, None
            self._backoff, self._retry_at = 0.0, 0.0
            self.starts += 1
            if self._stream_line is not None:
                try:
                    proc.write(self._stream_line)
                except HostError:
                    pass  # the reader sees the stream end and drops it
        self._reader = threading.Thread(target=self._read_loop, args=(proc,),
                                        name=f"sampler-{self.host.name}", daemon=True)
        self._reader.start()

    def _running(self, wait: float = 0.0) -> HostProcess:
        """The running process; otherwise starts one in the background (one start at a time) and waits up to
        `wait` seconds for it: SamplerUnavailable when it is not running by then, or its backoff says not yet.
        """
        proc = self._proc
        if proc is not None:
            return proc
        with self._lock:
            starter = self._starter if self._starter is not None and self._starter.is_alive() else None
            retry_in = self._retry_at - time.monotonic()
            if starter is None and retry_in <= 0:
                starter = self._starter = threading.Thread(target=self._start_quietly,
                                                           name=f"sampler-start-{self.host.name}", daemon=True)
                starter.start()
        if starter is None:
            raise SamplerUnavailable(f"{self.reason} (next try in {retry_in:.0f}s)")
        starter.join(wait)
        proc = self._proc
        if proc is None:
            raise SamplerUnavailable("sampler starting" if starter.is_alive() else self.reason or "sampler stopped")
        return proc

    def _start_quietly(self) -> None:
        try:
            self.start(self.start_timeout)
        except SamplerUnavailable:
            pass  # the reason and the backoff are recorded
        except Exception as e:  # e.g. the caller's audit store closed meanwhile: no traceback from a thread
            with self._lock:
                self._failed(f"sampler did not start: {e}")

    def _failed(self, reason: str, *, no_python: bool = False) -> None:
        self.reason = reason
        if no_python:
            self._backoff = NO_PYTHON_RETRY_S
        else:
            self._backoff = min(max(self._backoff * 2, 1.0), self.max_backoff_s)
        self._retry_at = time.monotonic() + self._backoff

    def _drop(self, proc: HostProcess, reason: str) -> None:
        """Stop a failed process; a call after the backoff starts a new one."""
        with self._lock:
            if self._proc is proc:
                self._proc = None
                self._failed(reason)
        proc.close()
        with self._cond:
            self._cond.notify_all()

    def _read_loop(self, proc: HostProcess) -> None:
        while self._proc is proc:
            try:
                line = proc.readline(READ_WAIT_S)
            except OutputTooLarge as e:   # a line without end: not a sampler of ours
                self._drop(proc, f"sampler stream: {e}")
                return
            except HostError:
                continue  # no sample for a while: keep waiting
            except (OSError, ValueError) as e:  # the stream was closed under us
                self._drop(proc, f"sampler stream closed: {e}")
                return
            if not line:
                tail = proc.stderr_tail()
                self._drop(proc, f"sampler ended{': ' + tail if tail else ''}")
                return
            try:
                d = nodejson.loads(line)
                sample = Sample(seq=nodenum.COUNT.from_json(d["seq"]), t=nodenum.UNIX_TIME.from_json(d["t"]),
                                gpu=d.get("gpu"), host=d.get("host"))
            except (ValueError, KeyError, TypeError):
                self._drop(proc, f"sampler sent a bad line: {line[:80]!r}")
                return
            with self._cond:
                self._latest = sample
                self._received += 1
                for part in ("gpu", "host"):
                    if getattr(sample, part) is not None:
                        self._latest_part[part] = sample
                self._cond.notify_all()

    def close(self) -> None:
        """Stop the sampler (the node side exits when its stdin closes)."""
        with self._lock:
            proc, self._proc = self._proc, None
            self._epoch += 1
        if proc is not None:
            proc.close()
        with self._cond:
            self._cond.notify_all()

    # -- samples -------------------------------------------------------------------
    def request(self, parts: str = "gh", timeout: float = 5.0) -> Sample:
        """A fresh sample of `parts` ("g" GPUs, "h" host), taken after this call; within `timeout`, a start of
        the sampler included.

        Raises SamplerUnavailable (the caller falls back to one-shot commands).
        """
        deadline = time.monotonic() + timeout
        proc = self._running(timeout)
        with self._lock:
            with self._cond:
                seen = self._received
            err: HostError | None
            try:
                proc.write(parts.encode() + b"\n")
            except HostError as e:
                err = e
            else:
                err = None
        if err is not None:
            self._drop(proc, str(err))
            raise SamplerUnavailable(str(err))
        want = ["gpu"] if parts == "g" else ["host"] if parts == "h" else ["gpu", "host"]
        with self._cond:
            while True:
                s = self._latest
                if self._received > seen and s is not None and all(getattr(s, w) is not None for w in want):
                    return s
                if self._proc is not proc:
                    raise SamplerUnavailable(self.reason or "sampler stopped")
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
        self._drop(proc, f"sampler gave no answer within {timeout:g}s")
        raise SamplerUnavailable(self.reason)

    def stream(self, interval: float, parts: str = "gh") -> None:
        """Make the node push a sample every `interval` seconds (0 stops); read them with latest().

        Kept across restarts. Raises SamplerUnavailable while the sampler is not running
        (then it is starting, or waiting out its backoff, and will stream once it runs).
        """
        line = _stream_line(interval, parts)
        with self._lock:
            self._stream_line = line if interval > 0 else None
        proc = self._running()
        with self._lock:
            try:
                proc.write(line)
                return
            except HostError as e:
                err = e
        self._drop(proc, str(err))
        raise SamplerUnavailable(str(err))

    def latest(self, part: str | None = None) -> Sample | None:
        """The newest sample received (with that part: "gpu" or "host"), without asking the node."""
        with self._cond:
            return self._latest if part is None else self._latest_part.get(part)

    def wait_newer(self, seq: int, timeout: float) -> Sample | None:
        """Block until a sample with a larger seq than `seq` arrives (None on timeout or stop)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._latest is None or self._latest.seq <= seq:
                left = deadline - time.monotonic()
                if left <= 0 or self._proc is None:
                    return None
                self._cond.wait(left)
            return self._latest
