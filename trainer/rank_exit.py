"""How a torchrun rank's process ends: at once, once its step is done (no torch import here: the CLI uses it).

A rank whose work was done and whose process group was destroyed was still seen to die in the
interpreter's teardown, now and then under load: SIGABRT, "terminate called without an active
exception" (in CI: a non-zero rank of the hidden-states capture and of DDP training, each after its
last collective; torch's issue tracker has the same abort from gloo's worker threads freeing tensors
at interpreter exit). torchrun then fails the whole run, and a stage whose every output is written is
judged failed. So a process that joined a group ends with `os._exit` once its step returned: what the
step wrote is closed by then, and its streams and logs are flushed first.
"""

from __future__ import annotations

import logging
import os
import sys

_joined = False
"""This process joined a process group (it is a torchrun rank)."""


def mark_joined() -> None:
    """This process joined a process group (trainer.distributed, once init_process_group returned)."""
    global _joined
    _joined = True


def end_rank(rc: int) -> int:
    """rc, as the exit status of a step; in a process that joined a process group, the process ends here with
    rc, its streams and logs flushed, without the interpreter's teardown."""
    if not _joined:
        return rc
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(rc)
