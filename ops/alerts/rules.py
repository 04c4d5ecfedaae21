"""Alert rules: pure functions from what nodedeck already collects to findings.

A finding is an alert that holds now; `hold_s` says how long it must keep holding before it
is raised (an idle GPU for ten minutes, not for one sample). ops.alerts.tracker turns findings
into alerts with `since`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ops import hints
from ops.alerts.records import Alert, AlertKind, Severity, Thresholds
from ops.telemetry.snapshots import GpuSnapshot, HostSnapshot, InferenceSnapshot
from ops.units import human_duration as fmt_duration


@dataclass(frozen=True)
class Finding:
    alert: Alert
    hold_s: float = 0.0                    # raise only once it held this long


# -- speculation ---------------------------------------------------------------
def speculation(node: str, snap: InferenceSnapshot | None, th: Thresholds,
                eval_accept_len: float | None = None) -> list[Finding]:
    """Speculation slower than the measured baseline; acceptance length under the plan's floor; and, by default,
    a collapse: acceptance near 1 while the server speculates (drafts almost never accepted: outputs stay correct,
    so nothing else notices), or far under the eval's (`eval_accept_len`, the plan's eval of the drafter)."""
    if snap is None or snap.error or snap.stale:
        return []
    out = collapse(node, snap, th, eval_accept_len)
    accept = f", accept len {snap.accept_len:.2f}" if snap.accept_len is not None else ""
    if snap.speedup_vs_baseline is not None and snap.speedup_vs_baseline < th.min_speedup:
        out.append(Finding(Alert(
            node, AlertKind.SPEC_SLOWER, snap.url or "server",
            f"speculation is slower than no speculation: {snap.speedup_vs_baseline:.2f}x the baseline",
            f"{snap.gen_tokens_per_s:.1f} tok/s vs baseline {snap.baseline_tokens_per_s:.1f} tok/s{accept}",
            Severity.CRITICAL)))
    if th.min_accept_len is not None and snap.accept_len is not None and snap.accept_len < th.min_accept_len:
        out.append(Finding(Alert(
            node, AlertKind.ACCEPT_LOW, snap.url or "server",
            f"acceptance length {snap.accept_len:.2f} is under the plan's floor {th.min_accept_len:.2f}",
            f"accept len {snap.accept_len:.2f}"
            + (f", accept rate {snap.accept_rate:.0%}" if snap.accept_rate else ""))))
    return out


def collapse(node: str, snap: InferenceSnapshot, th: Thresholds, eval_accept_len: float | None) -> list[Finding]:
    """The served acceptance collapsed (see `speculation`); raised once it held collapse_hold_s."""
    acc = snap.accept_len
    if acc is None:                        # the server reports no speculation
        return []
    rate = f", accept rate {snap.accept_rate:.0%}" if snap.accept_rate is not None else ""
    under_eval = eval_accept_len is not None and eval_accept_len > 1 and \
        acc - 1 < th.min_accept_vs_eval * (eval_accept_len - 1)
    if acc <= th.collapsed_accept_len:
        message = (f"acceptance collapsed to {acc:.2f} while speculating: drafts are almost never accepted "
                   "(outputs stay correct, the speedup is gone)")
    elif under_eval and eval_accept_len is not None:
        message = (f"acceptance {acc:.2f} is far under the eval's {eval_accept_len:.2f}: "
                   f"{acc - 1:.2f} drafts accepted a round against {eval_accept_len - 1:.2f}")
    else:
        return []
    evidence = f"accept len {acc:.2f}{rate}" + (f", eval {eval_accept_len:.2f}" if eval_accept_len is not None else "")
    return [Finding(Alert(node, AlertKind.ACCEPT_COLLAPSED, snap.url or "server", message, evidence,
                          Severity.CRITICAL), hold_s=th.collapse_hold_s)]


# -- training curves -----------------------------------------------------------
def _noise(y: np.ndarray) -> float:
    """Robust standard deviation of point-to-point noise (median absolute first difference)."""
    d = np.diff(y)
    if d.size == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / math.sqrt(2))


def find_jumps(y: np.ndarray, *, window: int = 5, k: float = 8.0, rel: float = 0.05) -> list[int]:
    """Indices where the curve steps up abruptly: median of the next `window` points minus the median of
    the previous `window` above max(k * noise, rel * level); one index per step (the strongest)."""
    n = y.size
    if n < 2 * window + 1:
        return []
    win = np.lib.stride_tricks.sliding_window_view(y, window)
    med = np.median(win, axis=1)                     # med[j] = median(y[j:j+window])
    step = med[window:] - med[:-window]              # step[i - window] compares after i with before i
    level = float(np.median(np.abs(y))) or 1.0
    threshold = max(k * _noise(y), rel * level)
    above = np.flatnonzero(step > threshold)
    jumps: list[int] = []
    for j in above:
        i = int(j) + window
        if jumps and i - jumps[-1] <= window:
            if step[j] > step[jumps[-1] - window]:
                jumps[-1] = i
            continue
        jumps.append(i)
    return jumps


def _periodic(jumps: Sequence[int], xs: np.ndarray, min_jumps: int) -> float | None:
    """The period (in x units) when the jumps come at regular intervals, else None.

    A reset too weak to be seen leaves a gap of two (or more) periods: such gaps are allowed, as long
    as every gap is within 25% of a whole number of periods and at least min_jumps - 1 gaps are single
    periods (the rule without missed resets)."""
    if len(jumps) < min_jumps:
        return None
    gaps = np.diff(xs[list(jumps)])
    if gaps.size == 0:
        return None
    period = float(np.median(gaps))
    if period <= 0:
        return None
    ratio = gaps / period
    whole = np.maximum(np.round(ratio), 1.0)
    if np.any(np.abs(ratio - whole) > 0.25 * whole ** 0.5):
        return None
    single = gaps[whole == 1]
    if single.size < max(1, min_jumps - 1) or float(np.std(single)) > 0.25 * float(np.mean(single)):
        return None
    return float(np.mean(single))


def curve(node: str, subject: str, xs: Sequence[float] | np.ndarray, ys: Sequence[float] | np.ndarray,
          th: Thresholds, *,
          name: str = "loss", higher_is_better: bool = False, epoch_steps: float | None = None) -> list[Finding]:
    """Resets (periodic jumps in the wrong direction), NaN/inf, and divergence of one training curve."""
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    if y.size == 0:
        return []
    out: list[Finding] = []
    if not math.isfinite(y[-1]):
        out.append(Finding(Alert(node, AlertKind.LOSS_NAN, f"{subject}:{name}", f"{name} is {y[-1]} at step {x[-1]:g}",
                                 f"last finite {name}: {_last_finite(y)}", Severity.CRITICAL)))
        return out
    finite = np.isfinite(y)
    x, y = x[finite], y[finite]
    bad = -y if higher_is_better else y
    jumps = find_jumps(bad)
    period = _periodic(jumps, x, th.reset_min_jumps)
    if period is not None:
        sizes = [float(np.median(bad[i:i + 5]) - np.median(bad[max(0, i - 5):i])) for i in jumps]
        aligned = ""
        if epoch_steps:
            ratio = period / epoch_steps
            if abs(ratio - round(ratio)) < 0.1 and round(ratio) >= 1:
                aligned = f"; they line up with epoch boundaries ({epoch_steps:g} steps)"
        out.append(Finding(Alert(
            node, AlertKind.LOSS_RESETS, f"{subject}:{name}",
            f"{name} resets every ~{period:.0f} steps: the homogeneous length-bucket symptom{aligned}",
            f"{len(jumps)} jumps at steps {', '.join(f'{x[i]:g}' for i in jumps[:6])}"
            + ("…" if len(jumps) > 6 else "") + f", mean size {np.mean(sizes):.3g}")))
    if not higher_is_better and y.size >= 40:
        w = max(5, y.size // 10)
        recent = float(np.median(y[-w:]))
        best = float(np.min(np.convolve(y, np.ones(w) / w, mode="valid")))
        earlier = float(np.median(y[-2 * w:-w]))
        if best > 0 and recent > 1.5 * best and recent > earlier:
            out.append(Finding(Alert(
                node, AlertKind.LOSS_DIVERGING, f"{subject}:{name}",
                f"{name} is diverging: {recent:.3g} now vs {best:.3g} at its best",
                f"median of the last {w} records {recent:.4g}, the {w} before {earlier:.4g}", Severity.CRITICAL)))
    return out


def _last_finite(y: np.ndarray) -> str:
    f = y[np.isfinite(y)]
    return f"{f[-1]:.4g}" if f.size else "none"


# -- GPUs, stages, disks -----------------------------------------------------------
def gpu_idle(node: str, gpus: GpuSnapshot | None, running: Sequence[str], th: Thresholds) -> list[Finding]:
    """Every GPU under the idle threshold while stages run (raised after gpu_idle_s of it)."""
    if gpus is None or gpus.stale or not gpus.available or not running:
        return []
    idle = [g for g in gpus.gpus if g.util_pct is not None and g.util_pct < th.gpu_idle_pct]
    if not idle or len(idle) < len([g for g in gpus.gpus if not g.lost]):
        return []
    utils = ", ".join(f"gpu{g.index} {g.util_pct:.0f}%" for g in idle[:8])
    return [Finding(Alert(
        node, AlertKind.GPU_IDLE, "gpus",
        f"GPUs idle for {fmt_duration(th.gpu_idle_s)}+ while {', '.join(running)} "
        f"{'runs' if len(running) == 1 else 'run'}",
        utils), hold_s=th.gpu_idle_s)]


def stalled(node: str, stage: str, idle_s: float | None, th: Thresholds) -> list[Finding]:
    """A running stage whose log and progress records have not grown for stall_s."""
    if idle_s is None or idle_s < th.stall_s:
        return []
    return [Finding(Alert(node, AlertKind.STAGE_STALLED, stage,
                          f"stage {stage} has not advanced for {fmt_duration(idle_s)}",
                          f"log and progress unchanged for {fmt_duration(idle_s)} (threshold "
                          f"{fmt_duration(th.stall_s)})"))]


def disk_before_eta(node: str, host: HostSnapshot | None, stage: str, eta_s: float | None,
                    th: Thresholds) -> list[Finding]:
    """A watched disk projected to fill before the running stage's ETA."""
    if host is None or eta_s is None or host.stale:
        return []
    out = []
    for d in host.disks:
        if d.time_to_full_s is not None and d.time_to_full_s < eta_s * th.disk_margin:
            out.append(Finding(Alert(
                node, AlertKind.DISK_FULL_BEFORE_ETA, d.path,
                f"{d.path} fills in {fmt_duration(d.time_to_full_s)}, before {stage} ends (ETA {fmt_duration(eta_s)})",
                f"{d.free / 2**30:.1f} GiB free, filling at {(d.fill_rate_bytes_per_s or 0) / 2**20:.1f} MiB/s",
                Severity.CRITICAL)))
    return out


