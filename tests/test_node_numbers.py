"""Issue 41, items 1-4: a number a node sends goes through one parser (ops.nodenum); a bad one is shown as invalid
for its field and never ends a command or the dashboard.

Each case runs against the loopback sshd with the lying command first on the node's PATH: nvidia-smi, the
probe's python3, head/getconf/df, curl, tmux and find print Unicode digits (`²`, which `str.isdigit()` takes),
400-digit integers, 1e308 and tiny rates; progress and metrics files on the node hold the same.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from cli.main import main
from tests.support.hostile_node import executable, lying_node_toml
from tests.support.tmux_sessions import kill_plan_sessions
from tests.support.tui_fixed import FixedSource
from tests.support.tui_screens import aio, screen_ready, until, wait_polled

HUGE = 10**400
HUGE_TEXT = "9" * 400
REAL = "/usr/bin"


def _screen(app) -> str:
    """The dashboard's text as the user reads it (the screenshot's SVG with its spaces)."""
    return app.export_screenshot().replace("&#160;", " ")


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


@pytest.fixture
def node(tmp_path, sshd):
    """(nodes.toml naming the sshd as gpu1, the bin dir first on its PATH, its work dir)."""
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    (tmp_path / "home").mkdir()
    sshd.put_first_on_path(bindir, tmp_path / "home")
    work = tmp_path / "work"
    return lying_node_toml(tmp_path, sshd, root=str(work)), bindir, work


# -- 1. node setup: nvidia-smi's GPU memory `8²`, a probe's free disk of 400 digits ---------------------------
SMI_8SQ = ('#!/bin/sh\nif [ $# -gt 0 ]; then echo "NVIDIA H100 80GB HBM3, 550.54, 8²"; '
           'else echo "| NVIDIA-SMI 550.54   Driver Version: 550.54   CUDA Version: 12.4 |"; fi\n')
NO_VENV = ('#!/bin/bash\nfor a in "$@"; do [ "$a" = venv ] && { echo "venv: refused by the test" >&2; exit 1; }; done\n'
           f'exec {REAL}/python3 "$@"\n')


def _steps(out: str) -> dict[str, dict]:
    return {s["step"]: s for s in json.loads(out)["steps"]}


def test_node_setup_shows_gpu_memory_8sq_as_invalid_and_goes_on(node, capsys):
    cfg, bindir, _ = node
    executable(bindir / "nvidia-smi", SMI_8SQ)
    executable(bindir / "python3", NO_VENV)      # the setup stops at the environment: nothing installed
    rc, out, err = _cli(capsys, "--config", str(cfg), "node", "setup", "gpu1", "--json")
    steps = _steps(out)
    assert rc == 1 and steps["environment"]["status"] == "failed", out
    gpus = steps["gpus"]
    assert gpus["status"] == "warning" and gpus["detail"].startswith("1 x NVIDIA H100 80GB HBM3; driver 550.54")
    assert "invalid GPU memory 8²" in gpus["detail"]


def test_node_setup_shows_a_400_digit_free_disk_and_python_version_as_invalid(node, capsys):
    cfg, bindir, work = node
    answer = {"python": [3, 12, 1], "executable": "/usr/bin/python3", "gpus": None, "torch_version": None,
              "disk": {"path": str(work), "free": HUGE, "total": HUGE}}
    line = "NODEDECK-PROBE " + json.dumps(answer)
    (bindir / "probe.json").write_text(line + "\n")
    executable(bindir / "python3", f'#!/bin/bash\ncase "$2" in *NODEDECK-PROBE*) cat {bindir}/probe.json; exit 0;; '
                                   f'esac\n{NO_VENV.split(chr(10), 1)[1]}')
    rc, out, _ = _cli(capsys, "--config", str(cfg), "node", "setup", "gpu1", "--json")
    steps = _steps(out)
    assert rc == 1 and steps["environment"]["status"] == "failed", out
    assert steps["disk"]["status"] == "warning"
    assert steps["disk"]["detail"] == "free space unknown: invalid free disk (an integer of about 401 digits)"
    answer["python"] = [3, HUGE, 0]
    (bindir / "probe.json").write_text("NODEDECK-PROBE " + json.dumps(answer) + "\n")
    rc, out, _ = _cli(capsys, "--config", str(cfg), "node", "setup", "gpu1", "--json")
    python = _steps(out)["python"]
    assert rc == 1 and python["status"] == "failed" and "Python 0.0.0" in python["detail"]


class _Picker(FixedSource):
    """Fixed data whose node picker lists the lying node of nodes.toml."""

    def __init__(self, config_path: Path):
        super().__init__()
        self.config_path = config_path

    def nodes(self) -> list[str]:
        return ["gpu1"]


@aio
async def test_n_then_u_on_a_node_whose_gpu_memory_is_8sq_keeps_the_dashboard(node):
    from tui.app import NodedeckApp
    from tui.screens.nodes import NodePickerScreen
    from tui.screens.setup import NodeSetupScreen

    cfg, bindir, _ = node
    executable(bindir / "nvidia-smi", SMI_8SQ)
    executable(bindir / "python3", NO_VENV)
    app = NodedeckApp(_Picker(cfg), refresh_s=3600)
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_polled(app, pilot)
        await pilot.press("n")
        await until(pilot, lambda: screen_ready(app, NodePickerScreen), what="picker")
        await pilot.press("u")
        await until(pilot, lambda: screen_ready(app, NodeSetupScreen), what="setup screen")
        await until(pilot, lambda: "is not ready" in app.screen.lines.plain, timeout=120, what="the setup's end")
        assert "invalid GPU memory 8²" in app.screen.lines.plain
        await pilot.press("escape")
        await until(pilot, lambda: screen_ready(app, NodePickerScreen), what="back to the picker")
    assert app.return_code in (None, 0)


# -- 2. progress and training metrics: 1e308 totals, tiny rates, a 400-digit nonfinite_steps ------------------
def _plan(tmp_path: Path, record: dict) -> tuple[Path, str]:
    name = f"num{uuid.uuid4().hex[:8]}"
    rec = tmp_path / "record.json"
    rec.write_text(json.dumps(record) + "\n")
    plan = tmp_path / "plan.toml"
    plan.write_text(f'[plan]\nname = "{name}"\nnode = "gpu1"\n\n[[stage]]\nid = "count"\ntitle = "Counts"\n'
                    f'command = "cat {rec} >> $NODEDECK_PROGRESS; sleep 120"\n')
    return plan, name


def test_plan_show_and_the_dashboard_take_a_progress_record_of_1e308_at_1e_300_per_s(node, tmp_path, capsys):
    from tui.app import NodedeckApp
    from tui.live import LiveSource

    cfg, _, _ = node
    plan, name = _plan(tmp_path, {"ts": time.time(), "done": 5, "total": 1e308, "rate": 1e-300, "unit": "rows"})
    try:
        rc, out, err = _cli(capsys, "--config", str(cfg), "stage", "start", "count", "--plan", str(plan))
        assert rc == 0, out + err
        seen = ""
        for _ in range(40):
            rc, out, err = _cli(capsys, "--config", str(cfg), "plan", "show", str(plan))
            assert rc == 0, err
            if "progress" in out:
                seen = out
                break
            time.sleep(0.25)
        assert "progress 5 rows, 1e-300 rows/s (invalid total 1e+308)" in seen, seen

        async def dashboard() -> None:
            src = LiveSource(config_path=cfg, plan_path=plan, timeout=5)
            app = NodedeckApp(src, refresh_s=0.25)
            try:
                async with app.run_test(size=(160, 40)) as pilot:
                    await wait_polled(app, pilot, timeout=30)
                    await until(pilot, lambda: "invalid total 1e+308" in _screen(app), 30,
                                "the progress row")
                assert app.return_code in (None, 0)
            finally:
                src.close()

        aio(dashboard)()
    finally:
        kill_plan_sessions(name)


def _metrics(path: Path) -> None:
    lines = [{"step": 1, "ts": 1000.0, "loss": 2.0, "total_steps": 1e308},
             {"step": 2, "ts": 1000.0 + 1e9, "loss": 1.5, "total_steps": 1e308, "nonfinite_steps": HUGE},
             {"step": 3, "ts": 1000.0 + 2e9, "loss": HUGE, "total_steps": 1e308, "nonfinite_steps": HUGE}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_training_takes_total_steps_1e308_a_tiny_rate_and_400_digit_values(node, tmp_path, capsys):
    cfg, _, _ = node
    path = tmp_path / "metrics.jsonl"
    _metrics(path)
    rc, out, err = _cli(capsys, "--config", str(cfg), "training", "gpu1", str(path))
    assert rc == 0, err
    head = out.splitlines()[0]
    assert head.startswith("step 3  loss -  lr -  ") and head.endswith(" steps/s  eta -"), head
    assert err.count("\n") == 1 and "loss (an integer of about 401 digits)" in err and "total_steps 1e+308" in err
    assert "nonfinite_steps (an integer of about 401 digits)" in err and "000000000" not in out
    rc, out, _ = _cli(capsys, "--config", str(cfg), "training", "gpu1", str(path), "--json")
    snap = json.loads(out)
    assert rc == 0 and snap["loss"] is None and snap["eta_s"] is None and snap["total_steps"] is None


@aio
async def test_the_training_panel_takes_the_same_file(node, tmp_path):
    from tui.app import NodedeckApp
    from tui.live import LiveSource

    cfg, _, _ = node
    path = tmp_path / "metrics.jsonl"
    _metrics(path)
    src = LiveSource(config_path=cfg, node="gpu1", metrics_path=str(path), timeout=5)
    app = NodedeckApp(src, refresh_s=0.25)
    try:
        async with app.run_test(size=(160, 40)) as pilot:
            await wait_polled(app, pilot, timeout=30)
            await until(pilot, lambda: "step 3" in _screen(app), 30, "the training panel")
            shown = app.dash.training.view
            assert shown is not None and shown.snapshot is not None
            huge = "(an integer of about 401 digits)"
            assert shown.snapshot.invalid == {"loss": huge, "total_steps": "1e+308", "nonfinite_steps": huge}
        assert app.return_code in (None, 0)
    finally:
        src.close()


# -- 3. eight CLI tracebacks from a Unicode digit or a 400-digit integer -------------------------------------
SGLANG = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{model_name="m",tp_rank="{rank}"}} 3.0
sglang:num_running_reqs{{model_name="m",tp_rank="0"}} 2.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{model_name="m",tp_rank="0"}} {queue}
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{{model_name="m",tp_rank="0"}} 100.0
"""


