"""Inference-server log lines (SGLang, vLLM) parsed field by field.

Formats change between versions, so a line is split on commas into
`key: value` pairs, known keys are mapped and unknown ones kept raw but
otherwise ignored: a new field never breaks parsing.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from ops import nodenum
from ops.telemetry.inference import invalid_values
from ops.telemetry.snapshots import InferenceSnapshot


@dataclass
class LogRecord:
    """One metrics line: kind is sglang-decode, sglang-prefill, vllm-engine or vllm-spec."""

    kind: str
    engine: str
    values: dict[str, float | list[float]]
    """Mapped fields, named like InferenceSnapshot's (per_position_acceptance is the one list)."""
    raw: dict[str, str] = field(default_factory=dict)
    """Every key: value pair as written."""
    logged_at: float | None = None
    """The line's own timestamp, local time, when it has one: SGLang's `[YYYY-MM-DD HH:MM:SS ...]` prefix, or
    vLLM's year-less `INFO MM-DD HH:MM:SS` (the year is the latest that does not put it more than a day ahead)."""

    @property
    def server(self) -> str:
        return self.kind.split("-")[0]


_SGLANG_KEYS = {
    "#running-req": "running_reqs",
    "#queue-req": "queued_reqs",
    "token usage": "kv_cache_usage",
    "full token usage": "kv_cache_usage",
    "accept len": "accept_len",
    "accept rate": "accept_rate",
    "gen throughput (token/s)": "gen_tokens_per_s",
    "input throughput (token/s)": "prompt_tokens_per_s",
}
_VLLM_ENGINE_KEYS = {
    "avg prompt throughput": "prompt_tokens_per_s",
    "avg generation throughput": "gen_tokens_per_s",
    "running": "running_reqs",
    "waiting": "queued_reqs",
    "pending": "queued_reqs",
    "kv cache usage": "kv_cache_usage",     # `GPU KV cache usage` on CUDA; CPU, XPU, TPU, ... elsewhere
    "prefix cache hit rate": "prefix_cache_hit_rate",
}
_VLLM_SPEC_KEYS = {
    "mean acceptance length": "accept_len",
    "avg draft acceptance rate": "accept_rate",
    "draft acceptance rate": "accept_rate",
    "per-position acceptance rate": "per_position_acceptance",
}

_BRACKETS = re.compile(r"\[([^\[\]]*)\]")   # no '[' inside: a search from each '[' stops at the next one (linear)
_ENGINE = re.compile(r"Engine\s+(\d+):\s*")
_RANK = re.compile(r"\b(DP\d+|TP\d+|PP\d+|EP\d+)\b")
_STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
_SHORT_STAMP = re.compile(r"(?<![\d-])(\d\d-\d\d \d\d:\d\d:\d\d)(?![\d:])")
_DEVICE_KV = re.compile(r"^\w+ kv cache usage$")


def _stamp(head: str, now: float | None = None) -> float | None:
    """The local time a log line's prefix `head` was written at, or None when it carries no stamp."""
    if (m := _STAMP.search(head)) is not None:
        return _local_time(m.group(1))
    if (m := _SHORT_STAMP.search(head)) is None:
        return None
    now = time.time() if now is None else now
    year = time.localtime(now).tm_year
    for y in (year, year - 1):
        t = _local_time(f"{y}-{m.group(1)}")
        if t is not None and t <= now + 86400:   # None: 02-29 outside a leap year
            return t
    return None


def _local_time(stamp: str) -> float | None:
    """`YYYY-MM-DD HH:MM:SS` as local time, or None for a date no calendar has (the log is the node's)."""
    try:
        return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def split_fields(text: str) -> list[tuple[str, str]]:
    """`a: 1, b: 2 x, c: 3, 4` -> [(a, 1), (b, 2 x), (c, 3, 4)]; pieces without a colon join the previous value."""
    pairs: list[tuple[str, str]] = []
    for piece in text.split(","):
        key, sep, val = piece.partition(":")
        if sep and key.strip():
            pairs.append((key.strip(), val.strip()))
        elif pairs:
            pairs[-1] = (pairs[-1][0], f"{pairs[-1][1]}, {piece.strip()}")
    return pairs


