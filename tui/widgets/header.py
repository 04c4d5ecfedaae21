"""The top line: node, connection state, the node's cost and active alerts, clock."""

from __future__ import annotations

from rich.text import Text

from ops.fleet.status import NodeStatus
from ops.hosts.base import ConnState, HostInfo
from ops.textsafe import shown
from tui.format import clock, human_duration
from tui.widgets.lines import TextLines
from tui.widgets.panel import mark


class NodeHeader(TextLines):
    """`nodedeck · node <name> · <connection> … <clock>`; the connection part says how stale data is."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self._node = ""
        self._info: HostInfo | None = None
        self._stale_since: float | None = None
        self._now = 0.0
        self._status: NodeStatus | None = None

    def show(self, node: str, info: HostInfo | None, stale_since: float | None, now: float,
             status: NodeStatus | None = None) -> None:
        """Repaints only when what it says changed. The clock shows minutes: a clock ticking seconds in the top
        row would make every frame span the whole screen (Textual draws the box around every change).

        status: the node's fleet row, for its cost and active alerts count."""
        same = stale_since is None and ((node, info, stale_since, int(now) // 60, status)   # (a stale age ticks)
                                        == (self._node, self._info, self._stale_since, int(self._now) // 60,
                                            self._status))
        self._node, self._info, self._stale_since, self._now = node, info, stale_since, now
        self._status = status
        if same:
            return
        mark(self, stale_since is not None, "-stale")
        self.changed()

    def texts(self, width: int) -> list[Text]:
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(" nodedeck ", style="bold reverse")
        t.append("  node ")
        t.append(shown(self._node), style="bold")
        t.append("   ")
        t.append_text(connection_text(self._info, self._stale_since, self._now))
        if self._status is not None:
            t.append_text(status_text(self._status))
        right = clock(self._now, seconds=False) if self._now else ""
        pad = width - t.cell_len - len(right) - 1
        if pad > 0:
            t.append(" " * pad)
            t.append(right, style="bold")
        return [t]


def connection_text(info: HostInfo | None, stale_since: float | None, now: float) -> Text:
    """`● connected`, `◌ connecting…`, or `◌ reconnecting · stale since T (age)` with the last error."""
    if info is None:
        return Text("◌ connecting…", style="yellow")
    state = info.state
    if state == ConnState.CONNECTED and stale_since is None:
        return Text("● connected", style="green")
    if state == ConnState.CONNECTING and stale_since is None:
        return Text("◌ connecting…", style="yellow")
    label = "not answering" if state == ConnState.CONNECTED else "reconnecting"
    t = Text(f"◌ {label}", style="bold red")
    if stale_since is not None:
        t.append(f" · stale since {clock(stale_since)} ({human_duration(now - stale_since)})", style="red")
    if info.last_error:
        t.append(f" · {shown(info.last_error)}", style="dim")
    return t


def status_text(status: NodeStatus) -> Text:
    """`   $412 spent (+$96 to finish)   ⚠ 2 alerts` (cost only when the node has cost_per_hour)."""
    t = Text()
    c = status.cost
    if c is not None:
        t.append(f"   ${c.spent:,.2f} spent", style="bold")
        t.append(f" ({c.hours:.1f} h at ${c.per_hour:,.2f}/h", style="dim")
        if c.projected_more is not None:
            t.append(f", +{'≥' if c.open_ended else ''}${c.projected_more:,.2f} to finish", style="dim")
        t.append(")", style="dim")
    if status.alerts:
        n = len(status.alerts)
        t.append(f"   ⚠ {n} alert{'s' if n > 1 else ''}", style="bold red")
    return t
