"""The pipeline's outcome: acceptance length, throughput with and without the drafter, the speedup.

Read from the result files the plan's evaluation and benchmark stages write (their declared
`.json`/`.jsonl` outputs), and from the live inference server:

- nodedeck-train eval (`mean_accept_len`, `tokens_per_s`, `baseline_tokens_per_s`, `speedup`,
  `untrained.mean_accept_len`);
- SGLang's benchmark (`sglang.bench_serving --output-file`, one JSON object per line with
  `output_throughput` and, when the server speculates, `accept_length`): a run with an
  acceptance length is the drafter's, one without is the baseline's;
- the live server (accept len, gen throughput, speedup vs the stored baseline).

The verdict says plainly when speculation is slower than no speculation.
CLI: `nodedeck plan outcome FILE [--json]`; the dashboard's Outcome panel and its closing summary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ops.errors import HostError
from ops.hosts.base import Host
from ops.telemetry.snapshots import InferenceSnapshot

MAX_READ = 256 * 1024                     # a result file's last 256 KiB is plenty for its last record


@dataclass(frozen=True)
class Measurement:
    """One measured number and where it came from (a stage's file, or the live server)."""

    value: float
    source: str


@dataclass(frozen=True)
class Outcome:
    accept_len: Measurement | None = None
    untrained_accept_len: Measurement | None = None
    drafter_tok_s: Measurement | None = None
    baseline_tok_s: Measurement | None = None
    speedup: Measurement | None = None

    @property
    def empty(self) -> bool:
        return all(m is None for m in (self.accept_len, self.drafter_tok_s, self.baseline_tok_s, self.speedup))

    @property
    def slower(self) -> bool:
        return self.speedup is not None and self.speedup.value < 1.0

    def verdict(self) -> str:
        if self.speedup is None:
            if self.accept_len is None:
                return "no outcome yet: the evaluation and benchmark stages have not written results"
            return "speedup not measured yet: benchmark the baseline and the drafter"
        if self.slower:
            return (f"SPECULATION IS SLOWER than no speculation: {self.speedup.value:.2f}x the baseline "
                    "(check the acceptance length and the draft settings)")
        return f"speculation is {self.speedup.value:.2f}x faster than no speculation"

    def lines(self) -> list[str]:
        """The summary, one fact a line (printed when the dashboard closes)."""
        out = []
        if self.accept_len:
            untrained = (f" (untrained drafter {self.untrained_accept_len.value:.2f})"
                         if self.untrained_accept_len else "")
            out.append(f"acceptance length {self.accept_len.value:.2f}{untrained}  [{self.accept_len.source}]")
        if self.drafter_tok_s:
            out.append(f"with the drafter {self.drafter_tok_s.value:.1f} tok/s  [{self.drafter_tok_s.source}]")
        if self.baseline_tok_s:
            out.append(f"without (baseline) {self.baseline_tok_s.value:.1f} tok/s  [{self.baseline_tok_s.source}]")
        out.append(self.verdict())
        return out

    def to_json(self) -> dict:
        def m(x: Measurement | None):
            return None if x is None else {"value": x.value, "source": x.source}

        return {"accept_len": m(self.accept_len), "untrained_accept_len": m(self.untrained_accept_len),
                "drafter_tok_s": m(self.drafter_tok_s), "baseline_tok_s": m(self.baseline_tok_s),
                "speedup": m(self.speedup), "slower": self.slower, "verdict": self.verdict()}


def _number(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def last_record(host: Host, path: str) -> dict | None:
    """The JSON document in path, or its last JSON line; None when missing or not JSON."""
    st = host.stat(path)
    if st is None or st.is_dir:
        return None
    try:
        raw = host.read_range(path, max(0, st.size - MAX_READ), MAX_READ)
    except HostError:
        return None
    text = raw.decode(errors="replace")
    try:
        doc = json.loads(text)
        return doc if isinstance(doc, dict) else None
    except ValueError:
        pass
    for line in reversed(text.splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            return doc
    return None


def from_results(results: list[tuple[str, dict]], live: InferenceSnapshot | None = None) -> Outcome:
    """The outcome of (source, record) pairs, newest last; the live server fills what files lack.

    Throughputs are only compared within one way of measuring: the trainer's eval harness ("eval")
    or serving (SGLang's benchmark, the live server and its stored baseline). A drafter measured one
    way over a baseline measured the other is no speedup."""
    accept: Measurement | None = None
    untrained: Measurement | None = None
    drafter: dict[str, Measurement] = {}
    baseline: dict[str, Measurement] = {}
    for source, doc in results:
        if (mean := _number(doc.get("mean_accept_len"))) is not None:    # nodedeck-train eval
            accept = Measurement(mean, source)
            u = doc.get("untrained")
            if isinstance(u, dict) and (before := _number(u.get("mean_accept_len"))) is not None:
                untrained = Measurement(before, source)
            if (tps := _number(doc.get("tokens_per_s"))) is not None:
                drafter["eval"] = Measurement(tps, source)
            if (base := _number(doc.get("baseline_tokens_per_s"))) is not None:
                baseline["eval"] = Measurement(base, source)
        elif (out := _number(doc.get("output_throughput"))) is not None:   # SGLang's benchmark
            tok_s = Measurement(out, source)
            acc = _number(doc.get("accept_length"))
            if acc is not None and acc > 0:
                drafter["serving"], accept = tok_s, Measurement(acc, source)
            else:
                baseline["serving"] = tok_s
    if live is not None and not live.error:
        where = f"live {live.server} server"
        if accept is None and live.accept_len is not None:
            accept = Measurement(live.accept_len, where)
        if not drafter and live.gen_tokens_per_s is not None and live.accept_len is not None:
            drafter["serving"] = Measurement(live.gen_tokens_per_s, where)
        if not baseline and live.baseline_tokens_per_s is not None:
            baseline["serving"] = Measurement(live.baseline_tokens_per_s, "stored baseline")
    paired = [k for k in ("serving", "eval") if k in drafter and k in baseline and baseline[k].value > 0]
    if paired:
        d, b = drafter[paired[0]], baseline[paired[0]]
        return Outcome(accept, untrained, d, b, Measurement(d.value / b.value, f"{d.source} / {b.source}"))
    return Outcome(accept, untrained, drafter.get("serving") or drafter.get("eval"),
                   baseline.get("serving") or baseline.get("eval"), None)


def result_paths(stage) -> list[str]:
    """A stage's declared .json/.jsonl outputs that can hold results (not metrics or progress records)."""
    out = []
    for path in stage.outputs:
        name = path.rsplit("/", 1)[-1]
        if name.endswith((".json", ".jsonl")) and "metrics" not in name and "progress" not in name:
            out.append(path)
    return out


def plan_outcome(scheduler, live: InferenceSnapshot | None = None) -> Outcome:
    """The outcome of a plan from its stages' result files on their nodes (then the live server)."""
    results = []
    for stage in scheduler.plan.stages:
        if not result_paths(stage):
            continue
        names = result_paths(scheduler.resolved(stage))
        host = scheduler.node(stage).host
        for path in names:
            try:
                doc = last_record(host, path)
            except HostError:
                doc = None
            if doc is not None:
                results.append((f"stage {stage.id}", doc))
    return from_results(results, live)


def closing_lines(scheduler) -> list[str]:
    """The outcome as printed when the dashboard or the demo ends; nothing when there is none yet."""
    from ops.errors import NodedeckError

    try:
        outcome = plan_outcome(scheduler)
    except NodedeckError:
        return []
    if outcome.empty:
        return []
    first, *rest = outcome.lines()
    return [f"outcome: {first}", *(f"         {line}" for line in rest)]
