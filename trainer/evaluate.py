"""Acceptance length of a trained drafter against its target, by greedy speculative decoding.

    python -m trainer.evaluate --target DIR --drafter EXPORT_DIR (--data heldout.jsonl | --prompts FILE)
        --out eval.json [--max-new-tokens 128] [--num-prompts 20] [--num-draft-tokens K] [--compare-untrained]

Each round the drafter proposes tokens after the newest one (EAGLE-3: a greedy chain of K tokens,
default the TTT length; DFlash: one block of K + 1 slots as vLLM queries it, default K = block
size - 1), the target scores them in one forward pass (KV cache), the longest prefix matching the
target's greedy choices is kept plus the target's next token. Accept length per round = accepted
+ 1 (the range 1..K+1, as SGLang reports).
Plain greedy decoding of the same prompts gives the baseline tokens/s and a correctness check:
speculative output must equal greedy output (`matches_greedy`).

Prompts: --data takes a tokenized JSONL and uses each sample's tokens before its first loss-masked
token; --prompts takes JSONL objects with "messages" (chat template), "prompt" (a user message
through the chat template when there is one, else raw text) or "input_ids".
JSON written: mode, target, drafter, engine {name, version}, num_prompts, max_new_tokens, num_draft_tokens,
dtype, prompts_sha256 (the prompts' token ids), d2t_sha256 (EAGLE-3: the vocab map decoded with),
mean_accept_len (pooled over rounds), mean_accept_len_per_prompt, rounds and accepted (pooled),
per_position_acceptance (position i: the share of rounds whose draft i was accepted, as vLLM's
`num_accepted_tokens_per_pos / num_drafts`), tokens_per_s, baseline_tokens_per_s, speedup,
greedy_match_rate, per_prompt[...], and with --compare-untrained `untrained` {mean_accept_len,
tokens_per_s, per_prompt_accept_len}.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import inspect
import json
import sys
import time
from pathlib import Path

import torch

from ops.errors import UserError
from ops.setup.wheel import version
from trainer.cli import step_main
from trainer.export import load_export
from trainer.jsonl import write_json
from trainer.models import init_drafter
from trainer.models.dflash import DFlashDrafter
from trainer.models.target import LayerCapture, load_embed_and_head
from trainer.progress import ProgressWriter
from trainer.prompts import prompts_from_file, prompts_from_tokenized, prompts_sha256


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _new_cache(target):
    from transformers import DynamicCache  # lazy: transformers: 1.4 s to import

    return DynamicCache(config=target.config)


@functools.lru_cache(maxsize=None)
def _cache_kwarg(model_type: type[torch.nn.Module]) -> str:
    """`cache` in newer transformers, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model_type.forward).parameters else "past_key_values"


def _forward(target: torch.nn.Module, ids: torch.Tensor, cache):
    # every class is hashable; mypy does not see type[Module] as Hashable (lru_cache's argument type)
    return target(input_ids=ids, use_cache=True, **{_cache_kwarg(type(target)): cache})  # type: ignore[arg-type]


def _crop(cache, keep: int) -> None:
    """Drop cached positions past `keep` (a negative count works on transformers 4.x and 5.x)."""
    extra = cache.get_seq_length() - keep
    if extra > 0:
        cache.crop(-extra)


@torch.no_grad()
def greedy_decode(target, prompt: list[int], max_new: int, eos: set[int]) -> list[int]:
    device = next(target.parameters()).device
    cache = _new_cache(target)
    out = _forward(target, torch.tensor([prompt], device=device), cache)
    new = [int(out.logits[0, -1].argmax())]
    while len(new) < max_new and new[-1] not in eos:
        out = _forward(target, torch.tensor([[new[-1]]], device=device), cache)
        new.append(int(out.logits[0, -1].argmax()))
    return new


@torch.no_grad()
def speculative_decode(target, capture: LayerCapture, drafter, prompt: list[int], max_new: int, eos: set[int],
                       k: int) -> tuple[list[int], list[int]]:
    """(new tokens, accept length of each round) of greedy speculative decoding."""
    device = next(target.parameters()).device
    cache = _new_cache(target)
    out = _forward(target, torch.tensor([prompt], device=device), cache)
    feats = capture.features()
    tokens = list(prompt) + [int(out.logits[0, -1].argmax())]
    rounds: list[int] = []
    while len(tokens) - len(prompt) < max_new and tokens[-1] not in eos:
        if isinstance(drafter, DFlashDrafter):
            drafts = drafter.draft(feats.to(torch.float32), tokens[-1], k).tolist()
        else:
            nxt = torch.tensor([tokens[1:]], device=device)
            drafts = drafter.draft(feats.to(torch.float32), nxt, k).tolist()
        block = torch.tensor([[tokens[-1]] + drafts], device=device)
        out = _forward(target, block, cache)
        preds = out.logits[0].argmax(-1).tolist()
        a = 0
        while a < len(drafts) and drafts[a] == preds[a]:
            a += 1
        new = drafts[:a] + [preds[a]]
        stop = next((j for j, t in enumerate(new) if t in eos), None)
        if stop is not None:
            new = new[: stop + 1]
        feats = torch.cat([feats, capture.features()[:, : a + 1]], dim=1)
        tokens += new
        _crop(cache, len(tokens) - 1)
        rounds.append(a + 1)
    return tokens[len(prompt):][:max_new], rounds


