"""Target hidden states for drafter training: offline shards on disk, a lazy reader, an online extractor.

On-disk format (`nodedeck-hidden-states/1`), a directory with:

    index.json  {"format", "model", "mode", "aux_layers", "hidden_size", "num_layers", "dtype",
                 "num_samples", "shard_samples", "data", "shards": [{"file", "ids", "num_tokens"}]}
    shard-00000.safetensors   for sample k (its position in the shard):
        "{k}.input_ids" int64 [T], "{k}.loss_mask" uint8 [T],
        "{k}.aux" dtype [T, len(aux_layers) * H]  (outputs of the aux layers, concatenated in order)
        "{k}.last" dtype [T, H]                  (final hidden state after the model's last norm)

Layer numbering: layer i is the i-th decoder layer (0-based); its OUTPUT is what is stored, i.e.
transformers' `hidden_states[i + 1]` (hidden_states[0] is the embedding output). Defaults:
EAGLE-3 `[1, L//2 - 1, L - 4]`; when those are not three distinct layers below L - 1 (L < 7),
three evenly spaced layers in 0..L-2 (L=4 -> [0, 1, 2]). DFlash: K evenly spaced layers in
1..L-3 (duplicates dropped; for L < 4 the range is 0..L-2); K = 1 is [L//2], as SpecForge.

Split capture: shard n always holds samples [n * shard_samples, (n + 1) * shard_samples) of the
data. Under `torchrun --nproc-per-node G` rank r of W computes shards r, r + W, ... on its own GPU
and, when every rank is done, the part indexes are gathered over the process group and the first
rank of each node writes index.json (nodes need not share a disk: each node's OUT then holds its
own shards and the whole index, and the others' shards are copied in before training);
`--part I/N` does the same for part I of N in independent processes (other nodes, or a restart
of one part), each part resuming from its own `index.part-I-of-N.json`, and the part that finds
all parts complete writes index.json. Either
way the directory holds exactly the shard files and index of one unsplit run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import errno
import json
import math
import mmap
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import torch

from ops.errors import UserError
from trainer.cli import step_main
from trainer.jsonl import write_json
from trainer.progress import Progress
from trainer.tokenized import iter_tokenized

FORMAT = "nodedeck-hidden-states/1"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SPACE_MARGIN = 0.05  # refuse unless free space >= projection * (1 + margin) + SPACE_RESERVE
SPACE_RESERVE = 256 * 2**20


def _spaced(lo: int, hi: int, k: int) -> list[int]:
    if k <= 1 or hi <= lo:
        return [lo]
    return sorted({round(lo + (hi - lo) * j / (k - 1)) for j in range(k)})


def default_aux_layers(num_layers: int, mode: str = "eagle3", num_dflash_layers: int = 5) -> list[int]:
    """The aux layers captured by default for a target with `num_layers` decoder layers."""
    L = num_layers
    if mode == "dflash":
        if num_dflash_layers == 1:
            return [max(0, min(L // 2, L - 2))]  # SpecForge's choice for one layer: the middle
        return _spaced(1, L - 3, num_dflash_layers) if L >= 4 else _spaced(0, L - 2, num_dflash_layers)
    layers = [1, L // 2 - 1, L - 4]
    if len(set(layers)) == 3 and all(0 <= i < L - 1 for i in layers):
        return layers
    if L < 4:
        return _spaced(0, L - 1, 3)
    return _spaced(0, L - 2, 3)


def check_aux_layers(layers, num_layers: int, log=None) -> list[int]:
    """Valid aux layers in ascending order (the order servers capture them in).

    Layer L-1's output is the last hidden state itself: servers capture the input of layer
    id + 1, so ids must be at most L-2. Unsorted ids are sorted with a notice on stderr."""
    layers = [int(i) for i in layers]
    bad = [i for i in layers if not 0 <= i < num_layers - 1]
    if bad or not layers:
        raise UserError(f"aux layers {layers}: {bad or 'none'} out of range; a target with {num_layers} layers "
                        f"takes ids 0..{num_layers - 2} (the output of layer {num_layers - 1} is the final state)")
    if len(set(layers)) != len(layers):
        raise UserError(f"aux layers {layers} repeat a layer")
    if layers != sorted(layers):
        (log or (lambda m: print(m, file=sys.stderr)))(
            f"aux layers {layers} sorted to {sorted(layers)} (servers capture them in ascending order)")
    return sorted(layers)


def _decoder_layers(model):
    """(decoder, its layer list) of any causal LM transformers builds.

    The decoder is `get_decoder()` (the base model whose output is the final-norm hidden state);
    its layers are the module list of `num_hidden_layers` blocks (`.layers` for Llama, Qwen3,
    Qwen3-MoE, DeepSeek-V3, ...; `.h`, `.blocks` or any other name for other families)."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    want = int(getattr(config, "num_hidden_layers", -1))
    layers = getattr(base, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) != want:
        lists = [m for _, m in base.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) == want]
        layers = lists[0] if lists else None
    if layers is None:
        raise UserError(f"{type(model).__name__}: cannot find its {want} decoder layers "
                        f"(no module list of that length under {type(base).__name__})")
    return base, layers


