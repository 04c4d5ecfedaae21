"""ops.units: the one size and duration formatter, in each style its callers show."""

from __future__ import annotations

from ops.units import COMPACT, ESTIMATE, HOURS, human_bytes, human_duration
from tui.format import human_bytes as tui_bytes
from tui.format import human_duration as tui_duration


def test_bytes_in_binary_units_up_to_the_largest():
    assert [human_bytes(n) for n in (0, 1023, 1024, 1536, 5 * 2**30, 3 * 2**40, 2**50)] == [
        "0 B", "1023 B", "1.0 KiB", "1.5 KiB", "5.0 GiB", "3.0 TiB", "1024.0 TiB"]
    assert human_bytes(2**50, largest="PiB") == "1.0 PiB" and human_bytes(2**60, largest="PiB") == "1024.0 PiB"
    assert human_bytes(-2048) == "-2.0 KiB"


def test_duration_styles():
    cases = (59, 60, 119, 120, 600, 3599, 3600, 7199, 7200, 3 * 3600 + 120, 86399, 86400, 172799, 3 * 86400 + 7200)
    assert [human_duration(s, COMPACT) for s in cases] == [
        "59s", "1m00s", "1m59s", "2m00s", "10m00s", "59m59s", "1h00m", "1h59m", "2h00m", "3h02m", "23h59m",
        "1d00h", "1d23h", "3d02h"]
    assert [human_duration(s, HOURS) for s in cases] == [
        "59s", "60s", "119s", "2m00s", "10m00s", "59m59s", "60m00s", "119m59s", "2h00m", "3h02m", "23h59m",
        "24h00m", "47h59m", "74h00m"]
    assert [human_duration(s, ESTIMATE)
            for s in (59, 600, 3 * 3600 + 120, 3 * 86400 + 7200)] == ["59s", "10m", "3h02m", "3d2h"]
    assert [human_duration(s, ESTIMATE) for s in cases] == [
        "59s", "60s", "119s", "2m", "10m", "59m", "60m", "119m", "2h00m", "3h02m", "23h59m", "24h00m", "47h59m", "3d2h"]
    assert human_duration(12.9) == "12s" and human_duration(-5.5, HOURS) == "-5s"


def test_dashboard_shows_unknown_as_a_question_mark_and_never_a_negative_duration():
    assert tui_bytes(None) == "?" and tui_bytes(3 * 2**50) == "3.0 PiB"
    assert tui_duration(None) == "?" and tui_duration(-30) == "0s" and tui_duration(90061) == "1d01h"
