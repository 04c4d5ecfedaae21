"""Numbers from a node: the one parser every number a node sends goes through.

A node is not trusted (ops/textsafe.py says so of its text). Its numbers are no better: `"²".isdigit()` is True
and `int("²")` raises; `float("١٢")` is 12.0 and `float("1_0")` 10.0; a 400-digit integer makes `float()` and
`math.isfinite()` raise OverflowError; `1e308`, `inf` and `nan` pass `float()` and end later as `int(inf)` or a
309-digit number on the screen. Here a number is ASCII digits (a sign, a point and an exponent for a real one),
at most MAX_CHARS long (as text), finite, and inside the range of its field (a JSON integer is compared with the
range before any float() of it). Anything else is `Invalid` for that field: its str() (`invalid pid ²`) is what
the user is shown, and the value never ends a command or the dashboard.

Where a node's values become numbers, each through a field of this module:
  ops/setup/probe.py             the probe's JSON (Python version, free and total disk), nvidia-smi's memory.total
  ops/telemetry/gpus.py          nvidia-smi's CSV and XML (index, readings, pids), ps's pids, the script's status
  ops/telemetry/sampled.py       the resident sampler's JSON (GPUs, processes, the host part)
  ops/telemetry/sampler.py       the sampler's sequence number and clock
  ops/telemetry/hoststats.py     /proc/stat, loadavg, meminfo, nproc and df over the host script
  ops/telemetry/inference.py     /metrics sample values, their tp/pp/ep rank and position labels
  ops/telemetry/serverlog.py     an inference server's log lines
  ops/telemetry/training.py      metrics.jsonl (step, loss and every other series, total steps, time)
  ops/run/progress.py            the records of $NODEDECK_PROGRESS
  ops/run/checks.py              line and match counts, the node's clock; ops/run/starter.py and ranks.py: the
                                 clock before a launch, the free port torchrun gets
  ops/tmux/view.py, ops/procs.py tmux's panes (pid, exit status, signal), pid and exit files, /proc/PID/stat
  ops/tmux/runner.py             a log's size before it is followed
  ops/fleet/watch.py             the node's clock, uptime, files' mtime and size
  ops/decommission/inventory.py  the listing (root index, size, times, inode, mode); transfer.py: the sender's
                                 byte counts; sysinfo.py: CPU count, memory, df rows
  ops/outcome.py                 the eval's and the benchmarks' result files (acceptance lengths, throughputs);
                                 ops/acceptance.py: their per-position shares, rounds and drafts, the probe's
  ops/agents/discover.py         the times of a coding agent's todo lists
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Generic, Self, TypeVar

from ops.textsafe import shown

MAX_CHARS = 40
"""The longest text taken as a number (a float's repr is at most 24 characters)."""
MAX_DIGITS = 30
"""An integer of more digits is described by its length (`an integer of about 401 digits`), not printed."""

_WHOLE = re.compile(r"[+-]?[0-9]+", re.ASCII)
_REAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4})?", re.ASCII)
_SPACE = " \t\r\n"


class Invalid(ValueError):
    """A value a node sent that is no number of its field; str() is the one line that says so."""

    def __init__(self, field: str, raw: object):
        self.field, self.raw = field, describe(raw)
        super().__init__(f"invalid {field} {self.raw}")


def describe(raw: object) -> str:
    """A node's value as it is shown beside `invalid`: short, on one line, inert."""
    if isinstance(raw, bool) or raw is None:
        return str(raw).lower() if raw is not None else "nothing"
    if isinstance(raw, int):
        if abs(raw) < 10**MAX_DIGITS:
            return str(raw)
        return f"(an integer of about {int(raw.bit_length() * math.log10(2)) + 1} digits)"
    if isinstance(raw, float):
        return repr(raw)
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "surrogateescape")
    if isinstance(raw, str):
        text = shown(raw[:MAX_CHARS]) + ("..." if len(raw) > MAX_CHARS else "")
        return text if text and " " not in text else repr(text)
    return f"(a {type(raw).__name__})"


N = TypeVar("N", int, float)


@dataclass(frozen=True)
class _Field(Generic[N]):
    name: str
    lo: float
    hi: float

    def parse(self, raw: object) -> N:
        """raw (text, bytes, or a number from JSON) as this field's value; raises Invalid."""
        raise NotImplementedError

    def from_json(self, raw: object) -> N:
        """raw, a value from JSON, as this field's value: a number only (text is not one here); raises Invalid."""
        if not is_number(raw):
            raise Invalid(self.name, raw)
        return self.parse(raw)

    def get(self, raw: object) -> N | None:
        """parse(raw), None when raw is None or invalid."""
        try:
            return None if raw is None else self.parse(raw)
        except Invalid:
            return None

    def get_json(self, raw: object) -> N | None:
        """from_json(raw), None when raw is no valid number of this field (text included)."""
        return self.get(raw) if is_number(raw) else None

    def named(self, name: str) -> Self:
        """The same range under another name (what the node called it: `free disk`, `util_pct`)."""
        return replace(self, name=name)

    def _text(self, raw: str | bytes, pattern: re.Pattern[str]) -> str:
        text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
        text = text.strip(_SPACE)
        if len(text) > MAX_CHARS or not pattern.fullmatch(text):
            raise Invalid(self.name, raw)
        return text

    def _in_range(self, v: int | float, raw: object) -> None:
        if not self.lo <= v <= self.hi:     # int and float compare exactly: no overflow, and NaN fails
            raise Invalid(self.name, raw)


