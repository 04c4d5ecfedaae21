"""GPU telemetry: recorded nvidia-smi outputs, the real query script, NVML mocked at pynvml (the node sampler's
reader, run in this process)."""

from __future__ import annotations

import os
import stat
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest

from ops.hosts.local import LocalHost
from ops.telemetry import gpus as gpumod
from ops.telemetry.gpus import (
    gpu_query_script,
    parse_apps_csv,
    parse_gpu_csv,
    parse_gpu_script_output,
    read_remote_gpus,
)
from ops.telemetry.sampler import gpu_snapshot
from ops.telemetry.sampler_node import Nvml, gpu_sample
from ops.telemetry.snapshots import GpuSnapshot

DATA = Path(__file__).parent / "data" / "telemetry"


def fixture(name: str) -> str:
    return (DATA / name).read_text()


def nvml_read(nvml: Nvml) -> GpuSnapshot:
    """What the node sampler answers a GPU request with (there is no nvidia-smi here), as the GPU panel gets it."""
    return gpu_snapshot(gpu_sample(nvml, {"gpu_script": "", "nvidia_smi": "no-such-nvidia-smi"}), time.time())


def fake_smi(tmp_path: Path, gpus_file: str, apps_file: str | None = None, rc: int = 0) -> str:
    """An executable that answers the two queries like nvidia-smi, from recorded outputs."""
    apps = f"cat {DATA / apps_file}" if apps_file else "true"
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {tmp_path / "calls.log"}\n'
        'case "$*" in\n'
        f"  *--query-gpu=*) cat {DATA / gpus_file}; exit {rc};;\n"
        f"  *--query-compute-apps=*) {apps};;\n"
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


# -- recorded nvidia-smi CSV ----------------------------------------------------------
def test_h100_rows_parse_every_field():
    gpus, reason = parse_gpu_csv(fixture("smi_h100_8gpu_gpus.csv"))
    assert reason is None
    assert [g.index for g in gpus] == list(range(8))
    g0 = gpus[0]
    assert g0.name == "NVIDIA H100 80GB HBM3"
    assert g0.uuid.startswith("GPU-") and len(g0.uuid) == 40
    assert (g0.util_pct, g0.mem_used_mib, g0.mem_total_mib, g0.temp_c) == (100.0, 74215.0, 81559.0, 61.0)
    assert (g0.power_w, g0.power_limit_w, g0.sm_clock_mhz) == (512.34, 700.0, 1980.0)
    assert g0.mem_pct == pytest.approx(100 * 74215 / 81559)
    assert not any(g.lost or g.error for g in gpus)


def test_h100_apps_map_uuid_to_index_and_keep_names():
    gpus, _ = parse_gpu_csv(fixture("smi_h100_8gpu_gpus.csv"))
    procs = parse_apps_csv(fixture("smi_h100_8gpu_apps.csv"), gpus)
    assert len(procs) == 9
    xorg = next(p for p in procs if p.pid == 40112)
    assert (xorg.gpu_index, xorg.mem_mib, xorg.command) == (0, 58.0, "/usr/lib/xorg/Xorg")
    assert sorted(p.gpu_index for p in procs if p.command == "/usr/bin/python3") == list(range(8))


def test_h200_odd_values_become_none_with_reasons():
    gpus, reason = parse_gpu_csv(fixture("smi_h200_8gpu_odd_gpus.csv"))
    assert reason is None and len(gpus) == 8
    assert gpus[0].mem_total_mib == 143771.0 and gpus[0].name == "NVIDIA H200"
    assert gpus[2].power_w is None and gpus[2].error is None  # [N/A]: just not reported
    assert gpus[3].sm_clock_mhz is None and gpus[3].power_limit_w is None and gpus[3].error is None
    assert gpus[5].mem_used_mib is None and gpus[5].mem_pct is None
    assert gpus[5].error == "memory.used: [Unknown Error]"
    assert gpus[6].util_pct is None and gpus[6].temp_c is None and gpus[6].mem_used_mib == 1.0
    procs = parse_apps_csv(fixture("smi_h200_8gpu_odd_apps.csv"), gpus)
    na = next(p for p in procs if p.pid == 7100)
    assert na.mem_mib is None and na.gpu_index == 5


def test_lost_gpu_message_takes_the_missing_index():
    gpus, reason = parse_gpu_csv(fixture("smi_h100_lost_gpus.txt"))
    assert reason is None
    assert [g.index for g in gpus] == list(range(8))
    lost = gpus[3]
    assert lost.lost and lost.util_pct is None and lost.uuid is None
    assert "0000:5D:00.0" in lost.error and "GPU is lost" in lost.error
    assert not any(g.lost for i, g in enumerate(gpus) if i != 3)


