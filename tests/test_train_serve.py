"""The train-serve side by side (issue 43 item 1): the eval's acceptance and each engine's, the band they agree
within and why, and the causes nodedeck checks for a server's export and command, on recorded figures and on real
exports written by the trainer's exporter (then broken as users' exports were: ids off by one, a stale vocab map)."""

from __future__ import annotations

import json
import math
import struct
import time
from pathlib import Path

import pytest
import torch

from cli.main import main
from ops.acceptance import NUMERICS, Acceptance, band, bench_figure, compare, eval_figure, probe_figure
from ops.gap import served_checks
from ops.hosts.local import LocalHost
from ops.served import bench_command, server_command
from tests.support.torch_threads import one_torch_thread  # noqa: F401  (an autouse fixture)
from tests.test_train_models import eagle3
from trainer.evaluate import d2t_sha256, per_position
from trainer.export import export_drafter

# Recorded: vLLM 0.32 against `nodedeck-train eval` on the demo's 6 prompts (issue 43, a DFlash drafter, K = 7):
# vLLM counted 69 drafts / 93 accepted, the eval 68 rounds / 94 accepted.
SAME = "sha-of-the-demo-prompts"
EVAL_DFLASH = Acceptance(1 + 94 / 68, "stage evaluate", "eval", rounds=68, num_draft_tokens=7, prompts_sha256=SAME,
                         greedy=True)
VLLM_DFLASH = Acceptance(1 + 93 / 69, "stage probe", "serving", server="vllm", rounds=69, num_draft_tokens=7,
                         prompts_sha256=SAME, greedy=True)
# An EAGLE-3 eval (K = 4) and vLLM's benchmark of the same export on other prompts (`vllm bench serve --save-result`,
# greedy), as the demo's stages write them.
EVAL_DOC = {"mean_accept_len": 2.5, "rounds": 50, "num_draft_tokens": 4, "prompts_sha256": SAME,
            "per_position_acceptance": [0.8, 0.4, 0.2, 0.1]}
VLLM_BENCH = {"output_throughput": 92.4, "spec_decode_acceptance_length": 2.62, "spec_decode_num_drafts": 270,
              "spec_decode_acceptance_rate": 40.5,
              "spec_decode_per_position_acceptance_rates": [0.83, 0.45, 0.22, 0.12]}


# Recorded here (docs/engines.md): a 2-layer DFlash drafter (block 8, 360 online steps on the demo's data), K = 7, the
# demo's 6 eval prompts, 24 tokens: `nodedeck-train eval` and vLLM 0.32.0+cpu prompt by prompt (rounds, accepted).
IDS = [f"native-native-00{i}" for i in range(6)]
EVAL_2L = {"mean_accept_len": 1 + 93 / 64, "rounds": 64, "num_draft_tokens": 7, "prompts_sha256": SAME,
           "per_position_acceptance": [0.3906, 0.25, 0.1719, 0.1719, 0.1562, 0.1562, 0.1562],
           "per_prompt": [{"id": i, "rounds": r, "accept_len": 1 + a / r}
                          for i, (r, a) in zip(IDS, [(10, 17), (10, 17), (12, 18), (8, 17), (13, 11), (11, 13)])]}
VLLM_2L = {"mode": "probe", "server": "vllm", "engine": {"name": "vLLM", "version": "0.32.0+cpu"}, "greedy": True,
           "served_accept_len": 1 + 95 / 67, "rounds": 67, "accepted": 95, "num_draft_tokens": 7,
           "prompts_sha256": SAME,
           "per_position_acceptance": [0.3881, 0.2985, 0.2388, 0.209, 0.1343, 0.0746, 0.0746],
           "per_prompt": [{"id": i, "rounds": r, "accepted": a}
                          for i, (r, a) in zip(IDS, [(11, 19), (11, 19), (13, 17), (8, 17), (13, 11), (11, 12)])]}


def test_the_same_prompts_agree_within_the_numerics_band():
    v = compare(EVAL_DFLASH, VLLM_DFLASH)
    assert v.state == "agree" and v.band.width == pytest.approx(NUMERICS * EVAL_DFLASH.value)
    assert "the same prompts" in v.band.why and "near-tie" in v.band.why
    assert "agree within ±0.07" in v.line()


