"""`nodedeck gpus|host|metrics|training|tail|baseline`: a node's telemetry, the same calls the dashboard makes."""

from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from typing import Iterator, TypeVar

from cli.common import host_key_flag, json_flag, number, open_node
from cli.output import emit_json, emit_table
from ops.errors import HostError, UserError
from ops.hints import current
from ops.hosts.base import Host
from ops.nodes import NodeConfig, get_node, load_nodes
from ops.state import StateStore
from ops.telemetry.baseline import Baseline, load_baseline, save_baseline
from ops.telemetry.collector import NodeTelemetry
from ops.telemetry.snapshots import Snapshot
from ops.telemetry.tail import LogFollower
from ops.telemetry.training import MAX_SERIES
from ops.textsafe import shown
from ops.units import ESTIMATE, human_bytes, human_duration


def _common(p, *, json_help="print JSON") -> None:
    p.add_argument("node", help="node name from nodes.toml (`local` is this machine)")
    p.add_argument("--timeout", type=number(float), default=15.0, help="seconds to wait for the node (default 15)")
    host_key_flag(p)
    json_flag(p, json_help)
    p.set_defaults(look_only=True)


def register(sub) -> None:
    p = sub.add_parser("gpus", help="GPUs of a node: utilisation, memory, temperature, power, processes")
    _common(p)
    p.set_defaults(func=cmd_gpus)

    p = sub.add_parser("host", help="CPU, load, RAM and watched disks (fill rate, time to full) of a node")
    _common(p)
    p.add_argument("--interval", type=number(float), default=1.0,
                   help="seconds between the two samples CPU %% needs (default 1)")
    p.set_defaults(func=cmd_host)

    p = sub.add_parser("metrics", help="inference server (SGLang/vLLM) throughput, queue, KV cache, accept length")
    _common(p)
    p.add_argument("--url", help="Prometheus /metrics URL as seen from the node (default: the node's metrics_url)")
    p.add_argument("--log", help="read the server's log file on the node instead of /metrics")
    p.add_argument("--interval", type=number(float, zero_ok=True, unit="seconds"), default=1.0,
                   help="seconds between the two scrapes rates need; 0 = one scrape (default 1)")
    p.set_defaults(func=cmd_metrics)

    p = sub.add_parser("training", help="latest training metrics from a metrics JSONL file on a node")
    _common(p)
    p.add_argument("path", help="metrics JSONL file on the node")
    p.add_argument("--total-steps", type=number(int), help="steps the run will take (for the ETA)")
    p.set_defaults(func=cmd_training)

    p = sub.add_parser("tail", help="last lines of a file on a node; -f follows it")
    _common(p, json_help="print JSON (with -f: one JSON object per line)")
    p.add_argument("path", help="file on the node")
    p.add_argument("-n", "--lines", type=int, default=20, help="lines to show first (default 20)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines (Ctrl-C stops)")
    p.add_argument("--interval", type=number(float), default=0.5, help="seconds between reads with -f (default 0.5)")
    p.set_defaults(func=cmd_tail)

    p = sub.add_parser("baseline", help="show or record the baseline throughput speedups are measured against")
    p.add_argument("node", help="node name from nodes.toml")
    p.add_argument("--set", type=number(float), metavar="TOKENS_PER_S",
                   help="record this output tokens/s of the plain target model")
    p.add_argument("--label", default="", help="what was measured (with --set)")
    json_flag(p)
    p.set_defaults(func=cmd_baseline)


@contextmanager
def _telemetry(args, **kw) -> Iterator[tuple[NodeConfig, Host, NodeTelemetry]]:
    with open_node(args) as handle:
        telemetry = NodeTelemetry.for_node(handle.node, handle.host, timeout=args.timeout, **kw)
        try:
            yield handle.node, handle.host, telemetry
        finally:
            telemetry.close()   # the node's sampler, if `gpus` or `host` started it: the dashboard's reading


SnapshotT = TypeVar("SnapshotT", bound=Snapshot)


def _fresh(snap: SnapshotT) -> SnapshotT:
    """A one-shot command has no older data to show: a failed poll is an error."""
    if snap.stale:
        raise HostError(snap.error or "no data")
    return snap


def _n(v, fmt="{:.0f}", unit=""):
    return "-" if v is None else fmt.format(v) + unit


def _bytes(n) -> str:
    return "-" if n is None else human_bytes(n, largest="PiB")


