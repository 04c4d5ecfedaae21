"""Tokenise schema samples with the target's chat template: input ids + a loss mask on assistant tokens.

Each assistant turn is rebuilt exactly as the model emits it (`trainer.reasoning`): the sequence is
`prompt(messages[:i])` (mask 0) + `emitted(turn i)` (mask 1) for each assistant turn i, rendering the
template prefix by prefix. When the template rewrites history (e.g. drops earlier reasoning), so that a
later prompt does not extend the text so far, the sample becomes `prompt(history) + emitted(last turn)`
with only the last turn masked (counted as `history_turns_unmasked`). User, system and tool turns are
always masked out.

Output JSONL: `{"id", "input_ids": [int], "loss_mask": [0|1]}`; stats JSON next to it (or --stats).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from ops.errors import UserError
from trainer.cli import step_main
from trainer.jsonl import atomic_output, write_json
from trainer.progress import ProgressWriter
from trainer.reasoning import ThinkTags, TurnFormat, render
from trainer.schema import iter_samples


class ChatTokenizer:
    """Turn a schema sample into (input_ids, loss_mask, info) with one tokenizer and template."""

    def __init__(self, tokenizer, tags: ThinkTags = ThinkTags(), *, turn_end: str | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise UserError(f"{getattr(tokenizer, 'name_or_path', 'tokenizer')}: the tokenizer has no chat_template")
        self.tokenizer = tokenizer
        self.format = TurnFormat(tokenizer, tags, turn_end=turn_end)

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

    def segments(self, messages, tools=None) -> tuple[list[tuple[str, int]], int]:
        """[(text, mask)] pieces of the sequence, and how many assistant turns were left unmasked."""
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if not turns:
            return [], 0
        pieces, text = [], ""
        for i in turns:
            prompt = render(self.tokenizer, messages[:i], add_generation_prompt=True, tools=tools)
            if not prompt.startswith(text):
                last = turns[-1]
                prompt = render(self.tokenizer, messages[:last], add_generation_prompt=True, tools=tools)
                emitted = self.format.emitted_text(messages[:last], messages[last], prompt=prompt, tools=tools)
                return [(prompt, 0), (emitted, 1)], len(turns) - 1
            emitted = self.format.emitted_text(messages[:i], messages[i], prompt=prompt, tools=tools)
            pieces += [(prompt[len(text):], 0), (emitted, 1)]
            text = prompt + emitted
        return pieces, 0

    def encode(self, messages, tools=None) -> tuple[list[int], list[int], int]:
        ids, mask = [], []
        pieces, unmasked = self.segments(messages, tools)
        for piece, m in pieces:
            t = self._ids(piece)
            ids += t
            mask += [m] * len(t)
        return ids, mask, unmasked


def length_stats(lengths: list[int]) -> dict:
    """count, mean, p50/p90/p99 (nearest rank), max of a list of lengths."""
    if not lengths:
        return {"count": 0, "mean": 0.0, "p50": 0, "p90": 0, "p99": 0, "max": 0}
    s = sorted(lengths)

    def pct(p):
        return s[max(0, math.ceil(p / 100 * len(s)) - 1)]

    return {"count": len(s), "mean": round(sum(s) / len(s), 2), "p50": pct(50), "p90": pct(90),
            "p99": pct(99), "max": s[-1]}


def tokenize_file(model, inp, out, *, max_length: int | None = None, stats_path=None, tags=ThinkTags(),
                  turn_end=None, max_samples=None, progress=None, trust_remote_code: bool = False) -> dict:
    """Tokenise a schema JSONL file into tokenized JSONL (atomically); return the stats."""
    from transformers import AutoTokenizer  # lazy: transformers: 1.4 s to import

    inp, out = Path(inp), Path(out)
    if max_length is not None and max_length < 2:
        raise UserError("--max-length must be at least 2")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise UserError(f"{model}: cannot load the tokenizer ({str(exc).splitlines()[0]})") from None
    chat = ChatTokenizer(tokenizer, tags, turn_end=turn_end)
    first = next(iter_samples(inp, max_samples=1), None)  # schema check before any work
    if first is None:
        raise UserError(f"{inp}: no samples")
    total = sum(1 for _ in inp.open("rb")) if max_samples is None else max_samples
    lengths, truncated, written, masked, kept = [], 0, 0, 0, 0
    skipped = {"no_assistant_turn": 0, "no_loss_tokens_after_truncation": 0}
    unmasked_turns = 0
    with ProgressWriter(progress, "tokenize", total) as prog, atomic_output(out) as f:
        for n, (lineno, sample) in enumerate(iter_samples(inp, max_samples=max_samples), 1):
            try:
                ids, mask, unmasked = chat.encode(sample["messages"], sample.get("tools"))
            except UserError as exc:
                raise UserError(f"{inp}:{lineno}: {exc}") from None
            if not ids:
                skipped["no_assistant_turn"] += 1
            else:
                lengths.append(len(ids))
                if max_length is not None and len(ids) > max_length:
                    ids, mask = ids[:max_length], mask[:max_length]
                    truncated += 1
                if not any(mask):
                    skipped["no_loss_tokens_after_truncation"] += 1
                else:
                    f.write(json.dumps({"id": sample["id"], "input_ids": ids, "loss_mask": mask}) + "\n")
                    written += 1
                    masked += sum(mask)
                    kept += len(ids)
                    unmasked_turns += unmasked
            prog.update(n, written=written)
        if written == 0:
            raise UserError(f"{inp}: no sample has assistant tokens to train on ({skipped})")
        stats = {"input": str(inp), "output": str(out), "written": written, "max_length": max_length,
                 "length": length_stats(lengths), "truncated": truncated, "skipped": skipped,
                 "tokens": kept, "loss_tokens": masked, "history_turns_unmasked": unmasked_turns}
        prog.close(written=written)
    write_json(stats_path or out.with_name(out.name + ".stats.json"), stats)
    return stats


@step_main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="nodedeck-train tokenize", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="target model (or tokenizer) directory")
    p.add_argument("--input", required=True, help="schema JSONL (from prep or regen)")
    p.add_argument("--out", required=True, help="tokenized JSONL to write")
    p.add_argument("--max-length", type=int, help="truncate sequences to this many tokens")
    p.add_argument("--stats", help="length statistics JSON (default: OUT.stats.json)")
    p.add_argument("--think-start", default="<think>")
    p.add_argument("--think-end", default="</think>")
    p.add_argument("--turn-end", help="end-of-turn text the model emits (default: learnt from the template)")
    p.add_argument("--max-samples", type=int)
    p.add_argument("--progress", help="progress JSONL file (default $NODEDECK_PROGRESS)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own modelling/tokenizer code")
    args = p.parse_args(argv)
    stats = tokenize_file(args.model, args.input, args.out, max_length=args.max_length, stats_path=args.stats,
                          tags=ThinkTags(args.think_start, args.think_end), turn_end=args.turn_end,
                          max_samples=args.max_samples, progress=args.progress,
                          trust_remote_code=args.trust_remote_code)
    print(json.dumps({k: stats[k] for k in ("written", "truncated", "length", "loss_tokens")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
