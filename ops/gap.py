"""The causes of a train-serve gap nodedeck can check, for one server's export and command against the eval.

Read on the node (bounded reads: config files up to 1 MiB, a safetensors header up to 1 MiB, the vocab maps up to
16 MiB), each check a `Check` (ok, a cause, or not checkable and why):

- aux layer ids: the export's engine-facing ids against the trained ones (`nodedeck.model_config`) by the engine's
  rule for the target: vLLM takes the top-level `eagle_aux_hidden_state_layer_ids` as the input of layer k (the
  output of k - 1), else `dflash_config.target_layer_ids` + 1; SGLang the nested ids by trainer.sglang_rules;
- RoPE scaling: the export's `rope_theta` / `rope_scaling` against the trained rotary (YaRN's attn_factor aside);
- d2t/t2d (EAGLE-3): the map the engine drafts through against the one the eval decoded with (its digest), and
  against its own t2d (every mapped id in range, ascending, and marked);
- chat template: a server `--chat-template`, or a benchmark sending raw text, against the target's own template
  the eval's prompts went through;
- draft length: the server's K against the eval's, and a DFlash block's K + 1;
- dtype: the server's against the eval's;
- engine kernel: what an engine build is known to compute otherwise than trained (vLLM 0.32's CPU build normalises
  every DFlash layer's context keys with the first layer's k_norm: docs/engines.md).

The node is not trusted: a value it holds that is not what its field needs (a number through ops.nodenum, an
object, a list of layer ids, JSON at most MAX_DEPTH deep) fails its check with one line that quotes it inert and
short (`printable`), never an exception.
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
import struct
from typing import Mapping

from ops import nodejson, nodenum
from ops.acceptance import Check
from ops.errors import HostError, UserError
from ops.hosts.base import Host
from ops.measured_by import Engine
from ops.served import BenchCommand, ServerCommand
from ops.textsafe import printable, shown
from trainer.sglang_rules import sglang_layer_ids  # pure (no torch): the rule the export itself follows

MAX_JSON = 1 << 20
MAX_TENSOR = 16 << 20
MAX_DEPTH = 64
"""The deepest JSON read from the node: str() and == of a value nested near Python's limit would recurse past it."""
_YARN_SERVING_KEYS = ("attn_factor", "attention_factor")
_LAYER_ID = nodenum.Whole("layer id", 0, 2**20)
_LAYERS = nodenum.Whole("num_hidden_layers", 1, 2**20)
_BLOCK = nodenum.Whole("block_size", 1, 2**20)
_DRAFT_TOKENS = nodenum.Whole("num_draft_tokens", 0, 2**20)
_THETA = nodenum.Real("rope_theta", 0, 1e15)
_OFFSET = nodenum.Whole("data offset", 0, nodenum.INT64)
_DIM = nodenum.Whole("dimension", 0, nodenum.INT64)


def _line(e: Exception) -> str:
    """The first line of a node's error, inert and bounded."""
    lines = str(e).strip().splitlines()
    return printable(lines[0] if lines else "not readable")


def _loads(raw: bytes) -> object:
    """JSON from the node, at most MAX_DEPTH deep; ValueError with a short reason."""
    try:
        doc = nodejson.loads(raw.decode(errors="replace"))
    except ValueError as e:
        raise ValueError("not JSON" if isinstance(e, json.JSONDecodeError) else printable(e, 80)) from None
    level, depth = [doc], 0
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            raise ValueError(f"JSON nested deeper than {MAX_DEPTH}")
        level = [v for c in level if isinstance(c, (dict, list)) for v in (c.values() if isinstance(c, dict) else c)]
    return doc


def read_json(host: Host, path: str) -> dict:
    """A JSON object file on the node; ValueError with a one-line reason."""
    where = shown(path)
    try:
        raw = host.read_range(path, 0, MAX_JSON + 1)
    except HostError as e:
        raise ValueError(f"{where}: {_line(e)}") from None
    if len(raw) > MAX_JSON:
        raise ValueError(f"{where}: larger than {MAX_JSON >> 20} MiB")
    try:
        doc = _loads(raw)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: not a JSON object")
    return doc


