"""What a plan's server and benchmark commands serve and measure, read from the command line as the engine's own
parser takes it (ops.plan.command_words): the target, the drafter export, the draft length, dtype, chat template;
a benchmark's endpoint (chat template applied or raw text) and temperature.

vLLM: `vllm serve MODEL` (or `python -m vllm.entrypoints.openai.api_server --model MODEL`) with
`--speculative-config` as JSON, its dotted sub-options (`--speculative-config.model X`) or the `--spec-*` shortcuts;
`num_speculative_tokens` is K. SGLang: `python -m sglang.launch_server --model-path MODEL --speculative-algorithm
EAGLE3|DFLASH --speculative-draft-model-path D`; K is `--speculative-num-steps` (EAGLE-3, top-k 1), or the DFlash
block size (`--speculative-dflash-block-size`, `--speculative-num-draft-tokens`) - 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ops import nodejson
from ops.plan.command_words import flags_of, split_commands, tool_of, vllm_option

VLLM_SERVERS = ("vllm serve", "vllm.entrypoints.openai.api_server")
SGLANG_SERVER = "sglang.launch_server"
SGLANG_BENCH = ("sglang.bench_serving", "sglang.benchmark.serving")
_SPEC_SHORTCUTS = {"--spec-method": "method", "--spec-model": "model", "--spec-tokens": "num_speculative_tokens"}


def speculative_config(flags: list[tuple[str, str | None]]) -> dict:
    """vLLM's speculative config from a command's options (JSON, dotted sub-options, shortcuts), later ones
    winning; ValueError naming the text when --speculative-config is not JSON."""
    spec: dict = {}
    for name, value in flags:
        name = vllm_option(name)
        if value is None:
            continue
        if name in _SPEC_SHORTCUTS:
            spec[_SPEC_SHORTCUTS[name]] = value
        elif name in ("--speculative-config", "-sc"):
            try:
                loaded = nodejson.loads(value)
            except ValueError:
                raise ValueError(f"--speculative-config is not JSON: {value[:80]}") from None
            if isinstance(loaded, dict):
                spec.update(loaded)
        elif name.startswith("--speculative-config."):
            spec[name.split(".", 1)[1]] = value
    return spec


def _int(value) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None


@dataclass(frozen=True)
class ServerCommand:
    """A server stage's command: the engine and what it serves."""

    engine: Literal["vllm", "sglang"]
    target: str | None
    method: str | None
    """`eagle3`, `dflash`, ... (lower case); None: no speculation."""
    drafter: str | None
    """The drafter export directory."""
    num_draft_tokens: int | None
    """K, the drafts per round; None when the command leaves it to the engine."""
    block_size: int | None
    """A DFlash block size the command names (SGLang); None otherwise."""
    dtype: str
    """As given (`auto` when not: the target's own)."""
    chat_template: str | None
    """`--chat-template` (a file or the template), None: the target's tokenizer's."""


def server_command(command: str) -> ServerCommand | None:
    """The vLLM or SGLang server in a command line, or None when it runs neither."""
    for cmd in split_commands(command):
        tool, start = tool_of(cmd.words)
        args = cmd.words[start:]
        flags = flags_of(args)
        given = {vllm_option(k): v for k, v in flags}
        if tool in VLLM_SERVERS:
            target = given.get("--model")
            if tool == "vllm serve" and cmd.words[start - 1] != "serve":
                target = cmd.words[start - 1]            # vllm serve MODEL
            try:
                spec = speculative_config(flags)
            except ValueError:
                spec = {}
            method = str(spec["method"]).lower() if spec.get("method") else None
            return ServerCommand("vllm", target, method, spec.get("model"),
                                 _int(spec.get("num_speculative_tokens")), None, given.get("--dtype") or "auto",
                                 given.get("--chat-template"))
        if tool == SGLANG_SERVER:
            algo = given.get("--speculative-algorithm")
            method = algo.lower() if algo else None
            block = _int(given.get("--speculative-dflash-block-size") or given.get("--speculative-num-draft-tokens"))
            if method == "dflash":
                k = block - 1 if block else None
            else:
                k, block = _int(given.get("--speculative-num-steps")), None
            return ServerCommand("sglang", given.get("--model-path") or given.get("--model"), method,
                                 given.get("--speculative-draft-model-path"), k, block, given.get("--dtype") or "auto",
                                 given.get("--chat-template"))
    return None


@dataclass(frozen=True)
class BenchCommand:
    """A benchmark stage's command: whether its prompts go through the chat template, and whether it decodes
    greedily (None: not known)."""

    chat: bool
    greedy: bool | None


def bench_command(command: str) -> BenchCommand | None:
    """`vllm bench serve` or SGLang's bench_serving in a command line, or None."""
    for cmd in split_commands(command):
        tool, start = tool_of(cmd.words)
        given = dict(flags_of(cmd.words[start:]))
        if tool == "vllm bench serve":
            endpoint = given.get("--endpoint") or ""
            chat = "chat" in (given.get("--backend") or "") or endpoint.endswith("/chat/completions")
            temp = given.get("--temperature")
            try:
                greedy = None if temp is None else float(temp) == 0.0
            except ValueError:
                greedy = None
            return BenchCommand(chat, greedy)
        if tool in SGLANG_BENCH:
            chat = "--apply-chat-template" in given or "chat" in (given.get("--backend") or "")
            return BenchCommand(chat, True)          # SGLang's benchmark decodes greedily (temperature 0)
    return None
