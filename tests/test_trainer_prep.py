"""Dataset prep: every adapter into the one schema, kinds, ids, schema check before work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from trainer import prep
from trainer.schema import check_sample

REPO = Path(__file__).resolve().parents[1]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_prep(tmp_path, source, *args, name="ds"):
    rc = prep.main(["--dataset", name, "--source", str(source), "--out", str(tmp_path / "out"), *args])
    out = tmp_path / "out" / f"{name}.jsonl"
    rows = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else None
    return rc, rows


def test_sharegpt_with_tools_and_system(tmp_path):
    src = write_jsonl(tmp_path / "s.jsonl", [
        {"id": "x1", "system": "Be kind.", "conversations": [
            {"from": "human", "value": "What's the weather?"},
            {"from": "gpt", "value": "<think>need a tool</think>Let me check."},
            {"from": "function_call", "value": '{"name": "weather", "arguments": {"city": "Oslo"}}'},
            {"from": "observation", "value": "rain"},
            {"from": "gpt", "value": "It rains."}]},
        {"conversations": [{"from": "human", "value": "hi"}]},
    ])
    rc, rows = run_prep(tmp_path, src)
    assert rc == 0
    a, b = rows
    assert a["id"] == "ds-x1" and a["source"] == "ds" and a["kind"] == "target-native"
    assert a["messages"] == [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "What's the weather?"},
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "need a tool",
         "tool_calls": [{"id": "call_0", "type": "function",
                         "function": {"name": "weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "rain"},
        {"role": "assistant", "content": "It rains."},
    ]
    assert b["kind"] == "prompt-only" and b["id"].startswith("ds-") and len(b["id"]) == 3 + 16
    for r in rows:
        check_sample(r, "row")
    stats = json.loads((tmp_path / "out" / "ds.stats.json").read_text())
    assert stats["format"] == "sharegpt" and stats["kinds"] == {"target-native": 1, "prompt-only": 1}
    assert stats["with_tool_calls"] == 1 and stats["with_reasoning"] == 1


def test_openai_messages_reasoning_tool_calls(tmp_path):
    src = write_jsonl(tmp_path / "o.jsonl", [{"messages": [
        {"role": "developer", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "reasoning": "think",
         "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "42"},
        {"role": "assistant", "content": "done", "reasoning_content": "ok"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}])
    rc, rows = run_prep(tmp_path, src, "--format", "openai")
    assert rc == 0
    (r,) = rows
    assert r["messages"][0] == {"role": "system", "content": "sys"}
    assert r["messages"][1] == {"role": "user", "content": "ab"}
    assert r["messages"][2] == {"role": "assistant", "content": "", "reasoning_content": "think", "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]}
    assert r["messages"][3] == {"role": "tool", "content": "42", "tool_call_id": "t1"}
    assert r["messages"][4]["reasoning_content"] == "ok"
    assert r["tools"][0]["function"]["name"] == "f"


def test_ultrachat_instruction_and_agent_formats(tmp_path):
    uc = write_jsonl(tmp_path / "u.jsonl", [{"id": 7, "data": ["q1", "a1", "q2", "a2"]}])
    rc, rows = run_prep(tmp_path, uc, name="uc")
    assert rc == 0 and [m["role"] for m in rows[0]["messages"]] == ["user", "assistant", "user", "assistant"]
    assert rows[0]["id"] == "uc-7"

    ins = write_jsonl(tmp_path / "i.jsonl", [
        {"instruction": "Translate", "input": "hola", "output": "hello"},
        {"prompt": "Write a haiku"},
        {"prompt": "2+2?", "response": "4"},
    ])
    rc, rows = run_prep(tmp_path, ins, name="ins")
    assert rc == 0
    assert rows[0]["messages"] == [{"role": "user", "content": "Translate\n\nhola"},
                                   {"role": "assistant", "content": "hello"}]
    assert [r["kind"] for r in rows] == ["target-native", "prompt-only", "target-native"]

    ag = write_jsonl(tmp_path / "a.jsonl", [{"trajectory": [
        {"role": "system", "text": "You are an agent."},
        {"role": "user", "text": "list files"},
        {"role": "ai", "thought": "run ls", "text": "",
         "tool_calls": [{"name": "bash", "arguments": {"cmd": "ls"}}]},
        {"role": "environment", "text": "a.txt"},
        {"role": "ai", "text": "There is a.txt."}]}])
    rc, rows = run_prep(tmp_path, ag, "--format", "agent", name="ag")
    assert rc == 0
    msgs = rows[0]["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant"]
    assert msgs[2]["reasoning_content"] == "run ls"
    assert msgs[2]["tool_calls"][0]["function"] == {"name": "bash", "arguments": {"cmd": "ls"}}


def test_prompt_only_keeps_system_and_user_turns_and_dedupes(tmp_path):
    conv = {"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "u1"},
                              {"from": "gpt", "value": "a1"}, {"from": "human", "value": "u2"},
                              {"from": "gpt", "value": "a2"}]}
    src = write_jsonl(tmp_path / "s.jsonl", [conv, conv, {"conversations": [{"from": "gpt", "value": "only"}]}])
    rc, rows = run_prep(tmp_path, src, "--kind", "prompt-only")
    assert rc == 0 and len(rows) == 1
    assert rows[0]["kind"] == "prompt-only"
    assert [m["content"] for m in rows[0]["messages"]] == ["s", "u1", "u2"]
    stats = json.loads((tmp_path / "out" / "ds.stats.json").read_text())
    assert stats["duplicates"] == 1 and stats["skipped"]["unusable_for_kind"] == 1
    # ids are stable across runs
    rc, again = run_prep(tmp_path, src, "--kind", "prompt-only")
    assert again[0]["id"] == rows[0]["id"]


def test_parquet_and_json_array_sources(tmp_path):
    table = pa.Table.from_pylist([
        {"messages": [{"role": "user", "content": "p1"}, {"role": "assistant", "content": "r1"}]},
        {"messages": [{"role": "user", "content": "p2"}, {"role": "assistant", "content": "r2"}]},
    ])
    pq.write_table(table, tmp_path / "d.parquet")
    rc, rows = run_prep(tmp_path, tmp_path / "d.parquet", "--max-samples", "1")
    assert rc == 0 and len(rows) == 1 and rows[0]["messages"][1] == {"role": "assistant", "content": "r1"}

    (tmp_path / "arr.json").write_text(json.dumps([{"conversations": [{"from": "human", "value": "x"}]}]))
    rc, rows = run_prep(tmp_path, tmp_path / "arr.json", name="arr")
    assert rc == 0 and rows[0]["messages"] == [{"role": "user", "content": "x"}]


def test_schema_mismatch_fails_before_any_output(tmp_path, capsys):
    src = write_jsonl(tmp_path / "x.jsonl", [{"foo": 1, "bar": 2}])
    rc, rows = run_prep(tmp_path, src)
    assert rc == 2 and rows is None
    assert capsys.readouterr().err.strip() == (
        f"nodedeck-train: {src}:1: no adapter matches fields ['bar', 'foo'] "
        "(expected conversations|messages|data|instruction/output|prompt/response|trajectory|steps)")
    src2 = write_jsonl(tmp_path / "y.jsonl", [{"messages": [{"role": "user", "content": "a"}]}])
    rc, _ = run_prep(tmp_path, src2, "--format", "sharegpt")
    assert rc == 2
    assert capsys.readouterr().err.strip() == (
        f"nodedeck-train: {src2}:1: format sharegpt expects conversations, found fields ['messages']")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_bad_record_later_in_file_loses_nothing(tmp_path, capsys):
    rows = [{"conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": "a"}]} for i in range(8)]
    rows.append({"conversations": [{"from": "wizard", "value": "?"}]})
    src = write_jsonl(tmp_path / "s.jsonl", rows)
    out = tmp_path / "out"
    out.mkdir()
    (out / "ds.jsonl").write_text('{"previous": "complete output"}\n')
    rc, kept = run_prep(tmp_path, src)
    assert rc == 2
    assert capsys.readouterr().err.strip() == f"nodedeck-train: {src}:9: conversations[0]: unknown role 'wizard'"
    assert kept == [{"previous": "complete output"}]
    assert sorted(p.name for p in out.iterdir()) == ["ds.jsonl"]
    rc, kept = run_prep(tmp_path, src, "--skip-invalid")
    assert rc == 0 and len(kept) == 8
    stats = json.loads((out / "ds.stats.json").read_text())
    assert stats["skipped"]["invalid"] == 1 and stats["first_invalid"].startswith(f"{src}:9:")


def test_hub_source_without_datasets_package_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)   # `import datasets` raises ImportError
    rc, _ = run_prep(tmp_path, "some-org/some-dataset")
    assert rc == 2
    assert "the `datasets` package is not installed" in capsys.readouterr().err
    assert prep.main(["--dataset", "nope", "--out", str(tmp_path)]) == 2
    assert "not in the registry" in capsys.readouterr().err


def test_registry_and_cli_subprocess(tmp_path):
    src = write_jsonl(tmp_path / "s.jsonl", [{"prompt": "hello"}])
    reg = tmp_path / "datasets.toml"
    reg.write_text(f'[datasets.local]\nsource = "{src}"\nkind = "prompt-only"\n')
    proc = subprocess.run([sys.executable, "-m", "trainer.cli", "prep", "--dataset", "local", "--registry", str(reg),
                           "--out", str(tmp_path / "o"), "--progress", str(tmp_path / "p.jsonl")],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["written"] == 1
    assert json.loads((tmp_path / "o" / "local.jsonl").read_text())["kind"] == "prompt-only"
    last = json.loads((tmp_path / "p.jsonl").read_text().splitlines()[-1])
    assert last["final"] and last["done"] == 1 and last["total"] == 1 and last["step"] == "prep"
    assert {"sharegpt", "ultrachat"} <= set(prep.load_registry())
