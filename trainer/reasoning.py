"""Thinking spans: split model output into reasoning + answer, and rebuild a stored assistant turn
exactly as the model emits it after the generation prompt (Kimi-K2 / DeepSeek style).

For a thinking template the generation prompt already ends with the think-start tag, so the model
emits `reasoning + </think> + answer [+ tool calls] + <turn end>`. `emitted_text` rebuilds that
string from a stored turn; what the template adds for tool calls and the turn end is learnt from
the tokenizer's chat template by rendering a probe turn, so it works for any template that renders
an assistant's `content` verbatim. `check_turn` proves the rebuild against `apply_chat_template`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ops.errors import UserError

_PROBE = "\u2063NODEDECK-PROBE\u2063"


@dataclass(frozen=True)
class ThinkTags:
    start: str = "<think>"
    end: str = "</think>"


DEFAULT_TAGS = ThinkTags()


def split_reasoning(text: str, tags: ThinkTags = DEFAULT_TAGS, *, opened: bool = False) -> tuple[str | None, str]:
    """(reasoning or None, answer) from raw model text; lossless: `join_reasoning` inverts it.

    `opened`: the prompt already ended with the start tag, so the text begins inside the reasoning
    (an output cut before the end tag is all reasoning).
    """
    if not opened:
        stripped = text.lstrip()
        if not stripped.startswith(tags.start):
            return None, text
        text = stripped[len(tags.start):]
    if tags.end in text:
        reasoning, answer = text.split(tags.end, 1)
        return reasoning, answer
    return text, ""


def join_reasoning(reasoning: str | None, content: str, tags: ThinkTags = DEFAULT_TAGS) -> str:
    """`<think>` + reasoning + `</think>` + answer (an empty think block when reasoning is None)."""
    return f"{tags.start}{reasoning or ''}{tags.end}{content}"


def render(tokenizer, messages, *, add_generation_prompt: bool, tools=None) -> str:
    kwargs = {"tools": tools} if tools else {}
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
        )
    except Exception as exc:  # jinja errors from a template that rejects these messages
        raise UserError(f"chat template failed: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None


class TurnFormat:
    """What a tokenizer's template puts around an assistant turn, learnt by probe rendering."""

    def __init__(self, tokenizer, tags: ThinkTags = DEFAULT_TAGS, *, turn_end: str | None = None):
        self.tokenizer = tokenizer
        self.tags = tags
        self._turn_end = turn_end

    def _after_probe(self, history, tool_calls=None, tools=None) -> str:
        turn = {"role": "assistant", "content": _PROBE}
        if tool_calls:
            turn["tool_calls"] = tool_calls
        text = render(self.tokenizer, list(history) + [turn], add_generation_prompt=False, tools=tools)
        if _PROBE not in text:
            raise UserError("chat template does not render an assistant turn's content verbatim")
        return text[text.rindex(_PROBE) + len(_PROBE):]

    def turn_end(self, tools=None) -> str:
        """The marker the model emits to end its turn: the template's text after the content,
        up to and including its first special token (e.g. `<|im_end|>`), unless given.
        (Learnt once from a one-message history; with `tools`, for that tool list.)"""
        if self._turn_end is None or tools:
            after = self._after_probe([{"role": "user", "content": "x"}], tools=tools)
            specials = set(self.tokenizer.all_special_tokens) | set(self.tokenizer.get_added_vocab())
            first = min(((after.find(s), -len(s), s) for s in specials if s and s in after), default=None)
            end = after[: first[0] + len(first[2])] if first else after.rstrip()
            if tools:
                return end
            self._turn_end = end
        return self._turn_end

    def tool_calls_text(self, history, tool_calls, tools=None) -> str:
        """The template's rendering of a turn's tool calls (what follows the content)."""
        with_calls = self._after_probe(history, tool_calls, tools)
        plain = self._after_probe(history, None, tools)
        if not with_calls.endswith(plain):
            raise UserError("chat template renders tool calls in a way nodedeck cannot separate from the turn end")
        return with_calls[: len(with_calls) - len(plain)]

    def emitted_text(self, history, turn: dict, *, prompt: str | None = None, tools=None) -> str:
        """The exact text the model emits for `turn` after `render(history, add_generation_prompt=True)`."""
        if prompt is None:
            prompt = render(self.tokenizer, history, add_generation_prompt=True, tools=tools)
        tags, reasoning, content = self.tags, turn.get("reasoning_content"), turn.get("content") or ""
        bare = prompt.rstrip()
        if bare.endswith(tags.start):  # the prompt opened the think block already
            opened_ws = prompt[len(bare):]
            body = reasoning or ""
            if opened_ws and body.startswith(opened_ws):
                body = body[len(opened_ws):]
            body = f"{body}{tags.end}{content}"
        elif reasoning is not None:
            body = join_reasoning(reasoning, content, tags)
        else:
            body = content
        if turn.get("tool_calls"):
            body += self.tool_calls_text(history, turn["tool_calls"], tools)
        return body + self.turn_end(tools)


def check_turn(tokenizer, history, turn: dict, tags: ThinkTags = DEFAULT_TAGS, *, tools=None) -> list[int]:
    """Token ids of prompt + rebuilt turn; raise UserError unless they equal the template's ids."""
    fmt = TurnFormat(tokenizer, tags)
    prompt = render(tokenizer, history, add_generation_prompt=True, tools=tools)
    rebuilt = tokenizer.encode(prompt, add_special_tokens=False) + tokenizer.encode(
        fmt.emitted_text(history, turn, prompt=prompt, tools=tools), add_special_tokens=False
    )
    full = tokenizer.encode(
        render(tokenizer, list(history) + [turn], add_generation_prompt=False, tools=tools), add_special_tokens=False
    )
    if full[: len(rebuilt)] != rebuilt or tokenizer.decode(full[len(rebuilt):]).strip():
        at = next((i for i, (a, b) in enumerate(zip(rebuilt, full)) if a != b), min(len(rebuilt), len(full)))
        raise UserError(f"rebuilt turn differs from the chat template at token {at}: "
                        f"{tokenizer.decode(rebuilt[at:at + 8])!r} vs {tokenizer.decode(full[at:at + 8])!r}")
    return rebuilt
