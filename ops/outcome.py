"""The pipeline's outcome: acceptance length, throughput with and without the drafter, the speedup.

Read from the result files the plan's evaluation and benchmark stages write (their declared
`.json`/`.jsonl` outputs), and from the live inference server:

- nodedeck-train eval (`mean_accept_len`, `tokens_per_s`, `baseline_tokens_per_s`, `speedup`,
  `untrained.mean_accept_len`, and `engine`: the harness naming itself);
- SGLang's benchmark (`sglang.bench_serving --output-file`, one JSON object per line with
  `output_throughput` and, when the server speculates, `accept_length`) and vLLM's (`vllm bench serve
  --save-result`: `output_throughput`, `spec_decode_acceptance_length`): a run with an acceptance
  length is the drafter's, one without is the baseline's;
- the live server (accept len, gen throughput, speedup vs the stored baseline).

Each figure carries the engine that produced it, as the engine names itself: the eval's record says so,
and a benchmark's engine is the server stage it depends on, named by that server's own log line
(vLLM's `vLLM server version X, serving model M`); nothing is inferred from a command line.
A serving measurement is preferred over the eval harness's when a plan has both.
The verdict says plainly when speculation is slower than no speculation.

Acceptance side by side (ops.acceptance): the eval's and each serving engine's (a benchmark's, a probe of the eval's
own prompts, the live server), each with its engine and its per-position shares, and each serving figure held
against the eval's: agree within a band that says why it is that wide, or a train-serve gap with the causes nodedeck
checked for that server's export and command (ops.gap).
CLI: `nodedeck plan outcome FILE [--json]`; the dashboard's Outcome panel and its closing summary.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Mapping

from ops import nodejson, nodenum
from ops.acceptance import Acceptance, Check, Verdict, bench_figure, compare, eval_figure, probe_figure
from ops.errors import HostError, NodedeckError
from ops.gap import served_checks
from ops.hosts.base import Host
from ops.measured_by import Engine, device_in_log, engine_in_log
from ops.plan.records import Stage, StageKind
from ops.served import bench_command, server_command
from ops.telemetry.snapshots import InferenceSnapshot

if TYPE_CHECKING:
    from ops.run.scheduler import Scheduler

MAX_READ = 256 * 1024                     # a result file's last 256 KiB is plenty for its last record
CHECKS_KEPT_S = 60.0
"""How long the checks of one served figure are kept for a plan: the dashboard polls its outcome every few seconds,
and the checks read the export, the target's files and the server's log on the node."""
_kept_checks: weakref.WeakKeyDictionary[Scheduler, dict[tuple, tuple[float, tuple[Check, ...]]]] = \
    weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Measurement:
    """One measured number, where it came from (a stage's file, or the live server) and what measured it."""

    value: float
    source: str
    engine: Engine | None = None

    def where(self) -> str:
        """`stage bench_eagle3, vLLM 0.32.0+cpu`: the source, and the engine when known."""
        return self.source if self.engine is None else f"{self.source}, {self.engine}"

    def to_json(self) -> dict:
        return {"value": self.value, "source": self.source,
                "engine": None if self.engine is None else self.engine.to_json()}


@dataclass(frozen=True)
class Outcome:
    accept_len: Measurement | None = None
    untrained_accept_len: Measurement | None = None
    drafter_tok_s: Measurement | None = None
    baseline_tok_s: Measurement | None = None
    speedup: Measurement | None = None
    eval_acceptance: Acceptance | None = None
    """The eval's acceptance with its per-position shares."""
    served: tuple[Acceptance, ...] = ()
    """Each serving engine's acceptance (a probe of the eval's prompts first, then benchmarks, then the live one)."""
    train_serve: tuple[Verdict, ...] = ()
    """Each serving figure against the eval's (with the checks made for its server on a gap)."""

    @property
    def empty(self) -> bool:
        return all(m is None for m in (self.accept_len, self.drafter_tok_s, self.baseline_tok_s, self.speedup))

    @property
    def gap(self) -> bool:
        """A serving figure parts from the eval's beyond its band."""
        return any(v.state == "gap" for v in self.train_serve)

    @property
    def engines(self) -> tuple[Engine, ...]:
        """The engines behind the figures shown, each once (the speedup is the throughputs')."""
        shown = (self.accept_len, self.untrained_accept_len, self.drafter_tok_s, self.baseline_tok_s)
        return tuple(dict.fromkeys(m.engine for m in shown if m is not None and m.engine is not None))

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
            untrained = ""
            if u := self.untrained_accept_len:
                elsewhere = "" if u.where() == self.accept_len.where() else f" [{u.where()}]"
                untrained = f" (untrained drafter {u.value:.2f}{elsewhere})"
            out.append(f"acceptance length {self.accept_len.value:.2f}{untrained}  [{self.accept_len.where()}]")
        if self.drafter_tok_s:
            out.append(f"with the drafter {self.drafter_tok_s.value:.1f} tok/s  [{self.drafter_tok_s.where()}]")
        if self.baseline_tok_s:
            out.append(f"without (baseline) {self.baseline_tok_s.value:.1f} tok/s  [{self.baseline_tok_s.where()}]")
        out.append(self.verdict())
        figures = ([self.eval_acceptance] if self.eval_acceptance else []) + list(self.served)
        if len(figures) > 1 or any(f.per_position for f in figures):
            out.append("acceptance side by side (per draft position):")
            for f in figures:
                per_pos = " ".join(f"{p:.2f}" for p in f.per_position) or "not exposed"
                out.append(f"  {f.label():<24} {f.value:.2f}  [{per_pos}]  [{f.source}]")
        out += [f"train-serve: {v.line()}" for v in self.train_serve]
        return out

    def to_json(self) -> dict:
        def m(x: Measurement | None):
            return None if x is None else x.to_json()

        return {"accept_len": m(self.accept_len), "untrained_accept_len": m(self.untrained_accept_len),
                "drafter_tok_s": m(self.drafter_tok_s), "baseline_tok_s": m(self.baseline_tok_s),
                "speedup": m(self.speedup), "slower": self.slower, "verdict": self.verdict(),
                "engines": [str(e) for e in self.engines],
                "eval_acceptance": None if self.eval_acceptance is None else self.eval_acceptance.to_json(),
                "served_acceptance": [f.to_json() for f in self.served],
                "train_serve": [v.to_json() for v in self.train_serve], "gap": self.gap}


def _number(v, field: nodenum.Real = nodenum.TOKENS_PER_S) -> float | None:
    """A figure of a result file on the node, through ops.nodenum: None when it is no such figure."""
    return field.get_json(v)


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
        doc = nodejson.loads(text)
        return doc if isinstance(doc, dict) else None
    except ValueError:
        pass
    for line in reversed(text.splitlines()):
        try:
            doc = nodejson.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            return doc
    return None


def from_results(results: list[tuple[str, dict]], live: InferenceSnapshot | None = None,
                 engines: Mapping[str, Engine] | None = None,
                 greedy: Mapping[str, bool | None] | None = None) -> Outcome:
    """The outcome of (source, record) pairs, newest last; the live server fills what files lack.
    `engines` names the engine behind a source whose record does not name its own; `greedy` says whether a
    benchmark source decoded greedily (its command's temperature; absent: not known).

    Throughputs are only compared within one way of measuring: the trainer's eval harness ("eval")
    or serving (a serving benchmark, the live server and its stored baseline). A drafter measured one
    way over a baseline measured the other is no speedup. The acceptance length is serving's when
    there is one (the engine's own count), else the eval's."""
    accept: dict[str, Measurement] = {}
    untrained: Measurement | None = None
    drafter: dict[str, Measurement] = {}
    baseline: dict[str, Measurement] = {}
    ev: Acceptance | None = None
    served: dict[str, Acceptance] = {}
    for source, doc in results:
        engine = Engine.from_json(doc.get("engine")) or (engines or {}).get(source)
        if (probed := probe_figure(doc, source, engine)) is not None:     # nodedeck-train probe
            served[source] = probed
            continue
        if (mean := _number(doc.get("mean_accept_len"), nodenum.ACCEPT_LEN)) is not None:    # nodedeck-train eval
            ev = eval_figure(doc, source, engine) or ev
            accept["eval"] = Measurement(mean, source, engine)
            u = doc.get("untrained")
            if isinstance(u, dict) and (before := _number(u.get("mean_accept_len"), nodenum.ACCEPT_LEN)) is not None:
                untrained = Measurement(before, source, engine)
            if (tps := _number(doc.get("tokens_per_s"))) is not None:
                drafter["eval"] = Measurement(tps, source, engine)
            if (base := _number(doc.get("baseline_tokens_per_s"))) is not None:
                baseline["eval"] = Measurement(base, source, engine)
        elif (out := _number(doc.get("output_throughput"))) is not None:   # SGLang's or vLLM's benchmark
            tok_s = Measurement(out, source, engine)
            acc = _number(doc.get("accept_length"), nodenum.ACCEPT_LEN)
            if acc is None:
                acc = _number(doc.get("spec_decode_acceptance_length"), nodenum.ACCEPT_LEN)
            if acc is not None and acc > 0:
                drafter["serving"], accept["serving"] = tok_s, Measurement(acc, source, engine)
                if (fig := bench_figure(doc, source, engine, (greedy or {}).get(source))) is not None:
                    served[source] = fig
            else:
                baseline["serving"] = tok_s
    if live is not None and not live.error:
        where = f"live {live.server} server"
        if live.accept_len is not None:
            served[where] = Acceptance(live.accept_len, where, "serving", None, live.server,
                                       tuple(live.per_position_acceptance), None, live.accept_rate,
                                       len(live.per_position_acceptance) or None)
        if not accept and live.accept_len is not None:
            accept["serving"] = Measurement(live.accept_len, where)
        if not drafter and live.gen_tokens_per_s is not None and live.accept_len is not None:
            drafter["serving"] = Measurement(live.gen_tokens_per_s, where)
        if not baseline and live.baseline_tokens_per_s is not None:
            baseline["serving"] = Measurement(live.baseline_tokens_per_s, "stored baseline")
    acc_m = accept.get("serving") or accept.get("eval")
    figures = tuple(sorted(served.values(), key=lambda f: ev is None or f.prompts_sha256 != ev.prompts_sha256))
    verdicts = () if ev is None else tuple(compare(ev, f) for f in figures)
    paired = [k for k in ("serving", "eval") if k in drafter and k in baseline and baseline[k].value > 0]
    if paired:
        d, b = drafter[paired[0]], baseline[paired[0]]
        speedup = Measurement(d.value / b.value, f"{d.source} / {b.source}", d.engine if d.engine == b.engine else None)
        return Outcome(acc_m, untrained, d, b, speedup, ev, figures, verdicts)
    return Outcome(acc_m, untrained, drafter.get("serving") or drafter.get("eval"),
                   baseline.get("serving") or baseline.get("eval"), None, ev, figures, verdicts)


def result_paths(stage) -> list[str]:
    """A stage's declared .json/.jsonl outputs that can hold results (not metrics or progress records)."""
    out = []
    for path in stage.outputs:
        name = path.rsplit("/", 1)[-1]
        if name.endswith((".json", ".jsonl")) and "metrics" not in name and "progress" not in name:
            out.append(path)
    return out


def server_stage(scheduler: Scheduler, stage: Stage) -> Stage | None:
    """The first server stage `stage` depends on (the server a benchmark or a probe measures), or None."""
    return next((s for s in map(scheduler.plan.stage, stage.depends_on) if s.kind is StageKind.SERVER), None)


def server_log_head(scheduler: Scheduler, server: Stage) -> str | None:
    """The start of the log of a server stage's latest run (its first MAX_READ bytes), or None."""
    handle = scheduler.ctx.handle(server)
    run = handle.store.latest_run(scheduler.ctx.run_key(server))
    if run is None or not run.log_path:
        return None
    launch = scheduler.ctx.record(server).launch_for(run.id)
    try:
        head = handle.host.read_range(run.log_path, launch.log_offset if launch else 0, MAX_READ)
    except HostError:
        return None
    return head.decode(errors="replace")


def server_engine(scheduler: Scheduler, stage: Stage) -> Engine | None:
    """The engine of the server `stage` measures (`server_stage`), as the log of that server's latest run names
    it; None when there is none or its log does not say."""
    server = server_stage(scheduler, stage)
    head = None if server is None else server_log_head(scheduler, server)
    return None if head is None else engine_in_log(head)


def plan_outcome(scheduler: Scheduler, live: InferenceSnapshot | None = None) -> Outcome:
    """The outcome of a plan from its stages' result files on their nodes (then the live server), each
    figure with its engine (`server_engine` for a record that does not name its own); a serving figure that
    parts from the eval's gets the checks of its server's export and command (ops.gap)."""
    results = []
    engines: dict[str, Engine] = {}
    greedy: dict[str, bool | None] = {}
    stages: dict[str, Stage] = {}
    for stage in scheduler.plan.stages:
        if not result_paths(stage):
            continue
        resolved = scheduler.ctx.resolved(stage)
        host = scheduler.ctx.handle(stage).host
        source = f"stage {stage.id}"
        stages[source] = stage
        if (bench := bench_command(resolved.command)) is not None:
            greedy[source] = bench.greedy
        for path in result_paths(resolved):
            try:
                doc = last_record(host, path)
            except HostError:
                doc = None
            if doc is not None:
                results.append((source, doc))
                if source not in engines and "engine" not in doc and (engine := server_engine(scheduler, stage)):
                    engines[source] = engine
    outcome = from_results(results, live, engines, greedy)
    if outcome.eval_acceptance is not None and outcome.train_serve:
        eval_doc = next(doc for source, doc in reversed(results) if source == outcome.eval_acceptance.source)
        checked = tuple(v if v.state == "not compared" else replace(v, checks=_kept(scheduler, v, stages, eval_doc))
                        for v in outcome.train_serve)
        outcome = replace(outcome, train_serve=checked)
    return outcome


def _kept(scheduler: Scheduler, verdict: Verdict, stages: Mapping[str, Stage], eval_doc: dict) -> tuple[Check, ...]:
    """The checks of a compared figure, kept CHECKS_KEPT_S. Every compared figure is checked, not only one
    that parts from the eval: an export wrong for the engine can still agree on the eval's few prompts (a toy
    drafter that barely reads the target's features), and the next prompts pay for it."""
    key = (verdict.eval, verdict.serving.source, verdict.serving.prompts_sha256, verdict.serving.engine)
    kept = _kept_checks.setdefault(scheduler, {})
    now = time.monotonic()
    hit = kept.get(key)
    if hit is None or now - hit[0] > CHECKS_KEPT_S:
        for old in [k for k, (at, _) in kept.items() if now - at > CHECKS_KEPT_S]:   # a new eval's: the old go
            del kept[old]
        hit = kept[key] = (now, _checks(scheduler, verdict, stages, eval_doc))
    return hit[1]


def _checks(scheduler: Scheduler, verdict: Verdict, stages: Mapping[str, Stage], eval_doc: dict) -> tuple[Check, ...]:
    """The checks of the server a figure measured (a benchmark's or probe's server stage; for the live figure, the
    plan's speculating server), with the benchmark's own command when it is one."""
    measured_by = stages.get(verdict.serving.source)
    same = verdict.eval.prompts_sha256 is not None and verdict.eval.prompts_sha256 == verdict.serving.prompts_sha256
    if measured_by is not None:
        server = server_stage(scheduler, measured_by)
        bench = bench_command(scheduler.ctx.resolved(measured_by).command)
    else:
        bench = None
        server = next((s for s in scheduler.plan.stages if (c := server_command(scheduler.ctx.resolved(s).command))
                       and c.method), None)
    if server is None:
        return (Check("server", None, "no server stage of the plan serves this figure"),)
    command = server_command(scheduler.ctx.resolved(server).command)
    if command is None:
        return (Check("server", None, f"stage {server.id} runs neither vLLM nor SGLang"),)
    head = server_log_head(scheduler, server)
    return served_checks(scheduler.ctx.handle(server).host, command, eval_doc, bench, same, verdict.serving.engine,
                         None if head is None else device_in_log(head))


def plan_eval(scheduler: Scheduler) -> Acceptance | None:
    """The eval's acceptance of a plan (its newest eval record), read from the result files alone: what a served
    acceptance is held against live (ops.alerts.rules.collapse)."""
    found = None
    for stage in scheduler.plan.stages:
        if not result_paths(stage):
            continue
        host = scheduler.ctx.handle(stage).host
        for path in result_paths(scheduler.ctx.resolved(stage)):
            try:
                doc = last_record(host, path)
            except HostError:
                continue
            if doc is not None and (fig := eval_figure(doc, f"stage {stage.id}", None)) is not None:
                found = fig
    return found


def closing_lines(scheduler: Scheduler) -> list[str]:
    """The outcome as printed when the dashboard or the demo ends; nothing when there is none yet."""
    try:
        outcome = plan_outcome(scheduler)
    except NodedeckError:
        return []
    if outcome.empty:
        return []
    first, *rest = outcome.lines()
    return [f"outcome: {first}", *(f"         {line}" for line in rest)]
