"""Inference-server telemetry from Prometheus /metrics (SGLang and vLLM).

Locally the endpoint is fetched with urllib; on a remote node with
`curl -s --max-time N URL` run on the node (server ports are usually bound to
its 127.0.0.1). Counters become rates between consecutive scrapes, surviving
counter resets (a restarted server).

The page is the server's word: its rank and position labels go through ops.nodenum (a sample whose label is no
such number is left out and named in `invalid`), every figure derived from it is checked against its field's
range (a queue of 1e308 is invalid, not a 309-digit number), and the work is linear in the page's samples.
"""

from __future__ import annotations

import http.client
import math
import shlex
import socket
import time
import urllib.error
import urllib.request
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from ops import nodenum
from ops.errors import HostError, HostTimeout
from ops.hosts.base import Host
from ops.telemetry.baseline import Baseline, speedup
from ops.telemetry.snapshots import InferenceSnapshot
from ops.textsafe import last_line, printable, shown

RANK_LABELS = ("tp_rank", "pp_rank", "moe_ep_rank")
"""Ranks of one model replica repeat the same numbers: rank 0 is kept. (`dp_rank` is not one of
them: under DP attention each DP leader reports its own requests, and they are summed.)"""

NUMBERED_LABELS = {**{k: nodenum.RANK.named(k) for k in RANK_LABELS}, "position": nodenum.POSITION}
"""Labels whose values are numbers: a sample whose label is none (`tp_rank="²"`) is not counted."""
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


class Samples(dict[str, list[tuple[dict[str, str], float]]]):
    """sample name -> [(labels, value)]; `invalid`: label -> the first value of it that is no number of it."""

    def __init__(self) -> None:
        super().__init__()
        self.invalid: dict[str, str] = {}


MAX_METRICS_BYTES = 4 << 20
"""A /metrics page is read up to this size: SGLang's and vLLM's are tens to hundreds of KiB; a larger one
is refused before it is parsed (a 50 MB page cost 7.8 s and 400 MB of memory to parse)."""
MAX_METRICS_LINE = 16 << 10
"""The longest /metrics line parsed (a server's are under 1 KiB): the Prometheus parser copies the rest of a line
for each of its labels, so a page of a few long lines cost minutes."""

_FIELDS = {
    "gen_tokens_per_s": nodenum.TOKENS_PER_S, "prompt_tokens_per_s": nodenum.TOKENS_PER_S,
    "running_reqs": nodenum.REQUESTS, "queued_reqs": nodenum.REQUESTS,
    "kv_cache_usage": nodenum.FRACTION, "accept_rate": nodenum.FRACTION, "prefix_cache_hit_rate": nodenum.FRACTION,
    "accept_len": nodenum.ACCEPT_LEN,
}
"""The range of each figure of a snapshot (ops.nodenum): a value outside it is no such figure."""


def fetch_metrics(host: Host, url: str, *, timeout: float = 3.0) -> str:
    """The /metrics text; HostError (or HostTimeout) when no server answers."""
    if host.kind == "local":
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return _bounded(r.read(MAX_METRICS_BYTES + 1), url)
        except urllib.error.HTTPError as e:
            raise HostError(f"{url}: HTTP {e.code} {e.reason}") from e
        except (socket.timeout, TimeoutError) as e:
            raise HostTimeout(f"{url}: no answer within {timeout:g}s") from e
        except urllib.error.URLError as e:
            reason = e.reason
            if isinstance(reason, (socket.timeout, TimeoutError)):
                raise HostTimeout(f"{url}: no answer within {timeout:g}s") from e
            raise HostError(f"no inference server at {url} ({getattr(reason, 'strerror', None) or reason})") from e
        except ValueError as e:
            raise HostError(f"{url}: not a valid URL") from e
        except (http.client.HTTPException, OSError) as e:   # an ssh banner, a 70 KB header line, a reset
            raise HostError(f"{url}: not a valid HTTP answer ({_why(e)})") from e
    curl = shlex.join(["curl", "-sS", "--fail", "--max-time", f"{timeout:g}", url])
    res = host.run(["bash", "-c", f"{curl} | head -c {MAX_METRICS_BYTES + 1}; exit ${{PIPESTATUS[0]}}"],
                   timeout=timeout + 10)
    if len(res.stdout) > MAX_METRICS_BYTES:
        _bounded(res.stdout, f"{url} on {host.name}")
    if res.ok:
        return res.text
    err = last_line(res.stderr) or f"exit status {res.returncode}"
    if res.returncode == 127:
        raise HostError(f"curl not found on {host.name} (needed to reach {url} there)")
    if res.returncode == 28:
        raise HostTimeout(f"{url} on {host.name}: no answer within {timeout:g}s")
    if res.returncode == 7:
        raise HostError(f"no inference server at {url} on {host.name} ({err.removeprefix('curl: (7) ')})")
    raise HostError(f"{url} on {host.name}: {err}")


