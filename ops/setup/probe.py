"""What a node has, asked of one of its Pythons: version, free disk, GPUs (driver, CUDA), torch.

The probe is a short stdlib script run by that Python on the node; it prints one JSON line after a
marker. A node is not trusted: every value is type-checked here and every string made printable
(`printable`), so nothing it says reaches the terminal raw.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ops.errors import HostError
from ops.hosts.base import Host
from ops.textsafe import shown

MARK = "NODEDECK-PROBE "

# Runs on the node's python (3.x, stdlib only). argv[1]: the work dir, whose disk is measured.
SCRIPT = r'''
import json, os, shutil, subprocess, sys
out = {"python": list(sys.version_info[:3]), "executable": sys.executable}
p = os.path.abspath(os.path.expanduser(sys.argv[1]))
while not os.path.exists(p) and p != os.path.dirname(p):
    p = os.path.dirname(p)
try:
    u = shutil.disk_usage(p)
    out["disk"] = {"path": p, "free": u.free, "total": u.total}
except OSError as e:
    out["disk_error"] = str(e)
try:
    from importlib import metadata
    out["torch_version"] = metadata.version("torch")
except Exception:
    out["torch_version"] = None
if out["torch_version"] is not None and "--torch" in sys.argv:
    try:
        import torch
        out["torch_file"] = getattr(torch, "__file__", None)
        out["torch_cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
    except Exception as e:
        out["torch_error"] = "%s: %s" % (type(e).__name__, e)
smi = shutil.which("nvidia-smi")
if smi:
    try:
        q = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        out["gpus"] = q.stdout.decode(errors="replace").splitlines()
        if q.returncode != 0:
            out["gpu_error"] = (q.stderr or q.stdout).decode(errors="replace").strip()[-300:]
        b = subprocess.run([smi], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        for word in b.stdout.decode(errors="replace").split("CUDA Version:")[1:2]:
            out["cuda"] = word.split()[0] if word.split() else None
    except Exception as e:
        out["gpu_error"] = "%s: %s" % (type(e).__name__, e)
else:
    out["gpus"] = None
print("NODEDECK-PROBE " + json.dumps(out))
'''


def printable(text: Any, limit: int = 300) -> str:
    """A node's text made safe to print (ops.textsafe.shown: control and bidi characters as escapes), cut at limit."""
    s = shown(text)
    return s if len(s) <= limit else s[: limit - 3] + "..."


@dataclass(frozen=True)
class InstalledGpu:
    name: str
    driver: str
    memory_mib: int | None


@dataclass(frozen=True)
class NodeFacts:
    """What the probe found; every string is printable."""

    python: tuple[int, int, int]
    executable: str
    disk_path: str | None
    disk_free: int | None
    disk_total: int | None
    gpus: tuple[InstalledGpu, ...] | None        # None: no nvidia-smi on the node's PATH
    gpu_error: str | None
    cuda: str | None                    # the driver's CUDA version (nvidia-smi's banner)
    torch_version: str | None
    torch_file: str | None
    torch_cuda: str | None
    torch_error: str | None

    @property
    def python_version(self) -> str:
        return ".".join(map(str, self.python))


def probe(host: Host, python: str, root: str, *, torch: bool = False, timeout: float = 120) -> NodeFacts:
    """Run the probe with `python` on host (torch: import torch to see its file and CUDA build)."""
    argv = [python, "-c", SCRIPT, root] + (["--torch"] if torch else [])
    res = host.run(argv, timeout=timeout)
    line = next((ln for ln in reversed(res.text.splitlines()) if ln.startswith(MARK)), None)
    if res.returncode != 0 or line is None:
        why = (res.stderr.decode(errors="replace").strip().splitlines() or [f"exit status {res.returncode}"])[-1]
        raise HostError(f"{host.name}: {printable(python)} could not run the probe: {printable(why)}")
    try:
        d = json.loads(line[len(MARK):])
    except ValueError:
        raise HostError(f"{host.name}: the probe printed no JSON") from None
    return _facts(d if isinstance(d, dict) else {})


def _str(v: Any) -> str | None:
    return printable(v) if isinstance(v, str) else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _facts(d: dict[str, Any]) -> NodeFacts:
    py = d.get("python")
    version = tuple(py[:3]) if isinstance(py, list) and len(py) >= 3 and all(_int(x) is not None for x in py[:3]) \
        else (0, 0, 0)
    found_disk = d.get("disk")
    disk: dict[str, Any] = found_disk if isinstance(found_disk, dict) else {}
    gpus: tuple[InstalledGpu, ...] | None = None
    if isinstance(d.get("gpus"), list):
        found = []
        for row in d["gpus"]:
            if not isinstance(row, str) or not row.strip():
                continue
            parts = [p.strip() for p in row.split(",")]
            mem = parts[2] if len(parts) > 2 else ""
            found.append(InstalledGpu(printable(parts[0], 80), printable(parts[1] if len(parts) > 1 else "?", 40),
                             int(mem) if mem.isdigit() else None))
        gpus = tuple(found)
    return NodeFacts(
        python=(int(version[0]), int(version[1]), int(version[2])),
        executable=_str(d.get("executable")) or "?",
        disk_path=_str(disk.get("path")),
        disk_free=_int(disk.get("free")),
        disk_total=_int(disk.get("total")),
        gpus=gpus,
        gpu_error=_str(d.get("gpu_error")),
        cuda=_str(d.get("cuda")),
        torch_version=_str(d.get("torch_version")),
        torch_file=_str(d.get("torch_file")),
        torch_cuda=_str(d.get("torch_cuda")),
        torch_error=_str(d.get("torch_error")),
    )
