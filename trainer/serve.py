"""A small OpenAI-compatible server for a transformers causal LM (CPU or one GPU), SGLang-style telemetry.

Endpoints: `GET /health` (200 once the model is loaded, 503 while loading), `GET /health_generate`
(runs a one-token generation), `GET /v1/models`, `POST /v1/chat/completions` (non-streaming; the
chat template with the generation prompt; greedy at temperature 0, else sampled; `<think>...</think>`
split into `message.reasoning_content`), `GET /get_server_info` (and `/server_info`), and
`GET /metrics` (Prometheus text, SGLang metric names). Concurrent requests with the same sampling
settings are batched (up to --max-running-requests) by one engine thread; the rest wait in a queue.
While busy it logs SGLang-format lines every --log-interval seconds:

    [2026-09-27 09:20:28 TP0] Decode batch, #running-req: N, #token: N, token usage: X,
        gen throughput (token/s): X, #queue-req: N   (one line)

Generation is one function, `hf_generate(model, tokenizer, prompts, params, on_step)`; pass another
with the same signature to `ServeEngine(generate_fn=...)` (e.g. speculative decoding).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ops.errors import UserError
from trainer.cli import step_main
from trainer.progress import ProgressWriter
from trainer.reasoning import ThinkTags, split_reasoning

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0

    @property
    def batch_key(self):
        return (self.temperature, self.top_p)


@dataclass
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    enqueued: float = field(default_factory=time.monotonic)


def hf_generate(model, tokenizer, prompts: list[list[int]], params: SamplingParams, on_step) -> list[list[int]]:
    """Batched `model.generate` (left padding); `on_step(n_active)` is called after each decode step.
    Returns each prompt's completion ids, ending at (and including) the first eos when one was produced."""
    import torch  # lazy: torch: 2.5 s to import, only for a real model
    from transformers import StoppingCriteria, StoppingCriteriaList  # lazy: transformers: 1.4 s to import

    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(eos_ids), 0)
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):] = torch.tensor(p)
        mask[r, width - len(p):] = 1
    done = torch.zeros(len(prompts), dtype=torch.bool)

    class Counter(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            nonlocal done
            active = int((~done).sum())
            if eos_ids:
                done = done | torch.isin(input_ids[:, -1].cpu(), torch.tensor(sorted(eos_ids)))
            on_step(active)
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    device = next(model.parameters()).device
    kwargs = dict(max_new_tokens=params.max_new_tokens, pad_token_id=pad,
                  stopping_criteria=StoppingCriteriaList([Counter()]))
    if params.temperature > 0:
        kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=0)
    else:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    with torch.no_grad():
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **kwargs)
    completions = []
    for row in out[:, width:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))
        completions.append(row[:end])
    return completions


class Metrics:
    """SGLang-named Prometheus metrics in a private registry."""

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name, "tp_rank": "0"}
        names = list(labels)

        def gauge(name, doc):
            return Gauge(name, doc, names, registry=self.registry).labels(**labels)

        def counter(name, doc):
            return Counter(name, doc, names, registry=self.registry).labels(**labels)

        self.gen_throughput = gauge("sglang:gen_throughput", "The generation throughput (token/s).")
        self.num_running_reqs = gauge("sglang:num_running_reqs", "The number of running requests.")
        self.num_queue_reqs = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.token_usage = gauge("sglang:token_usage", "The token usage (fraction of the token budget).")
        self.num_used_tokens = gauge("sglang:num_used_tokens", "The number of used tokens.")
        self.prompt_tokens = counter("sglang:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("sglang:generation_tokens", "Number of generation tokens processed.")
        self.num_requests = counter("sglang:num_requests", "Number of requests processed.")
        self.e2e_latency = Histogram(
            "sglang:e2e_request_latency_seconds", "End-to-end request latency in seconds.", names,
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 60, 120, 300), registry=self.registry).labels(**labels)

    def render(self) -> bytes:
        return generate_latest(self.registry)


@dataclass(frozen=True)
class ServedModel:
    """The model a ServeEngine serves and its tokenizer, once loaded."""
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase

    @property
    def context_length(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048) or 2048)

    def chat_prompt(self, messages: list, tools: list | None) -> str:
        """The chat template's text for `messages`, ending in the generation prompt."""
        if tools:
            prompt = self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                        add_generation_prompt=True)
        else:   # a remote-code template may take no `tools` at all
            prompt = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert isinstance(prompt, str)  # tokenize=False renders text
        return prompt

    def text(self, ids: list[int]) -> str:
        """One completion's ids as text, special tokens kept."""
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        assert isinstance(text, str)  # one sequence decodes to one string
        return text


