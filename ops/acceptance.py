"""Acceptance on both sides of the train-serve line, side by side: the eval's and each serving engine's, per draft
position, and whether they agree within a band that says why it is that wide.

An acceptance length is the mean number of tokens a verify round emits (accepted drafts + the bonus token). Position
i's acceptance is the share of rounds whose draft i was accepted, vLLM's `num_accepted_tokens_per_pos[i] /
num_drafts`; the eval writes the same (`per_position_acceptance`). From their sum and the rounds behind them comes the
spread of accepted drafts per round, and so the sampling error of a mean (`Acceptance.variance`).

The band (`band`):
- a serving figure measured by sampling (temperature > 0) is not compared: the eval decodes greedily, and a sampled
  draft is accepted by a different rule;
- the same prompts, greedy (the digests of their token ids agree): only numerics differ (kernels, batch composition,
  dtype), where a near-tie in a logit flips one draft: NUMERICS of the acceptance length;
- other prompts (a benchmark's, a live server's traffic): Z standard errors of the difference of the two means, from
  each side's rounds and spread (a side whose rounds are unknown adds none, and the band says so), never under the
  numerics band.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from ops import nodenum
from ops.measured_by import Engine

NUMERICS = 0.03
"""Same prompts, greedy: the share of the acceptance length a near-tie can move (a flipped draft changes a round or
two of the tens a demo's prompts give; vLLM 0.32 against the eval on a DFlash drafter: 1.5%, docs/engines.md)."""
Z = 3.0
"""Standard errors of the difference of two means on other prompts (rounds taken as independent)."""

Side = Literal["eval", "serving"]


@dataclass(frozen=True)
class Acceptance:
    """One acceptance measurement and what it stands on."""

    value: float
    """Mean acceptance length per round, the bonus token included (1..K+1)."""
    source: str
    """Where it was read: `stage evaluate`, `stage bench_eagle3`, `live vllm server`."""
    side: Side
    engine: Engine | None = None
    server: str | None = None
    """The serving engine's kind (`vllm`, `sglang`); None for the eval."""
    per_position: tuple[float, ...] = ()
    """Share of rounds whose draft i was accepted, i = 0..K-1 (empty when the engine does not expose it)."""
    rounds: int | None = None
    """Rounds (vLLM's drafts, SGLang's verify steps) the mean is over; None when not known."""
    accept_rate: float | None = None
    """Accepted / proposed draft tokens (SGLang's `spec_accept_rate`), when given."""
    num_draft_tokens: int | None = None
    """K, the drafts per round."""
    prompts_sha256: str | None = None
    """The digest of the prompts' token ids (the eval's; a probe of the same prompts carries it too)."""
    greedy: bool | None = None
    """Decoded greedily; None: not known."""
    per_prompt: tuple[tuple[str, int, int], ...] = ()
    """(prompt id, rounds, accepted drafts) of each prompt, where the measurement went prompt by prompt."""

    def variance(self) -> float | None:
        """Variance of accepted drafts per round: from the per-position shares (P(A > i) = p_i, so E[A] = sum p_i and
        E[A^2] = sum (2i + 1) p_i), else the largest a count in 0..K can have (K^2 / 4); None without either."""
        if self.per_position:
            mean = sum(self.per_position)
            return max(0.0, sum((2 * i + 1) * p for i, p in enumerate(self.per_position)) - mean * mean)
        if self.num_draft_tokens:
            return self.num_draft_tokens ** 2 / 4
        return None

    def label(self) -> str:
        """`eval`, `vLLM 0.32.0+cpu`, `live sglang server`: who measured it, for a line of text."""
        if self.engine is not None:
            return str(self.engine) if self.side == "serving" else "eval"
        return self.server or self.side

    def to_json(self) -> dict:
        return {"value": self.value, "source": self.source, "side": self.side,
                "engine": None if self.engine is None else self.engine.to_json(), "server": self.server,
                "per_position": list(self.per_position), "rounds": self.rounds, "accept_rate": self.accept_rate,
                "num_draft_tokens": self.num_draft_tokens, "prompts_sha256": self.prompts_sha256,
                "greedy": self.greedy}


@dataclass(frozen=True)
class Band:
    """How far apart the two figures may be and still agree, and why that far."""

    width: float | None
    """None: not compared (why says so)."""
    why: str

    def to_json(self) -> dict:
        return {"width": self.width, "why": self.why}


def band(ev: Acceptance, serving: Acceptance) -> Band:
    """The band within which `serving` agrees with the eval `ev` (module docstring: sampling, prompts, batch)."""
    if serving.greedy is False:
        return Band(None, "the serving figure was sampled (temperature > 0) and the eval decodes greedily: a sampled "
                          "draft is accepted by another rule, so the two are not compared")
    floor = NUMERICS * ev.value
    if ev.prompts_sha256 is not None and ev.prompts_sha256 == serving.prompts_sha256:
        return Band(floor, f"the same prompts, greedy: only numerics differ (kernels, batch, dtype), where a near-tie "
                           f"flips a draft: {NUMERICS:.0%} of the eval's {ev.value:.2f}")
    terms, said = [], []
    for side in (ev, serving):
        var = side.variance()
        if side.rounds and var is not None:
            terms.append(var / side.rounds)
            said.append(f"{side.label()} {side.rounds} rounds")
        else:
            said.append(f"{side.label()} rounds unknown (adds none)")
    stat = Z * math.sqrt(sum(terms)) if terms else 0.0
    why = (f"other prompts than the eval's: {Z:g} standard errors of the difference of the means "
           f"({', '.join(said)}), at least the numerics band ({NUMERICS:.0%})")
    return Band(max(stat, floor), why)


@dataclass(frozen=True)
class Check:
    """One cause of a train-serve gap that nodedeck can check for an export and a server command."""

    name: str
    """`aux layer ids`, `RoPE scaling`, `d2t/t2d`, `chat template`, `draft length`, `dtype`."""
    ok: bool | None
    """False: this is a cause; None: it could not be checked (detail says why)."""
    detail: str

    def to_json(self) -> dict:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass(frozen=True)
class Verdict:
    """A serving figure held against the eval's."""

    eval: Acceptance
    serving: Acceptance
    band: Band
    checks: tuple[Check, ...] = field(default=())
    """What was checked for this server's export and command (for every compared figure)."""

    @property
    def delta(self) -> float:
        return self.serving.value - self.eval.value

    @property
    def state(self) -> Literal["agree", "gap", "not compared"]:
        if self.band.width is None:
            return "not compared"
        return "agree" if abs(self.delta) <= self.band.width else "gap"

    @property
    def causes(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.ok is False)

    def parted_prompts(self) -> tuple[int, int] | None:
        """(prompts whose rounds or accepted drafts differ, prompts) on the same prompts measured prompt by prompt;
        None otherwise. Greedy on both sides, a prompt parts only where a draft flipped: a near-tie, or a real
        difference in what the engine drafts (docs/engines.md: vLLM 0.32's CPU build and a 2-layer DFlash)."""
        if self.band.width is None or self.eval.prompts_sha256 != self.serving.prompts_sha256 \
                or not self.eval.per_prompt or len(self.eval.per_prompt) != len(self.serving.per_prompt):
            return None
        parted = sum(a != b for a, b in zip(self.eval.per_prompt, self.serving.per_prompt))
        return parted, len(self.eval.per_prompt)

    def parting_position(self) -> int | None:
        """The first draft position whose acceptance parts by more than the band (relative to the position's
        share), or None: where the drafts go wrong (position 0: the first draft, which sees the target's own
        features; later ones: what the drafter feeds itself)."""
        if self.band.width is None:
            return None
        rel = self.band.width / max(self.eval.value, 1e-9)
        for i, (e, s) in enumerate(zip(self.eval.per_position, self.serving.per_position)):
            if abs(s - e) > max(rel * max(e, s), 0.05):
                return i
        return None

    def line(self) -> str:
        """One line for people: who against the eval, then `judgement`."""
        return f"{self.serving.label()} {self.serving.value:.2f} vs eval {self.eval.value:.2f}: {self.judgement()}"

    def judgement(self) -> str:
        """Agree within the band, not compared (why), or the gap with its causes (or what was checked)."""
        if self.state == "not compared":
            return f"not compared ({self.band.why})"
        parted = self.parted_prompts()
        if self.state == "agree":
            said = f"agree within ±{self.band.width:.2f}"
            if parted is not None:
                said += f"; {parted[0]} of {parted[1]} prompts part round for round" if parted[0] else \
                    f", all {parted[1]} prompts round for round"
            if self.causes:     # the export is wrong for the engine all the same: other prompts will show it
                said += ("; but causes: " if not parted or not parted[0] else "; causes: ") \
                    + "; ".join(f"{c.name}: {c.detail}" for c in self.causes)
            return said
        where = "" if (p := self.parting_position()) is None else f", parting from draft position {p + 1}"
        gap = f"TRAIN-SERVE GAP of {self.delta:+.2f} (band ±{self.band.width:.2f}{where})"
        if self.causes:
            return f"{gap}; causes: " + "; ".join(f"{c.name}: {c.detail}" for c in self.causes)
        unchecked = [c.name for c in self.checks if c.ok is None]
        checked = [c.name for c in self.checks if c.ok]
        said = f"checked and consistent: {', '.join(checked)}" if checked else "nothing could be checked"
        return f"{gap}; no cause nodedeck can check found ({said}" + (
            f"; not checked: {', '.join(unchecked)})" if unchecked else ")")

    def to_json(self) -> dict:
        parted = self.parted_prompts()
        return {"state": self.state, "serving": self.serving.to_json(), "delta": self.delta,
                "prompts_parted": None if parted is None else {"parted": parted[0], "prompts": parted[1]},
                "band": self.band.to_json(), "parting_position": self.parting_position(),
                "causes": [c.to_json() for c in self.causes], "checks": [c.to_json() for c in self.checks],
                "line": self.line()}


def compare(ev: Acceptance, serving: Acceptance, checks: tuple[Check, ...] = ()) -> Verdict:
    """The serving figure against the eval's, with the checks made for its server."""
    return Verdict(ev, serving, band(ev, serving), checks)


_FIGURE = nodenum.Real("figure", -1e12, 1e12)


def _num(v) -> float | None:
    """A figure of a result file on the node, through ops.nodenum: None when it is no finite figure."""
    return _FIGURE.get_json(v)


def _count(v) -> int | None:
    """A count of a result file on the node (rounds, drafts, tokens), through ops.nodenum."""
    return nodenum.COUNT.get(v) if isinstance(v, int) and not isinstance(v, bool) else None


def _shares(v) -> tuple[float, ...]:
    """Per-position shares as given, or () when any is not a share (a record from a node is never trusted)."""
    if not isinstance(v, list) or len(v) > 64:
        return ()
    out = tuple(_num(x) for x in v)
    return () if any(x is None or not 0 <= x <= 1 for x in out) else tuple(x for x in out if x is not None)


def _per_prompt(v, accepted_of) -> tuple[tuple[str, int, int], ...]:
    """(id, rounds, accepted) of each per-prompt record, or () when any is malformed."""
    if not isinstance(v, list) or len(v) > 100_000:
        return ()
    out = []
    for rec in v:
        rounds = _count(rec.get("rounds")) if isinstance(rec, dict) else None
        accepted = accepted_of(rec, rounds) if rounds is not None else None
        if rounds is None or accepted is None:
            return ()
        out.append((str(rec.get("id"))[:200], rounds, accepted))
    return tuple(out)


def _eval_accepted(rec: dict, rounds: int) -> int | None:
    mean = _num(rec.get("accept_len"))
    return None if mean is None else round(mean * rounds) - rounds


def eval_figure(doc: dict, source: str, engine: Engine | None) -> Acceptance | None:
    """The eval's acceptance from its result record (`nodedeck-train eval`), or None when it has none."""
    value = _num(doc.get("mean_accept_len"))
    if value is None or value < 1:
        return None
    return Acceptance(value, source, "eval", engine, None, _shares(doc.get("per_position_acceptance")),
                      _count(doc.get("rounds")), None, _count(doc.get("num_draft_tokens")),
                      doc.get("prompts_sha256") if isinstance(doc.get("prompts_sha256"), str) else None, True,
                      _per_prompt(doc.get("per_prompt"), _eval_accepted))


def bench_figure(doc: dict, source: str, engine: Engine | None, greedy: bool | None) -> Acceptance | None:
    """A serving benchmark's acceptance: vLLM's `vllm bench serve --save-result` (`spec_decode_acceptance_length`,
    per position, drafts) or SGLang's bench_serving line (`accept_length`); None for a run without speculation."""
    if (value := _num(doc.get("spec_decode_acceptance_length"))) is not None and value >= 1:
        per_pos = _shares(doc.get("spec_decode_per_position_acceptance_rates"))
        rate = _num(doc.get("spec_decode_acceptance_rate"))
        return Acceptance(value, source, "serving", engine, "vllm", per_pos, _count(doc.get("spec_decode_num_drafts")),
                          None if rate is None else rate / 100, len(per_pos) or None, None, greedy)
    if (value := _num(doc.get("accept_length"))) is not None and value >= 1:
        return Acceptance(value, source, "serving", engine, "sglang", greedy=greedy)
    return None


def probe_figure(doc: dict, source: str, engine: Engine | None) -> Acceptance | None:
    """The acceptance a running engine served on the eval's prompts (`nodedeck-train probe`), or None."""
    value = _num(doc.get("served_accept_len"))
    if value is None or value < 1:
        return None
    server = doc.get("server") if doc.get("server") in ("vllm", "sglang") else None
    rate = _num(doc.get("accept_rate"))
    return Acceptance(value, source, "serving", engine, server, _shares(doc.get("per_position_acceptance")),
                      _count(doc.get("rounds")), rate if rate is not None and 0 <= rate <= 1 else None,
                      _count(doc.get("num_draft_tokens")),
                      doc.get("prompts_sha256") if isinstance(doc.get("prompts_sha256"), str) else None,
                      doc.get("greedy") if isinstance(doc.get("greedy"), bool) else None,
                      _per_prompt(doc.get("per_prompt"), lambda rec, _: _count(rec.get("accepted"))))
