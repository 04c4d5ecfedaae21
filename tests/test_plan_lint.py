"""`nodedeck plan check`'s static checks: output directories, SGLang/vLLM flags, bundled plans."""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest

from cli.main import main
from ops.paths import ASSETS
from ops.plan.command_words import split_commands
from ops.plan.lint import lint_file, lint_plan, load_flag_tables
from ops.plan.parse import load_plan, parse_plan

PLANS = sorted((ASSETS / "plans").glob("*.toml"))


def lint(text: str) -> list[str]:
    return lint_plan(parse_plan(text, "p.toml"), text, "p.toml")


def plan(*commands: str, outputs: str = "[]", vars_: str = 'work = "${root}/w"') -> str:
    stages = "".join(f'\n[[stage]]\nid = "s{i}"\ntitle = "t"\ncommand = {json.dumps(c)}\noutputs = {outputs}\n'
                     for i, c in enumerate(commands))
    return f'[plan]\nname = "x"\n[vars]\n{vars_}\n{stages}'


# -- the bundled plans ------------------------------------------------------------------
@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.name)
def test_bundled_plans_pass_the_static_check(path):
    assert lint_file(load_plan(path), path) == []


@pytest.mark.parametrize("name", ["eagle3-sglang.toml", "dflash.toml"])
def test_bundled_benchmarks_use_the_plans_own_prompts(name):
    p = load_plan(ASSETS / "plans" / name)
    prompts = p.stage("bench_prompts")
    for sid in ("bench_baseline", f"bench_{name.split('-')[0].split('.')[0]}"):
        words = shlex.split(p.stage(sid).command.split("&&")[-1])
        assert words[:3] == ["python", "-m", "sglang.bench_serving"]      # the pinned SGLang 0.5.14's module
        assert words[words.index("--dataset-path") + 1] == prompts.outputs[0]
        assert "bench_prompts" in p.stage(sid).depends_on or "bench_baseline" in p.stage(sid).depends_on
        assert p.stage(sid).command.startswith("mkdir -p ${work}/bench && ")


def test_bench_prompts_stage_writes_sharegpt_format_from_the_training_data(tmp_path):
    """The stage's own command, run by bash on a small training file: the rows SGLang's ShareGPT loader reads."""
    data = tmp_path / "data"
    data.mkdir()
    with open(data / "train.jsonl", "w") as f:
        for i in range(12):
            msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": f"question {i}"},
                    {"role": "assistant", "content": f"answer {i}", "reasoning_content": "r"}]
            if i % 4 == 0:
                msgs = msgs[:2]       # prompt-only: no answer, skipped
            f.write(json.dumps({"id": str(i), "source": "s", "kind": "target-native", "messages": msgs}) + "\n")
    stage = load_plan(ASSETS / "plans" / "eagle3-sglang.toml").stage("bench_prompts")
    cmd = stage.command.replace("${work}", str(tmp_path)).replace("${data}", str(data))
    ok = subprocess.run(["bash", "-c", cmd.replace("${bench_prompts}", "2")], capture_output=True,
                        text=True, timeout=60,
                        check=False)
    assert ok.returncode == 0, ok.stderr
    assert "8 conversations for 2 prompts" in ok.stdout
    rows = json.loads((tmp_path / "bench" / "prompts.json").read_text())
    assert len(rows) == 8
    assert rows[0]["conversations"][0]["value"] == "question 1" and rows[0]["conversations"][1]["value"] == "answer 1"
    short = subprocess.run(["bash", "-c", cmd.replace("${bench_prompts}", "50")], capture_output=True, text=True,
                           timeout=60, check=False)
    assert short.returncode != 0 and "too few samples" in short.stderr


def test_dflash_plan_trains_and_serves_one_block_size():
    p = load_plan(ASSETS / "plans" / "dflash.toml")
    assert "--block-size ${block_size}" in p.stage("train").command
    assert "--block-size ${block_size}" in p.stage("train").smoke.command
    serve = p.stage("serve_dflash").command
    assert "--speculative-num-draft-tokens" not in serve and "--speculative-dflash-block-size" not in serve


# -- the check itself, on plans as they were on main -----------------------------------------
OLD_BENCH = ("python -m sglang.benchmark.serving --backend sglang --host 127.0.0.1 --port 30000 "
             "--dataset-name sharegpt --num-prompts 200 --max-concurrency 4 --output-file ${work}/bench/baseline.jsonl")
