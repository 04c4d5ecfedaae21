"""NVML on a GPU in MIG mode, mocked at the pynvml functions with answers recorded from an H100
(tests/support/fake_nvml.py): per-instance memory and (GPM) utilisation, read by the node sampler as on any
node, `local` included; the GPU panel says MIG instead of aggregate numbers."""

from __future__ import annotations

from pathlib import Path

import pynvml

from cli.main import main
from ops.hosts.local import LocalHost
from ops.telemetry.collector import NodeTelemetry
from ops.telemetry.gpus import read_remote_gpus
from ops.telemetry.sampler_node import Nvml
from tests.support import fake_nvml
from tests.support.fake_nvml import FakeMigNvml
from tests.test_telemetry_gpus import nvml_read
from tui.widgets.gpus import gpu_line, mig_line


def test_mig_gpu_reports_its_instances_not_the_aggregate(monkeypatch):
    FakeMigNvml(monkeypatch)
    snap = nvml_read(Nvml(pynvml))
    mig_gpu, plain = snap.gpus
    assert mig_gpu.util_pct is None and mig_gpu.error is None
    assert [(m.profile, m.gpu_instance, m.compute_instance, m.mem_used_mib, m.mem_total_mib) for m in mig_gpu.mig] == [
        ("3g.40gb", 2, 0, 30_512.0, 40_192.0), ("2g.20gb", 3, 0, 11.0, 19_968.0), ("1g.10gb", 9, 0, 9_830.0, 9_856.0)]
    assert mig_gpu.mig[0].uuid.startswith("MIG-")
    assert all(m.util_pct is None for m in mig_gpu.mig)          # GPM needs two samples
    assert plain.mig is None and plain.util_pct == 63.0


def test_mig_instance_utilisation_from_consecutive_gpm_samples(monkeypatch):
    fake = FakeMigNvml(monkeypatch)
    session = Nvml(pynvml)
    nvml_read(session)
    second = nvml_read(session).gpus[0].mig
    assert [m.util_pct for m in second] == [87.5, 0.0, 42.0]
    third = nvml_read(session).gpus[0].mig
    assert [m.util_pct for m in third] == [90.0, 0.0, 41.0]
    assert fake.freed == 6                                         # each older sample freed once used
    assert fake.calls["nvmlDeviceGetMigMode"] == 6 and fake.calls["nvmlGpmQueryDeviceSupport"] == 3


def test_without_gpm_instances_have_memory_but_no_utilisation(monkeypatch):
    fake = FakeMigNvml(monkeypatch, gpm=False)
    session = Nvml(pynvml)
    nvml_read(session)
    mig = nvml_read(session).gpus[0].mig
    assert [m.util_pct for m in mig] == [None, None, None] and mig[0].mem_used_mib == 30_512.0
    assert fake.calls["nvmlGpmQueryDeviceSupport"] == 1          # asked once, then remembered
    assert fake.calls["nvmlGpmMigSampleGet"] == 0


def test_gpu_panel_says_mig_and_lists_the_instances(monkeypatch):
    FakeMigNvml(monkeypatch)
    session = Nvml(pynvml)
    nvml_read(session)
    mig_gpu, plain = nvml_read(session).gpus
    row = gpu_line(mig_gpu, [], 100).plain
    assert "MIG · 3 instances" in row and "%" not in row and "/80G" not in row   # no aggregate util or memory
    lines = [mig_line(m, 100).plain for m in mig_gpu.mig]
    assert "3g.40gb" in lines[0] and "GI 2" in lines[0] and "88%" in lines[0] and "30/39G" in lines[0]
    assert "1g.10gb" in lines[2] and "42%" in lines[2]
    assert "63%" in gpu_line(plain, [], 100).plain


def test_mig_instances_travel_in_json(monkeypatch):
    FakeMigNvml(monkeypatch)
    d = nvml_read(Nvml(pynvml)).to_dict()
    assert d["gpus"][0]["mig"][2]["gpu_instance"] == 9 and d["gpus"][1]["mig"] is None


def test_destroyed_instance_frees_its_gpm_sample(monkeypatch):
    fake = FakeMigNvml(monkeypatch)
    session = Nvml(pynvml)
    nvml_read(session)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMaxMigDeviceCount", lambda h: 2)   # the 1g.10gb instance is gone
    mig = nvml_read(session).gpus[0].mig
    assert [m.profile for m in mig] == ["3g.40gb", "2g.20gb"]
    assert fake.freed == 3                   # two used and replaced, one for the destroyed instance


