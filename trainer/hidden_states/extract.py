"""Offline extraction: the target's hidden states of a tokenized file, written as shards into a directory
(or one part of it), resuming the shards already complete, refusing without the disk space."""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import time
from pathlib import Path

import torch

from ops.errors import UserError
from trainer import capture_sglang
from trainer.hidden_states.capture import HiddenStateTarget, TargetHiddenStates, check_aux_layers, default_aux_layers
from trainer.hidden_states.shards import (
    DTYPES,
    FORMAT,
    PackedShard,
    bytes_per_token,
    merge_parts,
    part_index_name,
    part_shards,
    read_index,
    shard_layout,
    write_shard,
)
from trainer.jsonl import write_json
from trainer.progress import ProgressWriter
from trainer.tokenized import iter_tokenized

SPACE_MARGIN = 0.05  # refuse unless free space >= projection * (1 + margin) + SPACE_RESERVE
SPACE_RESERVE = 256 * 2**20


def _scan(data: Path, max_samples):
    """One validating pass over the tokenized file: [(id, length)], duplicate ids rejected."""
    seen: dict[str, int] = {}
    out = []
    for s in iter_tokenized(data, max_samples=max_samples):
        if s.id in seen:
            raise UserError(f"{data}:{s.line}: duplicate sample id {s.id!r} (first on line {seen[s.id]})")
        seen[s.id] = s.line
        out.append((s.id, len(s.input_ids)))
    if not out:
        raise UserError(f"{data}: no samples")
    return out


def length_batches(lengths, batch_size: int, batch_tokens: int | None = None) -> list[list[int]]:
    """Indices batched by ascending length: at most batch_size each and, with batch_tokens, at most
    that many padded tokens (count x longest); a longer sample runs alone."""
    order = sorted(range(len(lengths)), key=lambda j: lengths[j])
    batches: list[list[int]] = []
    for j in order:
        if batches and len(batches[-1]) < batch_size and \
                (batch_tokens is None or (len(batches[-1]) + 1) * lengths[j] <= batch_tokens):
            batches[-1].append(j)
        else:
            batches.append([j])
    return batches


