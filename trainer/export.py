"""Export a trained drafter to a directory SGLang serves (`--speculative-draft-model-path DIR`).

EAGLE-3 (`--speculative-algorithm EAGLE3`):
    config.json        architectures ["LlamaForCausalLMEagle3"], model_type llama, num_hidden_layers 1,
                       hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, head_dim,
                       vocab_size (target), draft_vocab_size, rms_norm_eps, rope_theta/rope_scaling,
                       max_position_embeddings, target_hidden_size, torch_dtype, tie_word_embeddings false,
                       eagle_config.eagle_aux_hidden_state_layer_ids (the ids SGLang's target class turns into
                       the outputs of the trained layers: trainer.sglang_rules)
                       eagle_aux_hidden_state_layer_ids (the same +1: vLLM's id k is the output of layer k-1)
    model.safetensors  fc.weight, midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight,
                       midlayer.self_attn.{q,k,v,o}_proj.weight, midlayer.mlp.{gate,up,down}_proj.weight,
                       norm.weight, lm_head.weight, d2t (int64), t2d (bool), embed_tokens.weight (the
                       target's, unless --no-embeddings)
DFlash (`--speculative-algorithm DFLASH`):
    config.json        architectures ["DFlashDraftModel"], model_type qwen3, block_size, num_target_layers,
                       dflash_config {block_size, target_layer_ids, mask_token_id}, layer_types ...
    model.safetensors  layers.N.{input_layernorm,post_attention_layernorm}.weight,
                       layers.N.self_attn.{q,k,v,o}_proj.weight, layers.N.self_attn.{q,k}_norm.weight,
                       layers.N.mlp.{gate,up,down}_proj.weight, norm.weight, fc.weight, hidden_norm.weight
                       (no embedding or lm_head: SGLang uses the target's)
YaRN targets: rope_scaling also carries attn_factor/attention_factor so the served cos/sin scale
equals the trained one (trainer.sglang_rules).
Both carry `nodedeck` in config.json (mode, the trainer's model config, training summary) so
`load_export` rebuilds the exact training module.

CLI: `python -m trainer.export --checkpoint OUT|CHECKPOINT_DIR --out DIR [--dtype bfloat16] [--no-embeddings]`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ops.errors import UserError
from trainer.checkpoint import drafter_from_checkpoint, nonfinite_tensors
from trainer.cli import step_main
from trainer.jsonl import write_json
from trainer.models.dflash import DFlashConfig, DFlashDrafter
from trainer.models.eagle3 import Eagle3Config, Eagle3Drafter
from trainer.models.layers import Rotary
from trainer.models.target import load_embed_and_head
from trainer.progress import ProgressWriter
from trainer.sglang_rules import serving_rope_scaling, sglang_layer_ids

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
EAGLE3_ARCH = "LlamaForCausalLMEagle3"
DFLASH_ARCH = "DFlashDraftModel"


def _legacy_rope(rope: dict) -> tuple[float, dict | None]:
    rope = dict(rope)
    theta = float(rope.pop("rope_theta", 10000.0))
    return theta, (rope if rope.get("rope_type", "default") != "default" else None)


def _trained_rope_scale(cfg) -> float:
    """The cos/sin scale of the rotary embedding the drafter was trained with (transformers' attention_scaling)."""
    rotary = Rotary(cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, cfg.max_position_embeddings, cfg.rope)
    return float(rotary.inner.attention_scaling)


def _common(cfg, dtype_name: str) -> dict:
    theta, scaling = _legacy_rope(cfg.rope)
    scaling = serving_rope_scaling(scaling, _trained_rope_scale(cfg))  # YaRN: the served scale = the trained one
    return {
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": theta,
        "rope_scaling": scaling,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": dtype_name,
    }


def eagle3_config_json(cfg: Eagle3Config, dtype_name: str) -> dict:
    return {
        "architectures": [EAGLE3_ARCH],
        "model_type": "llama",
        **_common(cfg, dtype_name),
        "num_hidden_layers": 1,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        # SGLang reads the nested ids (output of layer k); vLLM the top-level ones (input of layer k = output of k-1);
        # the nested ones as SGLang's target class takes them (DeepSeek/Kimi: trainer.sglang_rules)
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": sglang_layer_ids(cfg.target_architectures,
                                                                              cfg.aux_layer_ids),
                         "use_aux_hidden_state": True},
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in cfg.aux_layer_ids],
    }