def test_lost_gpu_row_is_marked_lost():
    gpus, _ = parse_gpu_csv(fixture("smi_h100_lost_row_gpus.csv"))
    assert gpus[6].lost and gpus[6].util_pct is None and gpus[6].mem_total_mib is None
    assert gpus[6].error == "GPU is lost"
    assert gpus[5].util_pct == 12.0 and not gpus[5].lost


@pytest.mark.parametrize(
    "rc, name, reason",
    [
        (9, "smi_driver_failed.txt", "NVIDIA driver not reachable"),
        (6, "smi_no_devices.txt", "no NVIDIA GPUs found"),
    ],
)
def test_driver_failure_and_no_devices_are_unavailable_not_errors(rc, name, reason):
    out = f"@@nodedeck gpu {rc}\n{fixture(name)}"
    snap = parse_gpu_script_output(0, out)
    assert snap.available is False and snap.error is None
    assert snap.reason.startswith(reason)


# -- the real query script, run by bash ---------------------------------------------------
def test_script_runs_both_queries_in_one_command_with_ps_commands(tmp_path):
    smi = fake_smi(tmp_path, "smi_h100_8gpu_gpus.csv", "smi_h100_8gpu_apps.csv")
    host = LocalHost()
    runs = []
    orig = host.run
    host.run = lambda argv, **kw: runs.append(argv) or orig(argv, **kw)
    snap = read_remote_gpus(host, nvidia_smi=smi)
    assert len(runs) == 1  # one command per refresh
    assert snap.available and snap.source == "nvidia-smi" and snap.error is None
    assert len(snap.gpus) == 8 and len(snap.processes) == 9
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls == [
        # no GPU in MIG mode: no -q -x
        f"--query-gpu={gpumod.GPU_FIELDS},{gpumod.MIG_FIELD} --format=csv,noheader,nounits",
        f"--query-compute-apps={gpumod.APP_FIELDS} --format=csv,noheader,nounits",
    ]
    # the recorded pids do not exist here, so ps finds nothing and the process name stays
    assert {p.command for p in snap.processes} == {"/usr/bin/python3", "/usr/lib/xorg/Xorg"}


def test_script_fills_full_command_lines_from_ps(tmp_path):
    pid = os.getpid()
    apps = tmp_path / "apps.csv"
    uuid = parse_gpu_csv(fixture("smi_h100_8gpu_gpus.csv"))[0][0].uuid
    apps.write_text(f"{uuid}, {pid}, 1024, python3\n")
    script = tmp_path / "smi"
    script.write_text(
        "#!/bin/sh\ncase \"$*\" in\n"
        f"  *--query-gpu=*) cat {DATA / 'smi_h100_8gpu_gpus.csv'};;\n"
        f"  *--query-compute-apps=*) cat {apps};;\nesac\n"
    )
    script.chmod(0o755)
    snap = read_remote_gpus(LocalHost(), nvidia_smi=str(script))
    (proc,) = snap.processes
    assert proc.pid == pid and proc.gpu_index == 0
    assert "pytest" in proc.command or "python" in proc.command
    assert proc.command != "python3"  # the full argv from ps, not nvidia-smi's short name


def test_script_with_lost_gpu_exit_15_still_lists_processes(tmp_path):
    smi = fake_smi(tmp_path, "smi_h100_lost_gpus.txt", "smi_h100_8gpu_apps.csv", rc=15)
    snap = read_remote_gpus(LocalHost(), nvidia_smi=smi)
    assert snap.available and snap.gpus[3].lost and len(snap.processes) == 9


def test_script_driver_failure_skips_apps_query(tmp_path):
    smi = fake_smi(tmp_path, "smi_driver_failed.txt", "smi_h100_8gpu_apps.csv", rc=9)
    snap = read_remote_gpus(LocalHost(), nvidia_smi=smi)
    assert not snap.available and "driver" in snap.reason
    assert len((tmp_path / "calls.log").read_text().splitlines()) == 1


def test_missing_nvidia_smi_is_unavailable(tmp_path):
    snap = read_remote_gpus(LocalHost(), nvidia_smi=str(tmp_path / "no-such-nvidia-smi"))
    assert not snap.available and snap.error is None
    assert snap.reason == "nvidia-smi not found on the node"
    # the default name is simply absent on this machine
    assert read_remote_gpus(LocalHost()).reason == "nvidia-smi not found on the node"


def test_exit_127_from_the_transport_is_unavailable():
    snap = parse_gpu_script_output(127, "", "bash: nvidia-smi: command not found")
    assert not snap.available and "not found" in snap.reason


def test_script_is_valid_bash():
    res = LocalHost().run(["bash", "-n", "-c", gpu_query_script("/opt/odd path/nvidia-smi")])
    assert res.ok, res.stderr