def _extract(target: HiddenStateTarget, samples, batch_size: int, pad_id: int, shard: PackedShard,
             batch_tokens: int | None = None) -> None:
    """Run the target over the samples, batched by length, and put each sample's aux/last states
    straight into its place in `shard` (device -> host and dtype conversion in that one copy)."""
    for batch in length_batches([len(s.input_ids) for s in samples], batch_size, batch_tokens):
        width = max(len(samples[j].input_ids) for j in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, j in enumerate(batch):
            t = samples[j].input_ids
            ids[r, :len(t)] = torch.tensor(t)
            mask[r, :len(t)] = 1
        aux, last, _ = target(ids.to(target.device), mask.to(target.device))
        for r, j in enumerate(batch):
            n = len(samples[j].input_ids)
            shard.tensors[f"{j}.aux"].copy_(aux[r, :n])
            shard.tensors[f"{j}.last"].copy_(last[r, :n])


def _shards_of(data: Path, max_samples, shard_samples: int):
    batch = []
    for s in iter_tokenized(data, max_samples=max_samples):
        batch.append(s)
        if len(batch) == shard_samples:
            yield batch
            batch = []
    if batch:
        yield batch


def extract_to_dir(model_dir, data, out, *, aux_layers=None, mode: str = "eagle3", num_dflash_layers: int = 5,
                   shard_samples: int = 64, batch_size: int = 8, max_samples=None, dtype: str = "bfloat16",
                   device=None, device_map=None, trust_remote_code: bool = False, part: tuple[int, int] = (0, 1),
                   merge: bool = True, backend: str = "transformers", follower: bool = False, progress=None,
                   batch_tokens: int | None = None, mem_fraction_static: float = 0.85, log=print) -> dict:
    """Write (or resume) part `part = (i, n)` of a hidden-state directory (see the module docstring).

    Returns the whole run's index once every part is complete (with `merge`, the part that finds
    all parts done writes index.json), else this part's own index. `backend="sglang"` captures
    through SGLang (trainer.capture_sglang); a `follower` (a tensor-parallel rank other than 0)
    computes the same batches and writes nothing. `batch_tokens` caps a batch's padded tokens (SGLang
    default SGLANG_BATCH_TOKENS: its KV pool is sized to one such batch)."""
    from transformers import AutoConfig  # lazy: transformers: 1.4 s to import

    data, out = Path(data), Path(out)
    part_no, parts = part
    if dtype not in DTYPES:
        raise UserError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    if mode not in ("eagle3", "dflash"):
        raise UserError(f"--mode {mode!r}: choose eagle3 or dflash")
    if backend not in ("transformers", "sglang"):
        raise UserError(f"--backend {backend!r}: choose transformers or sglang")
    if shard_samples < 1 or batch_size < 1 or (batch_tokens is not None and batch_tokens < 1):
        raise UserError("--shard-samples, --batch-size and --batch-tokens must be at least 1")
    try:
        full_config = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise UserError(f"{model_dir}: cannot read the model config ({str(exc).splitlines()[0]})") from None
    config = full_config.get_text_config()
    num_layers, hidden = int(config.num_hidden_layers), int(config.hidden_size)
    layers = check_aux_layers(aux_layers if aux_layers else default_aux_layers(num_layers, mode, num_dflash_layers),
                              num_layers, log)
    sglang_ids = None
    if backend == "sglang":  # every refusal before any process group, model or file
        sglang_ids = capture_sglang.preflight(config, getattr(full_config, "architectures", None), layers,
                                              mode=mode, tp=int(os.environ.get("WORLD_SIZE", "1")))
        capture_sglang.require()
        batch_tokens = batch_tokens or capture_sglang.SGLANG_BATCH_TOKENS
    samples = _scan(data, max_samples)
    total_shards = -(-len(samples) // shard_samples)
    mine = part_shards(total_shards, part_no, parts)

    meta = {"format": FORMAT, "model": str(model_dir), "mode": mode, "aux_layers": layers, "hidden_size": hidden,
            "num_layers": num_layers, "dtype": dtype, "shard_samples": shard_samples}
    out.mkdir(parents=True, exist_ok=True)
    index_path = out / part_index_name(part_no, parts)
    previous = read_index(index_path, {k: v for k, v in meta.items() if k != "model"})
    done_shards: list[dict] = []
    for n, s in zip(mine, previous["shards"] if previous else []):
        # the complete prefix: a missing shard and all after it are redone
        if not (out / s["file"]).exists():
            break
        expect = [i for i, _ in samples[n * shard_samples:(n + 1) * shard_samples]]
        if s["file"] != f"shard-{n:05d}.safetensors" or s["ids"] != expect[:len(s["ids"])]:
            raise UserError(f"{index_path}: shard {s['file']} holds other samples than {data}"
                            " now has at that position; use another --out")
        if len(s["ids"]) < len(expect):  # a short last shard of a smaller run: redo it with more samples
            break
        done_shards.append(s)
    entries = list(done_shards)  # meta["shards"]: grows as shards are written
    meta.update(data=str(data), num_samples=len(samples), shards=entries)

    todo = set(mine[len(done_shards):])
    per_token = bytes_per_token(len(layers), hidden, DTYPES[dtype])
    todo_tokens = sum(n for k, (_, n) in enumerate(samples) if k // shard_samples in todo)
    need = per_token * todo_tokens
    free = shutil.disk_usage(out).free
    where = f" (part {part_no + 1}/{parts})" if parts > 1 else ""
    log(f"hidden states{where}: {todo_tokens} tokens x {per_token} B/token = {need / 2**30:.2f} GiB to write, "
        f"{free / 2**30:.2f} GiB free on {out}")
    if need * (1 + SPACE_MARGIN) + SPACE_RESERVE > free:
        raise UserError(f"{out}: needs {need / 2**30:.2f} GiB (+{SPACE_MARGIN:.0%} and "
                        f"{SPACE_RESERVE / 2**20:.0f} MiB margin) but only {free / 2**30:.2f} GiB is free")
    if not follower:
        write_json(index_path, meta)

    my_samples = sum(min(shard_samples, len(samples) - n * shard_samples) for n in mine)
    done_samples = done_before = sum(len(s["ids"]) for s in done_shards)
    written = 0
    if todo:
        if device is None and device_map is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        on_gpu = torch.cuda.is_available() if device_map is not None else str(device).startswith("cuda")
        # bf16 matmuls are slow on CPU: compute in float32 there and store in the requested dtype
        compute = DTYPES[dtype] if on_gpu else torch.float32
        target: HiddenStateTarget
        if backend == "sglang":
            longest = max(n for _, n in samples)
            budget = max(batch_tokens or 0, longest)  # a sample longer than the budget runs alone
            memory = capture_sglang.MemorySettings(mem_fraction_static=mem_fraction_static,
                                                   max_running_requests=batch_size,
                                                   max_total_tokens=budget + longest, context_length=longest + 8)
            target = capture_sglang.SGLangTargetHiddenStates(model_dir, layers, mode=mode, dtype=DTYPES[dtype],
                                                             sglang_ids=sglang_ids, memory=memory,
                                                             trust_remote_code=trust_remote_code)
        else:
            target = TargetHiddenStates(model_dir, layers, dtype=compute, device=device, device_map=device_map,
                                        trust_remote_code=trust_remote_code)
        pad_id = config.pad_token_id if isinstance(config.pad_token_id, int) else 0
        t0 = time.monotonic()
        with ProgressWriter(progress, "hidden-states", my_samples, done=done_samples) as prog, \
                concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="shard-writer") as writer:
            prog.update(done_samples, force=True, shards_done=len(done_shards), shards_total=len(mine))
            # (future, index entry, samples): shard n is written while shard n+1 is computed
            pending: tuple[concurrent.futures.Future[int], dict, int] | None = None

            def commit():
                nonlocal written, done_samples
                assert pending is not None
                future, entry, count = pending
                written += future.result()
                entries.append(entry)
                write_json(index_path, meta)
                done_samples += count
                elapsed = max(time.monotonic() - t0, 1e-9)
                prog.update(done_samples, force=True, shards_done=len(entries), shards_total=len(mine),
                            bytes_written=written, mb_per_s=round(written / elapsed / 1e6, 3))

            for n, shard in enumerate(_shards_of(data, max_samples, shard_samples)):
                if n not in todo:
                    continue
                tensors = shard_layout(shard, len(layers) * hidden, hidden, DTYPES[dtype])
                _extract(target, shard, batch_size, pad_id, tensors, batch_tokens)
                if follower:
                    tensors.release()
                    continue
                if pending:
                    commit()
                name = f"shard-{n:05d}.safetensors"
                entry = {"file": name, "ids": [s.id for s in shard], "num_tokens": sum(len(s.input_ids) for s in shard)}
                pending = (writer.submit(write_shard, out / name, tensors), entry, len(shard))
            if pending:
                commit()
            prog.close(shards_done=len(mine), shards_total=len(mine), bytes_written=written)
        log(f"hidden states{where}: wrote {written / 2**20:.1f} MiB in {len(todo)} shards to {out} "
            f"({done_samples - done_before} samples in {time.monotonic() - t0:.2f} s)")
    else:
        log(f"hidden states{where}: all {len(mine)} shards already complete in {out}")
    if parts > 1 and merge and not follower:
        merged = merge_parts(out, meta, parts)
        if merged is not None:
            log(f"hidden states: all {parts} parts complete; wrote {out / 'index.json'}")
            return merged
    return meta