def _row(out: str, name: str) -> str:
    """The value of a `metrics` table row."""
    return next(line[len(name):].strip() for line in out.splitlines() if line.startswith(name))


@pytest.mark.parametrize("rank", ["²", HUGE_TEXT], ids=["unicode-digit", "400-digits"])
def test_metrics_takes_a_tp_rank_label_of_unicode_digits_or_400_digits(node, capsys, rank):
    cfg, bindir, _ = node
    (bindir / "page.txt").write_text(SGLANG.format(rank=rank, queue="1.0"))
    executable(bindir / "curl", f"#!/bin/sh\ncat {bindir}/page.txt\n")
    rc, out, err = _cli(capsys, "--config", str(cfg), "metrics", "gpu1", "--url", "http://127.0.0.1:9/metrics",
                        "--interval", "0")
    assert rc == 0, err
    assert _row(out, "running / queued") == "2 / 1"      # the sample of an invalid rank is not counted
    assert err.count("\n") == 1 and f"tp_rank {rank[:12]}" in err


def test_a_queue_of_1e308_is_invalid_not_a_309_digit_number(node, capsys):
    cfg, bindir, _ = node
    (bindir / "page.txt").write_text(SGLANG.format(rank="0", queue="1e308"))
    executable(bindir / "curl", f"#!/bin/sh\ncat {bindir}/page.txt\n")
    rc, out, err = _cli(capsys, "--config", str(cfg), "metrics", "gpu1", "--url", "http://127.0.0.1:9/metrics",
                        "--interval", "0")
    assert rc == 0 and _row(out, "running / queued") == "3 / -", out
    assert "queued_reqs 1e+308" in err and "000000" not in out + err


