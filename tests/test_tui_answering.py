"""One slow poll is not a lost node (issue 31, item 13): the header and the event log say "not answering"
only when the polls stay bad, repeats are collapsed, and the local node is never "not answering"."""

from __future__ import annotations

import asyncio

from ops.errors import HostError
from tests.support.tui_fixed import FixedSource
from tests.support.tui_screens import Seen, aio, header_text, until, wait_polled
from tui.answering import Answering, Staleness
from tui.app import NodedeckApp


class FailingHost(FixedSource):
    """The host poll fails `fails` more times (forever with -1), as a node under load answering late."""

    fails = 0

    def poll_host(self):
        if self.fails:
            self.fails -= 1
            raise HostError("no answer within 30s")
        return super().poll_host()


def test_slow_polls_are_said_only_once_they_last():
    a = Answering("gpu1", local=False, after_s=10)
    bad = Staleness(polls=100.0)
    assert a.update(bad, 200, "timed out", mono=0) == a.update(bad, 201, "timed out", mono=9)
    assert a.update(bad, 201, mono=9).stale_since is None and not a.lost
    assert a.update(Staleness(), 202, mono=9.5).event is None   # it answered: nothing to say either way
    first = a.update(bad, 203, "timed out", mono=20)
    assert first.stale_since is None
    said = a.update(bad, 215, "timed out", mono=30)
    assert said.event == "gpu1 not answering: timed out" and said.stale_since == 100.0
    assert a.update(bad, 216, mono=31).event is None
    back = a.update(Staleness(), 255, mono=70)
    assert back.event == "gpu1 answering again after 2m35s" and back.stale_since is None


def test_a_lost_connection_is_said_at_once_and_repeats_collapse():
    a = Answering("gpu1", local=False, after_s=10, quiet_s=300)
    assert a.update(Staleness(connection=50.0), 60, "refused", mono=0).event == "gpu1 not answering: refused"
    assert a.update(Staleness(), 61, mono=1).event.startswith("gpu1 answering again")
    for i in range(3):   # three more outages within quiet_s: the header says stale, the log nothing
        gone = a.update(Staleness(connection=70.0 + i), 80 + i, mono=10 + i)
        assert gone.event is None and gone.stale_since == 70.0 + i
        assert a.update(Staleness(), 81 + i, mono=10.5 + i).event is None
    later = a.update(Staleness(connection=500.0), 510, "refused", mono=400)
    assert later.event == "gpu1 not answering: refused (also 3 times since it was last said, 6m40s ago)"


def test_the_local_node_is_never_not_answering():
    a = Answering("local", local=True, after_s=10)
    for t in range(0, 100, 5):
        assert a.update(Staleness(polls=0.0, connection=0.0), t, "slow", mono=t).stale_since is None
    assert not a.lost


@aio
async def test_one_failed_poll_of_a_remote_node_is_no_event_and_a_lasting_one_is():
    src = FailingHost()
    app = NodedeckApp(src, refresh_s=0.05, hang_s=1.0)
    seen = Seen()
    async with app.run_test(size=(120, 40), message_hook=seen) as pilot:
        await wait_polled(app, pilot)
        src.fails = 1
        await until(pilot, lambda: seen.failures(type(app.dash.query_one("#host"))) >= 1, what="a failed poll")
        await asyncio.sleep(1.5)   # the next polls answer
        assert "not answering" not in seen.event_text()
        assert "stale since" not in header_text(app)
        src.fails = -1
        await until(pilot, lambda: "gpu-node-1 not answering: no answer within 30s" in seen.event_text(),
                    timeout=10, what="a lasting failure said")
        assert "stale since" in header_text(app)
        src.fails = 0
        await until(pilot, lambda: "gpu-node-1 answering again" in seen.event_text(), timeout=10, what="back")


@aio
async def test_failing_polls_on_local_never_say_not_answering():
    src = FailingHost(node="local")
    src.fails = -1
    app = NodedeckApp(src, refresh_s=0.05, hang_s=0.2)
    seen = Seen()
    async with app.run_test(size=(120, 40), message_hook=seen) as pilot:
        await until(pilot, lambda: seen.failures(type(app.dash.query_one("#host"))) >= 3, timeout=15,
                    what="failed polls")   # three polls: seconds when the machine is loaded
        await asyncio.sleep(1.0)
        assert "not answering" not in seen.event_text()
        assert "stale since" not in header_text(app)
