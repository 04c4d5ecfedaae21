"""Length-bucketed batches, interleaved so every bucket runs out together; resumable mid-epoch.

Samples are split by length into buckets (equal-count quantiles), shuffled inside each bucket
and cut into batches (a fixed `batch_size`, or as many as fit `batch_tokens` = longest x count).
The batches are then interleaved by stride scheduling: bucket b with n_b of the N batches has
stride s_b = N/n_b and its k-th batch is due at (k + phase_b) * s_b (random phase per epoch);
each position takes the earliest due batch, so every bucket's share is spread evenly over the
epoch. With m the largest bucket's count and R = N - m the others':

- every batch is used exactly once;
- no more than K = max(3, ceil(m / (R + 1))) consecutive batches come from one bucket. K = 3
  whenever any schedule can do it (m <= 3(R + 1)); otherwise K is the least any schedule can
  reach (one huge bucket, tiny others). While m <= R + 1 the earliest-due choice is skipped when
  it would break the cap or leave no arrangement within it (an exact counting test); when
  m > R + 1 the big bucket is cut into R + 1 runs as even as possible with the other buckets'
  batches (in their own stride order) one by one between them;
- buckets finish together: fewer than s_b + B * g batches follow bucket b's last one (B: number
  of buckets; g = 1 while m <= R + 1, else the slot spacing ceil(N / (R + 1))), i.e. within
  one stride plus a slot per bucket.

The epoch order is a pure function of (seed, epoch, lengths, settings). The sampler state is
{epoch, position}; `load_state` makes iteration continue with exactly the remaining batches.
With several ranks, rank r takes positions r, r+W, ... of the epoch (the list is padded by
repeating its first batches to a multiple of W so every rank runs the same number of steps).
"""

from __future__ import annotations

import heapq
import math
import random

import torch

from ops.errors import UserError


def run_cap(counts: list[int], max_run: int = 3) -> int:
    """The run cap K for these bucket sizes: max(max_run, ceil(m / (N - m + 1)))."""
    counts = [c for c in counts if c > 0]
    if not counts:
        return max_run
    n, m = sum(counts), max(counts)
    return max(max_run, math.ceil(m / (n - m + 1)))


def finish_slack(counts: list[int]) -> int:
    """g in the finishing guarantee: 1, or the slot spacing ceil(N / (R + 1)) when one bucket
    outnumbers all others together plus one (m > R + 1)."""
    counts = [c for c in counts if c > 0]
    n, m = sum(counts), max(counts, default=0)
    return 1 if m <= n - m + 1 else math.ceil(n / (n - m + 1))


def _feasible(remaining: dict[int, int], last: int, run: int, cap: int) -> bool:
    """Can `remaining` follow a run of `run` batches of bucket `last` with every run <= cap?

    Bucket b needs r_b <= cap * (others) + cap (minus `run` when b continues the current run);
    only the largest bucket can break this (any r_b <= n/2 satisfies it), so only it is checked."""
    n = sum(remaining.values())
    b = max(remaining, key=remaining.__getitem__)
    r = remaining[b]
    return r <= cap * (n - r) + (cap - run if b == last else cap)


def _earliest_due(counts: dict[int, int], rng: random.Random, cap: int) -> list[int]:
    """Stride order: bucket b's k-th batch is due at (k + phase_b) / n_b; take the earliest due,
    skipping a choice that would exceed the run cap or leave no arrangement within it."""
    phase = {b: rng.random() for b in counts}
    used = dict.fromkeys(counts, 0)
    remaining = dict(counts)
    heap = [(phase[b] / counts[b], b) for b in counts]
    heapq.heapify(heap)
    order: list[int] = []
    last, run = -1, 0
    while heap:
        skipped, choice = [], None
        while heap:
            due, b = heapq.heappop(heap)
            if not (b == last and run >= cap):
                remaining[b] -= 1
                ok = _feasible(remaining, b, run + 1 if b == last else 1, cap)
                remaining[b] += 1
                if ok:
                    choice = b
                    break
            skipped.append((due, b))
        if choice is None:  # unreachable from a feasible start; keep every batch regardless
            due, choice = skipped.pop(0)
        for item in skipped:
            heapq.heappush(heap, item)
        remaining[choice] -= 1
        used[choice] += 1
        if remaining[choice]:
            heapq.heappush(heap, ((used[choice] + phase[choice]) / counts[choice], choice))
        run, last = (run + 1 if choice == last else 1), choice
        order.append(choice)
    return order


def interleave(counts: list[int], rng: random.Random, max_run: int = 3) -> list[int]:
    """Bucket id per position; bucket b appears counts[b] times (guarantees in the module doc)."""
    live = {b: c for b, c in enumerate(counts) if c > 0}
    if not live:
        return []
    big = max(live, key=lambda b: (live[b], -b))
    m = live[big]
    rest = sum(live.values()) - m
    if m <= rest + 1:
        return _earliest_due(live, rng, run_cap(counts, max_run))
    # One bucket outnumbers the rest: split it into rest+1 runs as even as possible and put
    # the other buckets' batches, in their own stride order, one by one between the runs.
    others = _earliest_due({b: c for b, c in live.items() if b != big}, rng, rest + 1)
    phi = rng.random()
    cuts = [0] + [math.floor(j * m / (rest + 1) + phi) for j in range(1, rest + 1)] + [m]
    order: list[int] = []
    for j in range(rest + 1):
        order += [big] * (cuts[j + 1] - cuts[j])
        if j < rest:
            order.append(others[j])
    return order


