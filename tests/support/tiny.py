"""The tiny target model, built once per test session (no download, a couple of seconds)."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=None)
def tiny_target_dir(num_layers: int = 4, hidden_size: int = 64) -> Path:
    """Directory holding a tiny Llama + tokenizer (shared read-only by every test of the session)."""
    from trainer.tiny import build_tiny_target

    root = Path(tempfile.mkdtemp(prefix=f"nodedeck-tiny-{num_layers}x{hidden_size}-"))
    atexit.register(shutil.rmtree, root, True)
    return build_tiny_target(root / "model", num_layers=num_layers, hidden_size=hidden_size)
