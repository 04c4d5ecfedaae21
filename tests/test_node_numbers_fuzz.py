"""Issue 41: every parser of what a node sends, fed with numbers that are none (hypothesis, bounded).

Unicode digits (`²` passes str.isdigit(), `١٢` passes float()), integers of hundreds of digits, inf/nan, 1e308 and
1e-300, negatives, separators (`1_0`) and huge lines reach each parser as text and as JSON. None may raise
anything but its documented one-line error, and every number it hands on is finite and within its field.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ops import nodenum
from ops.errors import HostError
from ops.textsafe import shown
from ops.units import human_bytes, human_duration

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

UNICODE_DIGITS = st.text(st.characters(categories=["Nd", "No", "Nl"]), min_size=1, max_size=6)
HUGE_INTS = st.integers(min_value=-(10**450), max_value=10**450)
ODD_TEXT = st.sampled_from(["inf", "-inf", "nan", "NaN", "+Inf", "1e308", "-1e308", "1e-300", "1_0", "0x10",
                            "9" * 400, "-" + "9" * 400, "1" * 41, "", " ", "-0", "+5", "1.", ".5", "5e", "²",
                            "8²", "١٢", "Ⅻ", "\x1b[2J7", "7\n8", "x" * 70_000])
NUMBER_TEXT = st.one_of(ODD_TEXT, UNICODE_DIGITS, HUGE_INTS.map(str),
                        st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=12))
JSON_NUMBER = st.one_of(HUGE_INTS, st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
                        NUMBER_TEXT)
FIELDS = [v for v in vars(nodenum).values() if isinstance(v, (nodenum.Whole, nodenum.Real))]


def _bounded(v: float | None, field: nodenum.Whole | nodenum.Real | None = None) -> bool:
    if v is None:
        return True
    if isinstance(v, float) and not math.isfinite(v):
        return False
    return field is None or field.lo <= v <= field.hi


# -- the parser itself ------------------------------------------------------------------------
@FUZZ
@given(st.sampled_from(FIELDS), st.one_of(JSON_NUMBER, NUMBER_TEXT.map(str.encode)))
def test_a_field_gives_a_number_in_its_range_or_says_invalid_in_one_short_line(field, raw):
    try:
        v = field.parse(raw)
    except nodenum.Invalid as e:
        said = str(e)
        assert said.startswith(f"invalid {field.name} ") and "\n" not in said and len(said) < 120
        assert not any(c in said for c in "\x1b\x9b")
        assert field.get(raw) is None
        return
    assert isinstance(v, int if isinstance(field, nodenum.Whole) else float) and not isinstance(v, bool)
    assert _bounded(v, field)
    if isinstance(raw, (str, bytes)):
        text = raw.decode() if isinstance(raw, bytes) else raw
        assert text.strip(" \t\r\n").isascii() and len(text.strip()) <= nodenum.MAX_CHARS


@pytest.mark.parametrize("raw", ["²", "8²", "١٢", "1_0", "9" * 400, "inf", "nan", "1e309", " 0x1 "])
def test_text_python_would_take_is_no_node_number(raw):
    assert nodenum.Real("x", -1e308, 1e308).get(raw) is None
    assert nodenum.Whole("x", -(10**500), 10**500).get(raw) is None


# -- every parser of a node's answer ------------------------------------------------------------
@FUZZ
@given(st.lists(NUMBER_TEXT, min_size=3, max_size=3), NUMBER_TEXT, st.lists(JSON_NUMBER, min_size=4, max_size=4))
def test_the_setup_probe(gpu_row, mem, numbers):
    from ops.setup.checks import check_disk, check_gpus, check_python
    from ops.setup.probe import _facts
    from ops.setup.results import Failed, StepStatus

    facts = _facts({"python": numbers[:3], "disk": {"path": "/w", "free": numbers[3], "total": numbers[0]},
                    "gpus": [", ".join(gpu_row), f"H100, 550, {mem}"]})
    assert all(_bounded(v) for v in (facts.disk_free, facts.disk_total, *facts.python))
    assert all(_bounded(g.memory_mib, nodenum.MIB) for g in facts.gpus or ())
    for check in (lambda: check_disk(facts, 20.0), lambda: check_gpus(facts)):
        status, detail = check()
        assert isinstance(status, StepStatus) and "\n" not in detail
    try:
        check_python(facts, "python3")
    except Failed as e:   # the step's own failure: one line
        assert "\n" not in str(e)


@FUZZ
@given(st.lists(NUMBER_TEXT, min_size=10, max_size=10), st.lists(NUMBER_TEXT, min_size=4, max_size=4),
       NUMBER_TEXT)
def test_nvidia_smi_and_ps(row, app, rc):
    from ops.telemetry.gpus import parse_gpu_script_output

    out = (f"@@nodedeck gpu {rc}\n{', '.join(x.replace(',', ' ') for x in row)}\n"
           f"@@nodedeck apps 0\n{', '.join(x.replace(',', ' ') for x in app)}\n@@nodedeck ps\n{app[1]} python x\n")
    snap = parse_gpu_script_output(0, out)
    for g in snap.gpus:
        assert _bounded(g.index, nodenum.GPU_INDEX) and _bounded(g.util_pct, nodenum.GPU_PERCENT)
        assert all(_bounded(v, nodenum.MIB) for v in (g.mem_used_mib, g.mem_total_mib))
        assert all(_bounded(v) for v in (g.temp_c, g.power_w, g.power_limit_w, g.sm_clock_mhz))
    assert all(_bounded(p.pid, nodenum.PID) and _bounded(p.mem_mib) for p in snap.processes)


@FUZZ
@given(st.dictionaries(st.sampled_from(["index", "util_pct", "mem_used_mib", "temp_c", "power_w", "pid",
                                        "gpu_index", "mem_mib"]), JSON_NUMBER),
       st.lists(JSON_NUMBER, max_size=9), JSON_NUMBER)
def test_the_samplers_json(fields, stat, one):
    from ops.telemetry.hoststats import raw_from_sample
    from ops.telemetry.sampler import gpu_snapshot

    try:
        snap = gpu_snapshot({"gpus": [dict(fields)], "processes": [dict(fields)]}, 1.0)
        assert all(_bounded(g.util_pct, nodenum.GPU_PERCENT) and _bounded(g.index) for g in snap.gpus)
    except HostError as e:
        assert "\n" not in str(e)
    try:
        raw = raw_from_sample({"stat": stat, "load": [one, 1.0, 1.0], "mem": {"MemTotal": one}, "nproc": one,
                               "disks": [["/", one, 1, one]]})
        assert all(_bounded(v) for d in raw.disks for v in d[1:])
    except HostError as e:
        assert "\n" not in str(e)


@FUZZ
@given(st.lists(NUMBER_TEXT, min_size=5, max_size=5))
def test_the_host_script(words):
    from ops.hosts.local import LocalHost
    from ops.telemetry.hoststats import HostStatsCollector, parse_host_script_output

    text = (f"@@nodedeck stat\ncpu {' '.join(w or '0' for w in words)} 1 2 3\n@@nodedeck loadavg\n{words[0]} 1 1\n"
            f"@@nodedeck meminfo\nMemTotal: {words[1]} kB\n@@nodedeck nproc\n{words[2]}\n"
            f"@@nodedeck df /\nFilesystem 1-blocks Used Available Capacity Mounted on\n"
            f"/dev/x {words[3]} 1 {words[4]} 1% /\n")
    stats = HostStatsCollector(LocalHost(), ["/"]).snapshot(parse_host_script_output(text, ["/"]), 1.0)
    assert all(_bounded(v) for v in (stats.cpu_count, stats.load1, stats.ram_total))
    assert all(human_bytes(d.free) and human_bytes(d.total) for d in stats.disks)


@FUZZ
@given(st.lists(NUMBER_TEXT, min_size=4, max_size=4))
def test_a_metrics_page(words):
    from ops.hosts.local import LocalHost
    from ops.telemetry.inference import InferenceMetrics

    def value(w: str) -> str:
        return w if w and not any(c.isspace() for c in w) and w.isprintable() else "1"

    label = json.dumps(words[0])[1:-1]
    page = (f'sglang:num_running_reqs{{tp_rank="{label}"}} {value(words[1])}\n'
            f'sglang:num_queue_reqs{{tp_rank="0"}} {value(words[2])}\n'
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{label}"}} {value(words[3])}\n')
    try:
        snap = InferenceMetrics(LocalHost(), "x").parse(page, 1.0)
    except HostError as e:
        assert "\n" not in str(e)
        return
    assert _bounded(snap.running_reqs, nodenum.REQUESTS) and _bounded(snap.queued_reqs, nodenum.REQUESTS)
    assert all(len(v) < 200 and "\n" not in v for v in snap.invalid.values())


@FUZZ
@given(st.lists(NUMBER_TEXT, min_size=3, max_size=3))
def test_a_server_log(words):
    from ops.telemetry.serverlog import ServerLogMetrics

    m = ServerLogMetrics()
    m.feed([f"[2026-09-27 09:20:28 TP0] Decode batch, #running-req: {words[0]}, #queue-req: {words[1]}, "
            f"gen throughput (token/s): {words[2]}, accept len: {words[0]}"], now=1.0)
    snap = m.snapshot()
    if snap is not None:
        assert all(_bounded(v) for v in (snap.running_reqs, snap.queued_reqs, snap.gen_tokens_per_s,
                                         snap.accept_len))


@FUZZ
@given(st.lists(st.dictionaries(st.sampled_from(["step", "loss", "lr", "ts", "total_steps", "nonfinite_steps",
                                                 "acc_0", "x" * 100]), JSON_NUMBER), min_size=1, max_size=4))
def test_training_metrics_lines(records):
    from ops.hosts.local import LocalHost
    from ops.telemetry.training import TrainingMetrics

    tm = TrainingMetrics(LocalHost(), "/nonexistent")
    for r in records:
        try:
            line = json.dumps(r)
        except ValueError:   # an integer past Python's 4300-digit str() limit: json cannot write it either
            continue
        tm.ingest(line)
    snap = tm.snapshot(1.0)
    assert all(_bounded(v) for v in (snap.step, snap.loss, snap.lr, snap.steps_per_s, snap.eta_s, snap.total_steps))
    assert snap.eta_s is None or human_duration(snap.eta_s)
    for name in tm.history.keys():
        assert all(math.isfinite(y) for y in tm.history.get(name)[1])


@FUZZ
@given(st.dictionaries(st.sampled_from(["ts", "done", "total", "rate", "unit"]), JSON_NUMBER))
def test_progress_records(record):
    from ops.run.progress import last_record

    try:
        data = json.dumps(record).encode() + b"\n"
    except ValueError:
        return
    rec = last_record(data)
    if rec is not None:
        assert all(_bounded(v) for v in (rec.ts, rec.done, rec.total, rec.rate, rec.eta_s, rec.fraction))
        text = rec.describe()
        assert shown(text) == text and len(text) < 400


@FUZZ
@given(st.lists(NUMBER_TEXT, min_size=6, max_size=6))
def test_tmux_panes_pid_files_and_proc_stat(words):
    from ops.tmux.view import parse_stop_output, parse_view

    w = [x.replace(":", "").replace("\t", "").replace("\n", "") for x in words]
    view = parse_view(f"T:nd-a:{w[0]}:1:{w[1]}:{w[2]}\nP\tx\t{w[0]}\t{w[3]} {w[4]}\nE\tx\t{w[1]}\t{w[5]}\n"
                      f"S\t{w[0]}\t{w[3]} {w[4]} S\n")
    for p in view.panes.values():
        assert _bounded(p.pid, nodenum.PID) and _bounded(p.dead_status) and _bounded(p.dead_signal)
    assert all(_bounded(v) for ids in view.pid_files.values() for v in ids)
    assert all(_bounded(c) and _bounded(t) for c, t in view.exit_files.values())
    assert all(_bounded(s.start) and _bounded(s.pgid) for s in view.procs.values())
    _, code, ended = parse_stop_output(f"stopped {w[1]} {w[5]}")
    assert _bounded(code) and _bounded(ended)


@FUZZ
@given(st.lists(NUMBER_TEXT, min_size=5, max_size=5))
def test_the_decommission_listing_and_counts(words):
    from ops.decommission.inventory import BadRecord, Root, _entry
    from ops.decommission.sysinfo import _parse_df
    from ops.decommission.transfer import MalformedAnswer, _count

    w = [x.replace("\t", "") for x in words]
    try:
        e = _entry(f"E\t0\tf\t{w[0]}\t{w[1]}\t{w[2]}\t{w[3]}\t644\tname", "", [Root("/r", "cli")])
        assert _bounded(e.size, nodenum.BYTES) and _bounded(e.inode) and abs(e.mtime_ns) < 10**22
    except BadRecord as bad:
        assert "\n" not in str(bad).replace("\\n", "")
    try:
        assert _bounded(_count("size", w[4]), nodenum.BYTES)
    except MalformedAnswer:
        pass
    for d in _parse_df(f"Filesystem 1B Used Avail Use% Mounted\n/dev/x {w[0]} {w[1]} {w[4]} 1% /\n"):
        assert all(_bounded(v, nodenum.BYTES) for v in (d.size, d.used, d.avail))


@FUZZ
@given(st.lists(JSON_NUMBER, min_size=4, max_size=4))
def test_result_files_for_the_outcome_and_agent_lists(numbers):
    from ops.agents.discover import _record
    from ops.outcome import from_results

    docs = [("eval", {"mean_accept_len": numbers[0], "tokens_per_s": numbers[1],
                      "baseline_tokens_per_s": numbers[2]}),
            ("bench", {"output_throughput": numbers[3], "accept_length": numbers[0]})]
    out = from_results(docs)
    for m in (out.accept_len, out.drafter_tok_s, out.baseline_tok_s, out.speedup):
        assert m is None or _bounded(m.value)
    try:
        _record({"agent": "claude", "session": "s", "updated": numbers[0], "items": []}, "lists[0]", "gpu1")
    except HostError as e:
        assert "\n" not in str(e)