def test_local_is_read_through_the_sampler_with_its_mig_instances(monkeypatch, tmp_path):
    """`local` goes through the same sampler as a node: its NVML reads MIG instances and their GPM utilisation."""
    fake_nvml.install(monkeypatch, tmp_path)
    tel = NodeTelemetry(LocalHost())
    try:
        tel.sampler.start()
        first, second = tel.poll_gpus(), tel.poll_gpus()
    finally:
        tel.close()
    assert tel.sampler.nvml and first.source == second.source == "nvml" and not second.stale
    mig_gpu, plain = second.gpus
    assert [(m.profile, m.gpu_instance, m.util_pct) for m in mig_gpu.mig] == [
        ("3g.40gb", 2, 87.5), ("2g.20gb", 3, 0.0), ("1g.10gb", 9, 42.0)]
    assert mig_gpu.util_pct is None and plain.mig is None and plain.util_pct == 63.0


def test_cli_gpus_lists_mig_instances(monkeypatch, tmp_path, capsys):
    fake_nvml.install(monkeypatch, tmp_path)
    assert main(["gpus", "local"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    parent = next(r for r in rows if r[:1] == ["0"])
    assert parent[5:7] == ["MIG", "MIG"]              # no aggregate utilisation or memory for the MIG GPU
    inst = next(r for r in rows if r[:1] == ["0/2"])
    assert inst[1:3] == ["MIG", "1g.10gb"] and "9830" in inst and "GI" in inst and "9" in inst
    assert any(r[:1] == ["1"] and "63%" in r for r in rows)


# -- remote nodes: nvidia-smi ----------------------------------------------------------------
def _fake_smi(tmp_path, *, old_driver=False):
    """An executable answering like nvidia-smi from recorded outputs (an old driver refuses mig.mode.current)."""
    data = Path(__file__).parent / "data" / "telemetry"
    script = tmp_path / "nvidia-smi"
    refuse = ('  *mig.mode.current*) echo \'Field "mig.mode.current" is not a valid field to query.\'; exit 2;;\n'
              if old_driver else "")
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {tmp_path / "calls.log"}\n'
        'case "$*" in\n'
        + refuse +
        f"  *--query-gpu=*mig.mode.current*) cat {data / 'smi_h100_mig_gpus.csv'};;\n"
        f"  *--query-gpu=*) cut -d, -f1-10 {data / 'smi_h100_mig_gpus.csv'};;\n"
        "  *--query-compute-apps=*) true;;\n"
        f"  '-q -x') cat {data / 'smi_h100_mig_q.xml'};;\n"
        "esac\n"
    )
    script.chmod(0o755)
    return str(script)


def test_remote_mig_gpu_lists_instances_from_nvidia_smi_xml(tmp_path):
    snap = read_remote_gpus(LocalHost(), nvidia_smi=_fake_smi(tmp_path))
    mig_gpu, plain = snap.gpus
    assert mig_gpu.util_pct is None and mig_gpu.error is None
    assert [(m.index, m.gpu_instance, m.compute_instance, m.mem_used_mib, m.mem_total_mib, m.util_pct)
            for m in mig_gpu.mig] == [(0, 2, 0, 30512.0, 40448.0, None), (1, 9, 0, 9830.0, 9984.0, None)]
    assert [m.profile for m in mig_gpu.mig] == ["40G", "10G"]   # the XML names no profile: its memory does
    assert plain.mig is None and plain.util_pct == 97.0
    assert "MIG · 2 instances" in gpu_line(mig_gpu, [], 100).plain


def test_remote_without_mig_skips_the_xml_and_old_drivers_still_answer(tmp_path):
    snap = read_remote_gpus(LocalHost(), nvidia_smi=_fake_smi(tmp_path, old_driver=True))
    assert [g.mig for g in snap.gpus] == [None, None]          # an old driver cannot say: no MIG shown
    assert [g.util_pct for g in snap.gpus] == [None, 97.0]      # the recorded [N/A] stays unknown
    calls = (tmp_path / "calls.log").read_text()
    assert "-q -x" not in calls and calls.count("--query-gpu=") == 2
