"""The checks of a `node setup` that only look: the node's Python, disk, GPUs and torch, and its trainer."""

from __future__ import annotations

import posixpath

from ops.hosts.base import Host
from ops.setup.probe import NodeFacts
from ops.setup.results import Failed, Outcome, StepStatus
from ops.textsafe import last_line
from ops.units import human_bytes

MIN_PYTHON = (3, 11)


def last_words(data: bytes) -> str:
    """What a failed tool said: its last line (ops.textsafe.last_line), or "(no output)"."""
    return last_line(data) or "(no output)"


def _invalid(facts: NodeFacts, field: str) -> str:
    """What the node sent for `field` that was no number of it (`: invalid free disk ...`), else ''."""
    said = [v for v in facts.invalid if v.startswith(f"invalid {field} ")]
    return f": {'; '.join(said)}" if said else ""


def check_python(facts: NodeFacts, python: str) -> Outcome:
    if facts.python < MIN_PYTHON:
        raise Failed(f"{python} is Python {facts.python_version}{_invalid(facts, 'Python version')}; nodedeck's "
                     f"trainer needs {'.'.join(map(str, MIN_PYTHON))} or newer: install one, or name an env with "
                     "--python")
    return StepStatus.OK, f"Python {facts.python_version} ({facts.executable})"


def check_disk(facts: NodeFacts, min_free_gib: float) -> Outcome:
    if facts.disk_free is None:
        bad = _invalid(facts, "free disk")
        return StepStatus.WARNING, f"free space unknown{bad or ' (the node did not say)'}"
    total = "?" if facts.disk_total is None else human_bytes(facts.disk_total)
    text = f"{human_bytes(facts.disk_free)} free of {total} at {facts.disk_path}"
    if facts.disk_free < min_free_gib * 2**30:
        return StepStatus.WARNING, f"{text}: less than {min_free_gib:g} GiB"
    return StepStatus.OK, text


def check_gpus(facts: NodeFacts) -> Outcome:
    if facts.gpus is None:
        return StepStatus.WARNING, "no GPUs: nvidia-smi is not on the node's PATH (stages run on its CPU)"
    if facts.gpu_error or not facts.gpus:
        return StepStatus.WARNING, f"nvidia-smi found no usable GPU: {facts.gpu_error or 'it listed none'}"
    names: dict[str, int] = {}
    for g in facts.gpus:
        label = g.name + (f" {g.memory_mib // 1024} GiB" if g.memory_mib else "")
        names[label] = names.get(label, 0) + 1
    listed = ", ".join(f"{n} x {label}" for label, n in names.items())
    text = f"{listed}; driver {facts.gpus[0].driver}, CUDA {facts.cuda or 'unknown'}"
    bad = _invalid(facts, "GPU memory")
    return (StepStatus.WARNING, text + "; " + bad[2:]) if bad else (StepStatus.OK, text)


def torch_text(f: NodeFacts) -> str:
    if f.torch_version is None:
        return "no torch"
    cuda = f", CUDA {f.torch_cuda}" if f.torch_cuda else ", CPU build" if f.torch_file else ""
    where = f" from {f.torch_file}" if f.torch_file else f" (import failed: {f.torch_error})" if f.torch_error else ""
    return f"torch {f.torch_version}{cuda}{where}"


def verify_trainer(host: Host, bin_dir: str, want_build: str | None) -> str:
    """`nodedeck-train --version` in bin_dir, checked to be this nodedeck's build; its words."""
    res = host.run([posixpath.join(bin_dir, "nodedeck-train"), "--version"], timeout=120)
    said = last_line(res.stdout)
    if res.returncode != 0 or not said.startswith("nodedeck-train "):
        raise Failed(f"{bin_dir}/nodedeck-train --version failed: {last_words(res.stderr or res.stdout)}")
    if want_build and f"(build {want_build})" not in said:
        raise Failed(f"{bin_dir}/nodedeck-train is {said!r}, not build {want_build}")
    return said[len("nodedeck-train "):]