def read_tensor(host: Host, path: str, name: str) -> tuple[str, list[int], bytes]:
    """(dtype, shape, raw little-endian bytes) of one tensor of a safetensors file; ValueError with a one-line
    reason when absent or not described as safetensors does."""
    where = shown(path)
    try:
        head = host.read_range(path, 0, 8)
        if len(head) < 8:
            raise ValueError("not a safetensors file")
        (size,) = struct.unpack("<Q", head)
        if size > MAX_JSON:
            raise ValueError(f"a header of {size} bytes")
        header = _loads(host.read_range(path, 8, size))
        info = header.get(name) if isinstance(header, dict) else None
        if not isinstance(info, dict):
            raise ValueError(f"has no {name}")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str) or not isinstance(shape, list) or not isinstance(offsets, list) \
                or len(offsets) != 2:
            raise ValueError(f"its header does not describe {name}")
        begin, end = (_OFFSET.named(f"{name} offset").from_json(x) for x in offsets)
        dims = [_DIM.named(f"{name} dimension").from_json(x) for x in shape]
        if begin > end or end - begin > MAX_TENSOR:
            raise ValueError(f"{name} spans {end - begin} bytes")
        data = host.read_range(path, 8 + size + begin, end - begin)
    except HostError as e:
        raise ValueError(f"{where}: {_line(e)}") from None
    except ValueError as e:         # nodenum.Invalid is one
        raise ValueError(f"{where}: {e}") from None
    if len(data) != end - begin:
        raise ValueError(f"{where}: {name} is cut short")
    return dtype, dims, data


def _object(doc: Mapping, key: str, where: str = "") -> dict:
    """doc[key], an object ({} when absent); ValueError when the node put anything else there."""
    value = doc.get(key)
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"{where or key} is {printable(value, 80)}, not an object")
    return value or {}


def _ids(value: object, where: str) -> list[int] | None:
    """value, a list of layer ids (None when absent); ValueError naming `where` otherwise."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise ValueError(f"{where} is {printable(value, 80)}, not a list of layer ids")
    try:
        return [_LAYER_ID.from_json(i) for i in value]
    except nodenum.Invalid as e:
        raise ValueError(f"{where}: {e}") from None


def _names(value: object, where: str) -> list[str]:
    """value, a list of architecture names ([] when absent); ValueError naming `where` otherwise."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise ValueError(f"{where} is {printable(value, 80)}, not a list of names")
    return value


def _layer_ids(engine: str, mode: str, export: dict, trained: list[int], arch: list[str]) -> Check:
    name = "aux layer ids"
    shown_trained = printable(trained, 80)
    try:
        if engine == "vllm":
            top = _ids(export.get("eagle_aux_hidden_state_layer_ids"), "eagle_aux_hidden_state_layer_ids")
            dflash = _ids(_object(export, "dflash_config").get("target_layer_ids"), "dflash_config.target_layer_ids")
            got = top if top else [i + 1 for i in dflash] if dflash else None
            want = [i + 1 for i in trained]
            rule = "vLLM's rule: id k is the input of layer k, the output of k - 1"
            if got is None:
                return Check(name, False, f"the export names none: vLLM falls back to the target's default layers, "
                                          f"not the trained outputs of layers {shown_trained}")
            where = "eagle_aux_hidden_state_layer_ids" if top else "dflash_config.target_layer_ids + 1"
        else:
            want = sglang_layer_ids(arch, trained, mode)
            key, inner = ("eagle_config", "eagle_aux_hidden_state_layer_ids") if mode == "eagle3" else \
                ("dflash_config", "target_layer_ids")
            got = _ids(_object(export, key).get(inner), f"{key}.{inner}")
            where, rule = f"{key}'s ids", f"SGLang's rule for {printable(', '.join(arch) or 'this target', 80)}"
    except (ValueError, UserError) as e:
        return Check(name, False, printable(e))
    if got == want:
        return Check(name, True, f"{where} {printable(got, 80)} capture the trained layers {shown_trained} ({rule})")
    return Check(name, False, f"{where} {printable(got, 80)} capture other layers than the trained outputs of "
                              f"{shown_trained}: {rule}, so they should be {printable(want, 80)}")


def _rope(export: dict, model_config: dict) -> Check:
    name = "RoPE scaling"
    try:
        rope = dict(_object(model_config, "rope", "the trained rope"))
        theta = _THETA.named("trained rope_theta").from_json(rope.pop("rope_theta", 10000.0))
        got = _object(export, "rope_scaling")
    except ValueError as e:
        return Check(name, False, str(e))
    want = None if rope.get("rope_type", "default") == "default" else rope
    got_cmp = None if not got else {k: v for k, v in got.items() if k not in _YARN_SERVING_KEYS}
    served_theta = export.get("rope_theta")
    served = _THETA.get_json(served_theta)
    if served is None or not math.isclose(served, theta, rel_tol=1e-9):
        return Check(name, False, f"rope_theta {printable(served_theta, 80)} is not the trained {theta:g}")
    if got_cmp != want:
        return Check(name, False, f"rope_scaling {printable(got or None, 160)} is not the trained "
                                  f"{printable(want, 160)}")
    return Check(name, True, f"rope_theta {theta:g}, rope_scaling {printable(want, 160)} as trained")