@dataclass(frozen=True)
class Whole(_Field[int]):
    """A field whose values are whole numbers in lo..hi: a pid, a byte count, an index."""

    def parse(self, raw: object) -> int:
        if isinstance(raw, (str, bytes)):
            v = int(self._text(raw, _WHOLE))
        elif isinstance(raw, int) and not isinstance(raw, bool):
            v = raw
        elif isinstance(raw, float) and math.isfinite(raw) and raw.is_integer():
            v = int(raw)
        else:
            raise Invalid(self.name, raw)
        self._in_range(v, raw)
        return v


@dataclass(frozen=True)
class Real(_Field[float]):
    """A field whose values are finite reals in lo..hi: a reading, a rate, a loss."""

    def parse(self, raw: object) -> float:
        if isinstance(raw, (str, bytes)):
            v = float(self._text(raw, _REAL))
        elif isinstance(raw, int) and not isinstance(raw, bool):
            self._in_range(raw, raw)         # before float(): a huge int would overflow it
            v = float(raw)
        elif isinstance(raw, float):
            v = raw
        else:
            raise Invalid(self.name, raw)
        if not math.isfinite(v):
            raise Invalid(self.name, raw)
        self._in_range(v, raw)
        return v


def is_number(raw: object) -> bool:
    """raw is an int or float from JSON (not a bool): a candidate for a field, valid or not."""
    return isinstance(raw, (int, float)) and not isinstance(raw, bool)


INT64 = 2**63 - 1
"""What SQLite, off_t and a C long hold: no size, time or count of a node is larger."""

# -- processes and tmux ------------------------------------------------------------
PID = Whole("pid", 0, 2**22)                       # Linux's PID_MAX_LIMIT
PGID = Whole("process group", 0, 2**22)
START_TICKS = Whole("start time", 0, INT64)        # /proc/PID/stat field 22, clock ticks since boot
EXIT_STATUS = Whole("exit status", -(2**31), 2**31 - 1)
SIGNAL = Whole("signal", 1, 128)
PORT = Whole("port", 1, 65535)
# -- time ----------------------------------------------------------------------------
UNIX_TIME = Real("time", 0, 253402300799.0)        # up to the year 9999
UPTIME = Real("uptime", 0, 1e10)
DURATION = Real("seconds", 0, 1e10)
# -- sizes and counts ----------------------------------------------------------------
BYTES = Whole("size", 0, INT64)
COUNT = Whole("count", 0, INT64)
INODE = Whole("inode", 0, 2**64 - 1)
MODE = Whole("mode", 0, 0o7777)
INDEX = Whole("index", 0, 2**20)
# -- host ----------------------------------------------------------------------------
CPU_COUNT = Whole("CPU count", 1, 2**20)
CPU_TICKS = Whole("CPU time", 0, INT64)
LOAD = Real("load average", 0, 1e6)
KIB = Whole("KiB", 0, INT64 // 1024)
# -- GPUs ----------------------------------------------------------------------------
GPU_INDEX = Whole("GPU index", 0, 1023)
GPU_PERCENT = Real("utilisation", 0, 100)
MIB = Real("MiB", 0, 2.0**40)                      # a GPU's memory: an exbibyte
TEMP_C = Real("temperature", 0, 1000)
WATTS = Real("power", 0, 1e6)
MHZ = Real("clock", 0, 1e6)
# -- inference servers ---------------------------------------------------------------
RANK = Whole("rank", 0, 2**20)
POSITION = Whole("position", 0, 1023)
REQUESTS = Real("requests", 0, 1e9)
TOKENS_PER_S = Real("tokens/s", 0, 1e12)
FRACTION = Real("fraction", 0, 1)
ACCEPT_LEN = Real("acceptance length", 1, 1024)
SAMPLE = Real("value", -1e18, 1e18)                 # any /metrics sample before its meaning is known
# -- training and progress -----------------------------------------------------------
STEP = Real("step", 0, 1e15)
TOTAL_STEPS = Whole("total steps", 0, 10**15)
METRIC = Real("metric", -3.5e38, 3.5e38)            # a loss or any series: what a float32 can hold
PROGRESS = Real("progress", 0, 1e18)               # done and total of a progress record
RATE = Real("rate", 0, 1e18)