OLD_SERVE = "python -m sglang.launch_server --model-path /m --tp 1 --host 127.0.0.1 --port 30000 --enable-metrics"


def test_abbreviated_flag_is_an_error_with_file_and_line():
    errors = lint(plan(OLD_SERVE))
    assert errors == [("p.toml:9: stage 's0': sglang.launch_server: --tp is an argparse abbreviation of --tp-size: "
                       "write the full flag name")]


def test_old_benchmark_command_fails_three_ways():
    errors = lint(plan(OLD_BENCH, outputs='["${work}/bench/baseline.jsonl"]'))
    assert any("python -m sglang.benchmark.serving is not in sglang 0.5.14 (assets/flags/sglang.toml): "
               "use python -m sglang.bench_serving" in e for e in errors)
    assert any("downloads ShareGPT" in e for e in errors)
    # an output that is not declared and whose directory nothing creates
    errors = lint(plan(OLD_BENCH))
    assert any("writes ${root}/w/bench/baseline.jsonl but nothing creates ${root}/w/bench" in e for e in errors)


def test_unknown_flag_names_the_table_and_version():
    errors = lint(plan("python3 -m sglang.launch_server --model-path /m --no-such-flag 3"))
    assert len(errors) == 1 and "unknown flag --no-such-flag" in errors[0] and "assets/flags/sglang.toml" in errors[0]
    assert "sglang 0.5.14 accepts no such option" in errors[0]


def test_flag_with_equals_and_env_prefix_and_vllm():
    assert lint(plan("CUDA_VISIBLE_DEVICES=0 python -m sglang.launch_server --model-path=/m --tp-size=2")) == []
    assert lint(plan("vllm serve /m --tensor-parallel-size 2 --port 8000")) == []
    errors = lint(plan("vllm serve /m --tensor-parallel 2"))
    assert len(errors) == 1 and "abbreviation of --tensor-parallel-size" in errors[0]


def test_vllm_benchmark_must_name_its_temperature():
    """vLLM 0.32's benchmark samples unless told (it warns; SGLang's is greedy): acceptance measured that way is
    not the evaluation's, so a plan names the temperature it measures at."""
    bench = "vllm bench serve --backend vllm --port 8000 --model /m --dataset-name sharegpt --dataset-path /p.json"
    errors = lint(plan(bench))
    assert len(errors) == 1 and errors[0].startswith("p.toml:") and "--temperature" in errors[0], errors
    assert lint(plan(bench + " --temperature 0")) == lint(plan(bench + " --temperature=0.7")) == []
    assert lint(plan("vllm serve /m --port 8000")) == []           # the server is not a benchmark


@pytest.mark.parametrize("command,ok", [
    ("echo hi > ${work}/logs/x.txt", False),                                # shell does not create ${work}/logs
    ("mkdir -p ${work}/logs && echo hi > ${work}/logs/x.txt", True),
    ("mkdir -p ${work}/logs/deeper && echo hi >> ${work}/logs/x.txt", True),   # -p made the parent too
    ("mkdir -p ${work}/other && echo hi > ${work}/logs/x.txt", False),
    ("some-tool --output-file ${work}/out/r.json", False),
    ("some-tool -o ${work}/out/r.json", False),
    ("some-tool --output-dir=${work}/out/dir", False),
    ("nodedeck-train prep --out ${work}/prep --progress ${work}/p/x.jsonl", True),  # the trainer makes its dirs
    ("torchrun --standalone --nproc-per-node gpu --no-python nodedeck-train hidden-states --out ${work}/h", True),
    ("torchrun --nproc_per_node=2 --rdzv-endpoint h:1 --no-python some-tool --output-file ${work}/out/r.json", False),
    ("echo hi > /dev/null 2>&1", True),
    ("echo hi > rel.txt", True),                                           # the stage's cwd exists
    ("python3 -c 'print(1 > 0)' > ${work}/declared/x.txt", True),         # declared below; quoted > is no redirect
])
def test_written_paths_need_their_directory(command, ok):
    errors = lint(plan(command, outputs='["${work}/declared/x.txt"]'))
    assert (errors == []) is ok, errors


def test_smoke_outputs_count_as_declared():
    text = plan("true") + ('smoke = { command = "head -n 5 x > ${work}/smoke/x.jsonl", '
                           'outputs = ["${work}/smoke/x.jsonl"] }\n')
    assert lint(text) == []
    text = plan("true") + 'smoke = { command = "head -n 5 x > ${work}/smoke/x.jsonl" }\n'
    assert len(lint(text)) == 1


