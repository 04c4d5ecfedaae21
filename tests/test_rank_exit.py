"""A torchrun rank ends at once when its step is done (trainer.rank_exit): what it printed is flushed, its exit
status kept, and the interpreter's teardown (where a finished gloo rank was seen to abort) skipped; a process
that joined no process group exits as before."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROBE = """
import atexit, sys
from trainer import rank_exit
atexit.register(lambda: print(" teardown ran"))
print("written", end="")          # still in the buffer: stdout is a pipe
if sys.argv[1] == "joined":
    rank_exit.mark_joined()
sys.exit(rank_exit.end_rank(3))
"""


@pytest.mark.parametrize("joined,teardown", [("joined", False), ("alone", True)])
def test_a_rank_ends_with_its_status_and_output_without_the_teardown(joined, teardown):
    r = subprocess.run([sys.executable, "-c", PROBE, joined], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stderr
    assert r.stdout.startswith("written")
    assert ("teardown ran" in r.stdout) is teardown
