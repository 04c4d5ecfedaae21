"""Process identity on a node, read from /proc in shell snippets sent to the host.

A PID names the same process only while its start time (field 22 of
/proc/PID/stat, in clock ticks since boot) is unchanged: PIDs are reused, start
times are not. Nothing here matches processes by name or command line.
"""

from __future__ import annotations

from dataclasses import dataclass

from ops import nodenum

STAT_FN = (
    'nd_stat() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; '
    's=${s##*) }; set -- $s; printf "%s %s %s\\n" "${20}" "${3}" "${1}"; }'
)
"""Bash function `nd_stat PID`: prints "START PGID STATE" or fails when PID is gone.

The command name in /proc/PID/stat may hold spaces and parentheses, so fields
are counted after its last ')': field 3 (state) is $1, 5 (pgrp) $3, 22 (starttime) $20.
"""

GROUP_ALIVE_FN = (
    'nd_group_alive() { local g=$1 f s; for f in /proc/[0-9]*/stat; do '
    '{ read -r s < "$f"; } 2>/dev/null || continue; s=${s##*) }; set -- $s; '
    '[ "$3" = "$g" ] && [ "$1" != Z ] && return 0; done; return 1; }'
)
"""Bash function `nd_group_alive PGID`: succeeds while a process of that group has not finished.

`kill -0 -- -PGID` is not enough: it also succeeds for zombies nobody has reaped yet.
"""


@dataclass(frozen=True)
class ProcStat:
    pid: int
    start: int
    pgid: int
    state: str

    @property
    def alive(self) -> bool:
        """Running or sleeping; a zombie has finished and only waits to be reaped."""
        return self.state not in ("Z", "X", "x")


def parse_stat_line(pid: int, line: str) -> ProcStat | None:
    """Parse what nd_stat printed for pid, or None when it is not three fields whose numbers are ones (ops.nodenum)."""
    parts = line.split()
    if len(parts) != 3:
        return None
    start, pgid = nodenum.START_TICKS.get(parts[0]), nodenum.PGID.get(parts[1])
    return None if start is None or pgid is None else ProcStat(pid, start, pgid, parts[2])

