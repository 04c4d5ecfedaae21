"""Review 2 (issue 31 item 9): dead nodes cost one connect timeout per round and never starve the live ones."""

from __future__ import annotations

import json
import socket
import time

import pytest

from cli.main import main
from ops.fleet.poller import Fleet
from ops.fleet.status import NodeStatus
from ops.fleet.watch import NodeWatch
from ops.nodes import NodeConfig
from tests.support.sshd import SSHServer, free_port


@pytest.fixture
def unaccepting_port():
    """A listener whose backlog is full: the kernel drops further SYNs, so connecting hangs (a blackhole)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(0)
    port = sock.getsockname()[1]
    fillers = []
    for _ in range(4):                      # fill the backlog (0 takes one, the kernel allows one more)
        c = socket.socket()
        c.setblocking(False)
        c.connect_ex(("127.0.0.1", port))
        fillers.append(c)
    time.sleep(0.2)
    yield port
    for c in fillers:
        c.close()
    sock.close()


@pytest.mark.parametrize("kind", ["silent", "unaccepting"])
def test_a_blackholed_node_costs_one_connect_timeout_per_poll(kind, silent_port, unaccepting_port):
    port = silent_port if kind == "silent" else unaccepting_port
    watch = NodeWatch(NodeConfig("bh", ssh="127.0.0.1", port=port, connect_timeout=2.0), timeout=2.0)
    try:
        for _ in range(2):
            t0 = time.monotonic()
            status = watch.poll()
            took = time.monotonic() - t0
            assert status.reachable is False and status.error, status
            assert took < 3.0, f"one poll of a blackholed node took {took:.1f}s with a 2 s connect timeout"
    finally:
        watch.close()


@pytest.fixture
def two_sshd(tmp_path_factory):
    servers = [SSHServer.create(tmp_path_factory.mktemp(f"sshd{i}")) for i in range(2)]
    for s in servers:
        s.start()
    yield servers
    for s in servers:
        s.stop()


def test_dead_nodes_never_starve_the_live_ones(two_sshd, silent_port, unaccepting_port, tmp_path):
    """Eight dead nodes listed first (they took all 4 workers before): the live rows still come at once and
    keep their 1-s interval."""
    dead = [NodeConfig(f"silent{i}", ssh="127.0.0.1", port=silent_port, connect_timeout=10.0) for i in range(3)]
    dead += [NodeConfig(f"unaccepting{i}", ssh="127.0.0.1", port=unaccepting_port, connect_timeout=10.0)
             for i in range(3)]
    dead += [NodeConfig("refused", ssh="127.0.0.1", port=free_port(), connect_timeout=10.0),
             NodeConfig("unresolvable", ssh="nodedeck-test.invalid", connect_timeout=10.0)]
    live = [NodeConfig(f"live{i}", ssh=s.alias, ssh_config=str(s.ssh_config), root=str(tmp_path / f"r{i}"),
                       connect_timeout=10.0) for i, s in enumerate(two_sshd)]
    fleet = Fleet(dead + live, interval=1.0, timeout=10.0)
    polls: dict[str, list[float]] = {n.name: [] for n in live}
    first: dict[str, float] = {}
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 15.0:
            fleet.tick()
            for s in fleet.snapshot():
                if s.name in polls and s.reachable and s.polled_at and s.polled_at not in polls[s.name]:
                    polls[s.name].append(s.polled_at)
                    first.setdefault(s.name, time.monotonic() - t0)
            time.sleep(0.05)
        rows = {s.name: s for s in fleet.snapshot()}
    finally:
        fleet.close()
    assert set(first) == {"live0", "live1"} and max(first.values()) < 9.0, first   # before a dead one's 10 s
    for name, times in polls.items():
        gaps = [b - a for a, b in zip(times[1:], times[2:])]      # after the first poll (it connects)
        assert len(times) >= 5 and max(gaps) < 3.0, (name, times)
    assert all(rows[n.name].reachable is not True for n in dead)
    assert "refused" in (rows["refused"].error or "") and "resolve" in (rows["unresolvable"].error or "")


def test_fleet_json_is_bounded_by_one_connect_timeout(tmp_path, capsys, silent_port, unaccepting_port):
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(
        f'[nodes.local]\nroot = "{tmp_path / "work"}"\n'
        f'[nodes.silent]\nssh = "127.0.0.1"\nport = {silent_port}\nconnect_timeout = 3.0\n'
        f'[nodes.unaccepting]\nssh = "127.0.0.1"\nport = {unaccepting_port}\nconnect_timeout = 3.0\n'
        f'[nodes.closed]\nssh = "127.0.0.1"\nport = {free_port()}\nconnect_timeout = 3.0\n')
    t0 = time.monotonic()
    assert main(["--config", str(cfg), "fleet", "--json"]) == 0
    took = time.monotonic() - t0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["nodes"]}
    assert rows["local"]["reachable"] is True
    assert rows["unaccepting"]["reachable"] is False and "no answer within" in rows["unaccepting"]["error"]
    assert rows["silent"]["reachable"] is False and "handshake" in rows["silent"]["error"]
    assert took < 5.0, f"fleet --json took {took:.1f}s with a 3 s connect timeout"


class _QuickWatch(NodeWatch):
    """A node whose poll answers after `took` seconds."""

    def __init__(self, node: NodeConfig, took: float):
        super().__init__(node)
        self.took = took
        self.polls = 0

    def poll(self, now=None, on_connected=None):
        time.sleep(self.took)
        self.polls += 1
        return NodeStatus(self.node.name, self.node.target, True, None, time.time())


def test_a_live_node_ticked_every_interval_is_polled_every_tick():
    """The next poll was due an interval after the last one ended: ticked every second (the fleet screen),
    a node was polled every other second."""
    watch = _QuickWatch(NodeConfig("n", ssh="h"), took=0.05)
    fleet = Fleet([watch.node], interval=1.0, make_watch=lambda n: watch)
    t0 = time.monotonic()
    try:
        for k in range(4):
            fleet.tick(t0 + k)               # ticks exactly an interval apart (the poll ends 0.05 s after one)
            deadline = time.monotonic() + 5
            while watch.polls < k + 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.02)
    finally:
        fleet.close()
    assert watch.polls == 4


def test_a_live_node_slower_than_the_interval_rests_half_an_interval_between_polls():
    """A poll due an interval after the last one started: a node whose poll takes longer than that must not be
    polled again at once, poll after poll."""
    watch = _QuickWatch(NodeConfig("n", ssh="h"), took=0.3)
    fleet = Fleet([watch.node], interval=0.2, make_watch=lambda n: watch)
    try:
        fleet.tick()
        deadline = time.monotonic() + 5
        while (watch.polls < 1 or fleet.snapshot()[0].polling) and time.monotonic() < deadline:
            time.sleep(0.005)
        fleet.tick()                          # just after the slow poll ended: not due yet
        assert not fleet.snapshot()[0].polling
        time.sleep(0.12)
        fleet.tick()                          # half an interval later: due
        assert fleet.snapshot()[0].polling
    finally:
        fleet.close()
