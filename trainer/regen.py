"""Response regeneration: ask the target model (an OpenAI-compatible server) for the assistant turns of
prompt-only samples, so the drafter trains on the target's own outputs.

For each prompt-only sample the user turns are answered one after another (each request carries the
conversation so far); the answer becomes an assistant turn with `content` and `reasoning_content`
(read from `message.reasoning_content` or `message.reasoning`). Target-native samples are copied
through. Output lines are written whole and flushed as samples complete (in completion order);
a rerun skips ids already in the output and appends. The `openai` client sends the requests and retries
them (--retries) with exponential backoff and jitter on connection errors, timeouts, 408, 409, 429 and
5xx; other 4xx answers fail that sample only (recorded in OUT.errors.jsonl). Throughput JSONL: one record
per --window seconds. Why the `openai` client, and what it weighs: docs/regen.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import httpx
import openai

from ops.errors import HostError, UserError
from trainer.cli import step_main
from trainer.progress import ProgressWriter
from trainer.schema import iter_samples


class ServerGaveUp(HostError):
    """The server stayed unreachable or failing through every retry."""


class RequestRejected(Exception):
    """A 4xx answer other than 429: retrying will not help."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class Throughput:
    """Windowed request and token rates, written as JSONL (`--throughput`)."""

    def __init__(self, path, window: float):
        self.path = Path(path) if path else None
        self.window = window
        self.start = self.window_start = time.monotonic()
        self.requests = self.tokens = self.prompt_tokens = 0
        self.total_requests = self.total_tokens = 0
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def add(self, completion_tokens: int, prompt_tokens: int) -> None:
        self.requests += 1
        self.tokens += completion_tokens
        self.prompt_tokens += prompt_tokens
        self.total_requests += 1
        self.total_tokens += completion_tokens

    def flush(self, *, in_flight: int, done: int, total: int, final: bool = False) -> dict:
        now = time.monotonic()
        span = max(now - self.window_start, 1e-9)
        record = {"ts": round(time.time(), 3), "step": "regen", "window_s": round(span, 3),
                  "requests": self.requests, "requests_per_s": round(self.requests / span, 3),
                  "completion_tokens": self.tokens, "tokens_per_s": round(self.tokens / span, 3),
                  "prompt_tokens": self.prompt_tokens, "in_flight": in_flight, "done": done, "total": total}
        if final:
            elapsed = max(now - self.start, 1e-9)
            record.update(final=True, total_requests=self.total_requests, total_completion_tokens=self.total_tokens,
                          mean_tokens_per_s=round(self.total_tokens / elapsed, 3),
                          mean_requests_per_s=round(self.total_requests / elapsed, 3))
        if self.path:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        self.window_start = now
        self.requests = self.tokens = self.prompt_tokens = 0
        return record