def test_dflash_block_size_must_match_the_trained_drafter():
    train = "nodedeck-train train --mode dflash --block-size ${block} --out ${work}/d"
    serve = ("python -m sglang.launch_server --model-path /m --speculative-algorithm DFLASH "
             "--speculative-draft-model-path ${work}/d/final --speculative-dflash-block-size 8")
    errors = lint(plan(train, serve, vars_='work = "/w"\nblock = 16'))
    assert len(errors) == 1 and "--speculative-dflash-block-size 8" in errors[0] and "--block-size 16" in errors[0]
    assert lint(plan(train, serve.replace(" 8", " ${block}"), vars_='work = "/w"\nblock = 16')) == []
    # no block flag on the server: SGLang reads it from the drafter's config
    assert lint(plan(train, serve.rsplit(" --speculative-dflash", 1)[0], vars_='work = "/w"\nblock = 16')) == []
    errors = lint(plan(train.replace(" --block-size ${block}", ""),
                       serve.replace("dflash-block-size", "num-draft-tokens"),
                       vars_='work = "/w"'))
    assert len(errors) == 1 and "without --block-size" in errors[0]


def test_unknown_flag_names_the_closest_real_one():
    errors = lint(plan("python -m sglang.launch_server --model-path /m --speculative-draft-modle-path /d"))
    assert len(errors) == 1 and "did you mean --speculative-draft-model-path?" in errors[0]
    errors = lint(plan("vllm serve /m --max-num-seq 8"))
    assert len(errors) == 1 and "abbreviation of --max-num-seqs" in errors[0]   # a prefix: argparse would take it
    errors = lint(plan("vllm serve /m --enable-prefix-cachin"))
    assert len(errors) == 1 and "abbreviation of --enable-prefix-caching" in errors[0]
    errors = lint(plan("vllm serve /m --enable-prefx-caching"))
    assert len(errors) == 1 and "did you mean --enable-prefix-caching?" in errors[0]


REAL_VLLM = ["--max-num-seqs", "--enable-prefix-caching", "--no-enable-prefix-caching", "--max-num-batched-tokens",
             "--kv-cache-dtype", "--quantization", "--tokenizer", "--chat-template", "--api-key", "-tp",
             "--pipeline-parallel-size", "--data-parallel-size", "--reasoning-parser", "--tool-call-parser",
             "--compilation-config", "--speculative-config.num_speculative_tokens", "--speculative-config.method"]


@pytest.mark.parametrize("flag", REAL_VLLM)
def test_real_vllm_flags_that_were_refused_are_accepted(flag):
    assert lint(plan(f"vllm serve /m {flag} 1")) == []
    assert lint(plan(f"python -m vllm.entrypoints.openai.api_server --model /m {flag} 1")) == []


def test_real_sglang_flags_aliases_and_negations_are_accepted():
    for flag in ("--speculative-draft-model", "--tensor-parallel-size", "--no-lora-strict-loading", "--api-key",
                 "--max-running-requests", "--chunked-prefill-size", "--reasoning-parser"):
        assert lint(plan(f"python -m sglang.launch_server --model-path /m {flag} 1")) == [], flag


def test_flag_tables_are_generated_with_version_and_date():
    import tomllib

    for name, version, least in (("vllm", "0.32.0", 400), ("sglang", "0.5.14", 400)):
        data = tomllib.loads((ASSETS / "flags" / f"{name}.toml").read_text())
        assert data["source"]["version"] == version and data["source"]["generated"]
        assert sum(len(t["flags"]) for t in data["tools"].values()) >= least
        assert "GENERATED by `python tools/flaggen.py" in (ASSETS / "flags" / f"{name}.toml").read_text()


