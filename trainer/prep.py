"""Dataset prep: convert one dataset (local JSONL/JSON/Parquet or a Hugging Face name) to the schema JSONL.

Writes OUT/<dataset>.jsonl and OUT/<dataset>.stats.json (temp names, renamed when complete), so
several datasets can be prepared in parallel into one directory. The first records are checked
against the adapter before any work. Kinds: `target-native` keeps the conversation as it is;
`prompt-only` keeps only system and user turns (regen asks the target for each answer);
`auto` is prompt-only exactly when a record has no assistant turn. Ids: `<dataset>-<source id>`,
or `<dataset>-<content hash>` when the record has none; exact duplicates are dropped.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ops.errors import UserError
from trainer import formats
from trainer.cli import step_main
from trainer.jsonl import atomic_output, jsonl_objects, write_json
from trainer.progress import ProgressWriter
from trainer.reasoning import ThinkTags
from trainer.schema import content_hash, has_assistant

REGISTRY = Path(__file__).with_name("datasets.toml")
CHECK_RECORDS = 5
LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet", ".gz")


# ---- sources -------------------------------------------------------------------------------------

class Source:
    """Records of one source as (where, record); `where` is `file:line` / `file:row N` / `name:row N`."""

    def __init__(self, spec: str, *, split: str = "train", subset: str | None = None):
        self.spec = spec
        self.path = Path(spec).expanduser()
        self.split, self.subset = split, subset
        self.files: list[Path] | None  # None: a Hugging Face dataset name
        if self.path.is_dir():
            self.files = sorted(p for p in self.path.rglob("*") if p.is_file() and p.name.endswith(
                (".jsonl", ".json", ".parquet", ".jsonl.gz", ".json.gz")))
            if not self.files:
                raise UserError(f"{spec}: no .jsonl, .json or .parquet files in this directory")
        elif self.path.is_file():
            self.files = [self.path]
        elif spec.startswith(("/", ".", "~")) or spec.endswith(LOCAL_SUFFIXES):
            raise UserError(f"{spec}: no such file")
        else:
            self.files = None

    def _hf(self):
        try:
            import datasets  # lazy: 1.5 s to import, only for a Hugging Face source
        except ImportError:
            raise UserError(f"{self.spec}: not a local file, and the `datasets` package is not installed"
                            " (pip install 'nodedeck[trainer]' or pip install datasets)") from None
        try:
            return datasets.load_dataset(self.spec, self.subset, split=self.split)
        except Exception as exc:  # hub/network/config errors reach the user as one line
            raise UserError(f"{self.spec}: load_dataset failed: "
                            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None

    def count(self) -> int | None:
        if self.files is None:
            return None
        total = 0
        for f in self.files:
            if f.suffix == ".parquet":
                import pyarrow.parquet as pq  # lazy: only for a parquet source

                total += pq.ParquetFile(f).metadata.num_rows
            elif f.suffix == ".gz" or _starts_with_bracket(f):
                return None
            else:
                total += sum(1 for line in f.open("rb") if line.strip())
        return total

    def __iter__(self):
        if self.files is None:
            for n, rec in enumerate(self._hf(), 1):
                yield f"{self.spec}:row {n}", rec
            return
        for f in self.files:
            yield from _iter_file(f)


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open("r", encoding="utf-8")


def _starts_with_bracket(path: Path) -> bool:
    with _open_text(path) as f:
        while True:
            ch = f.read(1)
            if not ch or not ch.isspace():
                return ch == "["


def _iter_file(path: Path):
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq  # lazy: only for a parquet source

        try:
            pf = pq.ParquetFile(path)
        except Exception as exc:
            raise UserError(f"{path}: not a readable Parquet file ({exc})") from None
        n = 0
        for batch in pf.iter_batches(batch_size=1024):
            for rec in batch.to_pylist():
                n += 1
                yield f"{path}:row {n}", rec
        return
    if _starts_with_bracket(path):  # one JSON array (ShareGPT dumps)
        with _open_text(path) as f:
            try:
                items = json.load(f)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
        for n, rec in enumerate(items, 1):
            if not isinstance(rec, dict):
                raise UserError(f"{path}:item {n}: expected a JSON object, got {type(rec).__name__}")
            yield f"{path}:item {n}", rec
        return
    with _open_text(path) as f:
        for lineno, rec in jsonl_objects(f, path):
            yield f"{path}:{lineno}", rec


# ---- conversion ----------------------------------------------------------------------------------

def check_schema(source: Source, fmt: str) -> str:
    """Check the first records against the adapter (auto: detect it); return the adapter name."""
    chosen = None if fmt == "auto" else fmt
    seen = 0
    for where, rec in source:
        name = formats.detect(rec) if chosen is None else (chosen if formats.matches(chosen, rec) else None)
        if name is None:
            if chosen is None:
                raise UserError(f"{where}: no adapter matches fields {sorted(rec)} (expected {formats.EXPECTED})")
            wanted = "|".join("/".join(g) for g in formats.ADAPTERS[chosen][1])
            raise UserError(f"{where}: format {chosen} expects {wanted}, found fields {sorted(rec)}")
        chosen = chosen or name
        seen += 1
        if seen >= CHECK_RECORDS:
            break
    if seen == 0 or chosen is None:
        raise UserError(f"{source.spec}: no records")
    return chosen


def apply_kind(messages: list[dict], kind: str) -> tuple[str | None, list[dict]]:
    """(kind, messages) for the requested kind; kind None means the record is unusable for it."""
    if kind == "auto":
        kind = "target-native" if has_assistant(messages) else "prompt-only"
    if kind == "prompt-only":
        messages = [m for m in messages if m["role"] in ("system", "user")]
        return (kind if any(m["role"] == "user" for m in messages) else None), messages
    return (kind if has_assistant(messages) else None), messages


@dataclass
class PrepStats:
    """What prepare() did, written as OUT/<dataset>.stats.json (keys in this order)."""

    dataset: str
    source: str
    format: str
    kind: str
    records: int = 0
    written: int = 0
    kinds: dict[str, int] = field(default_factory=lambda: {"target-native": 0, "prompt-only": 0})
    duplicates: int = 0
    skipped: dict[str, int] = field(default_factory=lambda: {"invalid": 0, "unusable_for_kind": 0})
    with_reasoning: int = 0
    with_tool_calls: int = 0
    first_invalid: str | None = None


def prepare(dataset: str, source: Source, out_dir, *, fmt: str = "auto", kind: str = "auto",
            max_samples: int | None = None, skip_invalid: bool = False, tags: ThinkTags = ThinkTags(),
            progress=None, log=print) -> PrepStats:
    """Convert `source` into OUT/<dataset>.jsonl; return the stats (also written as JSON)."""
    if fmt != "auto" and fmt not in formats.ADAPTERS:
        raise UserError(f"--format {fmt!r}: choose auto or one of {', '.join(formats.ADAPTERS)}")
    if kind not in ("auto", "target-native", "prompt-only"):
        raise UserError(f"--kind {kind!r}: choose target-native, prompt-only or auto")
    adapter_name = check_schema(source, fmt)
    adapter = formats.ADAPTERS[adapter_name][0]
    out_dir = Path(out_dir)
    out = out_dir / f"{dataset}.jsonl"
    total = source.count()
    if max_samples is not None:
        total = min(total, max_samples) if total is not None else max_samples
    stats = PrepStats(dataset, source.spec, adapter_name, kind)
    ids: dict[str, str] = {}
    with ProgressWriter(progress, "prep", total, unit="samples") as prog, atomic_output(out) as f:
        for where, rec in source:
            if max_samples is not None and stats.written >= max_samples:
                break
            stats.records += 1
            prog.update(stats.records, written=stats.written)
            try:
                if not formats.matches(adapter_name, rec):
                    raise ValueError(f"no {adapter_name} fields, found {sorted(rec)}")
                messages = adapter(rec, tags)
            except (ValueError, TypeError, KeyError) as exc:
                if not skip_invalid:
                    raise UserError(f"{where}: {exc}") from None
                stats.skipped["invalid"] += 1
                stats.first_invalid = stats.first_invalid or f"{where}: {exc}"
                continue
            sample_kind, messages = apply_kind(messages, kind)
            if sample_kind is None:
                stats.skipped["unusable_for_kind"] += 1
                continue
            tools = formats.tools_of(rec)
            digest = content_hash(messages, tools)
            sid = f"{dataset}-{formats.source_id(rec) or digest}"
            if sid in ids:
                if ids[sid] == digest:
                    stats.duplicates += 1
                    continue
                sid = f"{sid}-{digest[:8]}"
            ids[sid] = digest
            sample = {"id": sid, "source": dataset, "kind": sample_kind, "messages": messages}
            if tools:
                sample["tools"] = tools
            f.write(json.dumps(sample, ensure_ascii=False) + "\n")
            stats.written += 1
            stats.kinds[sample_kind] += 1
            stats.with_reasoning += any("reasoning_content" in m for m in messages)
            stats.with_tool_calls += any("tool_calls" in m for m in messages)
        if stats.written == 0:
            raise UserError(f"{source.spec}: no usable samples for --kind {kind} "
                            f"({stats.records} records, skipped {stats.skipped}, "
                            f"{stats.duplicates} duplicates)")
        prog.close(written=stats.written)
    write_json(out_dir / f"{dataset}.stats.json", asdict(stats))
    log(f"prep {dataset}: {stats.written} samples ({stats.kinds}) from {stats.records} records -> {out}")
    return stats


# ---- registry ------------------------------------------------------------------------------------

def load_registry(path=None) -> dict[str, dict]:
    """Named sources: `[datasets.NAME]` tables with `source`, optional `format`, `kind`, `split`, `subset`."""
    path = Path(path) if path else REGISTRY
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: {exc}") from None
    entries = data.get("datasets", {})
    for name, entry in entries.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("source"), str):
            raise UserError(f"{path}: [datasets.{name}] needs a source string")
    return entries


@step_main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="nodedeck-train prep", description=__doc__.splitlines()[0])
    p.add_argument("--dataset", help="dataset name (output file name; a registry name when --source is omitted)")
    p.add_argument("--source", help="local .jsonl/.json/.parquet file or directory, or a Hugging Face dataset name")
    p.add_argument("--format", choices=["auto", *formats.ADAPTERS])
    p.add_argument("--kind", choices=["auto", "target-native", "prompt-only"])
    p.add_argument("--split")
    p.add_argument("--subset")
    p.add_argument("--out", help="output directory")
    p.add_argument("--max-samples", type=int)
    p.add_argument("--skip-invalid", action="store_true", help="skip malformed records (counted) instead of failing")
    p.add_argument("--think-start", default="<think>")
    p.add_argument("--think-end", default="</think>")
    p.add_argument("--registry", help=f"datasets TOML (default: {REGISTRY.name} bundled with nodedeck)")
    p.add_argument("--list", action="store_true", help="print the registry as JSON and exit")
    p.add_argument("--progress", help="progress JSONL file (default $NODEDECK_PROGRESS)")
    args = p.parse_args(argv)
    if args.list:
        print(json.dumps(load_registry(args.registry), indent=2))
        return 0
    if not args.dataset or not args.out:
        p.error("--dataset and --out are required")
    entry = {}
    if not args.source:
        registry = load_registry(args.registry)
        if args.dataset not in registry:
            raise UserError(f"dataset {args.dataset!r} is not in the registry (known: {', '.join(registry) or 'none'});"
                            " give --source")
        entry = registry[args.dataset]
    source = Source(args.source or entry["source"], split=args.split or entry.get("split", "train"),
                    subset=args.subset or entry.get("subset"))
    stats = prepare(args.dataset, source, args.out, fmt=args.format or entry.get("format", "auto"),
                    kind=args.kind or entry.get("kind", "auto"), max_samples=args.max_samples,
                    skip_invalid=args.skip_invalid, tags=ThinkTags(args.think_start, args.think_end),
                    progress=args.progress, log=lambda m: print(m, file=sys.stderr))
    print(json.dumps({k: asdict(stats)[k] for k in ("dataset", "format", "written", "kinds", "duplicates", "skipped")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
