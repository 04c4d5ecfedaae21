"""The node's sampler answers in JSON (ops/telemetry/sampler_node.py): on the laptop that JSON is the node's word.

Every field is checked here before it becomes a typed record: a wrong type is a HostError naming the field
(`gpus[0].util_pct: expected a number, got str`), a reading no device can give (NaN, ±Inf, negative, past its
range: ops.nodenum) is dropped to None and named in the GPU's error (`invalid util_pct nan`), never shown as a
number; a whole number out of its field's range (a 400-digit pid) is a HostError naming the field.
"""

from __future__ import annotations

from typing import Any

from ops import nodenum
from ops.errors import HostError
from ops.telemetry.snapshots import Gpu, GpuProcess, MigInstance
from ops.textsafe import printable

_GPU_READINGS = {"util_pct": nodenum.GPU_PERCENT, "mem_used_mib": nodenum.MIB, "mem_total_mib": nodenum.MIB,
                 "temp_c": nodenum.TEMP_C, "power_w": nodenum.WATTS, "power_limit_w": nodenum.WATTS,
                 "sm_clock_mhz": nodenum.MHZ}
_MIG_READINGS = ("util_pct", "mem_used_mib", "mem_total_mib")


class BadSample(HostError):
    """The sampler's answer does not have the shape it must have."""


def _kind(v: Any) -> str:
    return "nothing" if v is None else type(v).__name__


def _where(at: str, key: str) -> str:
    """`at.key` for a message: the key may be the node's word, so it is shown inert and cut."""
    return f"{at}.{printable(key, 60)}"


def whole(d: dict, key: str, at: str, *, optional: bool = False,
          field: nodenum.Whole = nodenum.COUNT) -> int | None:
    """d[key] as a non-negative int in field's range (None allowed when optional)."""
    v = d.get(key)
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise BadSample(f"{_where(at, key)}: expected a whole number >= 0, got {_kind(v)} {nodenum.describe(v)}")
    try:
        return field.parse(v)
    except nodenum.Invalid as e:
        raise BadSample(f"{_where(at, key)}: {e}") from None


def text(d: dict, key: str, at: str, *, optional: bool = True) -> str | None:
    v = d.get(key)
    if v is None and optional:
        return None
    if not isinstance(v, str):
        raise BadSample(f"{_where(at, key)}: expected text, got {_kind(v)}")
    return v


def reading(d: dict, key: str, at: str, invalid: list[str], field: nodenum.Real = nodenum.MIB) -> float | None:
    """d[key] as a reading in field's range, None when absent; a NaN, infinite, negative or out-of-range one is
    None and noted."""
    v = d.get(key)
    if v is None:
        return None
    if not nodenum.is_number(v):
        raise BadSample(f"{_where(at, key)}: expected a number, got {_kind(v)}")
    try:
        return field.named(key).parse(v)
    except nodenum.Invalid as e:
        invalid.append(str(e))
        return None


def _obj(v: Any, at: str) -> dict:
    if not isinstance(v, dict):
        raise BadSample(f"{at}: expected an object, got {_kind(v)}")
    return v


def _list(v: Any, at: str) -> list:
    if not isinstance(v, list):
        raise BadSample(f"{at}: expected an array, got {_kind(v)}")
    return v


def gpus(part: dict) -> tuple[list[Gpu], list[GpuProcess]]:
    """The GPUs and processes of a sample's NVML gpu part, every field checked."""
    out = [gpu(_obj(g, f"gpus[{i}]"), f"gpus[{i}]") for i, g in enumerate(_list(part.get("gpus"), "gpus"))]
    procs = [process(_obj(p, f"processes[{i}]"), f"processes[{i}]")
             for i, p in enumerate(_list(part.get("processes"), "processes"))]
    return out, procs


def gpu(d: dict, at: str) -> Gpu:
    invalid: list[str] = []
    values = {k: reading(d, k, at, invalid, field) for k, field in _GPU_READINGS.items()}
    lost = d.get("lost", False)
    if not isinstance(lost, bool):
        raise BadSample(f"{at}.lost: expected true or false, got {_kind(lost)}")
    mig = d.get("mig")
    instances = None if mig is None else [mig_instance(_obj(m, f"{at}.mig[{i}]"), f"{at}.mig[{i}]", invalid)
                                          for i, m in enumerate(_list(mig, f"{at}.mig"))]
    error = "; ".join(p for p in (text(d, "error", at), *invalid) if p) or None
    return Gpu(whole(d, "index", at, field=nodenum.GPU_INDEX) or 0, text(d, "name", at), text(d, "uuid", at),
               **values, lost=lost, error=error, mig=instances)


def mig_instance(d: dict, at: str, invalid: list[str]) -> MigInstance:
    return MigInstance(whole(d, "index", at) or 0, whole(d, "gpu_instance", at, optional=True),
                       whole(d, "compute_instance", at, optional=True), text(d, "name", at), text(d, "uuid", at),
                       **{k: reading(d, k, at, invalid, _GPU_READINGS[k]) for k in _MIG_READINGS})


def process(d: dict, at: str) -> GpuProcess:
    invalid: list[str] = []
    return GpuProcess(whole(d, "pid", at, field=nodenum.PID) or 0,
                      whole(d, "gpu_index", at, optional=True, field=nodenum.GPU_INDEX), text(d, "gpu_uuid", at),
                      reading(d, "mem_mib", at, invalid), text(d, "command", at) or "")


def script_part(part: dict) -> tuple[int, str, str]:
    """rc, stdout and stderr of the nvidia-smi script, as the sampler relayed them."""
    rc = part.get("rc")
    if isinstance(rc, bool) or not isinstance(rc, int) or nodenum.EXIT_STATUS.get(rc) is None:
        raise BadSample(f"rc: expected a whole number, got {_kind(rc)} {nodenum.describe(rc)}")
    return rc, text(part, "out", "", optional=False) or "", text(part, "err", "", optional=False) or ""