def done_ids(out: Path) -> set[str]:
    """Ids already in the output; a torn last line (a crash mid-write) is cut off."""
    if not out.exists():
        return set()
    ids, good_end = set(), 0
    with out.open("rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                break
            try:
                ids.add(json.loads(line)["id"])
            except (json.JSONDecodeError, KeyError, TypeError):
                raise UserError(f"{out}:{lineno}: not a regen output line; use another --out") from None
            good_end += len(line)
    if good_end != out.stat().st_size:
        with out.open("r+b") as f:
            f.truncate(good_end)
    return ids


class Client:
    """Chat completions through the `openai` client, which sends them and retries (its backoff, Retry-After);
    ours are what is sent, which errors fail one sample or stop the run, and the count of its retries."""

    def __init__(self, base_url: str, model: str, *, retries: int, request_timeout: float, concurrency: int,
                 api_key: str | None, log):
        self.base_url = base_url
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.log = log
        self.retried = 0
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        # trust_env=False: no HTTP(S)_PROXY of the node's environment between regen and the server beside it
        http = openai.DefaultAsyncHttpxClient(limits=limits, event_hooks={"request": [self._on_request]},
                                              trust_env=False)
        self.api = openai.AsyncOpenAI(base_url=base_url, api_key=api_key or "none", max_retries=retries,
                                      timeout=request_timeout, http_client=http)

    async def _on_request(self, request: httpx.Request) -> None:
        retry = _retry_number(request)
        if retry:
            self.retried += 1
            if retry == 1 or retry % 4 == 0:
                self.log(f"regen: retry {retry} of {request.method} {request.url}")

    async def complete(self, messages: list, params: dict) -> dict:
        """The response as the server sent it; raises RequestRejected or ServerGaveUp."""
        try:
            return (await self.api.chat.completions.create(model=self.model, messages=messages, **params)).to_dict()
        except openai.APIStatusError as exc:
            if exc.status_code < 500 and exc.status_code not in (408, 409, 429):   # what the client does not retry
                raise RequestRejected(exc.status_code, _error_message(exc.body)) from None
            raise self._gave_up(exc.request, f"HTTP {exc.status_code}: {_error_message(exc.body)}") from None
        except openai.APIConnectionError as exc:   # APITimeoutError too
            cause = exc.__cause__
            raise self._gave_up(exc.request, f"{type(cause).__name__}: {cause}" if cause else str(exc)) from None
        except (json.JSONDecodeError, AttributeError):   # (the client hands a body not declared JSON over as text)
            raise RequestRejected(200, "the server answered 200 with a body that is not a JSON object") from None

    def _gave_up(self, request: httpx.Request, problem: str) -> ServerGaveUp:
        return ServerGaveUp(f"{self.url}: gave up after {_retry_number(request) + 1} attempts ({_one_line(problem)});"
                            " rerun the same command to resume")

    async def check_model(self) -> None:
        """Refuse a model the server does not list; pass when it has no /models or is not up yet."""
        try:
            served = [str(m.id) async for m in self.api.with_options(max_retries=0).models.list()]
        except (openai.APIError, ValueError, AttributeError, TypeError):
            return
        if served and self.model not in served:
            raise UserError(f"{self.base_url}: model {self.model!r} is not served there "
                            f"(served: {', '.join(served)})")


def _retry_number(request: httpx.Request) -> int:
    """Which retry of its call this request is (0: the first attempt), as the openai client numbers it."""
    value = request.headers.get("x-stainless-retry-count", "0")
    return int(value) if value.isdigit() else 0


def _error_message(body: object) -> str:
    """An error answer's message (the client hands over `error` of `{"error": {...}}`), on one line."""
    message = body.get("message", body) if isinstance(body, dict) else body
    return _one_line(str(message or "(empty body)"))[:300]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def assistant_turn(response: dict) -> tuple[dict, str | None, dict]:
    """(assistant message, finish_reason, usage) from a chat completion response."""
    try:
        choice = response["choices"][0]
        msg = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise RequestRejected(200, f"response has no choices[0].message: {str(response)[:200]}") from None
    turn = {"role": "assistant", "content": msg.get("content") or ""}
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if isinstance(reasoning, str):
        turn["reasoning_content"] = reasoning
    if msg.get("tool_calls"):
        turn["tool_calls"] = msg["tool_calls"]
    return turn, choice.get("finish_reason"), response.get("usage") or {}


async def regenerate_sample(client: Client, sample: dict, params: dict, throughput: Throughput) -> dict:
    """The sample with each user turn answered by the target (prompt-only), or as it is."""
    if sample["kind"] != "prompt-only":
        return sample
    conversation, finish = [], []
    for m in sample["messages"]:
        conversation.append(m)
        if m["role"] != "user":
            continue
        response = await client.complete(conversation, params)
        turn, reason, usage = assistant_turn(response)
        throughput.add(int(usage.get("completion_tokens") or 0), int(usage.get("prompt_tokens") or 0))
        conversation.append(turn)
        finish.append(reason)
    return {**sample, "kind": "target-native", "messages": conversation,
            "regen": {"model": client.model, "finish_reasons": finish}}


async def run(inp, out, *, base_url: str, model: str, concurrency: int = 128, max_samples=None,
              max_tokens=None, temperature=None, top_p=None, retries: int = 8,
              request_timeout: float = 600.0, api_key=None, progress=None,
              throughput=None, window: float = 10.0, log=print) -> dict:
    """Regenerate `inp` into `out` (appending, resumable); return a summary."""
    inp, out = Path(inp), Path(out)
    if concurrency < 1:
        raise UserError("--concurrency must be at least 1")
    finished = done_ids(out)
    todo_total = already = 0  # schema check before work; `already`: done by an earlier run (progress starts there)
    for _, sample in iter_samples(inp, max_samples=max_samples):
        todo_total += 1
        already += sample["id"] in finished
    if todo_total == 0:
        raise UserError(f"{inp}: no samples")
    params = {k: v for k, v in (("max_tokens", max_tokens), ("temperature", temperature), ("top_p", top_p))
              if v is not None}
    errors_path = out.with_name(out.name + ".errors.jsonl")
    summary = {"written": 0, "already_done": 0, "failed": 0, "passed_through": 0, "truncated": 0}
    meter = Throughput(throughput, window)
    in_flight = 0
    queue: asyncio.Queue = asyncio.Queue(maxsize=2 * concurrency)
    out.parent.mkdir(parents=True, exist_ok=True)
    with ProgressWriter(progress, "regen", todo_total, done=already) as prog, out.open("a", encoding="utf-8") as f, \
            open(errors_path, "a", encoding="utf-8") as errf:
        client = Client(base_url, model, retries=retries, request_timeout=request_timeout, concurrency=concurrency,
                        api_key=api_key, log=log)
        async with client.api:
            await client.check_model()

            def count_done() -> int:
                return summary["written"] + already + summary["failed"]

            async def worker():
                nonlocal in_flight
                while (sample := await queue.get()) is not None:
                    in_flight += 1
                    try:
                        result = await regenerate_sample(client, sample, params, meter)
                    except RequestRejected as exc:
                        summary["failed"] += 1
                        errf.write(json.dumps({"id": sample["id"], "error": str(exc)}) + "\n")
                        errf.flush()
                        if summary["failed"] == 1:
                            log(f"regen: sample {sample['id']} failed: {exc} (see {errors_path})")
                    else:
                        f.write(json.dumps(result, ensure_ascii=False) + "\n")
                        f.flush()
                        summary["written"] += 1
                        summary["passed_through"] += result is sample
                        summary["truncated"] += "length" in result.get("regen", {}).get("finish_reasons", [])
                    finally:
                        in_flight -= 1
                    prog.update(count_done(), written=summary["written"], failed=summary["failed"],
                                retries=client.retried)

            async def ticker():
                while True:
                    await asyncio.sleep(window)
                    meter.flush(in_flight=in_flight, done=count_done(), total=todo_total)

            async def producer():
                for _, sample in iter_samples(inp, max_samples=max_samples):
                    if sample["id"] in finished:
                        summary["already_done"] += 1
                    else:
                        await queue.put(sample)
                for _ in range(concurrency):
                    await queue.put(None)

            tasks = [asyncio.create_task(worker()) for _ in range(concurrency)] + [asyncio.create_task(producer())]
            tick = asyncio.create_task(ticker())
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
                for t in done:
                    if (exc := t.exception()) is not None:
                        raise exc
            finally:
                for t in [*tasks, tick]:
                    t.cancel()
                await asyncio.gather(*tasks, tick, return_exceptions=True)
        meter.flush(in_flight=0, done=count_done(), total=todo_total, final=True)
        summary["retries"] = client.retried
        prog.update(count_done())
        prog.close(**summary)
    if errors_path.stat().st_size == 0:
        errors_path.unlink()
    log(f"regen: {summary['written']} written, {summary['already_done']} already done, "
        f"{summary['failed']} failed, {client.retried} retries -> {out}")
    return summary


@step_main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="nodedeck-train regen", description=__doc__.splitlines()[0])
    p.add_argument("--input", required=True, help="schema JSONL with prompt-only samples")
    p.add_argument("--out", required=True, help="output JSONL (appended; a rerun resumes)")
    p.add_argument("--base-url", required=True, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:30000/v1")
    p.add_argument("--model", required=True, help="model name the server serves")
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--max-samples", type=int, help="only the first N input samples (smoke runs)")
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--retries", type=int, default=8)
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--api-key", default=os.environ.get("NODEDECK_API_KEY"))
    p.add_argument("--progress", help="progress JSONL file (default $NODEDECK_PROGRESS)")
    p.add_argument("--throughput", help="throughput JSONL file")
    p.add_argument("--window", type=float, default=10.0, help="seconds per throughput record")
    args = p.parse_args(argv)
    summary = asyncio.run(run(
        args.input, args.out, base_url=args.base_url, model=args.model, concurrency=args.concurrency,
        max_samples=args.max_samples, max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
        retries=args.retries, request_timeout=args.request_timeout, api_key=args.api_key, progress=args.progress,
        throughput=args.throughput, window=args.window, log=lambda m: print(m, file=sys.stderr)))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
