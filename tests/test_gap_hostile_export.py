"""A hostile node's drafter export, target config and eval record against `served_checks`: every value the node
holds that is not what its field needs becomes a check that says so on one line (inert, bounded), never an
exception (the callers, `plan outcome`, the TUI's Outcome panel and the exit's closing lines, catch only
NodedeckError)."""

from __future__ import annotations

import json
import re
import shutil
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ops.acceptance import Check
from ops.errors import HostError
from ops.gap import served_checks
from ops.hosts.local import LocalHost
from ops.measured_by import Engine
from ops.served import server_command
from tests.support.torch_threads import one_torch_thread  # noqa: F401  (an autouse fixture)
from tests.test_train_models import eagle3
from tests.test_train_serve import _vllm
from trainer.evaluate import d2t_sha256
from trainer.export import export_drafter

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff]")
LONGEST = 600        # the longest detail of any check (the engine kernel's on CPU is about 330 characters)
SHORT = {"ids": lambda v: repr(v)[:24]}     # parametrize ids: the values, cut short
NAMES = ["aux layer ids", "RoPE scaling", "d2t/t2d", "chat template", "draft length", "dtype", "engine kernel"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """One EAGLE-3 export (exporting is the slow part) and the eval record of its drafter."""
    model = eagle3()
    export = export_drafter(model, tmp_path_factory.mktemp("clean") / "final", dtype="float32")
    return export, {"mean_accept_len": 2.5, "num_draft_tokens": 4, "dtype": "float32",
                    "d2t_sha256": d2t_sha256(model.d2t)}


@pytest.fixture
def export(clean, tmp_path):
    return shutil.copytree(clean[0], tmp_path / "final")


@pytest.fixture
def eval_doc(clean):
    return dict(clean[1])


def _inert(check: Check) -> None:
    assert isinstance(check.detail, str) and check.detail.strip(), check
    assert not UNSAFE.search(check.detail) and len(check.detail) <= LONGEST, check


def _checks(export, eval_doc, command: str | None = None, host=None, **kw) -> dict[str, Check]:
    found = served_checks(host or LocalHost(), server_command(command or _vllm(export)), eval_doc, None, **kw)
    for check in found:
        _inert(check)
    return {c.name: c for c in found}


def _failed(checks: dict[str, Check], name: str, *said: str) -> None:
    check = checks[name]
    assert check.ok is not True, check
    for text in said:
        assert text in check.detail, check


RAW = "raw JSON here"


def _config(export, fn, raw: str = "") -> None:
    """Rewrite the export's config.json with fn(config) (the config changed in place, or its new text returned);
    every value RAW in it written as the JSON text `raw` (what json.dumps does not write)."""
    path = export / "config.json"
    cfg = json.loads(path.read_text())
    text = fn(cfg)
    path.write_text((text if isinstance(text, str) else json.dumps(cfg)).replace(json.dumps(RAW), raw))


def _trained(cfg: dict) -> dict:
    return cfg["nodedeck"]["model_config"]


def _header(export, fn) -> None:
    """Rewrite the safetensors header of the export's weights with fn(header) (changed in place); the data as is."""
    path = export / "model.safetensors"
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + size])
    text = fn(header)
    head = (text if isinstance(text, str) else json.dumps(header)).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + raw[8 + size:])


# -- the export's config ---------------------------------------------------------------------------------------
def test_num_hidden_layers_not_a_number(export, eval_doc):
    _config(export, lambda c: c.update(num_hidden_layers="abc"))
    _failed(_checks(export, eval_doc), "engine kernel", "num_hidden_layers", "abc")


@pytest.mark.parametrize("raw", ['"x"', "1e999", "1" + "0" * 400, "[1]", "true"], **SHORT)
def test_the_trained_rope_theta_not_a_number(export, eval_doc, raw):
    _config(export, lambda c: _trained(c)["rope"].update(rope_theta=RAW), raw)
    _failed(_checks(export, eval_doc), "RoPE scaling", "rope_theta")


@pytest.mark.parametrize("raw", ['"x"', "1e999", "1" + "0" * 400, "-1", "[10000]", "NaN"], **SHORT)
def test_the_served_rope_theta_not_a_number(export, eval_doc, raw):
    _config(export, lambda c: c.update(rope_theta=RAW), raw)
    _failed(_checks(export, eval_doc), "RoPE scaling", "rope_theta")