class ServeEngine:
    """Loads the model, batches queued requests on one thread, keeps metrics and the decode log."""

    def __init__(self, model_dir, *, model_name: str | None = None, max_running: int = 8,
                 max_total_tokens: int | None = None, log_interval: float = 2.0, log=None,
                 device: str | None = None, dtype: str | None = None, threads: int | None = None,
                 generate_fn=hf_generate, tags: ThinkTags = ThinkTags(),
                 device_map: str | None = None, trust_remote_code: bool = False, progress=None):
        self.progress = progress  # a ProgressWriter (unit: requests served, total unknown), advanced per batch, or None
        self.model_dir = str(model_dir)
        self.model_name = model_name or self.model_dir
        self.max_running = max_running
        self.max_total_tokens = max_total_tokens
        self.log_interval = log_interval
        self.log = log or (lambda line: print(line, flush=True))
        self.device, self.dtype, self.threads = device, dtype, threads
        self.device_map, self.trust_remote_code = device_map, trust_remote_code
        self.generate_fn = generate_fn
        self.tags = tags
        self.metrics = Metrics(self.model_name)
        self._served: ServedModel | None = None
        self.load_error: str | None = None
        self.loaded = threading.Event()
        self._queue: list[Request] = []
        self._cond = threading.Condition()
        self._active = 0  # requests of the running batch still generating
        self._tokens_in_flight = 0
        self._window_tokens = 0
        self._window_start = time.monotonic()
        self._last_log = time.monotonic()
        self.last_gen_throughput = 0.0
        self._stop = False

    # -- lifecycle
    def start(self) -> None:
        threading.Thread(target=self._run, name="nodedeck-serve-engine", daemon=True).start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    def _load(self) -> None:
        import torch  # lazy: torch: 2.5 s to import, only for a real model
        from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: transformers: 1.4 s to import

        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if self.threads:
            torch.set_num_threads(self.threads)
        dtype = getattr(torch,
                        self.dtype) if self.dtype else (torch.bfloat16 if device.startswith("cuda") else torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(self.model_dir, trust_remote_code=self.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=dtype, device_map=self.device_map,
                                                     trust_remote_code=self.trust_remote_code)
        # transformers types PreTrainedModel.to through a decorator that loses `self`: mypy reads the device as it
        model = (model if self.device_map else model.to(device)).eval()  # type: ignore[arg-type]
        self._served = ServedModel(model, tokenizer)
        if self.max_total_tokens is None:
            self.max_total_tokens = self._served.context_length * self.max_running

    @property
    def served(self) -> ServedModel:
        """The loaded model; only asked for once `loaded` is set without a `load_error`."""
        if self._served is None:
            raise RuntimeError(f"{self.model_dir} is not loaded")
        return self._served

    # -- requests
    def submit(self, prompt_ids: list[int], params: SamplingParams) -> concurrent.futures.Future:
        req = Request(prompt_ids, params)
        with self._cond:
            self._queue.append(req)
            self.metrics.num_queue_reqs.set(len(self._queue))
            self._cond.notify_all()
        return req.future

    def _take_batch(self) -> list[Request]:
        head = self._queue[0]
        batch = [r for r in self._queue if r.params.batch_key == head.params.batch_key][: self.max_running]
        for r in batch:
            self._queue.remove(r)
        return batch

    def _run(self) -> None:
        try:
            self._load()
        except Exception as exc:  # reported through /health and the log
            self.load_error = f"{type(exc).__name__}: {exc}"
            self.log(f"{self._prefix()}failed to load {self.model_dir}: {self.load_error}")
            self.loaded.set()
            return
        self.loaded.set()
        self.log(f"{self._prefix()}loaded {self.model_dir} on {next(self.served.model.parameters()).device}")
        ticker = threading.Thread(target=self._tick, name="nodedeck-serve-log", daemon=True)
        ticker.start()
        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                batch = self._take_batch()
                self._active = len(batch)
                self._tokens_in_flight = sum(len(r.prompt_ids) for r in batch)
                self._publish_state()
                queued = len(self._queue)
            new_tokens = sum(len(r.prompt_ids) for r in batch)
            self.log(f"{self._prefix()}Prefill batch, #new-seq: {len(batch)}, #new-token: {new_tokens}, "
                     f"#cached-token: 0, token usage: {self._usage():.2f}, #running-req: {len(batch)}, "
                     f"#queue-req: {queued}")
            self.metrics.prompt_tokens.inc(new_tokens)
            self._generate(batch)

    def _generate(self, batch: list[Request]) -> None:
        params = SamplingParams(max(r.params.max_new_tokens for r in batch), batch[0].params.temperature,
                                batch[0].params.top_p)

        def on_step(active: int) -> None:
            with self._cond:
                self._active = active
                self._tokens_in_flight += active
                self._window_tokens += active
            self.metrics.generation_tokens.inc(active)
            self._publish_state()

        try:
            served = self.served
            outs, error = self.generate_fn(served.model, served.tokenizer, [r.prompt_ids for r in batch], params,
                                           on_step), None
        except Exception as exc:
            outs, error = None, exc
        # Counters and gauges first, answers last: a client woken by its answer already sees it counted.
        if error is None:
            now = time.monotonic()
            for r in batch:
                self.metrics.num_requests.inc()
                self.metrics.e2e_latency.observe(now - r.enqueued)
            if self.progress is not None:
                self.progress.advance(len(batch))
        with self._cond:
            self._active = 0
            self._tokens_in_flight = 0
            self._publish_state()
        for i, r in enumerate(batch):
            if error is None:
                r.future.set_result(outs[i][: r.params.max_new_tokens])
            else:
                r.future.set_exception(error)

    # -- telemetry
    def _usage(self) -> float:
        return self._tokens_in_flight / self.max_total_tokens if self.max_total_tokens else 0.0

    def _publish_state(self) -> None:
        self.metrics.num_running_reqs.set(self._active)
        self.metrics.num_queue_reqs.set(len(self._queue))
        self.metrics.num_used_tokens.set(self._tokens_in_flight)
        self.metrics.token_usage.set(round(self._usage(), 4))

    @staticmethod
    def _prefix() -> str:
        return time.strftime("[%Y-%m-%d %H:%M:%S TP0] ")

    def _tick(self) -> None:
        while not self._stop:
            time.sleep(min(self.log_interval, 0.5))
            now = time.monotonic()
            if now - self._last_log < self.log_interval:
                continue
            with self._cond:
                tokens, self._window_tokens = self._window_tokens, 0
                elapsed = max(now - self._window_start, 1e-9)
                self._window_start = self._last_log = now
                running, queued, in_flight = self._active, len(self._queue), self._tokens_in_flight
            self.last_gen_throughput = tokens / elapsed
            self.metrics.gen_throughput.set(round(self.last_gen_throughput, 2))
            if running or queued or tokens:
                self.log(f"{self._prefix()}Decode batch, #running-req: {running}, #token: {in_flight}, "
                         f"token usage: {self._usage():.2f}, gen throughput (token/s): {self.last_gen_throughput:.2f}, "
                         f"#queue-req: {queued}")


# ---- HTTP ----------------------------------------------------------------------------------------

def _error(status: int, message: str, kind: str = "invalid_request_error"):
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


def _sampling(body: dict, context: int, prompt_len: int) -> SamplingParams:
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:
        max_tokens = min(256, context - prompt_len)
    temperature = body.get("temperature", 1.0)
    top_p = body.get("top_p", 1.0)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ValueError("max_tokens must be a positive integer")
    if not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError("temperature must be a number >= 0")
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ValueError("top_p must be in (0, 1]")
    if prompt_len + max_tokens > context:
        raise ValueError(f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) "
                         f"exceeds the context length {context}")
    return SamplingParams(max_tokens, float(temperature), float(top_p))