@dataclass(frozen=True)
class PreservedSummary:
    """What the node's last decommission run (or dry run) found."""

    at: float
    dry_run: bool
    selected: int
    not_preserved: int


def retiring(node: str, retire_at: float | None, now: float, summary: PreservedSummary | None,
             th: Thresholds) -> list[Finding]:
    """A node due for shutdown (retire_after) holding files not yet preserved, or never checked."""
    if retire_at is None or now < retire_at - th.retire_warn_s:
        return []
    when = "was due" if now >= retire_at else f"is due in {fmt_duration(retire_at - now)}"
    if summary is None:
        return [Finding(Alert(node, AlertKind.RETIRE_UNPRESERVED, "node",
                              f"node {when} for shutdown and nothing has checked what it holds",
                              f"run `{hints.current().command('decommission', node, '--dest', 'DIR', '--dry-run')}`",
                              Severity.CRITICAL))]
    if summary.not_preserved == 0:
        return []
    return [Finding(Alert(node, AlertKind.RETIRE_UNPRESERVED, "node",
                          f"node {when} for shutdown with {summary.not_preserved} of {summary.selected} files "
                          "not preserved",
                          f"last {'dry run' if summary.dry_run else 'decommission'}: "
                          f"{summary.not_preserved} not preserved", Severity.CRITICAL))]
