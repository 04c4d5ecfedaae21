"""NVML on a GPU in MIG mode, mocked at the pynvml functions with answers recorded from an H100:
per-instance memory and (GPM) utilisation; the GPU panel says MIG instead of aggregate numbers."""

from __future__ import annotations

import ctypes
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pynvml

from ops.telemetry.gpus import NvmlSession
from tui.widgets.gpus import gpu_line, mig_line

MiB = 2**20
# GPU 0: an H100 80GB in MIG mode with a 3g.40gb, a 2g.20gb and a 1g.10gb instance (GPU instance ids
# 2, 3 and 9 as `nvidia-smi mig -lgi` lists them); GPU 1: the same model without MIG.
INSTANCES = [
    {"name": "NVIDIA H100 80GB HBM3 MIG 3g.40gb", "uuid": "MIG-1f0c5d7e-4d1a-5a41-8c8c-0a4c2d0e9b11", "gi": 2, "ci": 0,
     "used": 30_512, "total": 40_192, "util": [None, 87.5, 90.0]},
    {"name": "NVIDIA H100 80GB HBM3 MIG 2g.20gb", "uuid": "MIG-7b2e9a30-6c4f-5f0e-9d3b-4e1a7c2d8f22", "gi": 3, "ci": 0,
     "used": 11, "total": 19_968, "util": [None, 0.0, 0.0]},
    {"name": "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "uuid": "MIG-c3d4e5f6-0718-5a29-b3c4-d5e6f7a8b933", "gi": 9, "ci": 0,
     "used": 9_830, "total": 9_856, "util": [None, 42.0, 41.0]},
]