@pytest.mark.parametrize("where,value", [("rope_scaling", "abc"), ("rope_scaling", [1]),
                                         ("rope", [1]), ("rope", "yarn")], **SHORT)
def test_rope_objects_that_are_not_objects(export, eval_doc, where, value):
    _config(export, lambda c: (c if where == "rope_scaling" else _trained(c)).update({where: value}))
    _failed(_checks(export, eval_doc), "RoPE scaling", where)


@pytest.mark.parametrize("key", ["dflash_config", "eagle_config"])
@pytest.mark.parametrize("value", [[1], "abc", 7], **SHORT)
def test_nested_configs_that_are_not_objects(export, eval_doc, key, value):
    _config(export, lambda c: c.update({key: value}))
    sglang = (f"python -m sglang.launch_server --model-path /models/t --speculative-algorithm EAGLE3 "
              f"--speculative-draft-model-path {export} --speculative-num-steps 4")
    for command in (_vllm(export), sglang):
        checks = _checks(export, eval_doc, command)
        if key in command or key == "dflash_config" and "vllm" in command:   # what each engine reads
            _failed(checks, "aux layer ids", key)


@pytest.mark.parametrize("value", [[1e999], ["a"], [[1]], "abc", 3, [1, 2, 10**40]], **SHORT)
def test_served_layer_ids_not_numbers(export, eval_doc, value):
    _config(export, lambda c: c.update(eagle_aux_hidden_state_layer_ids=value))
    _failed(_checks(export, eval_doc), "aux layer ids", "eagle_aux_hidden_state_layer_ids")
    _config(export, lambda c: (c.pop("eagle_aux_hidden_state_layer_ids"), c.update(dflash_config={
        "target_layer_ids": value})))
    _failed(_checks(export, eval_doc), "aux layer ids", "target_layer_ids")


@pytest.mark.parametrize("value", [[1e999], ["a"], [None], "abc", 3, {"1": 2}], **SHORT)
def test_trained_layer_ids_not_numbers(export, eval_doc, value):
    _config(export, lambda c: _trained(c).update(aux_layer_ids=value))
    checks = served_checks(LocalHost(), server_command(_vllm(export)), eval_doc, None)
    assert [c.name for c in checks] == ["drafter"] and checks[0].ok is None
    _inert(checks[0])
    assert "aux_layer_ids" in checks[0].detail


@pytest.mark.parametrize("value", ["8", 1e999, [8], -3], **SHORT)
def test_a_dflash_block_size_not_a_number(export, eval_doc, value):
    _config(export, lambda c: (c["nodedeck"].update(mode="dflash"), _trained(c).update(block_size=value)))
    _failed(_checks(export, eval_doc), "draft length", "block_size")


def test_target_architectures_not_names(export, eval_doc):
    _config(export, lambda c: _trained(c).update(target_architectures=[1, 2]))
    sglang = (f"python -m sglang.launch_server --model-path /models/t --speculative-algorithm EAGLE3 "
              f"--speculative-draft-model-path {export} --speculative-num-steps 4")
    checks = served_checks(LocalHost(), server_command(sglang), eval_doc, None)
    assert [c.name for c in checks] == ["drafter"] and "target_architectures" in checks[0].detail
    _inert(checks[0])


def test_node_text_in_the_export_is_inert_and_bounded(export, eval_doc):
    escape = "\x1b]52;c;cm0gLXJmIH4K\x07\x1b[2J\u202e\r\n" * 5000
    _config(export, lambda c: c.update(rope_scaling={"rope_type": escape}, draft_vocab_size=escape,
                                       eagle_aux_hidden_state_layer_ids=list(range(2, 20000))))
    checks = _checks(export, eval_doc)
    _failed(checks, "RoPE scaling", "rope_scaling")
    _failed(checks, "aux layer ids", "[2, 3, 4, 5")
    _failed(checks, "d2t/t2d", "draft vocabulary")