def _d2t(host: Host, weights: str, export: dict, eval_doc: Mapping) -> Check:
    name = "d2t/t2d"
    try:
        dtype, shape, d2t_raw = read_tensor(host, weights, "d2t")
        t_dtype, t_shape, t2d_raw = read_tensor(host, weights, "t2d")
    except ValueError as e:
        return Check(name, None, str(e))
    if dtype != "I64" or t_dtype != "BOOL" or len(shape) != 1 or len(t_shape) != 1:
        return Check(name, False, f"d2t is {printable(dtype, 20)}{printable(shape, 40)} and t2d "
                                  f"{printable(t_dtype, 20)}{printable(t_shape, 40)}, not int64 and bool vectors")
    if len(d2t_raw) != 8 * shape[0] or len(t2d_raw) != t_shape[0]:
        return Check(name, False, f"d2t holds {len(d2t_raw)} bytes for {shape[0]} int64s, t2d {len(t2d_raw)} for "
                                  f"{t_shape[0]} bools")
    d2t = struct.unpack(f"<{shape[0]}q", d2t_raw)
    mapped = [i + d for i, d in enumerate(d2t)]
    marked = [i for i, b in enumerate(t2d_raw) if b]
    problems = []
    if shape[0] != export.get("draft_vocab_size"):
        problems.append(f"{shape[0]} entries for a draft vocabulary of {printable(export.get('draft_vocab_size'), 80)}")
    if mapped != marked:
        first = next((i for i, (a, b) in enumerate(zip(mapped, marked)) if a != b), min(len(mapped), len(marked)))
        problems.append(f"d2t maps draft id {first} to target id {mapped[first] if first < len(mapped) else '-'}, "
                        f"t2d marks {marked[first] if first < len(marked) else '-'} (the two maps disagree)")
    digest = hashlib.sha256(d2t_raw).hexdigest()
    evaluated = eval_doc.get("d2t_sha256")
    if isinstance(evaluated, str) and evaluated != digest:
        problems.append("d2t is not the map the eval decoded with (its digest differs)")
    if problems:
        return Check(name, False, "; ".join(problems))
    said = ", the eval's" if evaluated == digest else " (the eval's digest not recorded)"
    return Check(name, True, f"{shape[0]} ids, ascending and marked in t2d{said}")


def _template(host: Host, server: ServerCommand, bench: BenchCommand | None, target: str | None,
              same_prompts: bool) -> Check:
    name = "chat template"
    if same_prompts and not server.chat_template:
        return Check(name, True, "the eval's own token ids, templated once (the probe sends them as they are)")
    if bench is not None and not bench.chat:
        return Check(name, False, "the benchmark sends raw prompts to the completions endpoint: no chat template, "
                                  "where the eval's prompts went through the target's")
    if server.chat_template:
        if target is None:
            return Check(name, None, "the server's target is not named in its command")
        given = server.chat_template
        try:
            if host.stat(given) is not None:
                given = host.read_range(given, 0, MAX_JSON).decode(errors="replace")
            own = read_json(host, posixpath.join(target, "tokenizer_config.json")).get("chat_template")
        except ValueError as e:
            return Check(name, None, str(e))
        except HostError as e:
            return Check(name, None, _line(e))
        if own is not None and not isinstance(own, str):
            return Check(name, None, f"the target's chat_template is {printable(own, 80)}, not one template")
        if given.strip() != (own or "").strip():
            return Check(name, False, f"the server applies --chat-template {shown(server.chat_template[:80])}, not "
                                      "the target's own template the eval's prompts went through")
    if bench is None:
        return Check(name, None, "the live server's requests are not known (templated or raw)")
    return Check(name, True, "the target's own template on both sides (the benchmark through the chat endpoint)")


def _draft_length(server: ServerCommand, eval_doc: Mapping, mode: str, block_size: object) -> Check:
    name = "draft length"
    k, recorded = server.num_draft_tokens, eval_doc.get("num_draft_tokens")
    ek = _DRAFT_TOKENS.get_json(recorded)
    try:
        block = None if block_size is None else _BLOCK.from_json(block_size)
    except nodenum.Invalid as e:
        return Check(name, False, f"the drafter's {e}")
    if mode == "dflash" and block is not None and k is not None and k + 1 != block:
        return Check(name, False, f"the server drafts {k} tokens a round; the drafter's block of {block} drafts "
                                  f"{block - 1} (num_speculative_tokens must be block size - 1)")
    if k is None or ek is None:
        return Check(name, None, "the server's draft length is left to the engine" if k is None
                     else "the eval did not record its draft length")
    if k != ek:
        return Check(name, False, f"the server drafts {k} tokens a round, the eval {ek}: the two measure "
                                  "different things")
    return Check(name, True, f"{k} draft tokens a round on both sides")


