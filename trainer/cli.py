"""`nodedeck-train <step> ...`: runs `main(argv)` of the module that implements the step."""

from __future__ import annotations

import functools
import importlib
import sys

from ops.errors import NodedeckError
from ops.setup.wheel import version_string
from trainer.rank_exit import end_rank

# Step name -> module (each has `main(argv) -> int`); also runnable as `python -m <module>`.
STEPS = {
    "tiny": "trainer.tiny",
    "prep": "trainer.prep",
    "regen": "trainer.regen",
    "tokenize": "trainer.tokenization",
    "vocab": "trainer.vocab",
    "hidden-states": "trainer.hidden_states.cli",
    "serve": "trainer.serve",
    "train": "trainer.train",
    "export": "trainer.export",
    "eval": "trainer.evaluate",
    "probe": "trainer.probe",
}


def step_main(fn):
    """Wrap a step's `main(argv)`: a NodedeckError becomes one stderr line and exit status 2."""

    @functools.wraps(fn)
    def wrapper(argv=None) -> int:
        try:
            return int(fn(argv) or 0)
        except NodedeckError as exc:
            print(f"nodedeck-train: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("nodedeck-train: interrupted", file=sys.stderr)
            return 130

    return wrapper


def _usage() -> str:
    return "usage: nodedeck-train <step> [args...]  (or --version)\nsteps: " + ", ".join(STEPS)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--version"]:   # what `nodedeck node setup` and `nodedeck nodes --check` read on a node
        print(f"nodedeck-train {version_string()}")
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    step, rest = argv[0], argv[1:]
    if step not in STEPS:
        print(f"nodedeck-train: unknown step {step!r}\n{_usage()}", file=sys.stderr)
        return 2
    try:
        rc = int(importlib.import_module(STEPS[step]).main(rest) or 0)
    except ModuleNotFoundError as exc:   # the trainer's libraries are an extra (torch, transformers, ...)
        if not exc.name or exc.name.split(".")[0] in ("trainer", "ops"):
            raise
        print(f"nodedeck-train: step {step!r} needs {exc.name!r}, which is not installed here: "
              "install the trainer with `pip install 'nodedeck[trainer]'`", file=sys.stderr)
        return 2
    return end_rank(rc)


if __name__ == "__main__":
    sys.exit(main())
