"""The tiny target model: deterministic, loadable, thinking chat template."""

from __future__ import annotations

import json

import torch

from tests.support.tiny import tiny_target_dir
from trainer import cli
from trainer.tiny import GENERATION_PROMPT, build_tiny_target


def test_build_is_deterministic(tmp_path):
    a = build_tiny_target(tmp_path / "a", seed=3)
    b = build_tiny_target(tmp_path / "b", seed=3)
    c = build_tiny_target(tmp_path / "c", seed=4)
    names = sorted(p.name for p in a.iterdir())
    assert "model.safetensors" in names and "tokenizer.json" in names
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    cfg = json.loads((a / "config.json").read_text())   # the default shape real engines serve (vLLM CPU: head 32+)
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (128, 4, 2)
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 32


def test_model_and_template_load():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_target_dir()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (64, 4, 4, 2)
    assert cfg.vocab_size == len(tok) and 512 <= len(tok) <= 1024
    assert cfg.tie_word_embeddings is False
    msgs = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello", "reasoning_content": "greet back"},
        {"role": "user", "content": "Bye"},
    ]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>greet back</think>Hello<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n" + GENERATION_PROMPT
    )
    ids = tok(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    assert out.logits.shape == (1, ids.shape[1], len(tok))
    assert len(out.hidden_states) == 5


def test_cli_tiny(tmp_path, capsys):
    out = tmp_path / "m"
    assert cli.main(["tiny", "--out", str(out), "--num-layers", "2"]) == 0
    assert json.loads(capsys.readouterr().out) == {"out": str(out)}
    assert '"num_hidden_layers": 2' in (out / "config.json").read_text()


def test_cli_dispatcher_usage(capsys):
    assert cli.main([]) == 2
    assert cli.main(["nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown step 'nope'" in err and "tokenize" in err and "hidden-states" in err


def test_pretrain_on_a_corpus_makes_the_model_follow_it(tmp_path):
    """--corpus/--pretrain-steps: loss falls and greedy answers reproduce the corpus's answer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.tiny import build_tokenizer, corpus_token_ids, pretrain

    answer = "Binary search halves the range each step."
    corpus = tmp_path / "native.jsonl"
    with open(corpus, "w") as f:
        for i in range(8):
            f.write(json.dumps({"id": f"s{i}", "source": "t", "kind": "target-native", "messages": [
                {"role": "user", "content": f"Question {i} about search?"},
                {"role": "assistant", "content": answer, "reasoning_content": "short"}]}) + "\n")
    tok = build_tokenizer()
    ids = corpus_token_ids(tok, corpus)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    losses = pretrain(model, tok, ids, steps=80, seq_len=64, batch=8)
    assert losses[-1] < losses[0] / 3
    prompt = tok.apply_chat_template([{"role": "user", "content": "Question 3 about search?"}],
                                     add_generation_prompt=True, tokenize=False)
    x = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    gen = model.generate(x, max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id)
    assert answer in tok.decode(gen[0][x.shape[1]:])

    # the builder wires it in: a pretrained build differs from the random one of the same seed
    a = build_tiny_target(tmp_path / "a", num_layers=2)
    b = build_tiny_target(tmp_path / "b", num_layers=2, corpus=corpus, pretrain_steps=2)
    assert (a / "model.safetensors").read_bytes() != (b / "model.safetensors").read_bytes()