_NUM = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?", re.ASCII)


def _number(v: str) -> float | None:
    """The number a value starts with ("2210.7 tokens/s", "28 reqs"); a % sign makes it a fraction. Through
    ops.nodenum: None where it is no number a server logs (1e308, 400 digits)."""
    m = _NUM.match(v.strip())
    x = None if m is None else nodenum.SAMPLE.get(m.group(0))
    if m is None or x is None:
        return None
    rest = v.strip()[m.end() :].lstrip()
    return x / 100.0 if rest.startswith("%") else x


def _convert(name: str, v: str) -> float | list[float] | None:
    if name == "per_position_acceptance":
        out = [_number(p) for p in v.split(",")]
        return [x for x in out if x is not None]
    x = _number(v)
    if x is None:
        return None
    if name in ("accept_rate", "kv_cache_usage", "prefix_cache_hit_rate") and x > 1.0 and "%" not in v:
        x /= 100.0  # some versions print 0-100 without a % sign
    return x


def parse_log_line(line: str) -> LogRecord | None:
    """A LogRecord for a SGLang/vLLM metrics line, None for any other line."""
    if "Decode batch" in line or "Prefill batch" in line:
        kind = "sglang-decode" if "Decode batch" in line else "sglang-prefill"
        marker = "Decode batch" if kind == "sglang-decode" else "Prefill batch"
        head, _, body = line.partition(marker)
        brackets = _BRACKETS.findall(head)
        ranks = {m.group(1)[:2]: m.group(1) for b in brackets for m in _RANK.finditer(b)}
        if ranks.get("PP", "PP0") != "PP0":
            return None  # later pipeline stages repeat the first one's numbers
        if "DP" not in ranks and ranks.get("TP", "TP0") != "TP0":
            return None  # other TP ranks repeat rank 0's numbers
        # Under DP attention each DP leader logs its own batch with its global TP rank (DP1 TP4 EP4): keep them all.
        rec = _record(kind, ranks.get("DP", ""), body.lstrip(".,: "), _SGLANG_KEYS)
        stamp = next((m.group(1) for b in brackets for m in [_STAMP.search(b)] if m), None)
        if rec is not None and stamp is not None:
            rec.logged_at = _local_time(stamp)
        return rec
    if "SpecDecoding metrics:" in line:
        head, _, body = line.partition("SpecDecoding metrics:")
        m = _ENGINE.search(head)
        rec = _record("vllm-spec", m.group(1) if m else "", body, _VLLM_SPEC_KEYS)
    elif "Avg prompt throughput:" in line or "Avg generation throughput:" in line:
        start = min(i for i in (line.find("Avg prompt throughput:"), line.find("Avg generation throughput:")) if i >= 0)
        head = line[:start]
        m = _ENGINE.search(head)
        rec = _record("vllm-engine", m.group(1) if m else "", line[start:], _VLLM_ENGINE_KEYS)
    else:
        return None
    if rec is not None:
        rec.logged_at = _stamp(head)
    return rec


def _record(kind: str, engine: str, body: str, keys: dict[str, str]) -> LogRecord | None:
    pairs = split_fields(body.strip().rstrip("."))
    if not pairs:
        return None
    values: dict[str, float | list[float]] = {}
    raw: dict[str, str] = {}
    for key, val in pairs:
        raw[key] = val
        low = key.lower()
        name = keys.get("kv cache usage" if keys is _VLLM_ENGINE_KEYS and _DEVICE_KV.match(low) else low)
        if name is None or name in values:
            continue  # unknown field, or a fallback (full token usage) after the main one
        conv = _convert(name, val)
        if conv is not None:
            values[name] = conv
    return LogRecord(kind, engine, values, raw)


_ADDITIVE = ("gen_tokens_per_s", "prompt_tokens_per_s", "running_reqs", "queued_reqs")
_MEAN = ("kv_cache_usage", "prefix_cache_hit_rate")
_PER_TOKEN = ("accept_len", "accept_rate")
"""Averaged over engines weighted by the tokens each generates (a plain mean when throughputs are missing)."""

QUIET_AFTER_S = 60.0
"""An engine whose last metrics line is this much older than the newest one is idle, not still busy."""


