"""What the node was: GPUs, driver/CUDA, CPU, RAM, disks, OS, Python packages, tmux, processes.

One remote script; each section runs guarded (a time limit, its exit status
recorded), so a missing tool is written down instead of failing the capture.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Iterator

from ops import nodenum
from ops.errors import HostError
from ops.hosts.base import Host, join_argv
from ops.textsafe import last_line, printable

SECTION_TIMEOUT = 60

# (name, title, shell command); $PY is the node's python
SECTIONS: tuple[tuple[str, str, str], ...] = (
    ("gpu_query", "GPUs (nvidia-smi --query-gpu)",
     "nvidia-smi --query-gpu=index,name,memory.total,driver_version,pci.bus_id --format=csv,noheader"),
    ("gpu", "GPUs (nvidia-smi -q)", "nvidia-smi -q"),
    ("nvidia_smi", "nvidia-smi", "nvidia-smi"),
    ("nvcc", "CUDA toolkit (nvcc --version)", "nvcc --version"),
    ("cpu", "CPU (lscpu)", "lscpu"),
    ("memory", "Memory (/proc/meminfo)", "cat /proc/meminfo"),
    ("disks", "Disks (df)", "df -P -B1 -x tmpfs -x devtmpfs -x squashfs -x overlay 2>/dev/null || df -P -B1"),
    ("os", "OS (/etc/os-release)", "cat /etc/os-release"),
    ("kernel", "Kernel (uname -a)", "uname -a"),
    ("python", "Python ($PY --version)", '"$PY" --version'),
    ("pip", "Python packages ($PY -m pip freeze)", '"$PY" -m pip freeze'),
    ("tmux", "tmux sessions (nodedeck's server, then the default one)",
     "tmux -L nodedeck list-sessions; tmux -L default list-sessions"),
    ("processes", "Processes (ps)", "ps -eo pid,ppid,user,etime,pcpu,pmem,rss,args --sort=-pcpu"),
)


def _script(marker: str, python: str) -> str:
    lines = [f"export PY={join_argv([python])} LC_ALL=C"]
    lines.append('if command -v timeout >/dev/null; then T="timeout %d"; else T=""; fi' % SECTION_TIMEOUT)
    for name, _, cmd in SECTIONS:
        first = cmd.split()[0].strip('"')
        lines.append(f"printf '%s BEGIN {name}\\n'" % marker)
        if first.startswith("$"):
            check = 'command -v "$PY" >/dev/null'
            missing = 'echo "$PY: not found"'
        else:
            check = f"command -v {first} >/dev/null"
            missing = f"echo '{first}: not found on this node'"
        lines.append(f"if {check}; then $T bash -c {join_argv([cmd])} 2>&1; rc=$?; else {missing}; rc=127; fi")
        lines.append(f"printf '\\n%s END {name} %%s\\n' \"$rc\"" % marker)
    return "\n".join(lines) + "\n"


@dataclass
class Section:
    name: str
    title: str
    command: str
    rc: int | None
    output: str


@dataclass(frozen=True)
class GpuRow:
    """One line of `nvidia-smi --query-gpu` (fields it did not give are "")."""

    index: str
    name: str
    memory: str
    driver: str
    bus_id: str


@dataclass(frozen=True)
class DiskRow:
    """One mounted file system, from df (bytes)."""

    filesystem: str
    size: int
    used: int
    avail: int
    mount: str


@dataclass(frozen=True)
class SystemSummary:
    """The headline facts of a capture (None where unknown)."""

    gpus: tuple[GpuRow, ...]
    gpu_note: str | None  # why there is no GPU list
    driver: str | None
    cuda: str | None
    cuda_toolkit: str | None
    cpu: str | None
    cpus: int | None
    ram_bytes: int | None
    os: str | None
    kernel: str | None
    python: str | None
    packages: int | None  # lines of pip freeze
    tmux_sessions: tuple[str, ...]
    disks: tuple[DiskRow, ...]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class SystemInfo:
    node: str
    captured_at: float
    sections: dict[str, Section] = field(default_factory=dict)
    error: str | None = None

    def summary(self) -> SystemSummary:
        """The headline facts, parsed from the sections (None where unknown)."""
        gpus_text = self._ok("gpu_query")
        gpus = tuple(GpuRow(*(p.strip() for p in (line.split(",") + [""] * 4)[:5]))
                     for line in (gpus_text or "").splitlines() if line.strip())
        cpu = self._ok("cpu") or ""
        cuda = re.search(r"CUDA Version:\s*([\d.]+)", self._ok("nvidia_smi") or "")
        toolkit = re.search(r"release ([\d.]+)", self._ok("nvcc") or "")
        model = re.search(r"^Model name:\s*(.+)$", cpu, re.M)
        cpus = re.search(r"^CPU\(s\):\s*(\d+)", cpu, re.M)
        ram = re.search(r"^MemTotal:\s*(\d+) kB", self._ok("memory") or "", re.M)
        os_name = re.search(r'^PRETTY_NAME="?([^"\n]+)"?', self._ok("os") or "", re.M)
        kernel = (self._ok("kernel") or "").split()
        pip = self._ok("pip")
        tmux = self._ok("tmux")
        return SystemSummary(
            gpus=gpus,
            gpu_note=None if gpus_text is not None else self._why("gpu_query"),
            driver=gpus[0].driver if gpus else None,
            cuda=cuda.group(1) if cuda else None,
            cuda_toolkit=toolkit.group(1) if toolkit else None,
            cpu=printable(model.group(1).strip(), 120) if model else None,
            cpus=nodenum.CPU_COUNT.get(cpus.group(1)) if cpus else None,
            ram_bytes=kib * 1024 if ram and (kib := nodenum.KIB.get(ram.group(1))) is not None else None,
            os=printable(os_name.group(1), 120) if os_name else None,
            kernel=kernel[2] if len(kernel) > 2 else None,
            python=(self._ok("python") or "").strip() or None,
            packages=len([x for x in pip.splitlines() if x.strip()]) if pip is not None else None,
            tmux_sessions=tuple(x.split(":", 1)[0] for x in (tmux or "").splitlines() if ":" in x),
            disks=_parse_df(self._ok("disks") or ""),
        )

    def _ok(self, name: str) -> str | None:
        s = self.sections.get(name)
        return s.output if s is not None and s.rc == 0 else None

    def _why(self, name: str) -> str:
        s = self.sections.get(name)
        if s is None:
            return "not captured"
        return last_line(s.output) or f"exit {s.rc}"

    def to_json(self) -> dict:
        return {
            "node": self.node,
            "captured_at": self.captured_at,
            "error": self.error,
            "summary": self.summary().to_json(),
            "sections": {n: {"title": s.title, "command": s.command, "rc": s.rc, "output": s.output}
                         for n, s in self.sections.items()},
        }

    def to_text(self) -> str:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.captured_at))
        out = [f"System information of node {self.node}, captured {stamp}", ""]
        if self.error:
            out += [f"CAPTURE INCOMPLETE: {self.error}", ""]
        for s in self.sections.values():
            known = {0: "ok", 127: "not available", 124: f"timed out after {SECTION_TIMEOUT}s"}
            status = "exit status unknown" if s.rc is None else known.get(s.rc, f"exit {s.rc}")
            out += [f"===== {s.title} [{status}] =====", f"$ {s.command}", s.output.rstrip(), ""]
        return "\n".join(out)


def _parse_df(text: str) -> tuple[DiskRow, ...]:
    """df's rows whose sizes are sizes (ops.nodenum); any other line is left out."""
    disks = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        sizes = [n for p in parts[1:4] if (n := nodenum.BYTES.get(p)) is not None]
        if len(parts) >= 6 and len(sizes) == 3:
            disks.append(DiskRow(parts[0], sizes[0], sizes[1], sizes[2], " ".join(parts[5:])))
    return tuple(disks)


