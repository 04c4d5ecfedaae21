"""One torch compute thread for the trainer tests: as each torchrun rank has, and on a shared, loaded CPU
spinning OpenMP workers cost 10x the time."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import pytest
import torch


@contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op threads set to one inside, put back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Every test of the module that imports this fixture runs on one torch thread."""
    with one_thread():
        yield
