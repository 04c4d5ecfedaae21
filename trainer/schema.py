"""The one sample schema every dataset is converted to (JSONL, one sample per line):

    {"id": str, "source": str, "kind": "target-native" | "prompt-only",
     "messages": [{"role": "system"|"user"|"assistant"|"tool", "content": str,
                   optional "reasoning_content": str, optional "tool_calls": [...],
                   optional "tool_call_id": str, optional "name": str}],
     optional "tools": [...]}

`tool_calls` use the OpenAI shape `{"id", "type": "function", "function": {"name", "arguments"}}`.
target-native: the assistant turns are the target model's own (train on them as they are).
prompt-only: no assistant turns; `trainer.regen` asks the target for them.
"""

from __future__ import annotations

import hashlib
import json

from ops.errors import UserError
from trainer.jsonl import iter_jsonl

ROLES = ("system", "user", "assistant", "tool")
KINDS = ("target-native", "prompt-only")
MESSAGE_KEYS = {"role", "content", "reasoning_content", "tool_calls", "tool_call_id", "name"}


def content_hash(messages, tools=None) -> str:
    """Stable hash of a conversation's content (hex, 16 chars)."""
    blob = json.dumps({"messages": messages, "tools": tools}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def has_assistant(messages) -> bool:
    return any(m["role"] == "assistant" for m in messages)


def check_sample(obj: dict, where: str) -> dict:
    """Validate one sample; raise UserError `where: ...` (where = file:line) when it is malformed."""
    missing = [k for k in ("id", "source", "kind", "messages") if k not in obj]
    if missing:
        raise UserError(f"{where}: not a nodedeck sample: missing {missing} (fields found: {sorted(obj)})")
    if obj["kind"] not in KINDS:
        raise UserError(f"{where}: kind {obj['kind']!r} is not one of {', '.join(KINDS)}")
    msgs = obj["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise UserError(f"{where}: messages must be a non-empty list")
    for n, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise UserError(f"{where}: messages[{n}]: role must be one of {', '.join(ROLES)}")
        if not isinstance(m.get("content"), str):
            raise UserError(f"{where}: messages[{n}]: content must be a string")
        extra = set(m) - MESSAGE_KEYS
        if extra:
            raise UserError(f"{where}: messages[{n}]: unknown fields {sorted(extra)}")
    if obj["kind"] == "target-native" and not has_assistant(msgs):
        raise UserError(f"{where}: a target-native sample needs an assistant turn")
    return obj


def iter_samples(path, *, max_samples: int | None = None):
    """Yield (line_number, sample) for each valid sample of a schema JSONL file."""
    count = 0
    for lineno, obj in iter_jsonl(path):
        if max_samples is not None and count >= max_samples:
            return
        yield lineno, check_sample(obj, f"{path}:{lineno}")
        count += 1
