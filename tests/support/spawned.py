"""Waiting on torch.multiprocessing ranks with a bound."""

from __future__ import annotations

import time


def join_within(ctx, seconds: float) -> None:
    """Wait for every process of an mp.spawn(join=False) context; kill them all past `seconds`."""
    deadline = time.monotonic() + seconds
    while not ctx.join(timeout=2, grace_period=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise AssertionError(f"the ranks did not finish within {seconds:g} s")
