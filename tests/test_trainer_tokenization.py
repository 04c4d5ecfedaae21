"""Tokenisation: assistant-only loss mask, truncation, length stats, errors."""

from __future__ import annotations

import json

import pytest

from tests.support.tiny import tiny_target_dir
from trainer import tokenization
from trainer.tokenization import ChatTokenizer, length_stats

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Add 2 and 3."},
    {"role": "assistant", "content": "5", "reasoning_content": "2+3=5"},
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": "", "reasoning_content": "use the tool",
     "tool_calls": [{"id": "a", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
    {"role": "tool", "content": "sunny", "tool_call_id": "a"},
    {"role": "assistant", "content": "It is sunny."},
    {"role": "user", "content": "thanks"},
]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_target_dir()))


def spans(mask):
    out, start = [], None
    for i, m in enumerate(mask + [0]):
        if m and start is None:
            start = i
        if not m and start is not None:
            out.append((start, i))
            start = None
    return out


def test_mask_covers_exactly_the_assistant_tokens(tok):
    ids, mask, unmasked = ChatTokenizer(tok).encode(CONVERSATION)
    assert unmasked == 0
    decoded = [tok.decode(ids[a:b]) for a, b in spans(mask)]
    assert decoded == [
        "2+3=5</think>5<|im_end|>",
        'use the tool</think><tool_call>weather\n{}</tool_call><|im_end|>',
        "</think>It is sunny.<|im_end|>",
    ]
    # the whole sequence is the template's rendering up to the last assistant turn
    want = tok.apply_chat_template(CONVERSATION[:7], tokenize=False)
    assert tok.decode(ids) == want.rstrip("\n")
    unmasked_text = tok.decode([t for t, m in zip(ids, mask) if not m])
    for m in CONVERSATION[:7]:
        if m["role"] != "assistant":
            assert m["content"] in unmasked_text


def test_history_rewriting_template_masks_only_the_last_turn(tok):
    from transformers import AutoTokenizer

    other = AutoTokenizer.from_pretrained(str(tiny_target_dir()))
    # a DeepSeek-R1-like template: history turns lose their reasoning
    other.chat_template = tok.chat_template.replace(
        "(message['reasoning_content'] or '')", "((message['reasoning_content'] or '') if loop.last else '')")
    ids, mask, unmasked = ChatTokenizer(other).encode(CONVERSATION[:3] + CONVERSATION[3:5] + CONVERSATION[5:7])
    assert unmasked == 2
    assert [other.decode(ids[a:b]) for a, b in spans(mask)] == ["</think>It is sunny.<|im_end|>"]
    assert "2+3=5" not in other.decode(ids)


def test_length_stats():
    assert length_stats(list(range(1, 101))) == {"count": 100, "mean": 50.5, "p50": 50, "p90": 90,
                                                 "p99": 99, "max": 100}
    assert length_stats([7]) == {"count": 1, "mean": 7.0, "p50": 7, "p90": 7, "p99": 7, "max": 7}


def write_samples(path, samples):
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))


def test_tokenize_cli_truncates_and_writes_stats(tmp_path, capsys):
    samples = [
        {"id": "a", "source": "t", "kind": "target-native", "messages": CONVERSATION},
        {"id": "b", "source": "t", "kind": "target-native",
         "messages": [{"role": "user", "content": "hi " * 40}, {"role": "assistant", "content": "yo"}]},
        {"id": "c", "source": "t", "kind": "prompt-only", "messages": [{"role": "user", "content": "q"}]},
    ]
    write_samples(tmp_path / "s.jsonl", samples)
    rc = tokenization.main(["--model", str(tiny_target_dir()), "--input", str(tmp_path / "s.jsonl"),
                            "--out", str(tmp_path / "tok.jsonl"), "--max-length", "60",
                            "--progress", str(tmp_path / "p.jsonl")])
    assert rc == 0, capsys.readouterr().err
    rows = [json.loads(x) for x in (tmp_path / "tok.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a"]  # b's assistant turn is past 60 tokens; c has none
    assert len(rows[0]["input_ids"]) == 60 == len(rows[0]["loss_mask"])
    stats = json.loads((tmp_path / "tok.jsonl.stats.json").read_text())
    assert stats["truncated"] == 2 and stats["written"] == 1
    assert stats["skipped"] == {"no_assistant_turn": 1, "no_loss_tokens_after_truncation": 1}
    assert stats["length"]["count"] == 2 and stats["length"]["max"] > 60
    assert stats["loss_tokens"] == sum(rows[0]["loss_mask"])
    assert json.loads((tmp_path / "p.jsonl").read_text().splitlines()[-1])["done"] == 3


def test_bad_sample_line_is_reported_and_nothing_written(tmp_path, capsys):
    good = {"id": "a", "source": "t", "kind": "target-native", "messages": CONVERSATION[:3]}
    bad = {"id": "b", "source": "t", "kind": "target-native", "messages": [{"role": "bot", "content": "x"}]}
    write_samples(tmp_path / "s.jsonl", [good, bad])
    rc = tokenization.main(["--model", str(tiny_target_dir()), "--input", str(tmp_path / "s.jsonl"),
                            "--out", str(tmp_path / "tok.jsonl")])
    assert rc == 2
    assert capsys.readouterr().err.strip() == (
        f"nodedeck-train: {tmp_path / 's.jsonl'}:2: messages[0]: role must be one of system, user, assistant, tool")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl"]