class FakeMigNvml:
    """Recorded NVML answers for one MIG-mode H100 and one plain H100."""

    def __init__(self, monkeypatch, gpm=True):
        self.calls = Counter()
        self.gpm = gpm
        self.samples: dict[int, tuple[int, int]] = {}    # sample address -> (gpu instance id, n-th sample)
        self.taken: Counter = Counter()
        self.freed = 0
        for name in [n for n in dir(self) if n.startswith("nvml")]:
            monkeypatch.setattr(pynvml, name, self._count(name, getattr(self, name)))

    def _count(self, name, fn):
        def wrapped(*a):
            self.calls[name] += 1
            return fn(*a)
        wrapped.__name__ = name
        return wrapped

    @staticmethod
    def _err(code):
        raise pynvml.NVMLError(code)

    def nvmlInit(self):
        return None

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)

    def nvmlDeviceGetName(self, h):
        return INSTANCES[h[2]]["name"] if h[0] == "mig" else "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, h):
        return INSTANCES[h[2]]["uuid"] if h[0] == "mig" else f"GPU-5a6b7c8d-000{h[1]}-4e5f-8a9b-0c1d2e3f4a5b"

    def nvmlDeviceGetMigMode(self, h):
        return [1, 1] if h[1] == 0 else [0, 0]

    def nvmlDeviceGetUtilizationRates(self, h):
        if h[1] == 0:   # NVML does not report a MIG-mode GPU's utilisation
            self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=63, memory=20)

    def nvmlDeviceGetMemoryInfo(self, h):
        if h[0] == "mig":
            m = INSTANCES[h[2]]
            return SimpleNamespace(used=m["used"] * MiB, total=m["total"] * MiB, free=(m["total"] - m["used"]) * MiB)
        used = 52_187 if h[1] == 0 else 20_000   # GPU 0: the sum over its instances plus reserved memory
        return SimpleNamespace(used=used * MiB, total=81_559 * MiB, free=(81_559 - used) * MiB)

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 38

    def nvmlDeviceGetPowerUsage(self, h):
        return 142_000

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlDeviceGetClockInfo(self, h, clock):
        return 1980

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return []

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, j):
        if j >= len(INSTANCES):
            self._err(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", h[1], j)

    def nvmlDeviceGetGpuInstanceId(self, h):
        return INSTANCES[h[2]]["gi"]

    def nvmlDeviceGetComputeInstanceId(self, h):
        return INSTANCES[h[2]]["ci"]

    def nvmlGpmQueryDeviceSupport(self, h):
        return SimpleNamespace(version=1, isSupportedDevice=1 if self.gpm else 0)

    def nvmlGpmSampleAlloc(self):
        return pynvml.c_nvmlGpmSample_t(pynvml.struct_c_nvmlGpmSample_t())

    def nvmlGpmMigSampleGet(self, h, gi, sample):
        self.samples[ctypes.addressof(sample.contents)] = (gi, self.taken[gi])
        self.taken[gi] += 1
        return sample

    def nvmlGpmSampleFree(self, sample):
        self.freed += 1

    def nvmlGpmMetricsGet(self, req):
        assert req.numMetrics == 1 and req.metrics[0].metricId == pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
        gi, n1 = self.samples[ctypes.addressof(req.sample1.contents)]
        gi2, n2 = self.samples[ctypes.addressof(req.sample2.contents)]
        assert gi == gi2 and n2 == n1 + 1
        inst = next(m for m in INSTANCES if m["gi"] == gi)
        req.metrics[0].value = inst["util"][n2]
        req.metrics[0].nvmlReturn = pynvml.NVML_SUCCESS
        return req


def test_mig_gpu_reports_its_instances_not_the_aggregate(monkeypatch):
    FakeMigNvml(monkeypatch)
    snap = NvmlSession().read()
    mig_gpu, plain = snap.gpus
    assert mig_gpu.util_pct is None and mig_gpu.error is None
    assert [(m.profile, m.gpu_instance, m.compute_instance, m.mem_used_mib, m.mem_total_mib) for m in mig_gpu.mig] == [
        ("3g.40gb", 2, 0, 30_512.0, 40_192.0), ("2g.20gb", 3, 0, 11.0, 19_968.0), ("1g.10gb", 9, 0, 9_830.0, 9_856.0)]
    assert mig_gpu.mig[0].uuid.startswith("MIG-")
    assert all(m.util_pct is None for m in mig_gpu.mig)          # GPM needs two samples
    assert plain.mig is None and plain.util_pct == 63.0


def test_mig_instance_utilisation_from_consecutive_gpm_samples(monkeypatch):
    fake = FakeMigNvml(monkeypatch)
    session = NvmlSession()
    session.read()
    second = session.read().gpus[0].mig
    assert [m.util_pct for m in second] == [87.5, 0.0, 42.0]
    third = session.read().gpus[0].mig
    assert [m.util_pct for m in third] == [90.0, 0.0, 41.0]
    assert fake.freed == 6                                         # each older sample freed once used
    assert fake.calls["nvmlDeviceGetMigMode"] == 6 and fake.calls["nvmlGpmQueryDeviceSupport"] == 3


def test_without_gpm_instances_have_memory_but_no_utilisation(monkeypatch):
    fake = FakeMigNvml(monkeypatch, gpm=False)
    session = NvmlSession()
    session.read()
    mig = session.read().gpus[0].mig
    assert [m.util_pct for m in mig] == [None, None, None] and mig[0].mem_used_mib == 30_512.0
    assert fake.calls["nvmlGpmQueryDeviceSupport"] == 1          # asked once, then remembered
    assert fake.calls["nvmlGpmMigSampleGet"] == 0


def test_gpu_panel_says_mig_and_lists_the_instances(monkeypatch):
    FakeMigNvml(monkeypatch)
    session = NvmlSession()
    session.read()
    mig_gpu, plain = session.read().gpus
    row = gpu_line(mig_gpu, [], 100).plain
    assert "MIG · 3 instances" in row and "%" not in row and "/80G" not in row   # no aggregate util or memory
    lines = [mig_line(m, 100).plain for m in mig_gpu.mig]
    assert "3g.40gb" in lines[0] and "GI 2" in lines[0] and "88%" in lines[0] and "30/39G" in lines[0]
    assert "1g.10gb" in lines[2] and "42%" in lines[2]
    assert "63%" in gpu_line(plain, [], 100).plain


def test_mig_instances_travel_in_json(monkeypatch):
    FakeMigNvml(monkeypatch)
    d = NvmlSession().read().to_dict()
    assert d["gpus"][0]["mig"][2]["gpu_instance"] == 9 and d["gpus"][1]["mig"] is None


def test_destroyed_instance_frees_its_gpm_sample(monkeypatch):
    fake = FakeMigNvml(monkeypatch)
    session = NvmlSession()
    session.read()
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMaxMigDeviceCount", lambda h: 2)   # the 1g.10gb instance is gone
    mig = session.read().gpus[0].mig
    assert [m.profile for m in mig] == ["3g.40gb", "2g.20gb"]
    assert fake.freed == 3                   # two used and replaced, one for the destroyed instance


def test_cli_gpus_lists_mig_instances(monkeypatch, capsys):
    from cli.main import main
    from ops.telemetry import gpus

    FakeMigNvml(monkeypatch)
    monkeypatch.setattr(gpus, "_SHARED", NvmlSession())
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
    from ops.hosts.local import LocalHost
    from ops.telemetry.gpus import read_remote_gpus

    snap = read_remote_gpus(LocalHost(), nvidia_smi=_fake_smi(tmp_path))
    mig_gpu, plain = snap.gpus
    assert mig_gpu.util_pct is None and mig_gpu.error is None
    assert [(m.index, m.gpu_instance, m.compute_instance, m.mem_used_mib, m.mem_total_mib, m.util_pct)
            for m in mig_gpu.mig] == [(0, 2, 0, 30512.0, 40448.0, None), (1, 9, 0, 9830.0, 9984.0, None)]
    assert [m.profile for m in mig_gpu.mig] == ["40G", "10G"]   # the XML names no profile: its memory does
    assert plain.mig is None and plain.util_pct == 97.0
    assert "MIG · 2 instances" in gpu_line(mig_gpu, [], 100).plain


def test_remote_without_mig_skips_the_xml_and_old_drivers_still_answer(tmp_path):
    from ops.hosts.local import LocalHost
    from ops.telemetry.gpus import read_remote_gpus

    snap = read_remote_gpus(LocalHost(), nvidia_smi=_fake_smi(tmp_path, old_driver=True))
    assert [g.mig for g in snap.gpus] == [None, None]          # an old driver cannot say: no MIG shown
    assert [g.util_pct for g in snap.gpus] == [None, 97.0]      # the recorded [N/A] stays unknown
    calls = (tmp_path / "calls.log").read_text()
    assert "-q -x" not in calls and calls.count("--query-gpu=") == 2