def dflash_config_json(cfg: DFlashConfig, dtype_name: str) -> dict:
    return {
        "architectures": [DFLASH_ARCH],
        "model_type": "qwen3",
        **_common(cfg, dtype_name),
        "num_hidden_layers": cfg.num_hidden_layers,
        "layer_types": ["full_attention"] * cfg.num_hidden_layers,
        "use_sliding_window": False,
        "sliding_window": None,
        "is_causal": False,
        "block_size": cfg.block_size,
        "num_target_layers": cfg.target_num_layers,
        "dflash_config": {
            "block_size": cfg.block_size,
            "target_layer_ids": list(cfg.target_layer_ids),
            "mask_token_id": cfg.mask_token_id,
        },
    }


def export_drafter(model, out_dir, *, dtype: str = "bfloat16", include_embeddings: bool = True,
                   summary: dict | None = None) -> Path:
    """Write config.json + model.safetensors for an Eagle3Drafter or DFlashDrafter (atomic dir swap)."""
    if dtype not in DTYPES:
        raise UserError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    out = Path(out_dir)
    state = model.state_dict()
    if isinstance(model, Eagle3Drafter):
        mode, config = "eagle3", eagle3_config_json(model.cfg, dtype)
        if not include_embeddings:
            state.pop("embed_tokens.weight")
    elif isinstance(model, DFlashDrafter):
        mode, config = "dflash", dflash_config_json(model.cfg, dtype)
        for name in model.frozen:
            state.pop(name)
    else:
        raise TypeError(f"cannot export {type(model).__name__}")

    bad = nonfinite_tensors(state)
    if bad:
        raise UserError(f"the drafter's {', '.join(bad[:4])}{' ...' if len(bad) > 4 else ''} hold NaN or inf; "
                        "not exported (train from an earlier checkpoint)")
    config["nodedeck"] = {"mode": mode, "model_config": model.cfg.to_dict(), **(summary or {})}
    tensors = {
        k: (v.to(DTYPES[dtype]) if v.is_floating_point() else v).detach().cpu().contiguous() for k, v in state.items()
    }
    tmp = out.with_name(out.name + ".tmp-export")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    write_json(tmp / "config.json", config)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def load_export(export_dir, target_dir=None, *, dtype=torch.float32):
    """Rebuild the trainer's module from an export; target_dir supplies frozen weights not in the file."""
    export_dir = Path(export_dir)
    try:
        config = json.loads((export_dir / "config.json").read_text())
    except FileNotFoundError:
        raise UserError(f"{export_dir}: no config.json (not a drafter export)") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{export_dir / 'config.json'}:{exc.lineno}: invalid JSON ({exc.msg})") from None
    info = config.get("nodedeck")
    if not info or info.get("mode") not in ("eagle3", "dflash"):
        raise UserError(f"{export_dir / 'config.json'}: not exported by nodedeck (no nodedeck.mode)")
    weights = export_dir / "model.safetensors"
    if not weights.exists():
        raise UserError(f"{export_dir}: no model.safetensors")
    state = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in load_file(str(weights)).items()}

    def frozen_from_target(what):
        if target_dir is None:
            raise UserError(f"{export_dir}: the export has no {what}; give the target model directory")
        return load_embed_and_head(target_dir)

    model: Eagle3Drafter | DFlashDrafter
    if info["mode"] == "eagle3":
        if "embed_tokens.weight" not in state:
            state["embed_tokens.weight"] = frozen_from_target("embed_tokens.weight")[0].to(dtype)
        model = Eagle3Drafter(Eagle3Config.from_dict(info["model_config"]), state["d2t"], state["t2d"])
    else:
        embed, head = frozen_from_target("embedding and lm_head (DFlash uses the target's)")
        state["embed_tokens.weight"], state["lm_head.weight"] = embed.to(dtype), head.to(dtype)
        model = DFlashDrafter(DFlashConfig.from_dict(info["model_config"]))
    model.load_state_dict(state, strict=True)
    return model.to(dtype).eval()


@step_main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="nodedeck-train export", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="a training OUT dir (its latest checkpoint) or a checkpoint dir")
    p.add_argument("--out", required=True, help="export directory (replaced)")
    p.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    p.add_argument("--no-embeddings", action="store_true", help="EAGLE-3: leave the target's embedding out")
    p.add_argument("--progress", help="progress JSONL file (default $NODEDECK_PROGRESS)")
    args = p.parse_args(argv)
    with ProgressWriter(args.progress, "export", 1, unit="shards") as prog:  # the one model.safetensors written
        model, summary = drafter_from_checkpoint(args.checkpoint)
        out = export_drafter(model, args.out, dtype=args.dtype, include_embeddings=not args.no_embeddings,
                             summary=summary)
        prog.advance()
    print(json.dumps({"out": str(out), "mode": summary["mode"], "step": summary["trained_steps"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