# -- gpus ---------------------------------------------------------------------------
def cmd_gpus(args) -> int:
    with _telemetry(args) as (node, _, tel):
        snap = _fresh(tel.poll_gpus())
    if args.json:
        emit_json({"node": node.name, **snap.to_dict()})
        return 0
    if not snap.available:
        print(f"{node.name}: no GPUs available ({shown(snap.reason)})")
        return 0
    rows = []
    for g in snap.gpus:
        rows.append([
            g.index,
            g.name or "?",
            "MIG" if g.mig is not None else _n(g.util_pct, unit="%"),
            "MIG" if g.mig is not None else f"{_n(g.mem_used_mib)} / {_n(g.mem_total_mib)} MiB",
            _n(g.temp_c, unit="C"),
            f"{_n(g.power_w)} / {_n(g.power_limit_w)} W",
            _n(g.sm_clock_mhz, unit=" MHz"),
            "LOST" + (f": {g.error}" if g.error and g.error != "GPU is lost" else "") if g.lost else (g.error or ""),
        ])
        for m in g.mig or ():   # a MIG instance: its own utilisation (GPM) and memory
            rows.append([f"{g.index}/{m.index}", f"MIG {m.profile}", _n(m.util_pct, unit="%"),
                         f"{_n(m.mem_used_mib)} / {_n(m.mem_total_mib)} MiB", "", "", "",
                         f"GI {_n(m.gpu_instance, '{}')} CI {_n(m.compute_instance, '{}')}"])
    emit_table(["gpu", "name", "util", "memory", "temp", "power", "sm clock", "note"], rows)
    if snap.processes:
        print()
        emit_table(
            ["gpu", "pid", "memory", "command"],
            [[_n(p.gpu_index, "{}"), p.pid, _n(p.mem_mib, unit=" MiB"), p.command or "?"] for p in snap.processes],
        )
    return 0


# -- host ------------------------------------------------------------------------------
def cmd_host(args) -> int:
    with _telemetry(args) as (node, _, tel):
        _fresh(tel.poll_host())
        time.sleep(args.interval)
        snap = _fresh(tel.poll_host())
    if args.json:
        emit_json({"node": node.name, **snap.to_dict()})
        return 0
    print(
        f"{node.name}: cpu {_n(snap.cpu_pct, '{:.1f}', '%')} of {_n(snap.cpu_count, '{}')} cores, "
        f"load {_n(snap.load1, '{:.2f}')} {_n(snap.load5, '{:.2f}')} {_n(snap.load15, '{:.2f}')}, "
        f"ram {_bytes(snap.ram_used)} / {_bytes(snap.ram_total)}"
    )
    if snap.disks:
        emit_table(
            ["path", "free", "total", "free %", "fill rate", "full in", "warning"],
            [
                [
                    d.path,
                    _bytes(d.free),
                    _bytes(d.total),
                    f"{d.free_pct:.1f}%",
                    "-" if d.fill_rate_bytes_per_s is None else f"{_bytes(d.fill_rate_bytes_per_s)}/s",
                    "-" if d.time_to_full_s is None else human_duration(d.time_to_full_s, ESTIMATE),
                    d.warn_reason or "",
                ]
                for d in snap.disks
            ],
        )
    if snap.error:
        print(f"nodedeck: {shown(snap.error)}", file=sys.stderr)
    return 0


# -- inference metrics ------------------------------------------------------------------
def cmd_metrics(args) -> int:
    with _telemetry(args) as (node, _, tel):
        url = args.url or (None if args.log else tel.metrics_url)
        if not url and not args.log:
            raise UserError(f"node {node.name} has no metrics_url in nodes.toml: pass --url URL or --log PATH")
        snap = _fresh(tel.poll_inference(url, log_path=args.log))
        if url and args.interval > 0:
            time.sleep(args.interval)
            snap = _fresh(tel.poll_inference(url))
    if snap.error:
        raise HostError(snap.error)
    if args.json:
        emit_json({"node": node.name, **snap.to_dict()})
        return 0
    rows = [
        ("server", f"{snap.server} ({snap.source}{': ' + snap.url if snap.url else ''})"),
        ("model", snap.model_name or "-"),
        ("generation tok/s", _n(snap.gen_tokens_per_s, "{:.1f}")),
        ("prompt tok/s", _n(snap.prompt_tokens_per_s, "{:.1f}")),
        ("running / queued", f"{_n(snap.running_reqs)} / {_n(snap.queued_reqs)}"),
        ("KV cache usage", _n(None if snap.kv_cache_usage is None else 100 * snap.kv_cache_usage, "{:.1f}", "%")),
        ("accept length", _n(snap.accept_len, "{:.2f}")),
        ("accept rate", _n(None if snap.accept_rate is None else 100 * snap.accept_rate, "{:.1f}", "%")),
        ("prefix cache hits",
         _n(None if snap.prefix_cache_hit_rate is None else 100 * snap.prefix_cache_hit_rate, "{:.1f}", "%")),
        ("baseline tok/s", _n(snap.baseline_tokens_per_s, "{:.1f}")),
        ("speedup", _n(snap.speedup_vs_baseline, "{:.2f}", "x")),
    ]
    if snap.per_position_acceptance:
        rows.append(("per-position accept", ", ".join(f"{p:.2f}" for p in snap.per_position_acceptance)))
    emit_table(["metric", "value"], rows)
    _say_invalid("the server", snap.invalid)
    return 0