def _why(e: BaseException) -> str:
    """What went wrong in a few words: its class and the start of its message (a server's words, inert)."""
    said = shown(str(e))
    return f"{type(e).__name__}: {said[:80]}{'...' if len(said) > 80 else ''}" if said else type(e).__name__


def _bounded(body: bytes, where: str) -> str:
    if len(body) > MAX_METRICS_BYTES:
        raise HostError(f"{where}: the metrics page is larger than {MAX_METRICS_BYTES >> 20} MiB: not read "
                        "(an inference server's is far smaller)")
    return body.decode(errors="replace")


def invalid_values(snap: InferenceSnapshot) -> None:
    """Move every value no such metric can have out of snap into snap.invalid (NaN, ±Inf, a negative
    count or rate, a fraction outside 0..1, an acceptance length under 1, a queue of 1e308: ops.nodenum)."""
    for name, field in _FIELDS.items():
        v = getattr(snap, name)
        if v is not None and field.get(v) is None:
            snap.invalid[name] = nodenum.describe(v)
            setattr(snap, name, None)
    bad = [p for p in snap.per_position_acceptance if nodenum.FRACTION.get(p) is None]
    if bad:
        snap.invalid["per_position_acceptance"] = ", ".join(map(nodenum.describe, bad[:8]))
        snap.per_position_acceptance = []


def parse_samples(text: str) -> Samples:
    """sample name -> [(labels, value)]; HostError when the text is not Prometheus format. A sample whose
    rank or position label is no such number is left out, and the label named in `invalid`."""
    out = Samples()
    longest = max(map(len, text.split("\n")), default=0)
    if longest > MAX_METRICS_LINE:
        raise HostError(f"/metrics is not in Prometheus text format (a line of {longest} characters, longer than "
                        f"{MAX_METRICS_LINE >> 10} KiB)")
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                labels = dict(s.labels)
                try:
                    value = float(s.value)
                except OverflowError:   # an integer of hundreds of digits: as infinite, invalid as such later
                    value = math.inf if s.value > 0 else -math.inf
                if _numbered_labels_valid(labels, out.invalid):
                    out.setdefault(s.name, []).append((labels, value))
    except ValueError as e:
        raise HostError(f"/metrics is not in Prometheus text format ({printable(e, 200)})") from e
    return out


def _numbered_labels_valid(labels: dict[str, str], invalid: dict[str, str]) -> bool:
    for key, field in NUMBERED_LABELS.items():
        if key in labels and field.get(labels[key]) is None:
            invalid.setdefault(key, nodenum.describe(labels[key]))
            return False
    return True


def detect_server(samples: Samples) -> str:
    if any(n.startswith("sglang:") for n in samples):
        return "sglang"
    if any(n.startswith("vllm:") for n in samples):
        return "vllm"
    return "unknown"


def _rank(labels: dict[str, str]) -> tuple[int, ...]:
    """The sample's ranks (parse_samples checked them), 0 where it has none."""
    return tuple(int(labels[k]) if k in labels else 0 for k in RANK_LABELS)