def test_prompts_that_part_round_for_round_are_said_even_when_the_means_agree():
    from ops.measured_by import Engine

    ev = eval_figure(EVAL_2L, "stage evaluate", None)
    served = probe_figure(VLLM_2L, "stage probe", Engine("vLLM", "0.32.0+cpu"))
    v = compare(ev, served)
    assert v.state == "agree" and v.parted_prompts() == (4, 6)
    assert v.line() == ("vLLM 0.32.0+cpu 2.42 vs eval 2.45: agree within ±0.07; 4 of 6 prompts part round for "
                        "round")
    assert compare(ev, probe_figure({**VLLM_2L, "per_prompt": EVAL_2L["per_prompt"]}, "s", None)).parted_prompts() \
        is None                           # an eval-shaped record is not a probe's: nothing compared prompt by prompt


def test_other_prompts_agree_within_the_sampling_error_of_both_means():
    ev = eval_figure(EVAL_DOC, "stage evaluate", None)
    served = bench_figure(VLLM_BENCH, "stage bench_eagle3", None, greedy=True)
    assert ev is not None and served is not None
    assert served.per_position == (0.83, 0.45, 0.22, 0.12) and served.rounds == 270 and served.accept_rate == 0.405
    # A = accepted drafts per round: P(A > i) = p_i, so Var A = sum (2i + 1) p_i - (sum p_i)^2
    var_e = 0.8 + 3 * 0.4 + 5 * 0.2 + 7 * 0.1 - 1.5 ** 2
    var_s = 0.83 + 3 * 0.45 + 5 * 0.22 + 7 * 0.12 - 1.62 ** 2
    assert ev.variance() == pytest.approx(var_e) and served.variance() == pytest.approx(var_s)
    b = band(ev, served)
    assert b.width == pytest.approx(3 * math.sqrt(var_e / 50 + var_s / 270))
    assert "other prompts" in b.why and "eval 50 rounds" in b.why
    assert compare(ev, served).state == "agree"


def test_a_collapse_is_a_gap_parting_from_the_first_draft():
    ev = eval_figure(EVAL_DOC, "stage evaluate", None)
    broken = bench_figure({**VLLM_BENCH, "spec_decode_acceptance_length": 1.04,
                           "spec_decode_per_position_acceptance_rates": [0.03, 0.01, 0.0, 0.0]},
                          "stage bench_eagle3", None, greedy=True)
    v = compare(ev, broken)
    assert v.state == "gap" and v.delta == pytest.approx(1.04 - 2.5) and v.parting_position() == 0
    assert "TRAIN-SERVE GAP of -1.46" in v.line() and "parting from draft position 1" in v.line()
    assert "no cause nodedeck can check found (nothing could be checked)" in v.line()


def test_a_sampled_serving_figure_is_not_compared():
    ev = eval_figure(EVAL_DOC, "stage evaluate", None)
    sampled = bench_figure(VLLM_BENCH, "stage bench_eagle3", None, greedy=False)
    v = compare(ev, sampled)
    assert v.state == "not compared" and v.band.width is None and "sampled" in v.line()


def test_figures_from_a_node_are_never_trusted():
    assert eval_figure({"mean_accept_len": float("nan")}, "s", None) is None
    assert eval_figure({"mean_accept_len": 0.5}, "s", None) is None
    odd = eval_figure({**EVAL_DOC, "per_position_acceptance": [0.5, 7.0], "rounds": -3}, "s", None)
    assert odd is not None and odd.per_position == () and odd.rounds is None
    assert bench_figure({"output_throughput": 10.0, "accept_length": 3.1}, "s", None, None).server == "sglang"
    assert bench_figure({"output_throughput": 10.0}, "s", None, None) is None
    assert probe_figure({"served_accept_len": 2.0, "server": "\x1b]52;x", "greedy": "yes"}, "s", None).server is None


def test_per_position_is_vllms_count_over_drafts():
    rounds = [1, 3, 5, 2, 1]          # accept lengths: accepted drafts 0, 2, 4, 1, 0
    assert per_position(rounds, 4) == [3 / 5, 2 / 5, 1 / 5, 1 / 5]
    assert 1 + sum(per_position(rounds, 4)) == pytest.approx(sum(rounds) / len(rounds))


# -- the checks, on real exports ---------------------------------------------------------------------------------
def _export(tmp_path, name="final"):
    return export_drafter(eagle3(), tmp_path / name, dtype="float32")


def _eval_doc(model=None) -> dict:
    model = model or eagle3()
    return {"mean_accept_len": 2.5, "num_draft_tokens": 4, "dtype": "float32", "d2t_sha256": d2t_sha256(model.d2t)}


def _vllm(export, extra="") -> str:
    return (f"vllm serve /models/t --speculative-config.method eagle3 --speculative-config.model {export} "
            f"--speculative-config.num_speculative_tokens 4 --dtype float32 {extra}")