class ServerLogMetrics:
    """Keeps the latest metrics line per engine and kind; sums or averages across engines.

    SGLang under DP attention logs one line per DP leader; vLLM logs one `Engine NNN:` line per
    engine, each followed by that engine's `SpecDecoding metrics:` line (which names no engine).
    """

    def __init__(self) -> None:
        self._latest: dict[tuple[str, str], tuple[int, float, LogRecord]] = {}
        self._seq = 0
        self._last_vllm_engine = ""

    def feed(self, lines, now: float | None = None) -> int:
        """Take new log lines; returns how many were metrics lines."""
        now = time.time() if now is None else now
        n = 0
        for line in lines:
            rec = parse_log_line(line)
            if rec is None:
                continue
            if rec.kind == "vllm-engine":
                self._last_vllm_engine = rec.engine
            elif rec.kind == "vllm-spec" and not rec.engine:
                rec.engine = self._last_vllm_engine
            self._seq += 1
            self._latest[(rec.kind, rec.engine)] = (self._seq, now, rec)
            n += 1
        return n

    def _current(self) -> list[tuple[int, float, LogRecord]]:
        """The latest entries, oldest first, without engines that have gone quiet."""
        entries = sorted(self._latest.values(), key=lambda e: e[0])

        def when(e) -> float:
            return e[2].logged_at if e[2].logged_at is not None else e[1]

        newest = max(when(e) for e in entries)
        # vLLM writes an interval's SpecDecoding line right after that interval's engine line, and only when it
        # drafted: a SpecDecoding line older than its engine's latest engine line is from an earlier interval.
        engine_seq = {e[2].engine: e[0] for e in entries if e[2].kind == "vllm-engine"}
        return [e for e in entries if newest - when(e) <= QUIET_AFTER_S
                and not (e[2].kind == "vllm-spec" and e[0] < engine_seq.get(e[2].engine, -1))]

    def snapshot(self) -> InferenceSnapshot | None:
        """The current view, or None before any metrics line was seen."""
        if not self._latest:
            return None
        entries = self._current()  # oldest first: newer values win
        ts = entries[-1][1]
        server = entries[-1][2].server
        per_engine: dict[str, dict[str, float | list[float]]] = {}
        for _, _, rec in entries:
            per_engine.setdefault(rec.engine, {}).update(rec.values)
        weights = {engine: _scalar(v.get("gen_tokens_per_s")) for engine, v in per_engine.items()}
        snap = InferenceSnapshot(ts=ts, server=server, source="log")

        def weighted(name: str) -> list[tuple[float, float | None]]:
            """(value, the engine's generation throughput) of each engine that reported name."""
            return [(x, weights[engine]) for engine, v in per_engine.items()
                    if (x := _scalar(v.get(name))) is not None]

        for name in _ADDITIVE:
            vals = [x for x, _ in weighted(name)]
            if vals:
                setattr(snap, name, float(sum(vals)))
        for name in _MEAN:
            vals = [x for x, _ in weighted(name)]
            if vals:
                setattr(snap, name, float(sum(vals) / len(vals)))
        for name in _PER_TOKEN:
            pairs = weighted(name)
            if pairs:
                setattr(snap, name, _per_token_mean(pairs))
        lists = [(p, weights[engine]) for engine, v in per_engine.items()
                 if isinstance(p := v.get("per_position_acceptance"), list) and p]
        if lists:
            depth = min(len(p) for p, _ in lists)
            snap.per_position_acceptance = [_per_token_mean([(p[k], w) for p, w in lists]) for k in range(depth)]
        invalid_values(snap)
        return snap


def _scalar(v: float | list[float] | None) -> float | None:
    return v if isinstance(v, float) else None


def _per_token_mean(pairs: list[tuple[float, float | None]]) -> float:
    """Mean of values (at least one) weighted by their engine's generation throughput; plain mean without
    throughputs."""
    positive = [(v, w) for v, w in pairs if w is not None and w > 0]
    if len(positive) == len(pairs):
        return float(sum(v * w for v, w in positive) / sum(w for _, w in positive))
    return float(sum(v for v, _ in pairs) / len(pairs))