class TargetHiddenStates:
    """Run the target and return (aux [B,T,len*H], last [B,T,H], logits [B,T,V] or None), no grad.

    `model` is a directory or a loaded causal LM. Aux layers are captured with forward hooks on
    the decoder layers (only during the call); `last` is the final-norm output fed to lm_head.
    `device_map` (a directory only, e.g. "auto") spreads a target larger than one GPU over the
    visible GPUs; the outputs are then on the first device of the map (the input embedding's),
    where the drafter is.
    """

    def __init__(self, model, aux_layers=None, *, mode: str = "eagle3", num_dflash_layers: int = 5,
                 dtype=None, device=None, device_map=None, trust_remote_code: bool = False,
                 return_logits: bool = False):
        if isinstance(model, (str, Path)):
            from transformers import AutoModelForCausalLM

            if device_map is None and device is not None:
                device_map = {"": str(device)}  # load straight onto the device (no full copy in host RAM first)
            model = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype or torch.float32,
                                                         device_map=device_map, trust_remote_code=trust_remote_code)
        else:
            if dtype is not None:
                model = model.to(dtype)
            if device is not None and device_map is None:
                model = model.to(device)
        self.model = model.eval().requires_grad_(False)
        self.base, self.layers = _decoder_layers(self.model)
        self.num_layers = len(self.layers)
        self.hidden_size = int(self.model.config.get_text_config().hidden_size)
        self.aux_layers = check_aux_layers(
            aux_layers if aux_layers is not None else default_aux_layers(self.num_layers, mode, num_dflash_layers),
            self.num_layers,
        )
        self.return_logits = return_logits

    @property
    def device(self):
        """Where inputs go: the input embedding's device (the first GPU under a device map)."""
        return self.model.get_input_embeddings().weight.device

    def __call__(self, input_ids, attention_mask=None, *, return_logits: bool | None = None):
        captured: dict[int, torch.Tensor] = {}

        def hook_for(i):
            def hook(_module, _args, output):
                captured[i] = output[0] if isinstance(output, (tuple, list)) else output
            return hook

        handles = [self.layers[i].register_forward_hook(hook_for(i)) for i in self.aux_layers]
        try:
            with torch.no_grad():
                out = self.base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
                home = self.device  # under a device map the layers sit on several GPUs: gather on the first
                last = out.last_hidden_state
                aux = torch.cat([captured[i].to(home) for i in self.aux_layers], dim=-1)
                want_logits = self.return_logits if return_logits is None else return_logits
                head = self.model.get_output_embeddings()
                logits = head(last.to(head.weight.device)).to(home) if want_logits else None
                last = last.to(home)
        finally:
            for h in handles:
                h.remove()
        return aux, last, logits


class HiddenStateDataset(torch.utils.data.Dataset):
    """Read a hidden-state directory lazily: `ds[i] -> {input_ids, loss_mask, aux, last}`."""

    def __init__(self, path):
        self.path = Path(path)
        index = self.path / "index.json"
        try:
            self.meta = json.loads(index.read_text())
        except FileNotFoundError:
            raise UserError(f"{index}: no such file (not a hidden-state directory)") from None
        except json.JSONDecodeError as exc:
            raise UserError(f"{index}:{exc.lineno}: invalid JSON ({exc.msg})") from None
        if self.meta.get("format") != FORMAT:
            raise UserError(f"{index}: format {self.meta.get('format')!r}, expected {FORMAT!r}")
        self._where = [(s["file"], k) for s in self.meta["shards"] for k in range(len(s["ids"]))]
        self.ids = [i for s in self.meta["shards"] for i in s["ids"]]
        self._open = None  # (pid, file, handle): one open shard per process

    def __len__(self) -> int:
        return len(self._where)

    @property
    def num_tokens(self) -> int:
        return sum(s["num_tokens"] for s in self.meta["shards"])

    def _handle(self, file: str):
        from safetensors import safe_open

        pid = os.getpid()
        if self._open is None or self._open[:2] != (pid, file):
            self._open = (pid, file, safe_open(str(self.path / file), framework="pt"))
        return self._open[2]

    def __getitem__(self, i: int) -> dict:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        file, k = self._where[i]
        f = self._handle(file)
        return {name: f.get_tensor(f"{k}.{name}") for name in ("input_ids", "loss_mask", "aux", "last")}

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_open"] = None
        return state