def grouped(samples: Samples, name: str, **match: str) -> dict[tuple, float]:
    """One value per replica (labels other than ranks), the lowest rank's sample kept."""
    best: dict[tuple, tuple[tuple[int, ...], float]] = {}
    for labels, v in _once(samples.get(name, [])):
        if any(labels.get(k) != want for k, want in match.items()):
            continue
        key = tuple(sorted((k, val) for k, val in labels.items() if k not in RANK_LABELS))
        rank = _rank(labels)
        if key not in best or rank < best[key][0]:
            best[key] = (rank, v)
    return {k: v for k, (_, v) in best.items()}


def _once(series: list[tuple[dict[str, str], float]]) -> list[tuple[dict[str, str], float]]:
    """Series counted once: SGLang with priority scheduling reports a `priority=""` total and then
    each priority again (`priority="0"`, ...); the total is kept and the breakdown dropped."""
    if any(lb.get("priority") for lb, _ in series) and any(lb.get("priority") == "" for lb, _ in series):
        return [(lb, v) for lb, v in series if not lb.get("priority")]
    return series


def total(samples: Samples, name: str) -> float | None:
    g = grouped(samples, name)
    return float(sum(g.values())) if g else None


def mean(samples: Samples, name: str) -> float | None:
    g = grouped(samples, name)
    return float(sum(g.values()) / len(g)) if g else None


class CounterRates:
    """Per-series increase between scrapes; a counter that went down restarted from 0."""

    def __init__(self):
        self._prev: dict[tuple, tuple[float, float]] = {}
        self._cur: dict[tuple, tuple[float, float]] = {}

    def begin(self) -> None:
        self._cur = {}

    def commit(self) -> None:
        self._prev.update(self._cur)

    def increase(self, samples: Samples, name: str, t: float, **match: str) -> tuple[float, float] | None:
        """(increase summed over replicas, seconds) since the last scrape, or None on the first."""
        inc, dt, seen = 0.0, None, False
        for key, v in grouped(samples, name, **match).items():
            k = (name, tuple(sorted(match.items())), key)
            self._cur[k] = (t, v)
            prev = self._prev.get(k)
            if prev is None or t <= prev[0]:
                continue
            seen = True
            inc += v - prev[1] if v >= prev[1] else v
            dt = t - prev[0] if dt is None else max(dt, t - prev[0])
        return (inc, dt) if seen and dt else None

    def rate(self, samples: Samples, name: str, t: float, **match: str) -> float | None:
        got = self.increase(samples, name, t, **match)
        return None if got is None else got[0] / got[1]