def test_vllm_dflash_draft_length_must_match_the_trained_block():
    """vLLM drafts num_speculative_tokens + 1 positions and never reads the drafter's block size."""
    train = "nodedeck-train train --mode dflash --block-size ${block} --out ${work}/d"
    serve = ("vllm serve /m --speculative-config "
             "'{\"method\": \"dflash\", \"num_speculative_tokens\": 16}'")
    v = 'work = "/w"\nblock = 16'
    errors = lint(plan(train, serve, vars_=v))
    assert len(errors) == 1 and "num_speculative_tokens + 1 = 17" in errors[0] and "--block-size 16" in errors[0]
    assert lint(plan(train, serve.replace("16}", "15}"), vars_=v)) == []
    dotted = "vllm serve /m --speculative-config.method dflash --speculative-config.num_speculative_tokens 7"
    errors = lint(plan(train, dotted, vars_=v))
    assert len(errors) == 1 and "= 8" in errors[0]
    assert lint(plan(train, dotted.replace(" 7", " 15"), vars_=v)) == []
    errors = lint(plan(train, serve.replace(', \"num_speculative_tokens\": 16', ""), vars_=v))
    assert len(errors) == 1 and "needs num_speculative_tokens" in errors[0]
    eagle = serve.replace("dflash", "eagle3").replace("16}", "3}")       # EAGLE-3 chains have no block
    assert lint(plan(train, eagle, vars_=v)) == []
    errors = lint(plan("vllm serve /m --speculative-config '{method: dflash}'"))
    assert len(errors) == 1 and "is not JSON" in errors[0]


def test_split_commands_operators_and_redirections():
    cmds = split_commands("a x > o1 && b 2>&1 | c >> o2; d < in")
    assert [c.words for c in cmds] == [("a", "x"), ("b",), ("c",), ("d",)]
    assert [c.redirected for c in cmds] == [("o1",), (), ("o2",), ()]


def test_flag_tables_record_the_checked_versions():
    tables = load_flag_tables()
    assert {"sglang.launch_server", "sglang.bench_serving", "vllm serve"} <= set(tables)
    assert "--tp-size" in tables["sglang.launch_server"].flags and "--tp" not in tables["sglang.launch_server"].flags
    assert all(t.checked_against and t.flags for t in tables.values())


def test_plan_check_cli_exits_2_with_one_line_per_problem(tmp_path, capsys):
    f = tmp_path / "old.toml"
    f.write_text(plan(OLD_SERVE))
    assert main(["plan", "check", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [(f"nodedeck: {f}:9: stage 's0': sglang.launch_server: --tp is an argparse abbreviation of "
                    "--tp-size: write the full flag name")]
    assert main(["plan", "check", *map(str, PLANS)]) == 0


@pytest.mark.parametrize("name", ["eagle3-sglang.toml", "dflash.toml"])
def test_sglang_servers_are_checked_without_generating(name):
    """/health_generate runs a real generation on every check (the dashboard re-checks while open): /health
    answers 503 while SGLang starts, and the log line proves its own warmup generation went through."""
    p = load_plan(ASSETS / "plans" / name)
    servers = [s for s in p.stages if s.command.startswith("python -m sglang.launch_server")]
    assert len(servers) == 2
    for s in servers:
        urls = [c.args["url"] for c in s.verify if c.kind == "http_ok"]
        assert urls and all(u.endswith("/health") for u in urls)
        assert any(c.kind == "log_contains" and "fired up" in c.args["pattern"] for c in s.verify)


def test_bundled_dflash_vllm_plan_serves_the_trained_block_and_check_refuses_a_mismatch():
    """dflash-vllm.toml's own train and serve commands: plan check passes them as bundled, and refuses the plan
    once the vLLM server's num_speculative_tokens and the trained block size disagree (either side edited)."""
    path = ASSETS / "plans" / "dflash-vllm.toml"
    text = path.read_text()
    p = load_plan(path)
    serve = p.stage("serve_dflash").command
    assert "--speculative-config.method dflash" in serve
    assert "--speculative-config.num_speculative_tokens ${num_draft_tokens}" in serve
    assert "--speculative-config.model ${work}/drafter/final" in serve
    assert "--block-size ${block_size}" in p.stage("train").command
    assert int(p.vars["num_draft_tokens"]) == int(p.vars["block_size"]) - 1
    assert lint_plan(parse_plan(text, "p.toml"), text, "p.toml") == []
    for old, new, block in (("num_draft_tokens = 15 ", "num_draft_tokens = 16 ", "17"),
                            ("block_size = 16 ", "block_size = 8 ", "16")):
        assert old in text
        bad = text.replace(old, new)
        errors = lint_plan(parse_plan(bad, "p.toml"), bad, "p.toml")
        assert len(errors) == 1 and "serve_dflash" in errors[0], errors
        assert f"num_speculative_tokens + 1 = {block}" in errors[0]