# -- training ---------------------------------------------------------------------------
def cmd_training(args) -> int:
    with _telemetry(args) as (node, _, tel):
        snap = _fresh(tel.poll_training(args.path, total_steps=args.total_steps))
    if args.json:
        emit_json({"node": node.name, **snap.to_dict()})
        return 0
    if snap.step is None:
        print(f"{args.path}: no metrics records yet ({snap.skipped_lines} malformed lines skipped)")
        return 0
    total = f" / {snap.total_steps}" if snap.total_steps else ""
    print(
        f"step {snap.step}{total}  loss {_n(snap.loss, '{:.4g}')}  lr {_n(snap.lr, '{:.3g}')}  "
        f"{_n(snap.steps_per_s, '{:.2f}')} steps/s  eta "
        f"{'-' if snap.eta_s is None else human_duration(snap.eta_s, ESTIMATE)}"
    )
    extra = [(k, v) for k, v in snap.latest.items() if k not in ("step", "loss", "lr")]
    if extra:
        emit_table(["metric", "value"], [(k, f"{v:.6g}" if isinstance(v, float) else v) for k, v in extra])
    if snap.skipped_lines:
        print(f"({snap.records} records, {snap.skipped_lines} malformed lines skipped)")
    _say_invalid("the metrics file", snap.invalid)
    if snap.uncharted:
        print(f"nodedeck: {snap.uncharted} values of keys past the first {MAX_SERIES} not charted", file=sys.stderr)
    return 0


def _say_invalid(source: str, invalid: dict[str, str]) -> None:
    """One line on stderr naming each value no such metric can have, as the node gave it (ops.nodenum)."""
    if invalid:
        print(f"nodedeck: {source} reported values no such metric can have (not shown): "
              + ", ".join(f"{k} {v}" for k, v in invalid.items()), file=sys.stderr)


# -- tail ---------------------------------------------------------------------------------
def _print_lines(lines, as_json: bool) -> None:
    for line in lines:
        print(json.dumps({"line": line}) if as_json else line)
    sys.stdout.flush()


def cmd_tail(args) -> int:
    if args.lines < 0:
        raise UserError("-n: must be 0 or more lines")
    with _telemetry(args) as (node, host, _):
        follower = LogFollower(host, args.path, n=args.lines, maxlen=max(args.lines, 1))
        first = follower.poll()
        if args.json and not args.follow:
            emit_json({"node": node.name, "path": args.path, "lines": first.new_lines})
            return 0
        _print_lines(first.new_lines, args.json)
        if not args.follow:
            return 0
        try:
            while True:
                time.sleep(args.interval)
                snap = follower.poll()
                if snap.restarted:
                    print(f"nodedeck: {args.path}: file truncated or replaced", file=sys.stderr)
                _print_lines(snap.new_lines, args.json)
        except KeyboardInterrupt:
            return 0


# -- baseline -----------------------------------------------------------------------------
def cmd_baseline(args) -> int:
    node = get_node(load_nodes(args.config), args.node)
    store = StateStore.for_node(node.name)
    try:
        if args.set is not None:
            save_baseline(store, Baseline(tokens_per_s=args.set, label=args.label))
        b = load_baseline(store)
    finally:
        store.close()
    if args.json:
        emit_json({"node": node.name, "baseline": None if b is None else vars(b)})
    elif b is None:
        record = current().command("baseline", node.name, "--set", "TOKENS_PER_S")
        print(f"{node.name}: no baseline recorded (`{record}` records one)")
    else:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(b.recorded_at))
        print(f"{node.name}: baseline {b.tokens_per_s:.1f} tok/s, recorded {when}"
              + (f" ({b.label})" if b.label else ""))
    return 0
