"""Reasoning split/rebuild: the rebuilt turn's token ids equal the chat template's."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.tiny import tiny_target_dir
from trainer.reasoning import DEFAULT_TAGS, ThinkTags, TurnFormat, check_turn, join_reasoning, split_reasoning


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_target_dir()))


def test_split_reasoning_cases():
    assert split_reasoning("<think>plan</think>answer") == ("plan", "answer")
    assert split_reasoning("  <think>a</think>b</think>c") == ("a", "b</think>c")
    assert split_reasoning("no thinking here") == (None, "no thinking here")
    assert split_reasoning("cut off mid thought", opened=True) == ("cut off mid thought", "")
    assert split_reasoning("r</think>\n\nA", opened=True) == ("r", "\n\nA")
    tags = ThinkTags("◁think▷", "◁/think▷")
    assert split_reasoning("◁think▷x◁/think▷y", tags) == ("x", "y")


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="<>")), st.text())
def test_join_then_split_round_trips(reasoning, answer):
    assert split_reasoning(join_reasoning(reasoning, answer)) == (reasoning, answer)
    opened = join_reasoning(reasoning, answer)[len(DEFAULT_TAGS.start):]
    assert split_reasoning(opened, opened=True) == (reasoning, answer)


HISTORIES = [
    [{"role": "user", "content": "What is 6 times 7?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!", "reasoning_content": "greet"},
     {"role": "user", "content": "Weather in Paris?"}],
    [{"role": "user", "content": "Look it up"},
     {"role": "assistant", "content": "", "tool_calls": [
         {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "paris"}'}}]},
     {"role": "tool", "content": "18 C", "tool_call_id": "c1"}],
]
TURNS = [
    {"role": "assistant", "content": "It is 42.", "reasoning_content": "6*7 = 42, easy."},
    {"role": "assistant", "content": "Plain answer without thinking."},
    {"role": "assistant", "content": "Calling a tool.", "reasoning_content": "need data",
     "tool_calls": [{"id": "c2", "type": "function",
                     "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
]


@pytest.mark.parametrize("history", HISTORIES)
@pytest.mark.parametrize("turn", TURNS)
def test_rebuilt_turn_ids_equal_template_ids(tok, history, turn):
    rebuilt = check_turn(tok, history, turn)
    full = tok.apply_chat_template(history + [turn], tokenize=False)
    full_ids = tok.encode(full, add_special_tokens=False)
    assert rebuilt == full_ids[: len(rebuilt)] and tok.decode(full_ids[len(rebuilt):]) == "\n"
    emitted = TurnFormat(tok).emitted_text(history, turn)
    assert emitted.startswith((turn.get("reasoning_content") or "") + "</think>" + turn["content"])
    assert emitted.endswith("<|im_end|>")


def test_check_turn_catches_a_template_that_drops_reasoning(tok):
    from transformers import AutoTokenizer

    other = AutoTokenizer.from_pretrained(str(tiny_target_dir()))
    other.chat_template = tok.chat_template.replace("(message['reasoning_content'] or '')", "''")
    with pytest.raises(Exception, match="differs from the chat template"):
        check_turn(other, HISTORIES[0], TURNS[0])
