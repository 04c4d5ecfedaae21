"""JSONL helpers: read with file:line errors, write whole lines atomically (temp name + rename)."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path

from ops.errors import UserError


def iter_jsonl(path):
    """Yield (line_number, object) for each non-empty line; bad JSON raises UserError `file:line: ...`."""
    path = Path(path)
    try:
        f = path.open("r", encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, expected a JSONL file") from None
    with f:
        yield from jsonl_objects(f, path)


def jsonl_objects(f, path):
    """Yield (line_number, object) for each non-empty line of the open text file f (errors name `path`)."""
    for lineno, line in enumerate(f, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise UserError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        yield lineno, obj


@contextmanager
def atomic_output(path, mode: str = "w"):
    """Open `path.tmp-<pid>` for writing; rename onto `path` only if the block completes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open(mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_json(path, obj) -> None:
    """Write a JSON document atomically."""
    with atomic_output(path) as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
