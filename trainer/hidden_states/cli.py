"""Target hidden states for drafter training: `nodedeck-train hidden-states` (see trainer.hidden_states)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ops.errors import UserError
from trainer.cli import step_main
from trainer.distributed import all_gather_objects, process_group
from trainer.hidden_states.extract import extract_to_dir
from trainer.hidden_states.shards import DTYPES, merge_metas


def parse_part(text: str) -> tuple[int, int]:
    """`I/N` (1 <= I <= N) -> the 0-based part index and the number of parts."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise UserError(f"--part {text!r}: expected I/N, like 2/4") from None
    if not 1 <= i <= n:
        raise UserError(f"--part {text!r}: I must be between 1 and N")
    return i - 1, n


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
    from trainer.rank_exit import end_rank

    sys.exit(end_rank(main()))
