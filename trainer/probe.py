"""The acceptance a running engine serves on the eval's own prompts, greedy, for the Outcome's side by side.

    nodedeck-train probe --base-url http://127.0.0.1:8124 (--data tokenized.jsonl | --prompts FILE --target DIR)
        --out served.json [--num-prompts 20] [--max-new-tokens 128] [--model NAME]

The prompts are the ones `nodedeck-train eval` picks with the same flags (the same `prompts_sha256`), sent one at a
time, as token ids, at temperature 0:
- vLLM: `/v1/completions`; the spec-decode counters of `/metrics` read before and after each request (drafts,
  accepted tokens, accepted per position): on a server nothing else is using, they are this request's;
- SGLang: `/generate` with `input_ids`; each response's `meta_info` (`spec_verify_ct` rounds,
  `spec_num_correct_drafts` accepted, `spec_num_proposed_drafts` proposed). SGLang exposes no per-position count.
The engine names itself (`/version`, else `/get_server_info`'s `version`).
JSON written: mode "probe", server, engine {name, version}, base_url, num_prompts, max_new_tokens, prompts_sha256,
greedy (true), served_accept_len (1 + accepted / rounds, as the eval's mean), rounds, accepted, accept_rate,
num_draft_tokens, per_position_acceptance (vLLM), per_prompt [{id, rounds, accepted, new_tokens}].
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from ops.errors import UserError
from trainer.cli import step_main
from trainer.jsonl import write_json
from trainer.progress import ProgressWriter
from trainer.prompts import prompts_from_file, prompts_from_tokenized, prompts_sha256

MAX_BODY = 8 << 20
DRAFTS, DRAFT_TOKENS = "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED, PER_POS = "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of a /metrics page by name (the Prometheus client's own parser); UserError when it is not one."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    except ValueError as e:
        raise UserError(f"/metrics is not in Prometheus text format ({e})") from None
    return out


class Server:
    """A vLLM or SGLang server at base_url, asked over plain HTTP (its port is the node's own)."""

    def __init__(self, base_url: str, timeout: float):
        self.base = base_url.rstrip("/")
        self.timeout = timeout

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.base + path, timeout=self.timeout) as r:
            return r.read(MAX_BODY)

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=self.timeout) as r:
            doc = json.loads(r.read(MAX_BODY))
        if not isinstance(doc, dict):
            raise UserError(f"{self.base}{path}: the answer is not a JSON object")
        return doc

    def counters(self) -> dict[str, float]:
        """vLLM's spec-decode counters now, summed over replicas (per position as `pos:<i>`)."""
        samples = _samples(self.get("/metrics").decode(errors="replace"))
        out = {name: sum(v for _, v in samples.get(name, [])) for name in (DRAFTS, DRAFT_TOKENS, ACCEPTED)}
        for labels, value in samples.get(PER_POS, []):
            if labels.get("position", "").isdigit():
                key = f"pos:{labels['position']}"
                out[key] = out.get(key, 0.0) + value
        return out

    def engine(self, kind: str) -> dict[str, str]:
        for path in ("/version", "/get_server_info"):
            try:
                version = json.loads(self.get(path)).get("version")
            except (urllib.error.URLError, OSError, ValueError, AttributeError):
                continue
            if isinstance(version, str) and version.strip():
                return {"name": {"vllm": "vLLM", "sglang": "SGLang"}[kind], "version": version.strip()[:80]}
        return {"name": {"vllm": "vLLM", "sglang": "SGLang"}[kind], "version": "unknown"}


def _model(server: Server, given: str | None) -> str:
    if given:
        return given
    data = json.loads(server.get("/v1/models")).get("data") or [{}]
    return str(data[0].get("id") or "default")


def probe_vllm(server: Server, model: str, pid: str, prompt: list[int], max_new: int) -> tuple[dict, dict[str, float]]:
    """One prompt through vLLM: its record and the counters' increase."""
    before = server.counters()
    out = server.post("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_new, "temperature": 0.0,
                                          "return_token_ids": True})
    after = server.counters()
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    choice = (out.get("choices") or [{}])[0]
    new = len(choice.get("token_ids") or []) or int((out.get("usage") or {}).get("completion_tokens") or 0)
    return {"id": pid, "rounds": int(delta[DRAFTS]), "accepted": int(delta[ACCEPTED]), "new_tokens": new}, delta