# ---- offline extraction -------------------------------------------------------------------------

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


def bytes_per_token(num_aux: int, hidden_size: int, dtype: torch.dtype) -> int:
    """Shard bytes per token: aux + last hidden states, int64 input id, uint8 mask."""
    return (num_aux + 1) * hidden_size * torch.empty((), dtype=dtype).element_size() + 8 + 1


def _read_index(index: Path, expected: dict) -> dict | None:
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


def parse_part(text: str) -> tuple[int, int]:
    """`I/N` (1 <= I <= N) -> the 0-based part index and the number of parts."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise UserError(f"--part {text!r}: expected I/N, like 2/4") from None
    if not 1 <= i <= n:
        raise UserError(f"--part {text!r}: I must be between 1 and N")
    return i - 1, n


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
        got = _read_index(index, {k: v for k, v in meta.items() if k not in ("model", "shards")})
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


def _extract(target: TargetHiddenStates, samples, batch_size: int, pad_id: int, shard: PackedShard,
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
    from transformers import AutoConfig

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
        from trainer.capture_sglang import SGLANG_BATCH_TOKENS, preflight, require

        sglang_ids = preflight(config, getattr(full_config, "architectures", None), layers, mode=mode,
                               tp=int(os.environ.get("WORLD_SIZE", "1")))
        require()
        batch_tokens = batch_tokens or SGLANG_BATCH_TOKENS
    samples = _scan(data, max_samples)
    total_shards = -(-len(samples) // shard_samples)
    mine = part_shards(total_shards, part_no, parts)

    meta = {"format": FORMAT, "model": str(model_dir), "mode": mode, "aux_layers": layers, "hidden_size": hidden,
            "num_layers": num_layers, "dtype": dtype, "shard_samples": shard_samples}
    out.mkdir(parents=True, exist_ok=True)
    index_path = out / part_index_name(part_no, parts)
    previous = _read_index(index_path, {k: v for k, v in meta.items() if k != "model"})
    done_shards = []
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
    meta.update(data=str(data), num_samples=len(samples), shards=list(done_shards))

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
        if backend == "sglang":
            from trainer.capture_sglang import MemorySettings, SGLangTargetHiddenStates

            longest = max(n for _, n in samples)
            budget = max(batch_tokens or 0, longest)  # a sample longer than the budget runs alone
            memory = MemorySettings(mem_fraction_static=mem_fraction_static, max_running_requests=batch_size,
                                    max_total_tokens=budget + longest, context_length=longest + 8)
            target = SGLangTargetHiddenStates(model_dir, layers, mode=mode, dtype=DTYPES[dtype], sglang_ids=sglang_ids,
                                              memory=memory, trust_remote_code=trust_remote_code)
        else:
            target = TargetHiddenStates(model_dir, layers, dtype=compute, device=device, device_map=device_map,
                                        trust_remote_code=trust_remote_code)
        pad_id = config.pad_token_id if isinstance(config.pad_token_id, int) else 0
        t0 = time.monotonic()
        with Progress(progress, "hidden-states", my_samples, done=done_samples) as prog, \
                concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="shard-writer") as writer:
            prog.update(done_samples, force=True, shards_done=len(done_shards), shards_total=len(mine))
            pending = None  # (future, index entry, samples): shard n is written while shard n+1 is computed

            def commit():
                nonlocal written, done_samples
                future, entry, count = pending
                written += future.result()
                meta["shards"].append(entry)
                write_json(index_path, meta)
                done_samples += count
                elapsed = max(time.monotonic() - t0, 1e-9)
                prog.update(done_samples, force=True, shards_done=len(meta["shards"]), shards_total=len(mine),
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


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


@step_main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="nodedeck-train hidden-states", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="target model directory")
    p.add_argument("--data", required=True, help="tokenized JSONL (from the tokenize step)")
    p.add_argument("--out", required=True, help="output directory (resumes completed shards)")
    p.add_argument("--aux-layers", type=_int_list, help="comma-separated layer indices (default: by --mode)")
    p.add_argument("--mode", choices=["eagle3", "dflash"], default="eagle3")
    p.add_argument("--num-dflash-layers", type=int, default=5)
    p.add_argument("--shard-samples", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--batch-tokens", type=int, help="at most this many padded tokens per batch (default: no cap; "
                                                     "SGLang: 32768, and its KV pool is sized to one batch)")
    p.add_argument("--mem-fraction-static", type=float, default=0.85,
                   help="SGLang: share of GPU memory for weights and KV pool (ServerArgs.mem_fraction_static)")
    p.add_argument("--max-samples", type=int)
    p.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    p.add_argument("--device", help="torch device (default: cuda when available, else cpu; under torchrun "
                                    "cuda:LOCAL_RANK)")
    p.add_argument("--device-map", help="spread a target larger than one GPU over the visible GPUs "
                                        "(transformers' device_map, e.g. auto); not with torchrun")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own modelling code")
    p.add_argument("--backend", choices=["transformers", "sglang"], default="transformers",
                   help="sglang: capture in SGLang's model runner (MoE/MLA targets; under torchrun the ranks are "
                        "SGLang's tensor parallelism and rank 0 writes); needs sglang, specforge and a GPU")
    p.add_argument("--part", help="I/N: compute only part I of N (independent processes or nodes; each part "
                                  "resumes on its own, the last to finish writes index.json)")
    p.add_argument("--dist-timeout", type=float, default=7 * 86400.0,
                   help="torchrun: seconds rank 0 waits for the slowest rank before writing index.json")
    p.add_argument("--progress", help="progress JSONL file (default $NODEDECK_PROGRESS; under torchrun each rank "
                                      "writes its own part, rank r > 0 to PATH.rank{r}; SGLang: rank 0 only)")
    args = p.parse_args(argv)
    part = parse_part(args.part) if args.part else (0, 1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.backend == "sglang":  # torchrun ranks form SGLang's tensor-parallel group: one copy of the data
        if args.device_map:
            raise UserError("--device-map is for the transformers backend; SGLang shards the target itself")
        _run(args, part, None, merge=True, progress=args.progress if int(os.environ.get("RANK", "0")) == 0 else False,
             follower=int(os.environ.get("RANK", "0")) != 0)
        return 0
    if world > 1:  # torchrun: every rank computes one part on its own device, rank 0 merges
        if args.part:
            raise UserError("--part and torchrun both split the data: use one of them")
        if args.device_map:
            raise UserError("--device-map spreads one copy of the target over the GPUs; under torchrun every "
                            "rank loads its own copy: use one of them")
        from trainer.distributed import all_gather_objects, process_group

        with process_group(args.device, args.dist_timeout) as info:
            meta = _run(args, (info.rank, info.world_size), info.device, merge=False, progress=args.progress)
            # every rank's part index travels over the process group: nodes need not share a disk
            metas = all_gather_objects(meta, info)
            if info.local_rank == 0:  # one writer per node: every node's OUT gets the whole index
                out = Path(args.out)
                merged = merge_metas(out, metas)
                elsewhere = [s["file"] for s in merged["shards"] if not (out / s["file"]).exists()]
                print(f"hidden states: {info.world_size} ranks done; wrote {out / 'index.json'}"
                      + (f" ({len(elsewhere)} of its {len(merged['shards'])} shards were written on other nodes: "
                         "copy them into this directory before training from it)" if elsewhere else ""),
                      file=sys.stderr)
        return 0
    _run(args, part, args.device, merge=True, progress=args.progress)
    return 0


def _run(args, part, device, *, merge: bool, progress, follower: bool = False) -> dict:
    return extract_to_dir(args.model, args.data, args.out, aux_layers=args.aux_layers, mode=args.mode,
                          num_dflash_layers=args.num_dflash_layers, shard_samples=args.shard_samples,
                          batch_size=args.batch_size, max_samples=args.max_samples, dtype=args.dtype, device=device,
                          device_map=args.device_map, trust_remote_code=args.trust_remote_code, part=part,
                          merge=merge, backend=args.backend, follower=follower, progress=progress,
                          batch_tokens=args.batch_tokens, mem_fraction_static=args.mem_fraction_static,
                          log=lambda m: print(m, file=sys.stderr))


if __name__ == "__main__":
    sys.exit(main())
