"""One registry of node handles (ops.node_handle.NodeHandles) for the plan engine, the dashboard, its fleet watch and
the CLI: a node is opened once per registry, whichever thread asks; close() closes what it opened, never a handle it
was lent."""

from __future__ import annotations

import argparse
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from cli.common import open_node
from ops.errors import NodedeckError, UserError
from ops.fleet.watch import NodeWatch
from ops.node_handle import NodeHandle, NodeHandles
from ops.nodes import get_node, load_nodes
from ops.plan.parse import load_plan
from ops.run.scheduler import Scheduler
from tests.support.sshd import free_port
from tui.live import LiveSource

PLAN = """
[plan]
name = "registry"

[[stage]]
id = "a"
command = "true"

[[stage]]
id = "b"
node = "far"
command = "true"
"""


@pytest.fixture
def cfg(tmp_path):
    """A local node, and one over ssh that nothing here connects to (a handle connects on its first command)."""
    path = tmp_path / "nodes.toml"
    path.write_text(f'[nodes.local]\nroot = "{tmp_path / "work"}"\n\n'
                    f'[nodes.far]\nssh = "127.0.0.1"\nport = {free_port()}\nroot = "/srv"\n')
    return path


def test_a_node_is_opened_once_whichever_thread_asks(cfg):
    with NodeHandles(cfg) as nodes, ThreadPoolExecutor(8) as pool:
        handles = list(pool.map(nodes, ["local", "far"] * 32))
        assert len({id(h) for h in handles}) == 2
        assert {h.name for h in handles} == {"local", "far"}
        with pytest.raises(UserError, match=r"unknown node 'nowhere' \(known: far, local\)"):
            nodes("nowhere")


def test_close_closes_what_it_opened_and_leaves_what_it_was_lent(cfg):
    lent = NodeHandle(get_node(load_nodes(cfg), "local"))
    nodes = NodeHandles(cfg)
    opened = nodes("local")
    opened.store.kv_set("k", "opened")
    store = opened.store
    borrowed = NodeHandles.of(lent)
    assert borrowed("local") is lent
    with pytest.raises(UserError, match="unknown node 'far'"):
        borrowed("far")
    borrowed.close()
    nodes.close()
    with pytest.raises(NodedeckError, match="closed database"):
        store.kv_get("k")
    assert lent.store.kv_get("k") == "opened"       # (the same node's state file, through the lent handle)
    again = nodes("local")
    assert again is not opened                      # a closed registry opens afresh
    again.close()
    lent.close()


def test_a_close_that_hangs_is_waited_for_at_most_wait_s(cfg):
    """A handle still connecting to a dead node holds its lock until its connect timeout: quitting does not wait."""
    nodes = NodeHandles(cfg)
    hung, gate = nodes("far"), threading.Event()
    hung.close = gate.wait  # type: ignore[method-assign]
    nodes.close(wait_s=0.1)
    assert not gate.is_set()   # close returned while that handle's close still hangs
    gate.set()


def test_the_plan_engine_takes_its_handles_from_the_registry(cfg, tmp_path):
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(PLAN)
    plan = load_plan(plan_file)
    with NodeHandles(cfg) as nodes:
        sched = Scheduler(plan, nodes)
        assert sched.ctx.handle(plan.stage("a")) is nodes("local")
        assert sched.ctx.handle(plan.stage("b")) is nodes("far")
        with pytest.raises(UserError, match="unknown node 'far'"):
            Scheduler(plan, NodeHandles.of(nodes("local")))   # a stage's node it does not hold is refused at once


def test_the_dashboard_its_plan_and_the_node_s_watch_share_one_handle(cfg, tmp_path):
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(PLAN)
    src = LiveSource(config_path=cfg, plan_path=plan_file)
    try:
        handle = src.handles("local")
        assert src.scheduler is not None and src.scheduler.ctx.handle(src.scheduler.plan.stage("a")) is handle
        watch = NodeWatch(get_node(load_nodes(cfg), "local"), nodes=src.handles)
        assert watch.handle is handle
        watch.close()                                # the dashboard's handles stay open
        store = handle.store
        store.kv_set("still", "open")
    finally:
        src.close()
    with pytest.raises(NodedeckError, match="closed database"):
        store.kv_get("still")


def test_a_watch_of_its_own_closes_its_handle(cfg):
    watch = NodeWatch(get_node(load_nodes(cfg), "local"))
    store = watch.handle.store
    watch.close()
    with pytest.raises(NodedeckError, match="closed database"):
        store.kv_get("x")


def test_a_cli_command_s_node_is_closed_when_the_command_ends(cfg):
    args = argparse.Namespace(node="local", config=str(cfg), accept_new_host_key=False)
    with open_node(args) as handle:
        store = handle.store
        store.kv_set("k", 1)
    with pytest.raises(NodedeckError, match="closed database"):
        store.kv_get("k")
