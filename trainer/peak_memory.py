"""Peak CPU tensor memory of one call, from torch's memory profiler (for benchmarks and memory tests)."""

from __future__ import annotations

from typing import Callable


def peak_cpu_bytes(call: Callable[[], object]) -> int:
    """The largest total of live CPU tensor bytes while `call()` runs, less what was live before it.

    Each allocation is counted once, by the op that made it (self), each free by its [memory] event,
    in time order."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        call()
    events = sorted(((e.time_range.start, e.self_cpu_memory_usage) for e in prof.events() if e.self_cpu_memory_usage),
                    key=lambda x: x[0])
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return peak