def _sections(text: str, marker: str) -> Iterator[tuple[str, str, int | None]]:
    """(name, output, exit status) of each `MARKER BEGIN name` ... `MARKER END name rc` in text, in one pass over its
    lines (a regex over the whole text rescanned it from every BEGIN left open: quadratic in what the node sent)."""
    begin, end = f"{marker} BEGIN ", f"{marker} END "
    name: str | None = None
    body: list[str] = []
    for line in text.split("\n"):
        if line.startswith(begin):
            name, body = line[len(begin):], []
        elif name is not None and line.startswith(f"{end}{name} "):
            yield name, "\n".join(body), nodenum.EXIT_STATUS.get(line[len(end) + len(name) + 1:])
            name = None
        elif name is not None:
            body.append(line)


def capture(host: Host, python: str = "python3", timeout: float = SECTION_TIMEOUT * len(SECTIONS) + 60) -> SystemInfo:
    """Run the sections on the node; a failure of the whole script is recorded, not raised."""
    marker = "NDK-" + secrets.token_hex(8)
    info = SystemInfo(host.name, time.time())
    try:
        res = host.run(["bash", "-c", _script(marker, python)], timeout=timeout)
        text = res.stdout.decode(errors="replace")
    except HostError as e:
        info.error = str(e)
        text = ""
    titles = {n: (t, c) for n, t, c in SECTIONS}
    for name, body, rc in _sections(text, marker):
        if name not in titles:   # not one the script asked for (the node saw the marker): not ours
            continue
        title, cmd = titles[name]
        info.sections[name] = Section(name, title.replace("$PY", python),
                                      cmd.replace('"$PY"', python).replace("$PY", python), rc, body)
    if not info.error and len(info.sections) < len(SECTIONS):
        info.error = f"only {len(info.sections)} of {len(SECTIONS)} sections came back"
    return info
