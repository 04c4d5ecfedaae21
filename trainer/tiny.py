"""A tiny, deterministic target model (tokenizer + random-weight Llama) built without any download.

`build_tiny_target(out_dir)` trains a byte-level BPE on a built-in corpus, wraps it in a
transformers fast tokenizer with a thinking-style chat template, creates a small
`LlamaForCausalLM` (hidden 128, 4 attention heads of 32, 2 KV heads: a shape vLLM and SGLang
serve) from a fixed seed and saves both with `save_pretrained` into one directory.
With `--corpus` (a prepared-schema JSONL, the output of `prep`) and `--pretrain-steps N`, the
model is first trained for N quick steps on those conversations, rendered with its own chat
template, so that its answers follow them and its next-token distributions are peaked: a
drafter then has something to learn (a random model's argmax is noise).

Chat template (Kimi-K2 / DeepSeek thinking style):

    <|im_start|>{role}\n{content}<|im_end|>\n                      system, user, tool turns
    <|im_start|>assistant\n<think>{reasoning}</think>{content}{calls}<|im_end|>\n
    calls: <tool_call>{name}\n{arguments as JSON}</tool_call> per tool call
    generation prompt: <|im_start|>assistant\n<think>

An assistant turn without `reasoning_content` renders `<think></think>` (non-thinking mode).
The model therefore emits reasoning, `</think>`, the answer and `<|im_end|>` (the eos token;
`<eos>` is the pad token and also stops generation).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ops.errors import UserError
from trainer.cli import step_main
from trainer.progress import ProgressWriter
from trainer.schema import iter_samples

THINK_START = "<think>"
THINK_END = "</think>"
TURN_START = "<|im_start|>"
TURN_END = "<|im_end|>"
PAD = "<eos>"
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
SPECIAL_TOKENS = [PAD, TURN_START, TURN_END, THINK_START, THINK_END, TOOL_CALL_START, TOOL_CALL_END]
GENERATION_PROMPT = f"{TURN_START}assistant\n{THINK_START}"

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<think>' + (message['reasoning_content'] or '') + '</think>' -}}"
    "{%- endif -%}"
    "{{- message['content'] or '' -}}"
    "{%- if message['role'] == 'assistant' and message['tool_calls'] -%}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- set fn = call['function'] if call['function'] is defined else call -%}"
    "{{- '<tool_call>' + fn['name'] + '\\n' -}}"
    "{{- fn['arguments'] if fn['arguments'] is string else fn['arguments'] | tojson -}}"
    "{{- '</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n<think>' -}}{%- endif -%}"
)

# A few kilobytes of mixed prose, chat, reasoning and code so BPE learns useful merges.
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. A speculative decoder drafts several tokens "
    "and the target model verifies them in one forward pass, keeping the accepted prefix.",
    "Hello! How can I help you today? Please explain how attention works in a transformer.",
    "Let me think step by step. First, compute the sum of the numbers; then divide by the count "
    "to get the mean. The answer is 42.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "import torch\nx = torch.randn(4, 8)\nprint(x.mean(dim=0))\n",
    "The user wants a short summary of the document. I should keep it concise and accurate.",
    "Tool call: search the web for the weather in Paris, then report the temperature in Celsius.",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    "User: What is the capital of France?\nAssistant: The capital of France is Paris.",
    "Training a draft model needs hidden states from the target: low, middle and high layers.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14 2.718 -1 +1 = < > ( ) [ ] { } ; : , .",
    "We measure throughput in tokens per second and acceptance length per verification step.",
    "Once upon a time, a small model learned to predict the next word of every sentence it read.",
    "Error: file not found. Please check the path and try again, or run the command with --help.",
    "SELECT name, count(*) FROM samples GROUP BY name ORDER BY count(*) DESC LIMIT 10;",
    "The gradient of the loss with respect to the weights is computed by backpropagation.",
    "Kimi and DeepSeek models think inside a reasoning block before writing their final answer.",
    "Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March April",
    "for i in range(10):\n    if i % 2 == 0:\n        print('even', i)\n    else:\n        print('odd', i)\n",
    "Sure, here is a list:\n1. Read the data.\n2. Clean it.\n3. Train the model.\n4. Evaluate.",
]


def _train_tokenizer(vocab_size: int):
    from tokenizers import (  # lazy: the trainer extra: the step names what is missing
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return tok


def build_tokenizer(vocab_size: int = 768):
    """The tiny fast tokenizer with the thinking chat template (not saved)."""
    from transformers import PreTrainedTokenizerFast  # lazy: transformers: 1.4 s to import

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(vocab_size),
        eos_token=TURN_END,
        pad_token=PAD,
        additional_special_tokens=[TURN_START, THINK_START, THINK_END, TOOL_CALL_START, TOOL_CALL_END],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.model_max_length = 2048
    return tokenizer


def corpus_token_ids(tokenizer, corpus) -> list[int]:
    """All conversations of a prepared-schema JSONL, rendered by the chat template, as one id stream."""
    ids: list[int] = []
    for _, sample in iter_samples(corpus):
        text = tokenizer.apply_chat_template(sample["messages"], tokenize=False)
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
    if len(ids) < 2:
        raise UserError(f"{corpus}: no conversations to pretrain on")
    return ids


def pretrain(model, tokenizer, ids: list[int], *, steps: int, seq_len: int = 128, batch: int = 16,
             lr: float = 3e-3, progress=None) -> list[float]:
    """Causal-LM training on random windows of `ids` (uses the caller's torch RNG); returns the losses.

    `progress`: a ProgressWriter (unit steps) advanced once per step, or None."""
    import torch  # lazy: torch: 2.5 s to import

    data = torch.tensor(ids, dtype=torch.long)
    seq_len = min(seq_len, len(ids) - 1)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(steps):
        starts = torch.randint(0, len(ids) - seq_len, (batch,))
        x = torch.stack([data[s : s + seq_len] for s in starts.tolist()])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if progress is not None:
            progress.advance()
    model.eval()
    return losses


HIDDEN_SIZE = 128
"""Default width: 4 heads of 32, the smallest head size real engines' kernels take (vLLM's CPU attention
refuses 16)."""


def build_tiny_target(
    out_dir, *, hidden_size: int = HIDDEN_SIZE, num_layers: int = 4, seed: int = 0, vocab_size: int = 768,
    corpus=None, pretrain_steps: int = 0, progress=False,
) -> Path:
    """Write a tokenizer and a LlamaForCausalLM (fixed seed; random, or briefly pretrained on corpus).

    `progress`: progress file for the pretraining steps (None: $NODEDECK_PROGRESS; False, the default: none)."""
    import torch  # lazy: torch: 2.5 s to import
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM  # lazy: transformers: 1.4 s to import
    from transformers.utils import logging as hf_logging  # lazy: transformers: 1.4 s to import

    hf_logging.disable_progress_bar()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size)
    eos_id = tokenizer.convert_tokens_to_ids(TURN_END)
    pad_id = tokenizer.convert_tokens_to_ids(PAD)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    steps = pretrain_steps if corpus is not None else 0
    with ProgressWriter(progress, "tiny", steps, unit="steps") as prog:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = LlamaForCausalLM(config)
            if steps > 0:
                pretrain(model, tokenizer, corpus_token_ids(tokenizer, corpus), steps=steps, progress=prog)
        model.generation_config = GenerationConfig(eos_token_id=[eos_id, pad_id], pad_token_id=pad_id)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    return out


@step_main
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="nodedeck-train tiny", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory to write the model into")
    parser.add_argument("--hidden-size", type=int, default=HIDDEN_SIZE,
                        help=f"model width; 4 heads of hidden/4 (default {HIDDEN_SIZE}: head size 32)")
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus", help="prepared-schema JSONL (from `prep`) to pretrain on")
    parser.add_argument("--pretrain-steps", type=int, default=0, help="training steps on --corpus (default 0: random)")
    parser.add_argument("--progress", help="progress JSONL file (default $NODEDECK_PROGRESS)")
    args = parser.parse_args(argv)
    if args.pretrain_steps < 0 or (args.pretrain_steps and not args.corpus):
        parser.error("--pretrain-steps needs --corpus and must be >= 0")
    out = build_tiny_target(args.out, hidden_size=args.hidden_size, num_layers=args.num_layers, seed=args.seed,
                            corpus=args.corpus, pretrain_steps=args.pretrain_steps, progress=args.progress)
    print(json.dumps({"out": str(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
