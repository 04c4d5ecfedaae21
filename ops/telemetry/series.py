"""The keys of a node's history series (ops.telemetry.history), named here and nowhere else.

The collector writes a series under one of these keys and every reader (the dashboard, the fleet, the alerts)
asks with the same typed key, so no reader rebuilds a series name from a string. An enum member's value is the
snapshot attribute its series charts.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class GpuField(Enum):
    """A reading charted per GPU (a Gpu attribute)."""

    UTIL = "util_pct"
    MEM_PCT = "mem_pct"
    POWER_W = "power_w"
    TEMP_C = "temp_c"


@dataclass(frozen=True)
class GpuKey:
    index: int
    field: GpuField = GpuField.UTIL


class HostSeries(Enum):
    """A host reading charted (a HostSnapshot attribute); the member is the key."""

    CPU_PCT = "cpu_pct"
    RAM_PCT = "ram_pct"


@dataclass(frozen=True)
class DiskFreeKey:
    """Free bytes of a watched disk, by the path watched."""

    path: str


class InferenceSeries(Enum):
    """An inference server figure charted (an InferenceSnapshot attribute); the member is the key."""

    GEN_TOKENS_PER_S = "gen_tokens_per_s"
    ACCEPT_LEN = "accept_len"
    RUNNING_REQS = "running_reqs"
    QUEUED_REQS = "queued_reqs"
    KV_CACHE_USAGE = "kv_cache_usage"
    SPEEDUP_VS_BASELINE = "speedup_vs_baseline"


@dataclass(frozen=True)
class TrainingKey:
    """One numeric field of a training metrics file (the file names its fields: `loss`, `acc_0`, ...)."""

    path: str
    field: str


SeriesKey = GpuKey | HostSeries | DiskFreeKey | InferenceSeries | TrainingKey
