"""A fake model on 127.0.0.1 that makes a real coding agent call its own todo tools (the agent-client tier).

`ScriptedModel` speaks the two APIs the clients are pointed at, both streaming (server-sent events):
- OpenAI chat completions (`POST /v1/chat/completions`): opencode, through a custom provider
  (`@ai-sdk/openai-compatible`, `options.baseURL`);
- Anthropic Messages (`POST /v1/messages`): Claude Code, through `ANTHROPIC_BASE_URL`.
Each request that offers the model tools gets the next scripted tool call; a request offering none (a title, a
summary) or one made once the script ran out gets a short text, which ends the client's turn. The clients run with
this server as their HTTP(S) proxy too: whatever they try to reach beyond 127.0.0.1 arrives here, is refused and
kept in `outside`, so a test can say that a client reached nothing else.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import count


@dataclass(frozen=True)
class ToolCall:
    """One model turn: call tool `name` with `input`."""

    name: str
    input: dict


class ScriptedModel:
    """The fake model; `play(calls)` sets the turns of the next client run (a context manager: serving inside)."""

    def __init__(self) -> None:
        self.script: deque[ToolCall] = deque()
        self.outside: list[str] = []          # what a client tried to reach beyond 127.0.0.1 (refused)
        self.asked: list[str] = []            # the paths of the model requests, in order
        self._ids = count(1)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def play(self, calls: list[ToolCall]) -> None:
        with self._lock:
            self.script = deque(calls)

    def next_call(self, offers_tools: bool) -> tuple[int, ToolCall | None]:
        with self._lock:
            return next(self._ids), self.script.popleft() if offers_tools and self.script else None

    def __enter__(self) -> "ScriptedModel":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


def _openai(n: int, model: str, call: ToolCall | None) -> list[dict | str]:
    """A chat-completion stream: one delta with the tool call (or the text), then the finish reason."""
    if call is None:
        delta: dict = {"role": "assistant", "content": "Done."}
    else:
        delta = {"role": "assistant", "tool_calls": [{"index": 0, "id": f"call_{n}", "type": "function", "function": {
            "name": call.name, "arguments": json.dumps(call.input)}}]}
    head = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": 0, "model": model}
    return [{**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
            {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop" if call is None else "tool_calls"}],
             "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}},
            "[DONE]"]


def _anthropic(n: int, model: str, call: ToolCall | None) -> list[tuple[str, dict]]:
    """A Messages stream: message_start, one content block (tool_use with its input as JSON deltas, or text),
    message_delta with the stop reason, message_stop."""
    if call is None:
        block: dict = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": "Done."}
    else:
        block = {"type": "tool_use", "id": f"toolu_{n:04d}", "name": call.name, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(call.input)}
    message = {"id": f"msg_{n:04d}", "type": "message", "role": "assistant", "model": model, "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}
    return [("message_start", {"type": "message_start", "message": message}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "usage": {"output_tokens": 1},
                               "delta": {"stop_reason": "end_turn" if call is None else "tool_use",
                                         "stop_sequence": None}}),
            ("message_stop", {"type": "message_stop"})]


def _handler(fake: ScriptedModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _refuse(self, code: int) -> None:
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_CONNECT(self) -> None:          # a client's HTTPS request to anywhere, through its proxy
            fake.outside.append(f"CONNECT {self.path}")
            self._refuse(403)

        def do_GET(self) -> None:
            if not self.path.startswith("/"):  # a plain-HTTP request to anywhere, through the proxy
                fake.outside.append(f"GET {self.path}")
                self._refuse(403)
            else:
                self._refuse(404)

        def do_POST(self) -> None:
            if not self.path.startswith("/"):
                fake.outside.append(f"POST {self.path}")
                return self._refuse(403)
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            path = self.path.split("?")[0]
            if path not in ("/v1/chat/completions", "/v1/messages"):
                return self._refuse(404)
            fake.asked.append(path)
            n, call = fake.next_call(bool(body.get("tools")))
            model = str(body.get("model", "fake"))
            if path == "/v1/chat/completions":
                self._stream([(None, e) for e in _openai(n, model, call)])
            else:
                self._stream(_anthropic(n, model, call))

        def _stream(self, events) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            for name, data in events:
                text = data if isinstance(data, str) else json.dumps(data)
                self.wfile.write((f"event: {name}\n" if name else "").encode() + f"data: {text}\n\n".encode())
            self.wfile.flush()
            self.close_connection = True

    return Handler