LYING_TMUX = f'''#!/bin/bash
out=$({REAL}/tmux "$@"); rc=$?
[ -n "$out" ] && printf '%s\\n' "$out"
for a in "$@"; do
  if [ "$a" = list-panes ]; then
    printf 'T:nd-liar-a:²:0::\\nT:nd-liar-b:{HUGE_TEXT}:1:{HUGE_TEXT}:²\\n'
    printf 'P\\tliar-a\\t²\\t1 2\\nE\\tliar-b\\t{HUGE_TEXT}\\t1e308\\nS\\t²\\t1 2 S\\n'
  fi
done
exit $rc
'''


def test_tmux_ls_and_stage_start_take_pane_pids_of_unicode_digits_and_400_digits(node, tmp_path, capsys):
    cfg, bindir, _ = node
    executable(bindir / "tmux", LYING_TMUX)
    plan, name = _plan(tmp_path, {"ts": time.time(), "done": 1})
    try:
        rc, out, err = _cli(capsys, "--config", str(cfg), "stage", "start", "count", "--plan", str(plan))
        assert rc == 0, out + err
        rc, out, err = _cli(capsys, "--config", str(cfg), "tmux", "ls", "gpu1")
        assert rc == 0 and "running" in out, out + err
    finally:
        kill_plan_sessions(name)


