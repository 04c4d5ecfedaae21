"""Typed snapshots every telemetry collector returns.

Every snapshot carries `ts` (unix time the data was read), `stale` and `error`.
A failed poll returns the last good data with `stale=True`, the old `ts` (so
`age_s` says how old it is) and `error` saying what went wrong. Values a device
or server does not report are None, never a made-up number.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(kw_only=True)
class Snapshot:
    ts: float
    stale: bool = False
    error: str | None = None

    @property
    def age_s(self) -> float:
        """Seconds since the data in this snapshot was read."""
        return max(0.0, time.time() - self.ts)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for --json output (includes age_s)."""
        d = asdict(self)
        d["age_s"] = round(self.age_s, 3)
        return d


# -- GPUs ---------------------------------------------------------------------
@dataclass
class MigInstance:
    """One MIG device of a GPU in MIG mode: its own memory and (when NVML's GPM can measure it) utilisation."""

    index: int                 # the MIG device index on its parent GPU
    gpu_instance: int | None = None
    compute_instance: int | None = None
    name: str | None = None    # e.g. "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    uuid: str | None = None    # "MIG-..."
    util_pct: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None

    @property
    def profile(self) -> str:
        """`3g.40gb` from the name; `40G` from the memory where the name is unknown (nvidia-smi's XML has none)."""
        name = self.name or ""
        if " MIG " in name:
            return name.rsplit(" MIG ", 1)[1]
        return f"{self.mem_total_mib / 1024:.0f}G" if self.mem_total_mib else "?"


@dataclass
class Gpu:
    """One GPU; a field is None where the driver says [N/A] / [Not Supported]."""

    index: int
    name: str | None = None
    uuid: str | None = None
    util_pct: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    lost: bool = False
    """The driver lost this GPU ("GPU is lost"); its other fields are None."""
    error: str | None = None
    """Why some fields could not be read (e.g. "[Unknown Error]" for memory)."""
    mig: list[MigInstance] | None = None
    """The MIG devices when the GPU is in MIG mode (None: MIG off). The GPU's own utilisation
    is then None and its memory the sum over instances: the instances carry the real numbers."""

    @property
    def mem_pct(self) -> float | None:
        if self.mem_used_mib is None or not self.mem_total_mib:
            return None
        return 100.0 * self.mem_used_mib / self.mem_total_mib


@dataclass
class GpuProcess:
    """A compute process using a GPU."""

    pid: int
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    mem_mib: float | None = None
    command: str = ""


@dataclass(kw_only=True)
class GpuSnapshot(Snapshot):
    available: bool = False
    """False when the node has no GPU / no driver / no nvidia-smi: a normal state."""
    reason: str | None = None
    """Why GPUs are unavailable, in words (None when available)."""
    gpus: list[Gpu] = field(default_factory=list)
    processes: list[GpuProcess] = field(default_factory=list)
    source: str = ""
    """"nvml" (nvidia-ml-py in the node sampler) or "nvidia-smi" (where the node cannot import it, or the sampler
    cannot answer)."""


# -- host ---------------------------------------------------------------------
@dataclass
class DiskUsage:
    """A watched path's filesystem, with its fill rate over the history window."""

    path: str
    total: int
    used: int
    free: int
    fill_rate_bytes_per_s: float | None = None
    """Bytes per second the free space is shrinking (negative: freeing); None until two samples."""
    time_to_full_s: float | None = None
    """Projected seconds until free reaches 0 at the current fill rate; None when not filling."""
    warn: bool = False
    warn_reason: str | None = None

    @property
    def free_pct(self) -> float:
        return 100.0 * self.free / self.total if self.total else 0.0


@dataclass(kw_only=True)
class HostSnapshot(Snapshot):
    cpu_pct: float | None = None
    """Whole-machine CPU busy %; None on the first remote sample (needs a delta)."""
    cpu_count: int | None = None
    load1: float | None = None
    load5: float | None = None
    load15: float | None = None
    ram_used: int | None = None
    """Bytes in use (total - available)."""
    ram_total: int | None = None
    disks: list[DiskUsage] = field(default_factory=list)

    @property
    def ram_pct(self) -> float | None:
        if self.ram_used is None or not self.ram_total:
            return None
        return 100.0 * self.ram_used / self.ram_total


# -- inference server ------------------------------------------------------------
@dataclass(kw_only=True)
class InferenceSnapshot(Snapshot):
    server: str = "unknown"
    """"sglang", "vllm" or "unknown"."""
    source: str = "metrics"
    """"metrics" (Prometheus /metrics) or "log" (server log lines)."""
    url: str | None = None
    model_name: str | None = None
    gen_tokens_per_s: float | None = None
    prompt_tokens_per_s: float | None = None
    running_reqs: float | None = None
    queued_reqs: float | None = None
    kv_cache_usage: float | None = None
    """Fraction 0..1 of KV cache in use (SGLang token usage, vLLM KV cache usage)."""
    accept_len: float | None = None
    """Mean accepted tokens per verify step, bonus token included (1..steps+1)."""
    accept_rate: float | None = None
    per_position_acceptance: list[float] = field(default_factory=list)
    prefix_cache_hit_rate: float | None = None
    baseline_tokens_per_s: float | None = None
    speedup_vs_baseline: float | None = None
    invalid: dict[str, str] = field(default_factory=dict)
    """Fields the server gave a value no such metric can have (NaN, ±Inf, negative, a fraction above 1):
    field name -> the value as given; the field itself is None (never shown as a number)."""

    @property
    def token_usage(self) -> float | None:
        """SGLang's name for kv_cache_usage."""
        return self.kv_cache_usage


# -- training -------------------------------------------------------------------
@dataclass(kw_only=True)
class TrainingSnapshot(Snapshot):
    path: str = ""
    latest: dict[str, Any] = field(default_factory=dict)
    """The last complete metrics record: its numbers that are valid (ops.nodenum) and its other values."""
    step: int | None = None
    loss: float | None = None
    lr: float | None = None
    steps_per_s: float | None = None
    total_steps: int | None = None
    eta_s: float | None = None
    records: int = 0
    """Valid records read so far."""
    skipped_lines: int = 0
    """Malformed lines skipped so far (never fatal)."""
    invalid: dict[str, str] = field(default_factory=dict)
    """The last record's values that are no number of their field (a 400-digit loss), by key, as described."""
    uncharted: int = 0
    """Values not charted: of keys past the most series a file may have (ops.telemetry.training.MAX_SERIES)."""


# -- logs -------------------------------------------------------------------------
@dataclass(kw_only=True)
class LogSnapshot(Snapshot):
    path: str = ""
    lines: list[str] = field(default_factory=list)
    """The bounded buffer of most recent lines, oldest first."""
    new_lines: list[str] = field(default_factory=list)
    """Lines that arrived with this poll."""
    restarted: bool = False
    """The file was truncated or rotated since the last poll and was re-read from the start."""
