"""Peak CPU tensor memory of one call, from torch's memory profiler (for benchmarks and memory tests)."""

from __future__ import annotations

from typing import Callable

from torch.profiler import ProfilerActivity, profile


def peak_cpu_bytes(call: Callable[[], object]) -> int:
    """The largest total of live CPU tensor bytes while `call()` runs, less what was live before it.

    Every allocation and free is one of the profiler's raw "[memory]" records, summed in time order. (The
    per-op `self_cpu_memory_usage` would file a free made inside a custom autograd Function, or any op
    with children, under that op's start: earlier than the allocations it frees, hiding their peak.)"""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        call()
    records = prof.profiler.kineto_results.events() if prof.profiler and prof.profiler.kineto_results else []
    deltas = sorted(((r.start_ns(), r.nbytes()) for r in records
                     if r.name() == "[memory]" and r.device_type().name == "CPU"),
                    key=lambda d: d[0])   # stable: records of one nanosecond keep their own order
    live = peak = 0
    for _, delta in deltas:
        live += delta
        peak = max(peak, live)
    return peak
