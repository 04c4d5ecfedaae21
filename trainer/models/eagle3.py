"""EAGLE-3 drafter, laid out like SGLang's `LlamaForCausalLMEagle3` so exports load there unchanged.

Per draft step:

    h      = fc(concat of 3 target aux hidden states)    (first step; later steps: the drafter's own h)
    x      = concat(input_layernorm(embed(token)), hidden_norm(h))    2H -> q/k/v   (SGLang order)
    h      = h + o_proj(attention(x))
    h      = h + mlp(post_attention_layernorm(h))     <- fed back as the next step's hidden state
    logits = lm_head(norm(h))                         over the draft vocabulary

Training-time test (TTT), `forward(aux, input_ids, steps)`: step 0 runs every row t on
(aux_t, token t+1) and predicts token t+2; step i feeds row t the step i-1 output of row t
and the token t+1+i, at rotary position t+i, predicting token t+2+i. Attention cache: step 0's
keys/values for all rows (causal), then one key/value per row per later step; a query of row t
at step i sees step-0 keys of rows <= t plus its own keys from steps 1..i (the "diagonal").
This is exactly what chain drafting at inference sees: the verified prefix plus its own chain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from trainer.models.layers import (
    GQAProjections,
    RMSNorm,
    Rotary,
    SwiGLU,
    apply_rope,
    chain_attention,
    frozen_from_target,
    merge_heads,
    repeat_kv,
    split_heads,
)
from trainer.models.target import TargetSized, sized_like


@dataclass(kw_only=True)
class Eagle3Config(TargetSized):
    draft_vocab_size: int
    aux_layer_ids: list[int]
    ttt_length: int = 7
    target_architectures: list[str] = field(default_factory=list)  # SGLang's layer-id rule depends on them

    @classmethod
    def from_target(cls, target_config, *, draft_vocab_size: int, aux_layer_ids, ttt_length: int = 7,
                    target_architectures=()):
        """Size the drafter like the target's decoder layers (SGLang expects the same hidden size)."""
        return cls(**sized_like(target_config), draft_vocab_size=draft_vocab_size,
                   aux_layer_ids=[int(i) for i in aux_layer_ids], ttt_length=ttt_length,
                   target_architectures=list(target_architectures))


class ChainCache:
    """Keys/values of one TTT unroll: step 0 for every row, then one entry per row per step."""

    def __init__(self):
        self.first: tuple[torch.Tensor, torch.Tensor] | None = None  # step 0's keys and values
        self.chain: list[tuple[torch.Tensor, torch.Tensor]] = []


class Eagle3Attention(GQAProjections):
    def __init__(self, cfg: Eagle3Config):
        super().__init__(cfg, in_size=2 * cfg.hidden_size)  # [input_layernorm(embeds); hidden_norm(hidden)]

    def forward(self, x, cos, sin, rows: torch.Tensor, cache: ChainCache) -> torch.Tensor:
        """x [B, R, 2H] for the query rows `rows` (indices into the step-0 rows)."""
        q = apply_rope(split_heads(self.q_proj(x), self.heads, self.head_dim), cos, sin)
        k = apply_rope(split_heads(self.k_proj(x), self.kv_heads, self.head_dim), cos, sin)
        v = split_heads(self.v_proj(x), self.kv_heads, self.head_dim)
        if cache.first is None:
            cache.first = (k, v)
        else:
            cache.chain.append((k, v))
        groups = self.heads // self.kv_heads
        k0, v0 = repeat_kv(cache.first[0], groups), repeat_kv(cache.first[1], groups)
        kc = torch.stack([repeat_kv(kj, groups) for kj, _ in cache.chain], -1) if cache.chain \
            else q.new_zeros(*q.shape, 0)
        vc = torch.stack([repeat_kv(vj, groups) for _, vj in cache.chain], -1) if cache.chain \
            else q.new_zeros(*q.shape, 0)
        out = chain_attention(q, k0, v0, rows, 1.0 / math.sqrt(self.head_dim), kc, vc)
        return self.o_proj(merge_heads(out))