# -- NVML mocked at the pynvml call boundary ---------------------------------------------
class FakeNvml:
    """Eight H200s behind the pynvml functions, counting every call."""

    def __init__(self, monkeypatch, count=8, lost=(), unsupported=()):
        self.calls = Counter()
        self.count = count
        self.lost = set(lost)
        self.unsupported = set(unsupported)
        self.procs = {0: [SimpleNamespace(pid=os.getpid(), usedGpuMemory=2048 * 2**20)],
                      1: [SimpleNamespace(pid=999999, usedGpuMemory=None)]}
        for name in [
            "nvmlInit", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetName",
            "nvmlDeviceGetUUID", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit",
            "nvmlDeviceGetClockInfo", "nvmlDeviceGetComputeRunningProcesses",
        ]:
            monkeypatch.setattr(pynvml, name, self._wrap(name))

    def _wrap(self, name):
        impl = getattr(self, "_" + name.removeprefix("nvml"))

        def fn(*args):
            self.calls[name] += 1
            if args and isinstance(args[0], dict):
                i = args[0]["i"]
                if i in self.lost:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
                if name in self.unsupported:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return impl(*args)

        fn.__name__ = name
        return fn

    def _Init(self):
        return None

    def _DeviceGetCount(self):
        return self.count

    def _DeviceGetHandleByIndex(self, i):
        return {"i": i}

    def _DeviceGetName(self, h):
        return "NVIDIA H200"

    def _DeviceGetUUID(self, h):
        return f"GPU-0000000{h['i']}-aaaa-bbbb-cccc-dddddddddddd"

    def _DeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=10 * h["i"], memory=5)

    def _DeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=(1000 + h["i"]) * 2**20, total=143771 * 2**20, free=0)

    def _DeviceGetTemperature(self, h, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 40 + h["i"]

    def _DeviceGetPowerUsage(self, h):
        return 250_500

    def _DeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def _DeviceGetClockInfo(self, h, clock):
        assert clock == pynvml.NVML_CLOCK_SM
        return 1980

    def _DeviceGetComputeRunningProcesses(self, h):
        return self.procs.get(h["i"], [])


PER_REFRESH = [
    "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetComputeRunningProcesses",
]


def test_nvml_reads_each_field_once_per_device_and_inits_once(monkeypatch):
    fake = FakeNvml(monkeypatch)
    session = Nvml(pynvml)
    snap = nvml_read(session)
    assert snap.available and snap.source == "nvml" and len(snap.gpus) == 8
    assert fake.calls["nvmlInit"] == 1 and fake.calls["nvmlDeviceGetCount"] == 1
    for name in PER_REFRESH + ["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetName", "nvmlDeviceGetUUID"]:
        assert fake.calls[name] == 8, name
    before = fake.calls.copy()
    nvml_read(session)
    nvml_read(session)
    delta = fake.calls - before
    assert {n: delta[n] for n in delta} == {n: 16 for n in PER_REFRESH}  # handles, name, uuid cached; no re-init
    g3 = snap.gpus[3]
    assert (g3.util_pct, g3.mem_used_mib, g3.mem_total_mib, g3.temp_c) == (30.0, 1003.0, 143771.0, 43.0)
    assert (g3.power_w, g3.power_limit_w, g3.sm_clock_mhz) == (250.5, 700.0, 1980.0)
    mine = next(p for p in snap.processes if p.gpu_index == 0)
    assert mine.mem_mib == 2048.0 and "python" in mine.command
    other = next(p for p in snap.processes if p.gpu_index == 1)
    assert other.mem_mib is None and other.command == ""  # gone process: no made-up name


def test_nvml_lost_gpu_and_unsupported_fields(monkeypatch):
    FakeNvml(monkeypatch, lost={2}, unsupported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetClockInfo"})
    snap = nvml_read(Nvml(pynvml))
    assert snap.available
    assert snap.gpus[2].lost and snap.gpus[2].util_pct is None
    g = snap.gpus[0]
    assert g.power_w is None and g.sm_clock_mhz is None and g.error is None and g.util_pct == 0.0


@pytest.mark.parametrize(
    "code, words",
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML library not found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission"),
    ],
)
def test_nvml_init_failure_is_unavailable_and_retried_later(monkeypatch, code, words):
    calls = Counter()

    def init():
        calls["init"] += 1
        raise pynvml.NVMLError(code)

    monkeypatch.setattr(pynvml, "nvmlInit", init)
    session = Nvml(pynvml, retry_s=3600)
    for _ in range(3):
        snap = nvml_read(session)
        assert not snap.available and words in snap.reason and snap.error is None
    assert calls["init"] == 1  # not hammered every refresh
    session.retry_s = 0
    nvml_read(session)
    assert calls["init"] == 2


def test_real_pynvml_reports_a_state_either_way():
    snap = nvml_read(Nvml(pynvml))  # no NVIDIA library on CI machines; real GPUs on a GPU node
    if snap.available:
        assert snap.gpus and all(g.name and g.mem_total_mib for g in snap.gpus if not g.lost)
    else:
        assert snap.reason and not snap.gpus and snap.error is None