def test_gpus_takes_a_gpu_index_of_unicode_digits_or_400_digits(node, capsys):
    cfg, bindir, _ = node
    rows = [f"{i}, GPU-{n}, NVIDIA H100, 10, 100, 81559, 40, 100.0, 700.0, 1980" for n, i in
            enumerate(["0", "²", HUGE_TEXT])]
    rows.append("1, GPU-9, NVIDIA H100, ², 1e308, 81559, 40, 1_0, 700.0, ١٩٨٠")
    (bindir / "gpus.csv").write_text("\n".join(rows) + "\n")
    (bindir / "apps.csv").write_text(f"GPU-0, ², 100, python3\nGPU-0, {HUGE_TEXT}, 100, python3\n")
    executable(bindir / "nvidia-smi", f'#!/bin/sh\ncase "$*" in *--query-gpu=*) cat {bindir}/gpus.csv;; '
                                      f'*--query-compute-apps=*) cat {bindir}/apps.csv;; esac\n')
    rc, out, err = _cli(capsys, "--config", str(cfg), "gpus", "gpu1", "--json")
    assert rc == 0, err
    gpus = json.loads(out)["gpus"]
    assert sorted(g["index"] for g in gpus) == [0, 1, 2, 3]
    bad = {g["uuid"]: g for g in gpus}
    assert "invalid GPU index ²" in bad["GPU-1"]["error"]
    assert "invalid GPU index 99999" in bad["GPU-2"]["error"]
    odd = bad["GPU-9"]
    assert odd["util_pct"] is None and odd["mem_used_mib"] is None and odd["power_w"] is None
    assert odd["sm_clock_mhz"] is None and "utilization.gpu: invalid ²" in odd["error"]
    rc, out, err = _cli(capsys, "--config", str(cfg), "gpus", "gpu1")
    assert rc == 0 and HUGE_TEXT[:50] not in out


HOST_LIES = {
    "head": f'#!/bin/bash\n[ "$*" = "-n 1 /proc/stat" ] && {{ echo "cpu ² 1 2 3 4 5 6 7"; exit 0; }}\n'
            f'exec {REAL}/head "$@"\n',
    "getconf": "#!/bin/sh\necho ²\n",
    "df": f"#!/bin/sh\necho 'Filesystem 1-blocks Used Available Capacity Mounted on'\n"
          f"echo '/dev/x {HUGE_TEXT} 1 {HUGE_TEXT} 1% /'\n",
}


def test_host_takes_a_cpu_count_of_unicode_digits_and_400_digit_df_sizes(node, capsys):
    cfg, bindir, _ = node
    for name, text in HOST_LIES.items():
        executable(bindir / name, text)
    executable(bindir / "python3", "#!/bin/sh\nexit 1\n")   # no sampler on this node: the host script answers
    rc, out, err = _cli(capsys, "--config", str(cfg), "host", "gpu1", "--interval", "0.1")
    assert rc == 0, err
    assert out.startswith("gpu1: cpu - of - cores, load ")
    assert "invalid CPU count ²" in err and "invalid df size at / 99999" in err and "invalid CPU time ²" in err


def test_decommission_takes_a_listing_whose_mtime_is_a_unicode_digit(node, tmp_path, capsys):
    cfg, bindir, work = node
    work.mkdir()
    (work / "notes.md").write_text("kept\n")
    executable(bindir / "find", f'#!/bin/bash\n{REAL}/find "$@"; rc=$?\n'
                                '[ "$2" = -mindepth ] && printf "E\\t0\\tf\\t5\\t²\\t1.0\\t7\\t644\\tliar.bin\\0\\0"\n'
                                'exit $rc\n')
    rc, out, err = _cli(capsys, "--config", str(cfg), "decommission", "gpu1", "--dest", str(tmp_path / "dest"),
                        "--dry-run")
    assert "liar.bin" in out + err and "time '²' is not a number of seconds" in out + err, out + err
