"""The shard format (`nodedeck-hidden-states/1`, see the package docstring): the packed, page-aligned
shard a capture fills, its durable O_DIRECT writer, and the index files of a run and of its parts."""

from __future__ import annotations

import errno
import json
import math
import mmap
import os
import threading
from pathlib import Path

import torch

from ops.errors import UserError
from trainer.jsonl import write_json

FORMAT = "nodedeck-hidden-states/1"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def bytes_per_token(num_aux: int, hidden_size: int, dtype: torch.dtype) -> int:
    """Shard bytes per token: aux + last hidden states, int64 input id, uint8 mask."""
    return (num_aux + 1) * hidden_size * torch.empty((), dtype=dtype).element_size() + 8 + 1


def read_index(index: Path, expected: dict) -> dict | None:
    """An existing index (None when absent); refuse when its settings differ from this run's."""
    if not index.exists():
        return None
    try:
        meta = json.loads(index.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{index}:{exc.lineno}: invalid JSON ({exc.msg})") from None
    for key, value in expected.items():
        if meta.get(key) != value:
            raise UserError(
                f"{index}: existing hidden states have {key}={meta.get(key)!r}, this run wants {value!r};"
                " use another --out or remove it"
            )
    return meta


def part_index_name(part: int, parts: int) -> str:
    """The index one part keeps of its own shards (the whole run's is index.json)."""
    return "index.json" if parts == 1 else f"index.part-{part + 1}-of-{parts}.json"


def part_shards(total_shards: int, part: int, parts: int) -> list[int]:
    """The global shard numbers part `part` of `parts` computes: every parts-th, from `part`.

    Shard n always holds samples [n * shard_samples, (n + 1) * shard_samples) of the data, so the
    parts together write exactly the shard files of one unsplit run."""
    return list(range(part, total_shards, parts))


def merge_parts(out: Path, meta: dict, parts: int) -> dict | None:
    """Write index.json from the N part indexes once every part is complete; else None."""
    total_shards = -(-meta["num_samples"] // meta["shard_samples"])
    shards = []
    for part in range(parts):
        index = out / part_index_name(part, parts)
        got = read_index(index, {k: v for k, v in meta.items() if k not in ("model", "shards")})
        if got is None or len(got["shards"]) != len(part_shards(total_shards, part, parts)):
            return None
        shards += got["shards"]
    merged = dict(meta, shards=sorted(shards, key=lambda s: s["file"]))
    write_json(out / "index.json", merged)
    return merged


def merge_metas(out: Path, metas: list[dict]) -> dict:
    """Write index.json from every part's index (part r of len(metas), as gathered from the ranks)."""
    parts = len(metas)
    total_shards = -(-metas[0]["num_samples"] // metas[0]["shard_samples"])
    for part, meta in enumerate(metas):
        if len(meta["shards"]) != len(part_shards(total_shards, part, parts)):
            raise UserError(f"{out}: part {part + 1}/{parts} holds {len(meta['shards'])} shards, expected "
                            f"{len(part_shards(total_shards, part, parts))}")
    merged = dict(metas[0], shards=sorted((s for m in metas for s in m["shards"]), key=lambda s: s["file"]))
    write_json(out / "index.json", merged)
    return merged


_ST_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int64: "I64",
              torch.uint8: "U8", torch.bool: "BOOL"}


ALIGN = 4096  # O_DIRECT: buffer address, file offset and length multiples of this
CHUNK = 16 * 2**20  # bytes per write call
_spare: list = []  # shard buffers written and free again (at most 2: one filling, one writing)
_spare_lock = threading.Lock()


def _buffer(nbytes: int):
    """A page-aligned buffer of at least nbytes: a spare one, else a fresh mapping faulted in at once."""
    with _spare_lock:
        fits = [m for m in _spare if len(m) >= nbytes]
        if fits:
            best = min(fits, key=len)
            _spare.remove(best)
            return best
    size = max(-(-nbytes // ALIGN) * ALIGN, ALIGN)
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0))


class PackedShard:
    """A shard's tensors back to back in one page-aligned buffer, laid out exactly as the file's
    data section, so the writer sends that memory to the disk as it is (no copy in between).

    `specs` is [(name, dtype, shape)] in file order; `tensors[name]` are writable views to fill.
    Buffers are reused: after `write_shard` the views belong to a later shard."""

    def __init__(self, specs):
        self.header, offset = {}, 0
        for name, dtype, shape in specs:
            nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            self.header[name] = {"dtype": _ST_DTYPES[dtype], "shape": list(shape),
                                 "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        self.nbytes = offset
        self._map = _buffer(offset)
        self.data = memoryview(self._map)
        self.tensors = {}
        for (name, dtype, shape), entry in zip(specs, self.header.values()):
            lo, hi = entry["data_offsets"]
            flat = torch.frombuffer(self._map, dtype=torch.uint8, count=hi - lo, offset=lo) if hi > lo else \
                torch.empty(0, dtype=torch.uint8)
            self.tensors[name] = flat.view(dtype).view(shape)

    @classmethod
    def of(cls, tensors: dict) -> "PackedShard":
        """Pack arbitrary tensors (one copy); shard_tensors builds its shards packed from the start."""
        packed = cls([(name, t.dtype, tuple(t.shape)) for name, t in tensors.items()])
        for name, t in tensors.items():
            packed.tensors[name].copy_(t)
        return packed

    def release(self) -> None:
        """Hand the buffer back for the next shard."""
        with _spare_lock:
            if len(_spare) < 2:
                _spare.append(self._map)
        self.tensors, self.data = {}, memoryview(b"")

    def file_header(self) -> bytes:
        """The 8-byte length and the JSON header, space-padded so the data starts on an ALIGN boundary."""
        blob = json.dumps(self.header, separators=(",", ":")).encode()
        blob += b" " * (-(8 + len(blob)) % ALIGN)
        return len(blob).to_bytes(8, "little") + blob


def _write_all(fd: int, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]


def _write_packed(fd: int, head: bytes, shard: PackedShard, *, direct: bool) -> None:
    if direct:  # O_DIRECT wants an aligned source: stage the (small, ALIGN-multiple) header in one page
        staging = mmap.mmap(-1, len(head))
        staging.write(head)
        _write_all(fd, staging)
        staging.close()
    else:
        _write_all(fd, head)
    end = -(-shard.nbytes // ALIGN) * ALIGN if direct else shard.nbytes  # O_DIRECT: whole blocks
    for lo in range(0, end, CHUNK):
        _write_all(fd, shard.data[lo:min(lo + CHUNK, end)])


def write_shard(path: Path, shard, *, direct: bool = True) -> int:
    """Write one safetensors shard durably (temp name, fsync, rename); return its size.

    `shard` is a PackedShard (see shard_tensors; its buffer is reused afterwards) or a dict of
    tensors (packed first, one copy).
    Its memory goes to the disk in large aligned O_DIRECT writes, like `dd oflag=direct`: no
    copy into the page cache; where the filesystem refuses O_DIRECT (tmpfs, some network
    filesystems) the same bytes go through the page cache."""
    if not isinstance(shard, PackedShard):
        shard = PackedShard.of(shard)
    head = shard.file_header()
    total = len(head) + shard.nbytes
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = None
    try:
        if direct and hasattr(os, "O_DIRECT"):
            try:
                fd = os.open(tmp, flags | os.O_DIRECT, 0o644)
                _write_packed(fd, head, shard, direct=True)
                os.ftruncate(fd, total)  # drop the padding of the last block
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                if fd is not None:
                    os.close(fd)
                fd = None  # O_DIRECT refused here: write through the page cache below
        if fd is None:
            fd = os.open(tmp, flags, 0o644)
            _write_packed(fd, head, shard, direct=False)
        os.fsync(fd)
        os.close(fd)
        fd = None
        os.replace(tmp, path)
    finally:
        if fd is not None:
            os.close(fd)
        if tmp.exists():
            tmp.unlink()
    shard.release()
    return total


def shard_layout(samples, aux_width: int, hidden: int, dtype) -> PackedShard:
    """An empty shard for these samples (ids and masks filled in), aux [T, aux_width] and last
    [T, hidden] of `dtype` to be filled; the widest element types first, so every view is aligned."""
    n = [len(s.input_ids) for s in samples]
    shard = PackedShard([(f"{k}.input_ids", torch.int64, (t,)) for k, t in enumerate(n)]
                        + [(f"{k}.{name}", dtype, (t, width)) for k, t in enumerate(n)
                           for name, width in (("aux", aux_width), ("last", hidden))]
                        + [(f"{k}.loss_mask", torch.uint8, (t,)) for k, t in enumerate(n)])
    for k, s in enumerate(samples):
        shard.tensors[f"{k}.input_ids"].copy_(torch.as_tensor(s.input_ids, dtype=torch.int64))
        shard.tensors[f"{k}.loss_mask"].copy_(torch.as_tensor(s.loss_mask, dtype=torch.uint8))
    return shard


def shard_tensors(samples, aux, last, dtype) -> PackedShard:
    """One shard from per-sample aux/last [T, ...] tensors, converted into place."""
    shard = shard_layout(samples, aux[0].shape[-1], last[0].shape[-1], dtype)
    for k, (a, h) in enumerate(zip(aux, last)):
        shard.tensors[f"{k}.aux"].copy_(a)
        shard.tensors[f"{k}.last"].copy_(h)
    return shard
