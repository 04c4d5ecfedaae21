"""JSON that came from a node, parsed so that whatever it holds fails as ValueError: nesting too deep for Python's
parser (RecursionError) included. Callers catch ValueError and say what was wrong in one line."""

from __future__ import annotations

import json
from typing import Any


def loads(data: str | bytes) -> Any:
    """json.loads(data); ValueError (never RecursionError) for anything that is not JSON Python can hold."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