class InferenceMetrics:
    """Scrapes one /metrics URL; keeps the previous scrape for counter rates."""

    def __init__(self, host: Host, url: str, *, baseline: Baseline | None = None):
        self.host = host
        self.url = url
        self.baseline = baseline
        self.rates = CounterRates()

    def poll(self, *, timeout: float = 3.0) -> InferenceSnapshot:
        """Raises HostError / HostTimeout when the server cannot be reached."""
        text = fetch_metrics(self.host, self.url, timeout=timeout)
        return self.parse(text, time.time())

    def parse(self, text: str, t: float) -> InferenceSnapshot:
        samples = parse_samples(text)
        server = detect_server(samples)
        snap = InferenceSnapshot(ts=t, server=server, source="metrics", url=self.url)
        snap.invalid.update(samples.invalid)
        self.rates.begin()
        if server == "sglang":
            self._sglang(samples, t, snap)
        elif server == "vllm":
            self._vllm(samples, t, snap)
        else:
            snap.error = "no sglang: or vllm: metrics at this endpoint"
        self.rates.commit()
        invalid_values(snap)
        snap.model_name = next(
            (labels["model_name"] for series in samples.values() for labels, _ in series if labels.get("model_name")),
            None,
        )
        if self.baseline is not None:
            snap.baseline_tokens_per_s = self.baseline.tokens_per_s
            snap.speedup_vs_baseline = speedup(snap.gen_tokens_per_s, self.baseline)
        return snap

    def _ratio(self, samples: Samples, num: str, den: str, t: float, **match: str) -> float | None:
        """num/den over the last interval, or since server start on the first scrape / when idle."""
        return self._over(samples, num, t, self.rates.increase(samples, den, t), total(samples, den), **match)

    def _over(self, samples: Samples, num: str, t: float, d_den: tuple[float, float] | None, den_total: float | None,
              **match: str) -> float | None:
        """num over a denominator read once (its increase this interval, its total): see _ratio."""
        d_num = self.rates.increase(samples, num, t, **match)
        if d_num is not None and d_den is not None and d_den[0] > 0:
            return d_num[0] / d_den[0]
        n = sum(grouped(samples, num, **match).values())
        return n / den_total if den_total else None

    def _sglang(self, s: Samples, t: float, snap: InferenceSnapshot) -> None:
        rate = self.rates.rate(s, "sglang:generation_tokens_total", t)
        snap.gen_tokens_per_s = rate if rate is not None else total(s, "sglang:gen_throughput")
        snap.prompt_tokens_per_s = self.rates.rate(s, "sglang:prompt_tokens_total", t)
        snap.running_reqs = total(s, "sglang:num_running_reqs")
        snap.queued_reqs = total(s, "sglang:num_queue_reqs")
        snap.kv_cache_usage = mean(s, "sglang:token_usage")
        accept = mean(s, "sglang:spec_accept_length")
        snap.accept_len = accept if accept is not None and not 0 <= accept < 1.0 else None   # NaN: invalid
        snap.accept_rate = mean(s, "sglang:spec_accept_rate") if snap.accept_len is not None else None
        snap.prefix_cache_hit_rate = mean(s, "sglang:cache_hit_rate")

    def _vllm(self, s: Samples, t: float, snap: InferenceSnapshot) -> None:
        snap.gen_tokens_per_s = self.rates.rate(s, "vllm:generation_tokens_total", t)
        snap.prompt_tokens_per_s = self.rates.rate(s, "vllm:prompt_tokens_total", t)
        snap.running_reqs = total(s, "vllm:num_requests_running")
        snap.queued_reqs = total(s, "vllm:num_requests_waiting")
        kv = mean(s, "vllm:kv_cache_usage_perc")
        snap.kv_cache_usage = kv if kv is not None else mean(s, "vllm:gpu_cache_usage_perc")
        drafts = "vllm:spec_decode_num_drafts_total"
        if drafts in s:
            per_draft = self._ratio(s, "vllm:spec_decode_num_accepted_tokens_total", drafts, t)
            snap.accept_len = None if per_draft is None else 1.0 + per_draft
            snap.accept_rate = self._ratio(
                s, "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total", t
            )
            snap.per_position_acceptance = self._per_position(s, drafts, t)
        for prefix in ("vllm:prefix_cache_", "vllm:gpu_prefix_cache_"):   # the older name first had gpu_
            if f"{prefix}queries_total" in s:
                snap.prefix_cache_hit_rate = self._ratio(s, f"{prefix}hits_total", f"{prefix}queries_total", t)
                break
        else:
            snap.prefix_cache_hit_rate = mean(s, "vllm:gpu_prefix_cache_hit_rate")   # vLLM V0's gauge

    def _per_position(self, s: Samples, drafts: str, t: float) -> list[float]:
        """Accepted tokens per draft at each position: the page's samples grouped by position once, the drafts
        read once, each position's ratio over its own group (a pass over the page, or over the drafts, per
        position was quadratic)."""
        by_position: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
        for labels, v in s.get(PER_POSITION, []):
            if "position" in labels:
                by_position[labels["position"]].append((labels, v))
        out = []
        d_den, den_total = self.rates.increase(s, drafts, t), total(s, drafts)
        for p in sorted(by_position, key=int):    # parse_samples checked every position is a number
            own = Samples()
            own[PER_POSITION] = by_position[p]
            ratio = self._over(own, PER_POSITION, t, d_den, den_total, position=p)
            if ratio is not None:
                out.append(ratio)
        return out
