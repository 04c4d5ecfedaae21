"""Coding agents' todo lists found and followed: opencode (JSON files and SQLite), Claude Code, todowrite."""

from __future__ import annotations

import json
import os
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ops.agents import scan
from ops.agents.discover import discover_local, discover_remote, select
from ops.agents.follow import AgentFollower
from ops.agents.todos import Agent, AgentSpec
from ops.errors import UserError
from tests.support.agent_lists import (
    opencode_data,
    opencode_db,
    touch_later,
    write_claude,
    write_claude_tasks,
    write_claude_transcript,
    write_opencode_db,
    write_opencode_json,
)

ITEMS = [{"content": "Prepare the ShareGPT data", "status": "completed"},
         {"content": "Train the EAGLE-3 drafter on 10K samples", "status": "in_progress"},
         {"content": "Benchmark against the baseline", "status": "pending"}]


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.setenv("XDG_DATA_HOME", str(h / ".local" / "share"))
    monkeypatch.delenv("CLAUDE_CONFIG_DIR", raising=False)
    return h


def test_every_agent_format_is_found_with_its_session_project_and_counts(home):
    write_opencode_json(home, "ses_old", ITEMS, directory="/work/old")
    write_opencode_db(home, "ses_new", ITEMS[:2], directory="/work/new")
    write_claude(home, "c0ffee", ITEMS, cwd="/work/claude")
    plain = home / "plan-todos.json"
    plain.write_text(json.dumps({"todos": [{"id": "a", "content": "x", "status": "pending", "priority": "low"}]}))

    lists = {(a.agent, a.agent_session): a for a in discover_local([str(plain)])}
    old = lists[(Agent.OPENCODE, "ses_old")]
    assert old.project == "/work/old" and old.counts() == {"completed": 1, "in_progress": 1, "pending": 1}
    assert [i.id for i in old.items] == ["1", "2", "3"] and old.error is None
    new = lists[(Agent.OPENCODE, "ses_new")]
    assert new.project == "/work/new" and new.path.endswith("opencode.db") and [i.id for i in new.items] == [None, None]
    assert [i.content for i in new.items] == [ITEMS[0]["content"], ITEMS[1]["content"]]
    claude = lists[(Agent.CLAUDE, "c0ffee-agent-c0ffee")]
    assert claude.project == "/work/claude" and claude.items[1].active_form.startswith("Doing: Train")
    assert lists[(Agent.TODOWRITE, str(plain))].items[0].priority == "low"
    assert all(a.updated for a in lists.values())


@pytest.mark.parametrize("agent,bad,field", [
    ("claude", [{"content": "x", "status": 3, "activeForm": "y"}], "[0].status"),
    ("claude", [{"content": "x", "status": "", "activeForm": "y"}], "[0].status"),
    ("claude", [{"content": "x", "status": "pending", "activeForm": ["y"]}], "[0].activeForm"),
    ("claude", {"todos": []}, "expected an array"),
    ("opencode", [{"id": "1", "content": "", "status": "pending", "priority": "high"}], "[0].content"),
    ("opencode", [{"id": "1", "content": "x", "status": "pending", "priority": 2}], "[0].priority"),
    ("opencode", '[{"id": "1", "content": "x", "sta', "invalid JSON"),
])
def test_a_malformed_list_is_one_line_naming_the_file_and_field(home, agent, bad, field):
    if agent == "claude":
        path = home / ".claude" / "todos" / "s-agent-s.json"
    else:
        path = opencode_data(home) / "storage" / "todo" / "ses_x.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(bad if isinstance(bad, str) else json.dumps(bad))
    [lst] = discover_local()
    assert lst.items == () and lst.error.startswith(f"{path}: ") and field in lst.error and "\n" not in lst.error


def test_an_opencode_database_of_another_schema_is_reported_not_crashed(home):
    db = opencode_db(home)
    con = sqlite3.connect(db)
    con.executescript("DROP TABLE todo; CREATE TABLE todo (session_id TEXT, text TEXT, state TEXT);")
    con.close()
    [lst] = discover_local()
    assert "table todo: missing column" in lst.error and str(db) in lst.error


def test_a_fifo_in_place_of_a_list_never_blocks(home):
    fifo = home / ".claude" / "todos" / "s-agent-s.json"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    [lst] = discover_local()
    assert "not a regular file" in lst.error


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                        lambda c: st.lists(c, max_size=4) | st.dictionaries(
                            st.sampled_from(["content", "status", "priority", "id", "activeForm", "todos"]), c,
                            max_size=5), max_leaves=20))
