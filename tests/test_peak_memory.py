"""`peak_cpu_bytes` counts every allocation at the time it was made, also those made and freed inside a custom
autograd Function (the profiler files their frees under the Function's own event, which starts earlier)."""

from __future__ import annotations

import torch

from trainer.peak_memory import peak_cpu_bytes

MIB = 2**20


class Scratch(torch.autograd.Function):
    """x + 0, through a 64 MiB temporary made and freed in forward."""

    @staticmethod
    def forward(ctx, x):
        scratch = torch.ones(16 * MIB)  # 64 MiB of float32
        return x + scratch[: x.numel()].sum() * 0

    @staticmethod
    def backward(ctx, grad):
        return grad


def test_a_temporary_inside_a_custom_function_counts():
    x = torch.zeros(4, requires_grad=True)
    peak = peak_cpu_bytes(lambda: Scratch.apply(x).sum().backward())
    assert 64 * MIB <= peak < 65 * MIB


def test_live_tensors_add_up_and_freed_ones_do_not():
    def step() -> None:
        a = torch.ones(8 * MIB)  # 32 MiB
        del a
        b, c = torch.ones(4 * MIB), torch.ones(4 * MIB)  # 16 + 16 MiB live together
        del b, c

    assert 32 * MIB <= peak_cpu_bytes(step) < 33 * MIB
