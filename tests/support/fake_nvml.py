"""NVML answers recorded from an H100 in MIG mode, for the node sampler's NVML reader (ops/telemetry/sampler_node.py).

FakeMigNvml replaces pynvml's functions through a monkeypatch (in this process), or, by `install`, in the processes
a test starts: a `pynvml` first on their PYTHONPATH loads nvidia-ml-py and lets a fake replace its calls, so the
sampler that reads `local` (a subprocess) gets these answers, through the same code as on a node.
"""

from __future__ import annotations

import ctypes
import os
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pynvml

REPO = Path(__file__).resolve().parents[2]
SHIM = """\
import importlib, importlib.machinery, importlib.util, os, sys

_here = os.path.dirname(os.path.abspath(__file__))
_shim = sys.modules[__name__]
_spec = importlib.machinery.PathFinder.find_spec("pynvml", [p for p in sys.path if os.path.abspath(p or ".") != _here])
_real = importlib.util.module_from_spec(_spec)
sys.modules[__name__] = _real  # nvidia-ml-py adds its error classes to sys.modules["pynvml"] as it loads
try:
    _spec.loader.exec_module(_real)
finally:
    sys.modules[__name__] = _shim
globals().update({k: v for k, v in vars(_real).items() if not k.startswith("__")})


class _Patch:
    @staticmethod
    def setattr(module, name, value):
        setattr(module, name, value)


_module, _, _cls = os.environ["NODEDECK_FAKE_NVML"].partition(":")
getattr(importlib.import_module(_module), _cls)(_Patch())
"""


def install(monkeypatch, tmp_path: Path, fake: str = "tests.support.fake_nvml:FakeMigNvml") -> None:
    """Make the processes started from now on import, as pynvml, nvidia-ml-py answering through `fake`
    ("module:Class", built with an object whose setattr(module, name, value) patches the module)."""
    (tmp_path / "pynvml.py").write_text(SHIM)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(REPO)]))
    monkeypatch.setenv("NODEDECK_FAKE_NVML", fake)


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
