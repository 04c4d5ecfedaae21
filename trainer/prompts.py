"""The prompts an eval decodes, and a probe sends to a server, picked the one same way (no torch here: the probe
runs beside a server without loading it).

--data takes a tokenized JSONL and uses each sample's tokens before its first loss-masked token; --prompts takes
JSONL objects with "messages" (chat template), "prompt" (a user message through the chat template when there is one,
else raw text) or "input_ids". `prompts_sha256` identifies what was picked.
"""

from __future__ import annotations

import hashlib
import json

from ops.errors import UserError
from trainer.jsonl import iter_jsonl
from trainer.tokenized import iter_tokenized


def prompts_from_tokenized(path, limit: int) -> list[tuple[str, list[int]]]:
    out: list[tuple[str, list[int]]] = []
    for s in iter_tokenized(path):
        if len(out) >= limit:
            break
        first = next((t for t, m in enumerate(s.loss_mask) if m), None)
        if first:  # needs a prompt before the first trained token
            out.append((s.id, s.input_ids[:first]))
    return out


def prompts_from_file(path, tokenizer, limit: int) -> list[tuple[str, list[int]]]:
    out: list[tuple[str, list[int]]] = []
    for lineno, obj in iter_jsonl(path):
        if len(out) >= limit:
            break
        pid = str(obj.get("id", len(out)))
        if "input_ids" in obj:
            ids = obj["input_ids"]
        elif tokenizer is None:
            raise UserError(f"{path}:{lineno}: text prompts need a tokenizer in the target directory")
        elif "messages" in obj or ("prompt" in obj and tokenizer.chat_template):
            messages = obj.get("messages") or [{"role": "user", "content": obj["prompt"]}]
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids  # a BatchEncoding in transformers 5
        elif "prompt" in obj:
            ids = tokenizer(obj["prompt"], add_special_tokens=True)["input_ids"]
        else:
            raise UserError(f"{path}:{lineno}: expected \"messages\", \"prompt\" or \"input_ids\"")
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            raise UserError(f"{path}:{lineno}: the prompt has no tokens")
        out.append((pid, list(ids)))
    return out


def prompts_sha256(prompts: list[tuple[str, list[int]]]) -> str:
    """What identifies the prompts evaluated: their token ids, in order (a serving measurement on the same
    prompts carries the same digest)."""
    return hashlib.sha256(json.dumps([ids for _, ids in prompts], separators=(",", ":")).encode()).hexdigest()