# -- JSON too deep for Python ----------------------------------------------------------------------------------
def test_a_config_nested_100000_deep(export, eval_doc):
    _config(export, lambda c: "[" * 100000 + "]" * 100000)
    checks = served_checks(LocalHost(), server_command(_vllm(export)), eval_doc, None)
    assert [c.name for c in checks] == ["drafter"] and "nested" in checks[0].detail
    _inert(checks[0])


def test_values_nested_as_deep_as_python_parses(clean, export, eval_doc):
    """JSON nested just under Python's limit parses, and str() or == of it a few frames deeper fails: whatever
    the depth, the export is said to be nested too deeply, or read."""
    for depth in range(700, 1001, 4):
        shutil.copyfile(clean[0] / "config.json", export / "config.json")
        _config(export, lambda c: (c.update(rope_scaling=RAW), _trained(c)["rope"].update(rope_type=RAW)),
                "[" * depth + "]" * depth)
        checks = served_checks(LocalHost(), server_command(_vllm(export)), eval_doc, None)
        for check in checks:
            _inert(check)


def test_a_safetensors_header_nested_100000_deep(export, eval_doc):
    _header(export, lambda h: "[" * 100000 + "]" * 100000)
    _failed(_checks(export, eval_doc), "d2t/t2d", "model.safetensors")


# -- the weights' header ---------------------------------------------------------------------------------------
def test_a_d2t_shape_longer_than_its_data(export, eval_doc):
    _header(export, lambda h: h["d2t"].update(shape=[3], data_offsets=[0, 16]))
    _failed(_checks(export, eval_doc), "d2t/t2d", "d2t")


@pytest.mark.parametrize("field,value", [
    ("data_offsets", ["a", 16]), ("data_offsets", [0, 1e999]), ("data_offsets", [0]), ("data_offsets", "x"),
    ("data_offsets", [0, 16, 32]), ("data_offsets", [16, 0]), ("data_offsets", [-8, 8]),
    ("shape", ["a"]), ("shape", [1e999]), ("shape", "abc"), ("shape", 20), ("shape", [-1]), ("shape", [10**40]),
    ("dtype", "\x1b[2J" * 1000), ("dtype", [["I64"]]), ("dtype", None)], **SHORT)
def test_header_entries_not_what_safetensors_says(export, eval_doc, field, value):
    _header(export, lambda h: h["d2t"].update({field: value}))
    _failed(_checks(export, eval_doc), "d2t/t2d", "d2t")


def test_a_header_that_is_not_an_object(export, eval_doc):
    for header in ("[1, 2]", '{"d2t": [0, 160]}', '{"d2t": {"dtype": "I64", "shape": [20]}}', "nul"):
        _header(export, lambda h, header=header: header)
        _failed(_checks(export, eval_doc), "d2t/t2d", "model.safetensors")


