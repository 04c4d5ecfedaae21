"""The recorded baseline throughput (target model without a drafter) speedups are measured against.

Kept in the node's StateStore key/value table under BASELINE_KEY; the plan's
benchmark stage (or `nodedeck baseline NODE --set`) records it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from ops.errors import UserError
from ops.state import StateStore

BASELINE_KEY = "telemetry.baseline"


@dataclass
class Baseline:
    tokens_per_s: float
    """Output token throughput of the plain target model."""
    recorded_at: float = field(default_factory=time.time)
    label: str = ""
    """What was measured, e.g. "sglang bench_serving, 32 prompts, concurrency 8"."""
    server: str | None = None
    model: str | None = None

    def __post_init__(self):
        if not isinstance(self.tokens_per_s, (int, float)) or not self.tokens_per_s > 0:
            raise UserError(f"baseline throughput must be a positive number, got {self.tokens_per_s!r}")
        self.tokens_per_s = float(self.tokens_per_s)


def save_baseline(store: StateStore, baseline: Baseline) -> None:
    store.kv_set(BASELINE_KEY, asdict(baseline))


def load_baseline(store: StateStore) -> Baseline | None:
    raw = store.kv_get(BASELINE_KEY)
    if raw is None:
        return None
    try:
        return Baseline(**raw)
    except (TypeError, UserError) as e:
        raise UserError(f"{store.path}: stored baseline is unreadable ({e}); record it again") from e


def speedup(tokens_per_s: float | None, baseline: Baseline | None) -> float | None:
    if tokens_per_s is None or baseline is None:
        return None
    return tokens_per_s / baseline.tokens_per_s