def per_position(rounds: list[int], k: int) -> list[float]:
    """Position i (0..k-1): the share of rounds whose draft i was accepted (accept length - 1 > i)."""
    return [sum(r - 1 > i for r in rounds) / len(rounds) if rounds else 0.0 for i in range(k)]


def d2t_sha256(d2t: torch.Tensor) -> str:
    """The vocab map's digest as an export stores it (int64, little-endian): `ops.gap` reads the served one."""
    return hashlib.sha256(d2t.detach().cpu().to(torch.int64).numpy().astype("<i8").tobytes()).hexdigest()


def _timed(fn, device):
    _sync(device)
    t0 = time.perf_counter()
    result = fn()
    _sync(device)
    return result, time.perf_counter() - t0


def evaluate_drafter(target, drafter, prompts, *, max_new: int, k: int, eos: set[int], baseline: bool = True,
                     progress=None) -> dict:
    """Speculative decoding of every prompt; returns the summary and per-prompt records.

    `progress`: a ProgressWriter (unit prompts) advanced once per prompt, or None."""
    device = next(target.parameters()).device
    capture = LayerCapture(target, drafter.cfg.aux_layer_ids if hasattr(drafter.cfg, "aux_layer_ids")
                           else drafter.cfg.target_layer_ids)
    per_prompt, all_rounds = [], []
    spec_tokens = spec_time = base_tokens = base_time = 0.0
    matches = 0
    try:
        for pid, prompt in prompts:
            (new,
             rounds), dt = _timed(lambda: speculative_decode(target, capture, drafter, prompt, max_new, eos, k), device)
            rec = {"id": pid, "prompt_tokens": len(prompt), "new_tokens": len(new), "rounds": len(rounds),
                   "accept_len": sum(rounds) / len(rounds) if rounds else 1.0, "tokens_per_s": len(new) / max(dt, 1e-9)}
            spec_tokens, spec_time = spec_tokens + len(new), spec_time + dt
            all_rounds += rounds
            if baseline:
                ref, bdt = _timed(lambda: greedy_decode(target, prompt, max_new, eos), device)
                n = min(len(ref), len(new))
                rec["matches_greedy"] = ref[:n] == new[:n] and len(ref) == len(new)
                rec["baseline_tokens_per_s"] = len(ref) / max(bdt, 1e-9)
                matches += rec["matches_greedy"]
                base_tokens, base_time = base_tokens + len(ref), base_time + bdt
            per_prompt.append(rec)
            if progress is not None:
                progress.advance()
    finally:
        capture.close()
    summary = {
        "num_prompts": len(per_prompt),
        "mean_accept_len": sum(all_rounds) / len(all_rounds) if all_rounds else 1.0,
        "mean_accept_len_per_prompt": sum(r["accept_len"] for r in per_prompt) / max(len(per_prompt), 1),
        "rounds": len(all_rounds),
        "accepted": sum(all_rounds) - len(all_rounds),
        "per_position_acceptance": per_position(all_rounds, k),
        "tokens_per_s": spec_tokens / max(spec_time, 1e-9),
        "per_prompt": per_prompt,
    }
    if baseline:
        summary["baseline_tokens_per_s"] = base_tokens / max(base_time, 1e-9)
        summary["speedup"] = summary["tokens_per_s"] / max(summary["baseline_tokens_per_s"], 1e-9)
        summary["greedy_match_rate"] = matches / max(len(per_prompt), 1)
    return summary


def untrained_like(drafter, target_dir, seed: int = 0):
    """The drafter training would start from (same config and frozen target weights)."""
    embed, head = load_embed_and_head(target_dir)
    if isinstance(drafter, DFlashDrafter):
        fresh = init_drafter(drafter.cfg, embed, head, seed=seed)
    else:
        fresh = init_drafter(drafter.cfg, embed, head, d2t=drafter.d2t.cpu(), t2d=drafter.t2d.cpu(), seed=seed)
    return fresh.eval()


