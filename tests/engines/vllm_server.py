"""A real vLLM OpenAI server (the CPU build in .venv-vllm) on a free loopback port, owned by one test."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def vllm_python() -> Path | None:
    """The Python vLLM is installed in: $NODEDECK_VLLM_PYTHON, else the repo's .venv-vllm, else None."""
    p = Path(os.environ.get("NODEDECK_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")
    return p if p.exists() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_env(**extra: str) -> dict[str, str]:
    """vLLM's environment: offline, small KV cache, stats logged every second."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                "VLLM_LOG_STATS_INTERVAL": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "TOKENIZERS_PARALLELISM": "false"})
    env.update(extra)
    return env


class VllmServer:
    """`python -m vllm.entrypoints.openai.api_server` on 127.0.0.1; its log in `log`; killed (group) on exit."""

    def __init__(self, model: Path, log: Path, *, speculative: dict | None = None, extra: tuple[str, ...] = (),
                 startup_s: float = 600.0):
        py = vllm_python()
        if py is None:
            raise RuntimeError("no vLLM Python: run `make .venv-vllm/.installed`")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = str(model)
        self.log = log
        self.argv = [str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                     "--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", "1024",
                     "--max-num-seqs", "8", "--seed", "0", "--dtype", "float32", "--enforce-eager", *extra]
        if speculative is not None:
            self.argv += ["--speculative-config", json.dumps(speculative)]
        self.startup_s = startup_s
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> VllmServer:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=engine_env(),
                                     start_new_session=True, cwd=self.log.parent)
        out.close()
        deadline = time.monotonic() + self.startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        self.__exit__(None, None, None)
        raise RuntimeError(f"vLLM did not become healthy in {self.startup_s:.0f}s:\n{self.tail()}")

    def __exit__(self, *exc) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        except ProcessLookupError:
            pass

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as r:
            return r.read().decode()

    def complete(self, prompt: list[int], max_tokens: int, *, ignore_eos: bool = False) -> dict:
        """Greedy completion of a token-id prompt (the EOS tokens of the model's generation config stop it,
        unless `ignore_eos`)."""
        body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                           "return_token_ids": True, "ignore_eos": ignore_eos}).encode()
        req = urllib.request.Request(f"{self.url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.loads(r.read())