def probe_sglang(server: Server, pid: str, prompt: list[int], max_new: int) -> tuple[dict, int]:
    """One prompt through SGLang: its record (from meta_info) and the draft tokens proposed."""
    out = server.post("/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": max_new,
                                                                             "temperature": 0.0}})
    meta = out.get("meta_info") or {}
    try:
        rec = {"id": pid, "rounds": int(meta["spec_verify_ct"]), "accepted": int(meta["spec_num_correct_drafts"]),
               "new_tokens": int(meta.get("completion_tokens") or 0)}
        return rec, int(meta.get("spec_num_proposed_drafts") or 0)
    except (KeyError, TypeError, ValueError):
        raise UserError(f"{server.base}/generate: meta_info has no spec_verify_ct / spec_num_correct_drafts "
                        "(is the server speculating?)") from None


def probe(server: Server, prompts: list[tuple[str, list[int]]], max_new: int, model: str | None,
          progress=None) -> dict:
    """Every prompt through the server, one at a time; the summary record (module docstring)."""
    names = _samples(server.get("/metrics").decode(errors="replace"))
    kind = next((k for k in ("sglang", "vllm") if any(n.startswith(f"{k}:") for n in names)), None)
    if kind is None:
        raise UserError(f"{server.base}/metrics: neither vLLM's nor SGLang's metrics")
    per_prompt: list[dict] = []
    proposed, positions = 0.0, dict[int, float]()
    name = _model(server, model) if kind == "vllm" else ""
    for pid, prompt in prompts:
        if kind == "vllm":
            rec, delta = probe_vllm(server, name, pid, prompt, max_new)
            proposed += delta[DRAFT_TOKENS]
            for key, v in delta.items():
                if key.startswith("pos:"):
                    positions[int(key[4:])] = positions.get(int(key[4:]), 0.0) + v
        else:
            rec, n = probe_sglang(server, pid, prompt, max_new)
            proposed += n
        per_prompt.append(rec)
        if progress is not None:
            progress.advance()
    rounds = sum(r["rounds"] for r in per_prompt)
    accepted = sum(r["accepted"] for r in per_prompt)
    if rounds <= 0:
        raise UserError(f"{server.base}: no speculative rounds were counted (is the server speculating, and is "
                        "nothing else using it?)")
    return {"mode": "probe", "server": kind, "engine": server.engine(kind), "base_url": server.base,
            "num_prompts": len(per_prompt), "max_new_tokens": max_new, "greedy": True,
            "served_accept_len": 1 + accepted / rounds, "rounds": rounds, "accepted": accepted,
            "accept_rate": accepted / proposed if proposed else None,
            "num_draft_tokens": round(proposed / rounds) if proposed else None,
            "per_position_acceptance": [positions[i] / rounds for i in sorted(positions)],
            "per_prompt": per_prompt}


@step_main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="nodedeck-train probe", description=__doc__.splitlines()[0])
    p.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8124")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="tokenized JSONL, as the eval's --data")
    src.add_argument("--prompts", help="JSONL with messages / prompt / input_ids, as the eval's --prompts")
    p.add_argument("--target", help="the target's directory, for its tokenizer (--prompts with text)")
    p.add_argument("--out", required=True, help="result JSON")
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--model", help="the served model's name (default: the first of /v1/models)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")
    p.add_argument("--progress", help="progress JSONL file (default $NODEDECK_PROGRESS)")
    args = p.parse_args(argv)
    if args.max_new_tokens < 1 or args.num_prompts < 1:
        raise UserError("--max-new-tokens and --num-prompts must be at least 1")
    if args.data:
        prompts = prompts_from_tokenized(args.data, args.num_prompts)
    else:
        tokenizer = None
        if args.target:
            from transformers import AutoTokenizer  # lazy: transformers: 1.4 s to import

            tokenizer = AutoTokenizer.from_pretrained(args.target)
        prompts = prompts_from_file(args.prompts, tokenizer, args.num_prompts)
    if not prompts:
        raise UserError(f"{args.data or args.prompts}: no usable prompts")
    server = Server(args.base_url, args.timeout)
    try:
        with ProgressWriter(args.progress, "probe", len(prompts), unit="prompts") as prog:
            result = probe(server, prompts, args.max_new_tokens, args.model, prog)
    except (urllib.error.URLError, OSError) as e:
        raise UserError(f"{args.base_url}: {getattr(e, 'reason', None) or e}") from None
    result["prompts_sha256"] = prompts_sha256(prompts)
    write_json(Path(args.out), result)
    print(json.dumps({k: result[k] for k in ("server", "num_prompts", "served_accept_len", "rounds")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
