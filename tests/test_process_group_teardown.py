"""Tearing down a gloo process group under a DDP model: `trainer.distributed.process_group` destroys
the group only once nothing else holds it, so a rank whose training raises right after a collective
neither hangs nor aborts. Before, the DDP reducer held the last reference: freed with the exception's
frames, it joined gloo's worker threads under the GIL while a worker waited for the GIL to free the
tensors of the barrier it had just run (a hang; at interpreter exit, "terminate called without an
active exception", the CI failure of test_resume_on_nodes_without_a_shared_disk)."""

from __future__ import annotations

import faulthandler
import os

import torch
import torch.multiprocessing as mp

from tests.support.spawned import join_within
from tests.support.sshd import free_port

ROUNDS = 30   # without the fix, two ranks hung within 20 rounds in each of three tries on a 2-core VM


class Crash(Exception):
    pass


def _step_then_crash(info) -> None:
    """A DDP step, the collectives a checkpoint ends with, then an error with the model on the stack."""
    from trainer.distributed import all_gather_objects, barrier, wrap_model

    model = wrap_model(torch.nn.Linear(64, 64), info)
    for _ in range(2):
        model(torch.randn(2, 64)).sum().backward()
    all_gather_objects({"rank": info.rank}, info)
    barrier(info)
    raise Crash


def _worker(rank: int, ports: list[int]) -> None:
    faulthandler.enable(all_threads=True)
    faulthandler.dump_traceback_later(100)   # a hung rank shows where, before the test kills it
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from trainer.distributed import process_group

    for port in ports:
        os.environ["MASTER_PORT"] = str(port)
        try:
            with process_group("cpu", timeout_s=60) as info:
                _step_then_crash(info)
        except Crash:
            pass


def test_ranks_whose_training_raises_after_a_barrier_tear_down_every_time():
    ctx = mp.spawn(_worker, args=([free_port() for _ in range(ROUNDS)],), nprocs=2, join=False)
    join_within(ctx, 110)