# -- the target's files and the eval's record ------------------------------------------------------------------
def _target(tmp_path, config: dict, tokenizer_config: dict) -> str:
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(config))
    (target / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return str(target)


@pytest.mark.parametrize("architectures", [5, [1, 2], "Llama\x1b[2J"], **SHORT)
def test_target_architectures_from_the_targets_config(tmp_path, export, eval_doc, architectures):
    target = _target(tmp_path, {"architectures": architectures}, {})
    for command in (_vllm(export).replace("/models/t", target),
                    f"python -m sglang.launch_server --model-path {target} --speculative-algorithm EAGLE3 "
                    f"--speculative-draft-model-path {export} --speculative-num-steps 4"):
        assert _checks(export, eval_doc, command)["aux layer ids"].ok is True


@pytest.mark.parametrize("template", [[{"name": "default", "template": "{{ x }}"}], 5, {"a": 1}], **SHORT)
def test_a_target_chat_template_that_is_not_text(tmp_path, export, eval_doc, template):
    target = _target(tmp_path, {}, {"chat_template": template})
    given = tmp_path / "template.jinja"
    given.write_text("{{ x }}")
    command = _vllm(export, f"--chat-template {given}").replace("/models/t", target)
    _failed(_checks(export, eval_doc, command), "chat template", "chat_template")


@pytest.mark.parametrize("dtype", ["\x1b[31mbf16\u202e" * 3000, [1] * 10000, {"a": "b"}, 5], **SHORT)
def test_a_target_dtype_the_node_made_up(tmp_path, export, eval_doc, dtype):
    target = _target(tmp_path, {"torch_dtype": dtype}, {})
    command = _vllm(export).replace("/models/t", target).replace("--dtype float32", "")
    _failed(_checks(export, eval_doc, command), "dtype")


@pytest.mark.parametrize("field,value", [("dtype", "\x1b[2J\x1b]0;owned\x07" * 2000), ("num_draft_tokens", 10**4000),
                                         ("num_draft_tokens", True), ("num_draft_tokens", 1e999),
                                         ("dtype", ["bf16"])], **SHORT)
def test_an_eval_record_the_node_made_up(export, eval_doc, field, value):
    eval_doc[field] = value
    checks = _checks(export, eval_doc, _vllm(export).replace("float32", "bfloat16")
                     .replace("num_speculative_tokens 4", "num_speculative_tokens 3"))
    assert checks[field.replace("num_draft_tokens", "draft length")].ok is not True


class _Silent(LocalHost):
    """A node whose errors say nothing (an empty message)."""

    def stat(self, path):
        raise HostError("")


def test_a_node_error_without_a_message(tmp_path, export, eval_doc):
    command = _vllm(export, f"--chat-template {tmp_path / 'x.jinja'}")
    _failed(_checks(export, eval_doc, command, host=_Silent()), "chat template")


# -- anything in any field gap.py reads ------------------------------------------------------------------------
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=10**300, max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=30)
    | st.sampled_from(["eagle3", "dflash", "yarn", "default", "I64", "BOOL", "float32", "\x1b[2J", "\u202e"]),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(
        st.sampled_from(["rope_type", "factor", "target_layer_ids", "eagle_aux_hidden_state_layer_ids", "x"]),
        inner, max_size=4),
    max_leaves=12)
FIELDS = {
    (): ["num_hidden_layers", "rope_theta", "rope_scaling", "eagle_aux_hidden_state_layer_ids", "dflash_config",
         "eagle_config", "draft_vocab_size", "nodedeck"],
    ("nodedeck",): ["mode", "model_config"],
    ("nodedeck", "model_config"): ["aux_layer_ids", "target_layer_ids", "rope", "target_architectures",
                                   "block_size"],
    ("eval",): ["num_draft_tokens", "dtype", "d2t_sha256"],
    ("d2t",): ["dtype", "shape", "data_offsets"],
}


@pytest.fixture(scope="module")
def fuzzed(clean, tmp_path_factory):
    return shutil.copytree(clean[0], tmp_path_factory.mktemp("fuzzed") / "final")


@FUZZ
@given(changes=st.lists(st.tuples(st.sampled_from([(w, k) for w, ks in FIELDS.items() for k in ks]), JSONISH),
                        min_size=1, max_size=4),
       sglang=st.booleans(), engine=st.sampled_from([None, "0.32.0+cpu"]))
def test_any_value_in_any_field_gap_reads(clean, fuzzed, changes, sglang, engine):
    shutil.copyfile(clean[0] / "config.json", fuzzed / "config.json")
    shutil.copyfile(clean[0] / "model.safetensors", fuzzed / "model.safetensors")
    cfg = json.loads((fuzzed / "config.json").read_text())
    eval_doc = dict(clean[1])
    header: dict = {}
    for (where, key), value in changes:
        if where == ("eval",):
            eval_doc[key] = value
        elif where == ("d2t",):
            header[key] = value
        else:
            doc = cfg
            for step in where:
                doc = doc.get(step) if isinstance(doc, dict) else None
            if isinstance(doc, dict):
                doc[key] = value
    (fuzzed / "config.json").write_text(json.dumps(cfg))
    if header:
        _header(fuzzed, lambda h: h["d2t"].update(header))
    command = (f"python -m sglang.launch_server --model-path /models/t --speculative-algorithm EAGLE3 "
               f"--speculative-draft-model-path {fuzzed} --speculative-num-steps 4" if sglang else _vllm(fuzzed))
    found = served_checks(LocalHost(), server_command(command), eval_doc, None,
                          engine=Engine("vLLM", engine) if engine else None, device="CPU" if engine else None)
    assert [c.name for c in found] in (["drafter"], NAMES, [n for n in NAMES if n != "d2t/t2d"]), found
    for check in found:
        _inert(check)