class Eagle3DecoderLayer(nn.Module):
    """SGLang `midlayer`: attention over [input_layernorm(embeds); hidden_norm(hidden)]."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Eagle3Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, embeds, hidden, cos, sin, rows, cache):
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        hidden = hidden + self.self_attn(x, cos, sin, rows, cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Drafter(nn.Module):
    """The trainable drafter (frozen target embedding) plus the draft-vocab maps `d2t`/`t2d`."""

    # Parameters taken from the target and never trained (left out of checkpoints).
    frozen = ("embed_tokens.weight",)
    d2t: torch.Tensor  # buffers (registered in __init__)
    t2d: torch.Tensor

    def __init__(self, cfg: Eagle3Config, d2t: torch.Tensor, t2d: torch.Tensor,
                 embed_weight: torch.Tensor | None = None):
        super().__init__()
        self.cfg = cfg
        if d2t.shape != (cfg.draft_vocab_size,) or t2d.shape != (cfg.vocab_size,):
            raise ValueError(
                f"draft vocab maps have shapes d2t {tuple(d2t.shape)}, t2d {tuple(t2d.shape)}; "
                f"expected ({cfg.draft_vocab_size},) and ({cfg.vocab_size},)"
            )
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        frozen_from_target(self.embed_tokens, embed_weight)
        self.fc = nn.Linear(3 * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = Eagle3DecoderLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", d2t.to(torch.int64).clone())
        self.register_buffer("t2d", t2d.to(torch.bool).clone())
        self.rotary = Rotary(cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim,
                             cfg.max_position_embeddings, cfg.rope)

    def draft_ids(self) -> torch.Tensor:
        """Target token id of each draft-vocab entry: i + d2t[i]."""
        return torch.arange(self.cfg.draft_vocab_size, device=self.d2t.device) + self.d2t

    def step(self, hidden, token_ids, positions, rows, cache: ChainCache):
        """One draft step for query rows: returns (hidden out [B,R,H], draft logits [B,R,D])."""
        embeds = self.embed_tokens(token_ids).to(hidden.dtype)
        cos, sin = self.rotary(hidden, positions)
        hidden = self.midlayer(embeds, hidden, cos, sin, rows, cache)
        return hidden, self.lm_head(self.norm(hidden))

    def forward(self, aux: torch.Tensor, input_ids: torch.Tensor, steps: int | None = None) -> list[torch.Tensor]:
        """TTT unroll over aux [B,T,3Ht] and tokens [B,T]; logits of step i at row t predict token t+2+i.

        Step i's rows t >= T-1-i have no input token (it lies past the end) and get token 0;
        their logits are meaningless and the loss masks them out.
        """
        steps = self.cfg.ttt_length if steps is None else steps
        b, t = input_ids.shape
        hidden = self.fc(aux.to(self.fc.weight.dtype))
        rows = torch.arange(t, device=input_ids.device)
        cache = ChainCache()
        logits = []
        for i in range(steps):
            shifted = torch.zeros_like(input_ids)
            if t - 1 - i > 0:
                shifted[:, : t - 1 - i] = input_ids[:, 1 + i :]
            positions = (rows + i).unsqueeze(0).expand(b, t)
            hidden, step_logits = self.step(hidden, shifted, positions, rows, cache)
            logits.append(step_logits)
        return logits

    @torch.no_grad()
    def draft(self, aux: torch.Tensor, next_ids: torch.Tensor, k: int) -> torch.Tensor:
        """Greedy chain of k target token ids after a prefix.

        aux [1, n, 3Ht]: target features of tokens 0..n-1; next_ids [1, n]: tokens 1..n (the
        last one is the newest token, whose target features are not known yet).
        """
        n = next_ids.shape[1]
        rows = torch.arange(n, device=next_ids.device)
        cache = ChainCache()
        hidden, logits = self.step(self.fc(aux.to(self.fc.weight.dtype)), next_ids, rows[None], rows, cache)
        last = rows[-1:]
        hidden, logits = hidden[:, -1:], logits[:, -1:]
        out = []
        for i in range(k):
            token = self.draft_ids()[logits.argmax(-1)]  # [1, 1] target ids
            out.append(token)
            if i == k - 1:
                break
            hidden, logits = self.step(hidden, token, (last + 1 + i)[None], last, cache)
        return torch.cat(out, dim=1)[0]

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items() if k not in self.frozen}