def test_fuzzed_lists_read_or_give_one_line(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("fz") / "list.json"
    path.write_text(json.dumps(doc))
    for agent in ("opencode", "claude", "todowrite"):
        entry = scan._file_list(agent, "s", None, str(path))
        assert (entry["error"] is None) or (entry["error"].startswith(str(path)) and "\n" not in entry["error"])


def test_a_thousand_items_are_read_whole_in_order(home):
    items = [{"content": f"item {n}: " + "long text " * 20, "status": "pending"} for n in range(1000)]
    write_opencode_db(home, "ses_big", items)
    [lst] = discover_local()
    assert len(lst.items) == 1000 and lst.items[999].content == items[999]["content"]
    assert [i.position for i in lst.items] == list(range(1, 1001))


def test_select_takes_the_newest_session_or_the_one_named(home):
    old = write_claude(home, "aaaa", ITEMS)
    write_claude(home, "bbbb", ITEMS[:1])
    touch_later(old, 100)
    lists = discover_local()
    assert select(lists, AgentSpec.parse("claude")).agent_session == "aaaa-agent-aaaa"
    assert select(lists, AgentSpec.parse("claude:bbbb")).agent_session == "bbbb-agent-bbbb"
    with pytest.raises(UserError, match="no opencode todo list"):
        select(lists, AgentSpec.parse("opencode"))
    with pytest.raises(UserError, match="unknown agent"):
        AgentSpec.parse("cursor")


def test_follow_keeps_the_last_good_list_through_a_half_written_file(home):
    path = write_claude(home, "s1", ITEMS)
    f = AgentFollower("claude")
    first = f.poll()
    assert first.changed and len(first.items) == 3 and first.error is None
    assert not f.poll().changed
    good = path.read_text()
    path.write_text(good[: len(good) // 2])                      # the agent's write caught half-way
    half = f.poll()
    assert half.error and "invalid JSON" in half.error and len(half.items) == 3
    path.write_text(json.dumps([{"content": "only one", "status": "completed", "activeForm": "x"}]))
    done = f.poll()
    assert done.changed and done.error is None and [i.content for i in done.items] == ["only one"]


def test_follow_switches_to_a_new_session(home):
    write_opencode_db(home, "ses_a", ITEMS, when_ms=1_000_000)
    f = AgentFollower("opencode")
    assert f.poll().source.agent_session == "ses_a"
    write_opencode_db(home, "ses_b", ITEMS[:1], when_ms=2_000_000)   # the user started a new session
    st = f.poll()
    assert st.changed and st.source.agent_session == "ses_b" and len(st.items) == 1


def test_follow_sees_a_rewrite_in_the_database(home):
    write_opencode_db(home, "ses_a", ITEMS, when_ms=1_000_000)
    f = AgentFollower("opencode:ses_a")
    f.poll()
    write_opencode_db(home, "ses_a", [{**ITEMS[1], "status": "completed"}], when_ms=1_000_500)
    st = f.poll()
    assert st.changed and [(i.content, i.status) for i in st.items] == [(ITEMS[1]["content"], "completed")]


def test_lists_on_a_node_are_read_over_ssh(sshd, tmp_path):
    from ops.hosts.ssh import SSHHost

    home = tmp_path / "nodehome"
    write_claude(home, "remote1", ITEMS, cwd="/data/work")
    host = SSHHost(sshd.alias, sshd.alias, ssh_config=str(sshd.ssh_config))
    try:
        [lst] = discover_remote(host, home=str(home), agents=("claude",))
    finally:
        host.close()
    assert lst.node == sshd.alias and lst.project == "/data/work" and len(lst.items) == 3


# -- the clients as they write today (Claude Code 2.1, opencode 1.18) --------------------------------------------
TASKS = [{"subject": "Prepare the ShareGPT data", "description": "download and clean", "activeForm": "Preparing",
          "status": "completed", "blocks": ["2"]},
         {"subject": "Train the EAGLE-3 drafter", "description": "10K samples", "activeForm": "Training",
          "status": "in_progress", "blockedBy": ["1"]},
         {"subject": "Benchmark against the baseline", "description": "vLLM"}]


def test_claude_code_task_lists_are_found_with_their_project_and_dependency_graph(home):
    config = home / ".claude"
    write_claude_tasks(config, "8c906272-eb12", TASKS)
    write_claude_transcript(config, "8c906272-eb12", "/work/my.proj")
    write_claude_tasks(config, "team-list", TASKS[:1])           # CLAUDE_CODE_TASK_LIST_ID: no transcript

    lists = {a.agent_session: a for a in discover_local()}
    tasks = lists["8c906272-eb12"]
    assert tasks.agent is Agent.CLAUDE and tasks.error is None and tasks.project == "/work/my.proj"
    assert tasks.path == str(config / "tasks" / "8c906272-eb12")
    assert [(i.position, i.id, i.content, i.status, i.active_form, i.description) for i in tasks.items] == [
        (1, "1", "Prepare the ShareGPT data", "completed", "Preparing", "download and clean"),
        (2, "2", "Train the EAGLE-3 drafter", "in_progress", "Training", "10K samples"),
        (3, "3", "Benchmark against the baseline", "pending", None, "vLLM")]
    assert [(i.blocks, i.blocked_by) for i in tasks.items] == [(("2",), ()), ((), ("1",)), ((), ())]
    assert lists["team-list"].project is None and len(lists["team-list"].items) == 1
    assert select(discover_local(), AgentSpec.parse("claude:8c90")).agent_session == "8c906272-eb12"


def test_task_files_are_ordered_by_their_number_and_a_deleted_one_is_gone(home):
    tasks = [{"id": str(n), "subject": f"task {n}"} for n in (1, 2, 10, 11, "²")]   # int("²") raises
    d = write_claude_tasks(home / ".claude", "s", tasks)
    (d / "2.json").unlink()                                      # TaskUpdate status=deleted removes the file
    (d / ".highwatermark").write_text("11")
    [lst] = discover_local()
    assert [i.content for i in lst.items] == ["task 1", "task 10", "task 11", "task ²"] and lst.error is None


def test_claude_config_dir_moves_the_store(home, tmp_path, monkeypatch):
    config = tmp_path / "elsewhere"
    write_claude_tasks(config, "moved", TASKS)
    write_claude_tasks(home / ".claude", "default", TASKS)
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(config))
    assert [a.agent_session for a in discover_local()] == ["moved"]


def test_a_task_file_caught_mid_write_is_read_again_not_an_error(home, monkeypatch):
    d = write_claude_tasks(home / ".claude", "s", TASKS)
    whole = (d / "2.json").read_bytes()
    real = scan._read_regular
    reads = []

    def first_read_cut(path):                                   # the client is writing 2.json as it is read
        reads.append(path)
        if path.endswith("2.json") and reads.count(path) == 1:
            return whole[:17]
        return real(path)

    monkeypatch.setattr(scan, "_read_regular", first_read_cut)
    [lst] = discover_local()
    assert lst.error is None and lst.items[1].content == "Train the EAGLE-3 drafter"
    assert reads.count(str(d / "2.json")) == 2


def test_a_task_file_that_stays_broken_is_one_line_naming_it(home, monkeypatch):
    d = write_claude_tasks(home / ".claude", "s", TASKS)
    (d / "3.json").write_text('{"id": "3", "subj')
    monkeypatch.setattr(scan, "REREAD_S", 0.0)
    [lst] = discover_local()
    assert lst.items == () and lst.error.startswith(f"{d / '3.json'}: invalid JSON") and "\n" not in lst.error
    (d / "3.json").write_text(json.dumps({"id": "3", "subject": "", "status": "pending"}))
    [lst] = discover_local()
    assert lst.error == f"{d / '3.json'}: subject: expected a non-empty string"


def test_broken_task_files_hold_one_scan_for_a_bounded_number_of_rereads(home, monkeypatch):
    for n in range(30):
        d = write_claude_tasks(home / ".claude", f"list{n}", TASKS[:1])
        (d / "1.json").write_text('{"id": "1", "subj')
    slept = []
    monkeypatch.setattr(scan.time, "sleep", slept.append)
    lists = discover_local()
    assert len(lists) == 30 and all("invalid JSON" in a.error for a in lists)
    assert len(slept) == scan.REREAD_WAITS


def test_the_last_todowrite_of_a_transcript_is_the_list(home):
    config = home / ".claude"
    first = [{"content": "Prepare the data", "status": "in_progress", "activeForm": "Preparing"}]
    second = [{"content": "Prepare the data", "status": "completed", "activeForm": "Preparing"},
              {"content": "Train the drafter", "status": "in_progress", "activeForm": "Training"}]
    path = write_claude_transcript(config, "7e94f75e", "/work/p", [first, second])
    [lst] = discover_local()
    assert (lst.agent, lst.agent_session, lst.path, lst.project) == (Agent.CLAUDE, "7e94f75e", str(path), "/work/p")
    assert [(i.content, i.status, i.active_form) for i in lst.items] == [
        ("Prepare the data", "completed", "Preparing"), ("Train the drafter", "in_progress", "Training")]
    assert lst.updated == pytest.approx(1796570761.5)            # the record's time, not the file's

    write_claude_transcript(config, "7e94f75e", "/work/p", [first, second, [{"content": "x", "status": 1}]],
                            failed_last=True)                     # refused by the client: the list is unchanged
    [lst] = discover_local()
    assert [i.content for i in lst.items] == ["Prepare the data", "Train the drafter"]

    write_claude_transcript(config, "nolist", "/work/q")          # a session that never wrote a todo list
    assert [a.agent_session for a in discover_local()] == ["7e94f75e"]


def test_a_todowrite_still_being_written_is_not_an_error(home):
    path = write_claude_transcript(home / ".claude", "s", "/w", [[{"content": "a", "status": "pending",
                                                                     "activeForm": "A"}]])
    with path.open("a") as f:
        f.write('{"type": "assistant", "message": {"content": [{"type": "tool_use", "name": "TodoWrite", "inp')
    [lst] = discover_local()
    assert lst.error is None and [i.content for i in lst.items] == ["a"]


def test_a_growing_transcript_is_searched_again_only_when_its_new_lines_touch_the_list(home, monkeypatch):
    first = [{"content": "Prepare the data", "status": "in_progress", "activeForm": "Preparing"}]
    path = write_claude_transcript(home / ".claude", "s", "/w", [first])
    searched = []
    real = scan._transcript_list
    monkeypatch.setattr(scan, "_transcript_list", lambda *a: searched.append(a[2]) or real(*a))
    assert [i.status for i in discover_local()[0].items] == ["in_progress"] and len(searched) == 1

    chat = {"type": "assistant", "message": {"role": "assistant", "content": [{"type": "text", "text": "hm"}]}}
    with path.open("a") as f:
        f.write(json.dumps(chat) + "\n" + json.dumps(chat)[:20])     # a line, and one still being written
    assert [i.status for i in discover_local()[0].items] == ["in_progress"] and len(searched) == 1

    done = [{**first[0], "status": "completed"}]
    with path.open("a") as f:
        f.write(json.dumps(chat)[20:] + "\n" + json.dumps({"type": "user", "cwd": "/w", "message": {
            "role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "ok"}]},
            "toolUseResult": {"oldTodos": first, "newTodos": done}}) + "\n")
    assert [i.status for i in discover_local()[0].items] == ["completed"] and len(searched) == 2


def test_transcripts_are_searched_within_a_byte_budget(home, monkeypatch):
    config = home / ".claude"
    for n in range(3):
        p = write_claude_transcript(config, f"s{n}", "/w", [[{"content": f"item {n}", "status": "pending"}]])
        touch_later(p, n)
    monkeypatch.setattr(scan, "TRANSCRIPT_BUDGET", p.stat().st_size * 2 + 10)
    lists = discover_local()
    assert [a.agent_session for a in lists if not a.error] == ["s2", "s1"]
    [cut] = [a for a in lists if a.error]
    assert "1 older transcript not searched" in cut.error and "\n" not in cut.error


def test_older_claude_code_lists_are_still_read(home):
    write_claude(home, "new", ITEMS)
    early = home / ".claude" / "todos" / "old-agent-old.json"     # Claude Code 1.0: ids and priorities, no activeForm
    early.write_text(json.dumps([{"id": "1", "content": "a", "status": "pending", "priority": "high"}]))
    lists = {a.agent_session: a for a in discover_local()}
    assert lists["new-agent-new"].items[0].active_form == "Doing: Prepare the ShareGPT data"
    old = lists["old-agent-old"]
    first = old.items[0]
    assert old.error is None and (first.id, first.priority, first.active_form) == ("1", "high", None)


def test_opencode_words_outside_nodedecks_are_kept_verbatim(home):
    write_opencode_db(home, "ses_w", [{"content": "Train", "status": "blocked", "priority": "urgent"},
                                      {"content": "Eval", "status": "pending", "priority": "\x1b[2Jlow"}])
    [lst] = discover_local()
    assert lst.error is None and [(i.status, i.priority) for i in lst.items] == [
        ("blocked", "urgent"), ("pending", "\x1b[2Jlow")]
    assert lst.counts() == {"blocked": 1, "pending": 1}


def test_follow_sees_a_task_list_change(home):
    config = home / ".claude"
    d = write_claude_tasks(config, "s1", TASKS)
    f = AgentFollower("claude")
    assert f.poll().changed
    write_claude_tasks(config, "s1", [{**TASKS[0]}, {**TASKS[1], "status": "completed"}])
    (d / "3.json").unlink()
    st = f.poll()
    assert st.changed and [(i.content, i.status) for i in st.items] == [
        ("Prepare the ShareGPT data", "completed"), ("Train the EAGLE-3 drafter", "completed")]