def _dtype(host: Host, server: ServerCommand, eval_doc: Mapping, target: str | None) -> Check:
    name = "dtype"
    ev = eval_doc.get("dtype")
    served = server.dtype
    if served == "auto" and target is not None:
        try:
            cfg = read_json(host, posixpath.join(target, "config.json"))
            served = str(cfg.get("dtype") or cfg.get("torch_dtype") or "auto")
        except ValueError:
            pass
    if not isinstance(ev, str):
        return Check(name, None, "the eval did not record its dtype")
    if served == "auto":
        return Check(name, None, "the server's dtype is the target's, which its config does not name")
    if served.replace("torch.", "") not in (ev, {"bfloat16": "bf16", "float32": "fp32"}.get(ev)):
        return Check(name, False, f"the server computes in {printable(served, 40)}, the eval in {printable(ev, 40)}: "
                                  "near-ties break differently (a shift of a few percent, not a collapse)")
    return Check(name, True, f"{printable(ev, 40)} on both sides")


def _kernel(server: ServerCommand, engine: Engine | None, device: str | None, mode: str, export: dict) -> Check:
    name = "engine kernel"
    try:
        layers = _LAYERS.from_json(export.get("num_hidden_layers") or 1)
    except nodenum.Invalid as e:
        return Check(name, False, f"the export's {e}")
    if engine is None:
        return Check(name, None, "the engine did not name its build")
    vllm_032 = engine.name == "vLLM" and engine.version.startswith("0.32.")
    on_cpu = device == "CPU" or "+cpu" in engine.version
    if server.engine == "vllm" and vllm_032 and mode == "dflash" and layers > 1:
        if device is None and not on_cpu:
            return Check(name, None, f"{engine} on a device its log does not name: its CPU build normalises every "
                                     "DFlash layer's context keys with layer 0's k_norm")
        if on_cpu:
            return Check(name, False, f"{engine} on CPU: its rms_norm takes one weight row, so each of the drafter's "
                                      f"{layers} layers gets layer 0's k_norm on its context keys (the CUDA kernel "
                                      "takes a row a layer: vLLM #46761; XPU had the same bug, vllm-xpu-kernels "
                                      "#573)")
    return Check(name, True, f"no known kernel difference in {engine}{f' on {device}' if device else ''} for this "
                             "drafter")


def served_checks(host: Host, server: ServerCommand, eval_doc: Mapping, bench: BenchCommand | None,
                  same_prompts: bool = False, engine: Engine | None = None,
                  device: str | None = None) -> tuple[Check, ...]:
    """Every check of the list above for one server (and the benchmark that measured it, None for the live
    server or a probe; `same_prompts`: the figure was measured on the eval's own prompts; `engine`: the build that
    measured it, `device`: where its log says it runs) against the eval's record; never raises for what the node
    holds."""
    target = server.target
    if server.drafter is None:
        return (Check("drafter", False, "the server command names no drafter: it does not speculate"),)
    try:
        export = read_json(host, posixpath.join(server.drafter, "config.json"))
    except ValueError as e:
        return (Check("drafter", None, str(e)),)
    info = export.get("nodedeck")
    info = info if isinstance(info, dict) else {}
    model_config = info.get("model_config")
    if not isinstance(model_config, dict):
        return (Check("drafter", None, f"{shown(server.drafter)} was not exported by nodedeck: the trained layers "
                                       "and rotary are not recorded"),)
    mode = str(info.get("mode"))
    key = "aux_layer_ids" if mode == "eagle3" else "target_layer_ids"
    try:
        trained = _ids(model_config.get(key), f"its trained {key}") or []
        arch = _names(model_config.get("target_architectures"), "its target_architectures")
    except ValueError as e:
        return (Check("drafter", None, f"{shown(server.drafter)}: {e}"),)
    if not arch and target is not None:
        try:
            arch = _names(read_json(host, posixpath.join(target, "config.json")).get("architectures"), "architectures")
        except ValueError:
            pass                # the target's rule unknown: the plain one
    checks = [_layer_ids(server.engine, mode, export, trained, arch), _rope(export, model_config)]
    if mode == "eagle3":
        checks.append(_d2t(host, posixpath.join(server.drafter, "model.safetensors"), export, eval_doc))
    checks += [_template(host, server, bench, target, same_prompts),
               _draft_length(server, eval_doc, mode, model_config.get("block_size") if mode == "dflash" else None),
               _dtype(host, server, eval_doc, target),
               _kernel(server, engine, device, mode, export)]
    return tuple(checks)
