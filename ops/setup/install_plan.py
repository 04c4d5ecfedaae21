"""What pip will install into a node's environment, and roughly how big it is, asked before installing.

`pip install --dry-run --report -` on the node resolves exactly what the install would (same requirements,
constraints and indexes) and lists each package with the URL it would come from; the node then gives each
file's size (a `file://` one from its disk, an http(s) one from the index's answer to a HEAD request). The
report and the sizes come from the node: parsed defensively, every text printable, sizes bounded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ops import nodejson
from ops.errors import HostError
from ops.hosts.base import Host
from ops.textsafe import printable
from ops.units import human_bytes

REPORT_MAX = 32 << 20      # a report bigger than this is not one pip wrote for a trainer's requirements
PACKAGES_MAX = 2000
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"

# Run by the node's python: a JSON list of URLs on stdin, a JSON list of sizes (null: unknown) on stdout.
_SIZES_PY = r"""
import json, os, sys, urllib.parse, urllib.request
from concurrent.futures import ThreadPoolExecutor
def size(url):
    u = urllib.parse.urlsplit(url)
    try:
        if u.scheme == "file":
            return os.path.getsize(urllib.parse.unquote(u.path))
        if u.scheme in ("http", "https"):
            req = urllib.request.Request(url, method="HEAD")
            with urllib.request.urlopen(req, timeout=10) as r:
                n = r.headers.get("Content-Length")
                return int(n) if n and n.isdigit() else None
    except Exception:
        return None
    return None
urls = json.loads(sys.stdin.read())
with ThreadPoolExecutor(8) as pool:
    print(json.dumps(list(pool.map(size, urls))))
"""


@dataclass(frozen=True)
class Package:
    name: str          # normalized: lower case, '-' for '_' and '.'
    version: str
    url: str
    size: int | None   # bytes to download, None when the node could not tell

    @property
    def cuda(self) -> bool:
        """One of the NVIDIA CUDA runtime wheels a CUDA build of torch pulls in."""
        return self.name.startswith("nvidia-")


@dataclass(frozen=True)
class InstallPlan:
    packages: tuple[Package, ...]

    def get(self, name: str) -> Package | None:
        return next((p for p in self.packages if p.name == name), None)

    @property
    def cuda(self) -> tuple[Package, ...]:
        return tuple(p for p in self.packages if p.cuda)

    @property
    def cuda_torch(self) -> bool:
        """The torch it installs is a CUDA build: it comes with NVIDIA's CUDA wheels (or says +cu in its version)."""
        torch = self.get("torch")
        return torch is not None and (bool(self.cuda) or "+cu" in torch.version)

    @staticmethod
    def size_text(packages: tuple[Package, ...]) -> str:
        known = [p.size for p in packages if p.size is not None]
        if not known:
            return "size unknown"
        text = f"about {human_bytes(sum(known))}"
        if len(known) == len(packages):
            return text
        return f"{text} for the {len(known)} of {len(packages)} whose size is known"

    def summary(self, where: str) -> str:
        """`pip will install N packages (about X to download) from WHERE: torch V (...), a 1.0, b 2.0 ...`."""
        if not self.packages:
            return "nothing to install: every requirement is already there"
        named = []
        torch = self.get("torch")
        if torch is not None:
            build = (f"a CUDA build, with {len(self.cuda)} nvidia-* package(s): {self.size_text(self.cuda)}"
                     if self.cuda_torch else "a CPU build" if "+cpu" in torch.version or not self.cuda else "")
            named.append(f"torch {torch.version}" + (f" ({build})" if build else ""))
        rest = [p for p in self.packages if p.name != "torch" and not p.cuda]
        named += [f"{p.name} {p.version}" for p in rest[:6]]
        if len(rest) > 6:
            named.append(f"and {len(rest) - 6} more")
        n = len(self.packages)
        return (f"pip will install {n} package{'' if n == 1 else 's'} ({self.size_text(self.packages)} to download) "
                f"from {where}: {', '.join(named)}")


class NoPlan(HostError):
    """pip could not say what it would install (too old for --dry-run --report, or it cannot resolve)."""


def _name(text: str) -> str:
    return text.lower().replace("_", "-").replace(".", "-")


def parse_report(data: bytes) -> list[tuple[str, str, str]]:
    """(name, version, url) of each package a pip installation report installs; NoPlan when it is no report."""
    if len(data) > REPORT_MAX:
        raise NoPlan(f"pip's report is over {REPORT_MAX >> 20} MiB")
    try:
        d: Any = nodejson.loads(data.decode("utf-8", "replace") or "null")
    except ValueError:
        raise NoPlan("pip printed no installation report") from None
    items = d.get("install") if isinstance(d, dict) else None
    if not isinstance(items, list) or len(items) > PACKAGES_MAX:
        raise NoPlan("pip's report lists no installation")
    out = []
    for item in items:
        meta = item.get("metadata") if isinstance(item, dict) else None
        info = item.get("download_info") if isinstance(item, dict) else None
        if not (isinstance(meta, dict) and isinstance(info, dict)):
            continue
        name, version, url = meta.get("name"), meta.get("version"), info.get("url")
        if isinstance(name, str) and isinstance(version, str) and isinstance(url, str):
            out.append((_name(printable(name, 100)), printable(version, 60), url[:4096]))
    return out


def install_plan(host: Host, python: str, pip_args: list[str], timeout: float) -> InstallPlan:
    """What `python -m pip install *pip_args` would install on the node, with each download's size."""
    res = host.run([python, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-",
                    "--disable-pip-version-check", "--no-input", *pip_args], timeout=timeout)
    if not res.ok:
        lines = (res.stderr + b"\n" + res.stdout).decode(errors="replace").splitlines()
        why = next((ln for ln in lines if ln.startswith("ERROR: ")), None) or next(
            (ln for ln in reversed(lines) if ln.strip()), f"exit {res.returncode}")
        raise NoPlan(printable(why, 300))
    found = parse_report(res.stdout)
    sizes: list[Any] = []
    if found:
        got = host.run([python, "-c", _SIZES_PY], input=json.dumps([u for _, _, u in found]).encode(), timeout=120)
        try:
            sizes = nodejson.loads(got.stdout[:1 << 20].decode(errors="replace")) if got.ok else []
        except ValueError:
            sizes = []
    if not isinstance(sizes, list) or len(sizes) != len(found):
        sizes = [None] * len(found)
    return InstallPlan(tuple(
        Package(name, version, url, s if isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 1 << 50
                else None)
        for (name, version, url), s in zip(found, sizes)))