def engine_identity() -> dict[str, str]:
    """What measured the figures, as the Outcome panel names it: this harness, its nodedeck version, and the
    transformers and torch it decodes with."""
    import transformers  # lazy: transformers: 1.4 s to import

    return {"name": "nodedeck-train eval",
            "version": f"{version()} (transformers {transformers.__version__}, torch {torch.__version__})"}


def _eos_ids(target, tokenizer) -> set[int]:
    eos = set()
    for src in (getattr(target, "generation_config", None), target.config):
        value = getattr(src, "eos_token_id", None) if src is not None else None
        eos |= set(value if isinstance(value, list) else [value] if value is not None else [])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    return eos


@step_main
def main(argv=None) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: transformers: 1.4 s to import

    p = argparse.ArgumentParser(prog="nodedeck-train eval", description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--drafter", required=True, help="export directory (OUT/final of a training run)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="held-out tokenized JSONL (prompt = tokens before the first trained token)")
    src.add_argument("--prompts", help="JSONL with messages / prompt / input_ids")
    p.add_argument("--out", required=True, help="result JSON")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--num-draft-tokens", type=int, help="EAGLE-3 chain length (default its TTT length); "
                   "DFlash: at most block size - 1")
    p.add_argument("--compare-untrained", action="store_true", help="also evaluate the untrained drafter")
    p.add_argument("--no-baseline", action="store_true", help="skip plain greedy decoding")
    p.add_argument("--device", help="torch device (default cuda when available)")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], help="target dtype (default bfloat16 on CUDA)")
    p.add_argument("--device-map", help="spread a target larger than one GPU over the visible GPUs (e.g. auto)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own modelling/tokenizer code")
    p.add_argument("--progress", help="progress JSONL file (default $NODEDECK_PROGRESS)")
    args = p.parse_args(argv)
    if args.max_new_tokens < 1 or args.num_prompts < 1:
        raise UserError("--max-new-tokens and --num-prompts must be at least 1")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = {"bfloat16": torch.bfloat16,
             "float32": torch.float32}[args.dtype or ("bfloat16" if device.type == "cuda" else "float32")]
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.target, trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError):
        tokenizer = None
    try:
        target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype, device_map=args.device_map,
                                                      trust_remote_code=args.trust_remote_code)
        # transformers types PreTrainedModel.to through a decorator that loses `self`: mypy reads the device as it
        target = (target if args.device_map else target.to(device)).eval()  # type: ignore[arg-type]
    except (OSError, ValueError) as exc:
        raise UserError(f"{args.target}: cannot load the target ({str(exc).splitlines()[0]})") from None
    drafter = load_export(args.drafter, args.target).to(device)
    if args.data:
        prompts = prompts_from_tokenized(args.data, args.num_prompts)
    else:
        prompts = prompts_from_file(args.prompts, tokenizer, args.num_prompts)
    if not prompts:
        raise UserError(f"{args.data or args.prompts}: no usable prompts")
    if isinstance(drafter, DFlashDrafter):
        k = min(args.num_draft_tokens or drafter.cfg.block_size - 1, drafter.cfg.block_size - 1)
    else:
        k = args.num_draft_tokens or drafter.cfg.ttt_length
    if k < 1:
        raise UserError("--num-draft-tokens must be at least 1")
    eos = _eos_ids(target, tokenizer)
    # one unit per prompt evaluated: the trained drafter's pass, then the untrained one's when compared
    passes = 2 if args.compare_untrained else 1
    with ProgressWriter(args.progress, "eval", len(prompts) * passes, unit="prompts") as prog:
        result = {"mode": "dflash" if isinstance(drafter, DFlashDrafter) else "eagle3", "target": args.target,
                  "drafter": args.drafter, "max_new_tokens": args.max_new_tokens, "num_draft_tokens": k,
                  "engine": engine_identity(), "dtype": str(dtype).removeprefix("torch."),
                  "prompts_sha256": prompts_sha256(prompts),
                  **({} if isinstance(drafter, DFlashDrafter) else {"d2t_sha256": d2t_sha256(drafter.d2t)}),
                  **evaluate_drafter(target, drafter, prompts, max_new=args.max_new_tokens, k=k, eos=eos,
                                     baseline=not args.no_baseline, progress=prog)}
        if args.compare_untrained:
            fresh = untrained_like(drafter, args.target).to(device)
            u = evaluate_drafter(target, fresh, prompts, max_new=args.max_new_tokens, k=k, eos=eos, baseline=False,
                                 progress=prog)
            result["untrained"] = {"mean_accept_len": u["mean_accept_len"], "tokens_per_s": u["tokens_per_s"],
                                   "per_prompt_accept_len": [r["accept_len"] for r in u["per_prompt"]]}
    write_json(Path(args.out), result)
    print(json.dumps({k: result[k] for k in ("mode", "num_prompts", "mean_accept_len", "tokens_per_s")
                      if k in result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
