"""The disk line says whose fill rate it shows (issue 39, item 11): `full in 52m` sat beside `demo-work`
(45 MB) though other processes filled the disk. The rate is the filesystem's, from every writer: said so,
with the rate, beside the watched path."""

from __future__ import annotations

from ops.telemetry.hoststats import DiskFillTracker
from ops.telemetry.snapshots import DiskUsage
from tui.widgets.host import disk_lines

GiB = 1 << 30


def test_the_watched_path_is_shown_with_its_disks_fill_rate_from_all_writers():
    d = DiskUsage("/home/u/demo-work", 100 * GiB, 90 * GiB, 10 * GiB, 3.4e6, 10 * GiB / 3.4e6)
    first, where = (t.plain for t in disk_lines(d, 10))
    assert "full in 52m" in first
    assert where.split() == ["/home/u/demo-work", "·", "its", "disk", "fills", "at", "3.2", "MiB/s", "from", "all",
                             "writers"]


def test_a_disk_not_filling_or_still_measuring_names_no_rate():
    for rate in (None, -1e6):
        d = DiskUsage("/data", 100 * GiB, 90 * GiB, 10 * GiB, rate, None)
        assert disk_lines(d, 10)[1].plain.strip() == "/data"


def test_the_warning_says_whose_rate_it_is():
    tracker = DiskFillTracker(min_span_s=1, smooth_s=1)
    tracker.observe("/data", 0.0, 100 * GiB, 90 * GiB, 10 * GiB)
    d = tracker.observe("/data", 10.0, 100 * GiB, 91 * GiB, 9 * GiB)
    assert d.warn and d.warn_reason is not None
    assert "full in" in d.warn_reason and "the disk's fill rate from all writers" in d.warn_reason
