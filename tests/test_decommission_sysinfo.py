"""SystemInfo.summary(): the headline facts of a capture as a record (None where unknown)."""

from __future__ import annotations

import json

from ops.decommission.sysinfo import DiskRow, GpuRow, Section, SystemInfo


def _info(**outputs: tuple[int, str]) -> SystemInfo:
    info = SystemInfo("n", 0.0)
    for name, (rc, out) in outputs.items():
        info.sections[name] = Section(name, name, name, rc, out)
    return info


def test_summary_parses_each_section():
    s = _info(gpu_query=(0, "0, A100, 40960 MiB, 535.1, 0:1\n1, A100, 40960 MiB"),
              disks=(0, "Filesystem 1-blocks Used Available Capacity Mounted on\n/dev/a 100 40 60 40% /mnt/my disk"),
              tmux=(0, "train: 1 windows\nno server running"), pip=(0, "a==1\n\nb==2\n")).summary()
    assert s.gpus == (GpuRow("0", "A100", "40960 MiB", "535.1", "0:1"), GpuRow("1", "A100", "40960 MiB", "", ""))
    assert s.driver == "535.1" and s.gpu_note is None
    assert s.disks == (DiskRow("/dev/a", 100, 40, 60, "/mnt/my disk"),)
    assert s.tmux_sessions == ("train",) and s.packages == 2
    assert json.loads(json.dumps(s.to_json()))["disks"] == [{"filesystem": "/dev/a", "size": 100, "used": 40,
                                                             "avail": 60, "mount": "/mnt/my disk"}]


def test_summary_says_why_there_are_no_gpus():
    s = _info(gpu_query=(127, "nvidia-smi: not found on this node")).summary()
    assert s.gpus == () and s.driver is None and s.gpu_note == "nvidia-smi: not found on this node"
    assert s.cpu is None and s.packages is None and s.disks == ()
