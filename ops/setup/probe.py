"""What a node has, asked of one of its Pythons: version, free disk, GPUs (driver, CUDA), torch.

The probe is a short stdlib script run by that Python on the node; it prints one JSON line after a
marker. A node is not trusted: every value is type-checked here and every string made printable
(`printable`), so nothing it says reaches the terminal raw, and every number goes through ops.nodenum: a value
that is not one (nvidia-smi's memory `8²`, a free disk of 400 digits) is None, and named in `invalid`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ops import nodejson, nodenum
from ops.errors import HostError
from ops.hosts.base import Host
from ops.textsafe import last_line, printable

MARK = "NODEDECK-PROBE "
PROBE_BYTES = 1 << 20
"""The most of the probe's output kept: its JSON line is a few KiB."""

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


PYTHON_PART = nodenum.Whole("Python version", 0, 10_000)
GPU_MEMORY = nodenum.MIB.named("GPU memory")


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
    invalid: tuple[str, ...] = ()
    """Each value the node sent that is no number of its field (`invalid GPU memory 8²`)."""

    @property
    def python_version(self) -> str:
        return ".".join(map(str, self.python))


def probe(host: Host, python: str, root: str, *, torch: bool = False, timeout: float = 120) -> NodeFacts:
    """Run the probe with `python` on host (torch: import torch to see its file and CUDA build)."""
    argv = [python, "-c", SCRIPT, root] + (["--torch"] if torch else [])
    res = host.run(argv, timeout=timeout, max_output=PROBE_BYTES)
    line = next((ln for ln in reversed(res.text.splitlines()) if ln.startswith(MARK)), None)
    if res.returncode != 0 or line is None:
        why = last_line(res.stderr) or f"exit status {res.returncode}"
        raise HostError(f"{host.name}: {printable(python)} could not run the probe: {why}")
    try:
        d = nodejson.loads(line[len(MARK):])
    except ValueError:
        raise HostError(f"{host.name}: the probe printed no JSON") from None
    return _facts(d if isinstance(d, dict) else {})


def _str(v: Any) -> str | None:
    return printable(v) if isinstance(v, str) else None


class _Numbers:
    """The probe's numbers, each through its field; what is not one is None here and noted in `invalid`."""

    def __init__(self) -> None:
        self.invalid: list[str] = []

    def get(self, field: nodenum.Whole, raw: Any) -> int | None:
        if raw is None:
            return None
        try:
            return field.from_json(raw)
        except nodenum.Invalid as e:
            self.invalid.append(str(e))
            return None

    def memory(self, raw: str) -> int | None:
        try:
            return int(GPU_MEMORY.parse(raw))
        except nodenum.Invalid as e:
            self.invalid.append(str(e))
            return None


def _facts(d: dict[str, Any]) -> NodeFacts:
    nums = _Numbers()
    py = d.get("python")
    parts = [n for x in (py[:3] if isinstance(py, list) else ()) if (n := nums.get(PYTHON_PART, x)) is not None]
    version = (parts[0], parts[1], parts[2]) if len(parts) == 3 else (0, 0, 0)
    found_disk = d.get("disk")
    disk: dict[str, Any] = found_disk if isinstance(found_disk, dict) else {}
    gpus: tuple[InstalledGpu, ...] | None = None
    if isinstance(d.get("gpus"), list):
        found = []
        for row in d["gpus"]:
            if not isinstance(row, str) or not row.strip():
                continue
            cells = [p.strip() for p in row.split(",")]
            mem = cells[2] if len(cells) > 2 else ""
            found.append(InstalledGpu(printable(cells[0], 80), printable(cells[1] if len(cells) > 1 else "?", 40),
                                      nums.memory(mem) if mem else None))
        gpus = tuple(found)
    return NodeFacts(
        python=version,
        executable=_str(d.get("executable")) or "?",
        disk_path=_str(disk.get("path")),
        disk_free=nums.get(nodenum.BYTES.named("free disk"), disk.get("free")),
        disk_total=nums.get(nodenum.BYTES.named("total disk"), disk.get("total")),
        gpus=gpus,
        gpu_error=_str(d.get("gpu_error")),
        cuda=_str(d.get("cuda")),
        torch_version=_str(d.get("torch_version")),
        torch_file=_str(d.get("torch_file")),
        torch_cuda=_str(d.get("torch_cuda")),
        torch_error=_str(d.get("torch_error")),
        invalid=tuple(nums.invalid),
    )