def test_a_clean_export_passes_every_check(tmp_path):
    export = _export(tmp_path)
    checks = served_checks(LocalHost(), server_command(_vllm(export)), _eval_doc(), bench_command(
        "vllm bench serve --backend openai-chat --endpoint /v1/chat/completions --temperature 0"))
    assert [(c.name, c.ok) for c in checks] == [("aux layer ids", True), ("RoPE scaling", True), ("d2t/t2d", True),
                                               ("chat template", True), ("draft length", True), ("dtype", True),
                                               ("engine kernel", None)]    # no engine named: not checked


def test_aux_layer_ids_off_by_one_are_named(tmp_path):
    export = _export(tmp_path)
    cfg = json.loads((export / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in cfg["eagle_aux_hidden_state_layer_ids"]]
    (export / "config.json").write_text(json.dumps(cfg))
    checks = {c.name: c for c in served_checks(LocalHost(), server_command(_vllm(export)), _eval_doc(), None)}
    assert checks["aux layer ids"].ok is False
    assert "[3, 4, 5]" in checks["aux layer ids"].detail and "should be [2, 3, 4]" in checks["aux layer ids"].detail
    # SGLang reads the nested ids, untouched: for SGLang the same export is right
    sglang = server_command(f"python -m sglang.launch_server --model-path /models/t --speculative-algorithm EAGLE3 "
                            f"--speculative-draft-model-path {export} --speculative-num-steps 4")
    assert {c.name: c.ok for c in served_checks(LocalHost(), sglang, _eval_doc(), None)}["aux layer ids"] is True


def _rewrite_tensor(path, name, fn):
    """Rewrite one int64 tensor of a safetensors file in place (its bytes, same length)."""
    raw = bytearray(path.read_bytes())
    (size,) = struct.unpack("<Q", raw[:8])
    info = json.loads(raw[8:8 + size])[name]
    begin, end = (8 + size + x for x in info["data_offsets"])
    values = list(struct.unpack(f"<{(end - begin) // 8}q", raw[begin:end]))
    raw[begin:end] = struct.pack(f"<{len(values)}q", *fn(values))
    path.write_bytes(bytes(raw))


def test_a_wrong_d2t_is_named(tmp_path):
    export = _export(tmp_path)
    _rewrite_tensor(export / "model.safetensors", "d2t", lambda d2t: [d2t[0] + 1, *d2t[1:]])
    checks = {c.name: c for c in served_checks(LocalHost(), server_command(_vllm(export)), _eval_doc(), None)}
    assert checks["d2t/t2d"].ok is False
    assert "d2t maps draft id 0 to target id 1, t2d marks 0" in checks["d2t/t2d"].detail
    assert "not the map the eval decoded with" in checks["d2t/t2d"].detail


def test_rope_chat_template_draft_length_and_dtype_are_named(tmp_path):
    export = _export(tmp_path)
    cfg = json.loads((export / "config.json").read_text())
    cfg["rope_theta"] = 1e6
    (export / "config.json").write_text(json.dumps(cfg))
    server = server_command(_vllm(export).replace("num_speculative_tokens 4", "num_speculative_tokens 3")
                            .replace("float32", "bfloat16"))
    raw_bench = bench_command("vllm bench serve --backend vllm --endpoint /v1/completions --temperature 0")
    checks = {c.name: c for c in served_checks(LocalHost(), server, _eval_doc(), raw_bench)}
    assert {n for n, c in checks.items() if c.ok is False} == {"RoPE scaling", "chat template", "draft length",
                                                               "dtype"}
    assert "rope_theta 1000000.0 is not the trained 10000" in checks["RoPE scaling"].detail
    assert "the server drafts 3 tokens a round, the eval 4" in checks["draft length"].detail


def test_a_dflash_block_against_num_speculative_tokens(tmp_path):
    from tests.test_train_models import target_config
    from trainer.models import init_drafter
    from trainer.models.dflash import DFlashConfig

    cfg = DFlashConfig.from_target(target_config(), target_layer_ids=[1, 3], mask_token_id=0, block_size=8)
    g = torch.Generator().manual_seed(0)
    model = init_drafter(cfg, torch.randn(50, 32, generator=g), torch.randn(50, 32, generator=g), seed=0)
    export = export_drafter(model, tmp_path / "dflash", dtype="float32")
    server = server_command(f"vllm serve /m --speculative-config '{{\"method\": \"dflash\", \"model\": \"{export}\", "
                            f"\"num_speculative_tokens\": 15}}'")
    checks = {c.name: c for c in served_checks(LocalHost(), server, {"num_draft_tokens": 7}, None)}
    assert checks["aux layer ids"].ok is True            # dflash_config.target_layer_ids + 1, vLLM's reading
    assert checks["draft length"].ok is False and "block of 8 drafts 7" in checks["draft length"].detail
    # vLLM 0.32's CPU build normalises every layer's context keys with layer 0's k_norm: a 2-layer drafter is hit
    from ops.measured_by import Engine, device_in_log

    two = export_drafter(init_drafter(DFlashConfig.from_target(target_config(), target_layer_ids=[1, 3],
                                                               mask_token_id=0, block_size=8, num_layers=2),
                                      torch.randn(50, 32, generator=g), torch.randn(50, 32, generator=g), seed=0),
                         tmp_path / "two", dtype="float32")
    vllm = Engine("vLLM", "0.32.0")                      # as its /version names it, CPU build or not
    log = (Path(__file__).parent / "data" / "telemetry" / "vllm032_cpu_eagle3.log").read_text()
    assert device_in_log(log) == "CPU" and device_in_log("INFO GPU KV cache usage: 3.0%") == "GPU"
    for export, engine, device, ok in ((two, vllm, "CPU", False), (two, Engine("vLLM", "0.32.0+cpu"), None, False),
                                       (export, vllm, "CPU", True), (two, vllm, "GPU", True), (two, vllm, None, None)):
        command = server_command(f"vllm serve /m --speculative-config.method dflash --speculative-config.model "
                                 f"{export} --speculative-config.num_speculative_tokens 7")
        checks = served_checks(LocalHost(), command, {}, None, engine=engine, device=device)
        [kernel] = [c for c in checks if c.name == "engine kernel"]
        assert kernel.ok is ok and (("layer 0's k_norm" in kernel.detail) == (ok is not True)), kernel


def _probed_plan(tmp_path, shift: int, eval_doc: dict, served: dict) -> list[str]:
    """A plan as a user's has it, on `local` with root tmp_path/w: an eval stage that wrote eval_doc, a vLLM server
    stage of an export whose aux layer ids are shifted by `shift`, a probe that wrote served. Its `plan outcome`
    arguments, less --json."""
    export = _export(tmp_path / "w")
    cfg = json.loads((export / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [i + shift for i in cfg["eagle_aux_hidden_state_layer_ids"]]
    (export / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "w" / "eval.json").write_text(json.dumps(eval_doc))
    (tmp_path / "w" / "served.json").write_text(json.dumps(
        {"mode": "probe", "server": "vllm", "engine": {"name": "vLLM", "version": "0.32.0+cpu"}, "num_draft_tokens": 4,
         "greedy": True, "prompts_sha256": SAME, **served}))
    (tmp_path / "nodes.toml").write_text(f'[nodes.local]\nroot = "{tmp_path / "w"}"\n')
    stages = [{"id": "evaluate", "command": "true", "outputs": ["eval.json"]},
              {"id": "serve_eagle3", "kind": "server", "command": _vllm(export)},
              {"id": "probe", "depends_on": ["serve_eagle3", "evaluate"], "command": "true",
               "outputs": ["served.json"]}]
    plan = tmp_path / "p.toml"
    plan.write_text("".join("[[stage]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in st.items())
                            for st in stages))
    return ["--config", str(tmp_path / "nodes.toml"), "plan", "outcome", str(plan)]


def test_plan_outcome_names_the_cause_of_a_gap(tmp_path, capsys):
    """`plan outcome --json`: the eval's record, a probe of the same prompts through the drafter's server, the
    server stage's command and the export on disk, read as a user's plan has them."""
    outcome = _probed_plan(tmp_path, -1, {**_eval_doc(), **EVAL_DOC, "engine": {
        "name": "nodedeck-train eval", "version": "0.1.0"}}, {
        "served_accept_len": 1.06, "rounds": 90, "accepted": 5, "per_position_acceptance": [0.05, 0.01, 0.0, 0.0]})
    assert main([*outcome, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["gap"] is True and doc["eval_acceptance"]["per_position"] == [0.8, 0.4, 0.2, 0.1]
    [verdict] = doc["train_serve"]
    assert verdict["state"] == "gap" and verdict["serving"]["engine"]["name"] == "vLLM"
    assert "the same prompts" in verdict["band"]["why"]
    assert [c["name"] for c in verdict["causes"]] == ["aux layer ids"]
    assert main(outcome) == 1
    out = capsys.readouterr().out
    assert "train-serve: vLLM 0.32.0+cpu 1.06 vs eval 2.50: TRAIN-SERVE GAP" in out and "aux layer ids" in out


def test_an_export_wrong_for_the_engine_is_named_though_its_figures_agree(tmp_path, capsys):
    """A drafter that barely reads the target's features (the demo's toy on a 4-layer target, a CI run here) served
    with its aux layer ids one late drafts the eval's rounds exactly: the figures agree, prompt by prompt, and the
    verdict still names the export's ids, which other prompts would pay for."""
    outcome = _probed_plan(tmp_path, +1, {**_eval_doc(), **EVAL_DOC, "per_prompt": [
        {"id": f"p{i}", "rounds": 10, "accept_len": 2.5} for i in range(5)]}, {
        "served_accept_len": 2.5, "rounds": 50, "accepted": 75, "per_position_acceptance": [0.8, 0.4, 0.2, 0.1],
        "per_prompt": [{"id": f"p{i}", "rounds": 10, "accepted": 15} for i in range(5)]})
    assert main([*outcome, "--json"]) == 0
    [verdict] = json.loads(capsys.readouterr().out)["train_serve"]
    assert verdict["state"] == "agree" and verdict["prompts_parted"] == {"parted": 0, "prompts": 5}
    assert [c["name"] for c in verdict["causes"]] == ["aux layer ids"]
    assert "all 5 prompts round for round; but causes: aux layer ids: eagle_aux_hidden_state_layer_ids" \
        in verdict["line"]


def test_plan_outcome_reads_the_servers_own_log_for_its_device(tmp_path, capsys):
    """The server stage launched for real (a `vllm` placed first on its PATH that logs what vLLM 0.32's CPU build
    logs, then idles): `plan outcome` reads the device from that run's log and names the CPU kernel as the cause of
    the prompts that part (the figures recorded here, a 2-layer DFlash export on disk)."""
    import uuid

    from tests.support.tmux_sessions import kill_plan_sessions
    from tests.test_train_models import target_config
    from trainer.models import init_drafter
    from trainer.models.dflash import DFlashConfig

    root = tmp_path / "w"
    g = torch.Generator().manual_seed(0)
    cfg = DFlashConfig.from_target(target_config(), target_layer_ids=[1], mask_token_id=0, block_size=8,
                                   num_layers=2)
    export_drafter(init_drafter(cfg, torch.randn(50, 32, generator=g), torch.randn(50, 32, generator=g), seed=0),
                   root / "final", dtype="float32")
    (root / "eval.json").write_text(json.dumps({**EVAL_2L, "dtype": "float32"}))
    (root / "served.json").write_text(json.dumps({**VLLM_2L, "engine": {"name": "vLLM", "version": "0.32.0"}}))
    fake = tmp_path / "bin" / "vllm"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'INFO vLLM server version 0.32.0, serving model /m'\n"
                    "echo 'INFO Engine 000: Avg generation throughput: 0.0 tokens/s, CPU KV cache usage: 0.0%'\n"
                    "exec sleep 60\n")
    fake.chmod(0o755)
    name = f"g{uuid.uuid4().hex[:8]}"
    (tmp_path / "nodes.toml").write_text(f'[nodes.local]\nroot = "{root}"\n')
    plan = tmp_path / "p.toml"
    plan.write_text(
        f'[plan]\nname = "{name}"\nenv = {{ PATH = "{fake.parent}:/usr/bin:/bin" }}\n'
        '[[stage]]\nid = "evaluate"\ncommand = "true"\noutputs = ["eval.json"]\n'
        '[[stage]]\nid = "serve"\nkind = "server"\ncommand = "vllm serve /m --speculative-config.method dflash '
        '--speculative-config.model ${root}/final --speculative-config.num_speculative_tokens 7 --dtype float32"\n'
        'verify = [{ kind = "log_contains", pattern = "KV cache usage" }]\n'
        '[[stage]]\nid = "probe"\ndepends_on = ["serve", "evaluate"]\ncommand = "true"\noutputs = ["served.json"]\n')
    config = ["--config", str(tmp_path / "nodes.toml")]
    try:
        assert main([*config, "stage", "start", "serve", "--plan", str(plan)]) == 0
        deadline = time.monotonic() + 20
        while main([*config, "stage", "verify", "serve", "--plan", str(plan)]) != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        capsys.readouterr()
        assert main([*config, "plan", "outcome", str(plan), "--json"]) == 0      # the means agree
        [verdict] = json.loads(capsys.readouterr().out)["train_serve"]
        assert verdict["state"] == "agree" and verdict["prompts_parted"] == {"parted": 4, "prompts": 6}
        [cause] = verdict["causes"]
        assert cause["name"] == "engine kernel" and cause["detail"].startswith("vLLM 0.32.0 on CPU:")
        assert "4 of 6 prompts part round for round; causes: engine kernel" in verdict["line"]
    finally:
        kill_plan_sessions(name)