def make_app(engine: ServeEngine):
    """The aiohttp application serving `engine`."""
    routes = web.RouteTableDef()

    def not_ready():
        if engine.load_error:
            return web.json_response({"status": "error", "error": engine.load_error}, status=503)
        if not engine.loaded.is_set():
            return web.json_response({"status": "loading"}, status=503)
        return None

    @routes.get("/health")
    async def health(request):
        return not_ready() or web.json_response({"status": "ok"})

    @routes.get("/health_generate")
    async def health_generate(request):
        if (resp := not_ready()) is not None:
            return resp
        ids = engine.served.tokenizer.encode("ok", add_special_tokens=False) or [0]
        await asyncio.wrap_future(engine.submit(ids, SamplingParams(1)))
        return web.json_response({"status": "ok"})

    @routes.get("/v1/models")
    async def models(request):
        return web.json_response({"object": "list", "data": [
            {"id": engine.model_name, "object": "model", "created": int(time.time()), "owned_by": "nodedeck",
             "root": engine.model_dir}]})

    @routes.get("/metrics")
    async def metrics(request):
        return web.Response(body=engine.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4"})

    @routes.get("/get_server_info")
    @routes.get("/server_info")
    async def server_info(request):
        return web.json_response({"model_path": engine.model_dir, "served_model_name": engine.model_name,
                                  "max_running_requests": engine.max_running,
                                  "max_total_num_tokens": engine.max_total_tokens,
                                  "internal_states": [{"last_gen_throughput": engine.last_gen_throughput}]})

    @routes.post("/v1/chat/completions")
    async def chat(request):
        if (resp := not_ready()) is not None:
            return resp
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "request body is not valid JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            return _error(400, "messages must be a non-empty list")
        if body.get("model") not in (None, engine.model_name, engine.model_dir):
            return _error(404, f"model {body.get('model')!r} is not served here (serving {engine.model_name!r})",
                          "model_not_found")
        if body.get("stream"):
            return _error(400, "stream=true is not supported by this server")
        if body.get("n", 1) != 1:
            return _error(400, "only n=1 is supported")
        served = engine.served
        try:
            prompt = served.chat_prompt(body["messages"], body.get("tools"))
            prompt_ids = served.tokenizer.encode(prompt, add_special_tokens=False)
            params = _sampling(body, served.context_length, len(prompt_ids))
        except ValueError as exc:
            return _error(400, str(exc))
        except Exception as exc:  # template errors on messages it rejects
            return _error(400, f"chat template failed: {type(exc).__name__}: {exc}")
        try:
            out = await asyncio.wrap_future(engine.submit(prompt_ids, params))
        except Exception as exc:
            return _error(500, f"generation failed: {type(exc).__name__}: {exc}", "server_error")
        eos = served.model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos])
        stopped = bool(out) and out[-1] in eos_ids
        text = served.text(out[:-1] if stopped else out)
        opened = prompt.rstrip().endswith(engine.tags.start)
        reasoning, content = split_reasoning(text, engine.tags, opened=opened)
        message = {"role": "assistant", "content": content}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        return web.json_response({
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": engine.model_name,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop" if stopped else "length"}],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(out),
                      "total_tokens": len(prompt_ids) + len(out)},
        })

    app = web.Application(client_max_size=64 * 2**20)
    app.add_routes(routes)
    return app


