"""What SGLang does with a drafter's settings that differs from how nodedeck trains them, per target.

Layer ids. nodedeck's aux layer i is the OUTPUT of decoder layer i. SGLang's
`set_eagle3_layers_to_capture(ids)` records the INPUT of layer id + 1 for Llama/Qwen targets (the
same thing), but DeepSeek-V2/V3 (and the models built on its code: Kimi-K2, GLM-4.7-Flash) add 1
only when ids[0] == 1 and otherwise record the input of layer id (the output of id - 1).
`set_dflash_layers_to_capture` always adds 1; Qwen2 has none. `sglang_layer_ids` gives the ids
to hand SGLang so it captures exactly the layers trained on (at capture and in the export).

YaRN scale. transformers scales YaRN's cos/sin by `attention_factor` (mscale / mscale_all_dim for
DeepSeek: 1.0); SGLang's (and vLLM's) `YaRNScalingRotaryEmbedding`, which serves the drafter's plain
Llama/Qwen3 attention, scales them by (0.1 ln(factor) + 1) * attn_factor. `serving_rope_scaling`
exports the attn_factor that makes the served scale the trained one.
"""

from __future__ import annotations

import math

from ops.errors import UserError

# Targets whose SGLang model class uses DeepseekV2ForCausalLM's layer-id rule (ids[0] == 1 -> +1).
DEEPSEEK_RULE = frozenset({"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM",
                           "KimiK25ForConditionalGeneration", "Glm4MoeLiteForCausalLM"})
# Targets whose SGLang model class has no DFlash layer capture.
NO_DFLASH_CAPTURE = frozenset({"Qwen2ForCausalLM"})


def sglang_layer_ids(architectures, layer_ids, mode: str = "eagle3") -> list[int]:
    """The ids to pass SGLang's set_{eagle3,dflash}_layers_to_capture so that it captures the outputs
    of `layer_ids` (nodedeck's numbering); a one-line UserError where no ids can."""
    arch = set(architectures or ())
    ids = [int(i) for i in layer_ids]
    if mode == "dflash":
        if arch & NO_DFLASH_CAPTURE:
            raise UserError(f"SGLang's {', '.join(sorted(arch & NO_DFLASH_CAPTURE))} has no DFlash layer capture "
                            "(set_dflash_layers_to_capture): it can neither capture nor serve a DFlash drafter for "
                            "this target; use --backend transformers to capture and another server, or EAGLE-3")
        return ids
    if not arch & DEEPSEEK_RULE or not ids or ids[0] == 1:
        return ids
    if ids[0] == 0:
        raise UserError(f"aux layers {ids}: SGLang's {', '.join(sorted(arch & DEEPSEEK_RULE))} cannot capture the "
                        "output of layer 0 (it adds 1 only when the first id is 1); start at layer 1 or later")
    return [i + 1 for i in ids]  # not starting at 1: SGLang takes them as they are, i.e. the input of layer id


def yarn_mscale(factor: float) -> float:
    """SGLang's `yarn_get_mscale`: the cos/sin scale of YaRN at `factor` (before attn_factor)."""
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def serving_rope_scaling(rope_scaling: dict | None, trained_scale: float) -> dict | None:
    """The exported `rope_scaling`: for YaRN, with the attn_factor (SGLang, vLLM) and attention_factor
    (transformers) that make the served cos/sin scale equal `trained_scale` (transformers'
    attention_scaling of the rotary embedding the drafter was trained with)."""
    if not rope_scaling or rope_scaling.get("rope_type", rope_scaling.get("type")) != "yarn":
        return rope_scaling
    factor = float(rope_scaling["factor"])
    return {**rope_scaling, "attn_factor": trained_scale / yarn_mscale(factor), "attention_factor": trained_scale}