def make_buckets(lengths: list[int], num_buckets: int) -> list[list[int]]:
    """Sample indices split into up to num_buckets equal-count groups by length (stable order)."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    k = max(1, min(num_buckets, len(order)))
    bounds = [round(j * len(order) / k) for j in range(k + 1)]
    return [order[bounds[j] : bounds[j + 1]] for j in range(k) if bounds[j + 1] > bounds[j]]


def cut_batches(indices: list[int], lengths: list[int], batch_size: int | None,
                batch_tokens: int | None) -> list[list[int]]:
    """Consecutive batches of indices: fixed size, or the most that keep longest*count <= budget."""
    if batch_tokens is None:
        assert batch_size is not None, "cut_batches takes a batch size or a token budget"
        return [indices[i : i + batch_size] for i in range(0, len(indices), batch_size)]
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in indices:
        new_longest = max(longest, lengths[i])
        if cur and new_longest * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, new_longest = [], lengths[i]
        cur.append(i)
        longest = new_longest
    if cur:
        batches.append(cur)
    return batches


class BucketBatchSampler:
    """Batches of sample indices for one rank; `state()` / `load_state()` for exact resume."""

    def __init__(self, lengths, *, batch_size: int | None = None, batch_tokens: int | None = None,
                 num_buckets: int = 8, seed: int = 0, max_run: int = 3, rank: int = 0, world_size: int = 1):
        if (batch_size is None) == (batch_tokens is None):
            raise UserError("give exactly one of --batch-size and --batch-tokens")
        if (batch_size is not None and batch_size < 1) or (batch_tokens is not None and batch_tokens < 1):
            raise UserError("batch size / batch tokens must be positive")
        if not lengths:
            raise UserError("no training samples")
        self.lengths = [int(x) for x in lengths]
        self.batch_size, self.batch_tokens = batch_size, batch_tokens
        self.num_buckets, self.seed, self.max_run = num_buckets, seed, max_run
        self.rank, self.world_size = rank, world_size
        self.buckets = make_buckets(self.lengths, num_buckets)
        self.epoch, self.position = 0, 0
        self._cached: tuple[int, list[list[int]]] | None = None

    def global_batches(self, epoch: int) -> list[list[int]]:
        """The whole epoch's batches in order (all ranks together)."""
        rng = random.Random(f"{self.seed}:{epoch}")
        per_bucket = []
        for bucket in self.buckets:
            idx = list(bucket)
            rng.shuffle(idx)
            per_bucket.append(cut_batches(idx, self.lengths, self.batch_size, self.batch_tokens))
        order = interleave([len(b) for b in per_bucket], rng, self.max_run)
        taken = [0] * len(per_bucket)
        out = []
        for b in order:
            out.append(per_bucket[b][taken[b]])
            taken[b] += 1
        return out

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of an epoch (the latest epoch asked for is cached)."""
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        batches = self.global_batches(epoch)
        w = self.world_size
        if w > 1 and len(batches) % w:
            batches = batches + batches[: w - len(batches) % w]
        self._cached = (epoch, batches[self.rank :: w])
        return self._cached[1]

    def __len__(self) -> int:
        return len(self.epoch_batches(0))

    def state(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def remaining(self) -> list[list[int]]:
        """This rank's batches of the current epoch not consumed yet (for a prefetching loader)."""
        return self.epoch_batches(self.epoch)[self.position :]

    def consumed(self) -> None:
        """Count one batch as done; after the epoch's last one the state moves to the next epoch."""
        self.position += 1
        if self.position >= len(self.epoch_batches(self.epoch)):
            self.epoch, self.position = self.epoch + 1, 0

    def __iter__(self):
        """This rank's remaining batches of the current epoch, each counted as consumed as soon as
        it is handed out (so a checkpoint taken while it is processed resumes after it)."""
        for batch in self.remaining():
            self.consumed()
            yield batch


def collate(items: list[dict], pad_id: int = 0) -> dict:
    """Right-padded batch: input_ids/loss_mask [B,T], lengths [B], and aux/last [B,T,...] if present."""
    lengths = [len(x["input_ids"]) for x in items]
    t = max(lengths)
    out = {"lengths": torch.tensor(lengths, dtype=torch.long)}
    out["input_ids"] = torch.full((len(items), t), pad_id, dtype=torch.long)
    out["loss_mask"] = torch.zeros((len(items), t), dtype=torch.uint8)
    out["attention_mask"] = torch.zeros((len(items), t), dtype=torch.long)
    for r, (x, n) in enumerate(zip(items, lengths)):
        out["input_ids"][r, :n] = x["input_ids"]
        out["loss_mask"][r, :n] = x["loss_mask"]
        out["attention_mask"][r, :n] = 1
    for key in ("aux", "last"):
        if key in items[0]:
            width = items[0][key].shape[-1]
            buf = torch.zeros((len(items), t, width), dtype=items[0][key].dtype)
            for r, (x, n) in enumerate(zip(items, lengths)):
                buf[r, :n] = x[key]
            out[key] = buf
    return out