class BackgroundServer:
    """Run `make_app(engine)` on 127.0.0.1 in a thread (tests, benchmarks); `.url`, `.stop()`."""

    def __init__(self, engine: ServeEngine, host: str = "127.0.0.1", port: int = 0):
        self.engine = engine
        self._loop = asyncio.new_event_loop()
        self._runner = web.AppRunner(make_app(engine))
        self._loop.run_until_complete(self._runner.setup())
        sock = socket.create_server((host, port))
        self.port = sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self._loop.run_until_complete(web.SockSite(self._runner, sock).start())
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        engine.start()

    def stop(self) -> None:
        self.engine.stop()
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@step_main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="nodedeck-train serve", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model directory (transformers)")
    p.add_argument("--port", type=int, default=30000, help="0 picks a free port (printed in the log)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--served-model-name", help="model id reported and accepted (default: the --model path)")
    p.add_argument("--log", help="append the server log here (default: stdout)")
    p.add_argument("--log-interval", type=float, default=2.0, help="seconds between decode log lines while busy")
    p.add_argument("--max-running-requests", type=int, default=8)
    p.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--threads", type=int, help="torch CPU threads (small models on busy CPUs run best with 1)")
    p.add_argument("--think-start", default="<think>")
    p.add_argument("--think-end", default="</think>")
    p.add_argument("--device-map", help="spread a target larger than one GPU over the visible GPUs (e.g. auto)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own modelling/tokenizer code")
    p.add_argument("--progress", help="progress JSONL file: requests served (default $NODEDECK_PROGRESS)")
    args = p.parse_args(argv)
    if not (Path(args.model) / "config.json").is_file():
        raise UserError(f"{args.model}: not a model directory (no config.json)")

    log_file = open(args.log, "a", buffering=1, encoding="utf-8") if args.log else sys.stdout

    def log(line: str) -> None:
        print(line, file=log_file, flush=True)

    engine = ServeEngine(args.model, model_name=args.served_model_name, max_running=args.max_running_requests,
                    log_interval=args.log_interval, log=log, device=args.device, dtype=args.dtype,
                    threads=args.threads, device_map=args.device_map, trust_remote_code=args.trust_remote_code,
                    tags=ThinkTags(args.think_start, args.think_end),
                    progress=ProgressWriter(args.progress, "serve", None, unit="prompts"))  # requests served
    try:
        sock = socket.create_server((args.host, args.port))
    except OSError as exc:
        raise UserError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    log(f"{engine._prefix()}listening on http://{args.host}:{sock.getsockname()[1]}")
    engine.progress.start()
    engine.start()
    try:
        web.run_app(make_app(engine), sock=sock, print=None, handle_signals=True)
    finally:
        engine.stop()
        engine.progress.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
