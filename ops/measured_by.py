"""What produced a measured figure, as it names itself: `vLLM 0.32.0+cpu`, `nodedeck-train eval 0.1.0`.

The eval's result record names its harness; a server names itself in its log (vLLM's startup line).
Nothing is inferred from a command line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ops.textsafe import shown


@dataclass(frozen=True)
class Engine:
    """What produced a figure, as it names itself: `vLLM 0.32.0+cpu`, `nodedeck-train eval 0.1.0`."""

    name: str
    version: str

    def __str__(self) -> str:
        return f"{self.name} {self.version}"

    def to_json(self) -> dict:
        return {"name": self.name, "version": self.version}

    @classmethod
    def from_json(cls, doc) -> "Engine | None":
        """The engine a result record names (`{"name": ..., "version": ...}`), or None."""
        if not isinstance(doc, dict):
            return None
        name, version = doc.get("name"), doc.get("version")
        if not isinstance(name, str) or not isinstance(version, str) or not name.strip() or not version.strip():
            return None
        return cls(shown(name.strip()[:80]), shown(version.strip()[:80]))   # node text: never a raw escape


_VLLM_VERSION = re.compile(r"\bvLLM (?:API )?server version ([0-9][0-9A-Za-z.+_-]*)")


def engine_in_log(text: str) -> Engine | None:
    """The engine a server's log names, its last such line: vLLM's startup line `vLLM server version X,
    serving model M` (written so with VLLM_DISABLE_LOG_LOGO=1; older versions: `vLLM API server version X`)."""
    found = None
    for m in _VLLM_VERSION.finditer(text):
        found = Engine("vLLM", m.group(1)[:80])
    return found


_DEVICE = re.compile(r"\bAutomatically detected platform (\w+)\.|\b(CPU|GPU|XPU|TPU|HPU) KV cache usage")


def device_in_log(text: str) -> str | None:
    """The device a vLLM server runs on, as its log says (`Automatically detected platform cpu.` at startup, then
    `CPU KV cache usage` in its stats lines), upper-cased: `CPU`, `CUDA`, `GPU`; None when the log does not say."""
    found = None
    for m in _DEVICE.finditer(text):
        found = (m.group(1) or m.group(2)).upper()[:16]
    return found
