"""Static checks of a parsed plan's commands, run by `nodedeck plan check` (nothing is started).

- Paths a command writes through an output flag (`--output-file`, `--output-dir`, `--output`,
  `--out`, `-o`) or a shell redirection (`>`, `>>`) need their directory: it must be a declared
  output of the stage (the scheduler creates the parent of every declared output) or lie in a
  directory the command itself creates (`mkdir -p DIR` earlier in the same command line).
  `nodedeck-train` steps create their own output directories and are not checked.
- `python -m sglang.launch_server`, `python -m sglang.bench_serving` and `vllm serve` (or `python -m
  vllm.entrypoints.openai.api_server`) may use only the flags in assets/flags/*.toml, generated from
  the engines' own parsers of the pinned versions (`python tools/flaggen.py`): an unknown flag is
  an error naming the closest real one, and so is an argparse abbreviation such as `--tp` for `--tp-size`.
- SGLang's benchmark module is the one of the pinned version (`sglang.bench_serving` in 0.5.14,
  `sglang.benchmark.serving` in later releases); a ShareGPT benchmark without `--dataset-path`
  downloads ShareGPT from the model hub at run time.
- A stage on several nodes (`nodes`) runs its command under torchrun on each node already: its
  command must not start torchrun itself.
- A DFLASH server given a block size (`--speculative-dflash-block-size` or
  `--speculative-num-draft-tokens`) must agree with the `--block-size` the plan trains the
  DFlash drafter with (SGLang otherwise takes it from the drafter's config.json). vLLM does not
  read the block size: its `--speculative-config` (JSON, or the dotted
  `--speculative-config.num_speculative_tokens`) with method `dflash` must set
  `num_speculative_tokens` to the trained block size - 1 (it drafts that many + 1 positions).
- A server's `port` comes to a TCP port, and no two servers on one node listen on the same one.
- `vllm bench serve` names its `--temperature`: vLLM's benchmark no longer decodes greedily by default
  (it says so in a warning), so an acceptance length it measures unasked is a sampled one.

Every problem is one line `FILE:LINE: stage 'ID': message`.
"""

from __future__ import annotations

import difflib
import json
import posixpath
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ops.paths import ASSETS
from ops.plan.command_words import ASSIGN, SimpleCommand, flags_of, split_commands, tool_of, vllm_option
from ops.plan.locate import SourceMap
from ops.plan.records import VAR_RE, Finding, Plan, Stage, tcp_port
from ops.plan.shelltext import substitute
from ops.served import speculative_config

FLAGS_DIR = ASSETS / "flags"
OUTPUT_FLAGS = ("--output-file", "--output-dir", "--output", "--out", "-o")
_SGLANG_BENCH = ("sglang.bench_serving", "sglang.benchmark.serving")
"""SGLang's benchmark module, by release; the flag tables hold the pinned release's."""
_SAME_PARSER = {"vllm.entrypoints.openai.api_server": "vllm serve"}
"""Modules that parse their arguments with a tool's parser."""


@dataclass(frozen=True)
class FlagTable:
    """The flags one tool may be given, and where they were checked."""

    tool: str                  # "sglang.launch_server", "sglang.bench_serving", "vllm serve"
    flags: frozenset[str]
    checked_against: str       # e.g. "sgl-project/sglang 0.5.14, python/sglang/srt/server_args.py"
    table: str                 # the assets file, for messages
    version: str = "?"         # e.g. "sglang 0.5.14"
    accepts_underscores: bool = False
    """vLLM's parser takes `--max_model_len` for `--max-model-len` (and the dotted keys as written)."""


def load_flag_tables(folder: Path = FLAGS_DIR) -> dict[str, FlagTable]:
    """Every tool's flag table from `folder/*.toml`."""
    tables: dict[str, FlagTable] = {}
    for f in sorted(folder.glob("*.toml")):
        data = tomllib.loads(f.read_text(encoding="utf-8"))
        src = data.get("source", {})
        for tool, spec in data.get("tools", {}).items():
            tables[tool] = FlagTable(tool, frozenset(spec["flags"]),
                                     f"{src.get('project', '?')} {src.get('version', '?')}, {spec.get('file', '?')}",
                                     f"assets/flags/{f.name}", f"{f.stem} {src.get('version', '?')}",
                                     bool(spec.get("accepts_underscores", False)))
    return tables


# torchrun's options that take a value, by name or name prefix (--nproc-per-node, --rdzv-endpoint, ...);
# the others (--standalone, --no-python, --run-path) are switches
def _vllm_accepts(flags: frozenset[str], name: str) -> bool:
    """`--x.key[.deeper]` of a JSON option: its key is a field of the option's config (or the option takes any
    JSON object: `--x.*`); `-O3` is `--optimization-level 3`."""
    if name in flags:
        return True
    if name.startswith("-O") and not name.startswith("--"):
        return "--optimization-level" in flags
    parts = name.split(".")
    return len(parts) > 1 and (f"{parts[0]}.{parts[1]}" in flags or f"{parts[0]}.*" in flags)


class _Expander:
    """Plan variables substituted (builtins such as ${root} stay as they are), for comparing paths; in a
    command (`shell`) as the stage gets them: `${name}` one shell-quoted word, `${name:raw}` as it is."""

    def __init__(self, plan: Plan):
        self.vars = dict(plan.vars)

    def __call__(self, text: str, depth: int = 0) -> str:
        if depth > 20:
            return text
        return VAR_RE.sub(lambda m: self(self.vars[m.group(1)], depth + 1) if m.group(1) in self.vars
                          else m.group(0), text)

    def shell(self, command: str) -> str:
        return substitute(command, lambda name: self(self.vars[name]) if name in self.vars else f"${{{name}}}",
                          shell=True)


def _norm(p: str) -> str:
    return posixpath.normpath(p) if p else p


def _covered(path: str, made: set[str]) -> bool:
    """Whether the directory of `path` exists once the directories in `made` are (mkdir -p) created."""
    parent = posixpath.dirname(path)
    if not parent or parent in ("/", "."):
        return True
    return any(d == parent or d.startswith(parent.rstrip("/") + "/") for d in made)


class PlanLinter:
    """The static checks of one plan; `run()` returns every problem as one line."""

    def __init__(self, plan: Plan, text: str, filename: str, tables: dict[str, FlagTable] | None = None):
        self.plan = plan
        self.map = SourceMap(text)
        self.file = filename
        self.tables = load_flag_tables() if tables is None else tables
        self.expand = _Expander(plan)
        self.errors: list[Finding] = []

    def err(self, line: int, stage: str, message: str) -> None:
        self.errors.append(Finding(self.file, line, message, stage))

    def run(self) -> list[Finding]:
        trained_blocks: list[tuple[str, str]] = []    # (stage id, --block-size value) of DFlash trainings
        dflash_servers: list[tuple[int, str, str, str]] = []  # (line, stage id, flag, value)
        for i, stage in enumerate(self.plan.stages):
            variants = [(stage.command, self.map.stage_key(i, "command"), self._declared(stage, False))]
            if stage.smoke is not None and stage.smoke.command != stage.command:
                variants.append((stage.smoke.command, self.map.stage_key(i, "command", "smoke"),
                                 self._declared(stage, True)))
            for command, line, declared in variants:
                for cmd in split_commands(self.expand.shell(command)):
                    self._command(stage, line, cmd, trained_blocks, dflash_servers)
                    if stage.nodes:
                        self._no_torchrun(stage, line, cmd)
                self._outputs(stage, line, command, declared)
        self._dflash(trained_blocks, dflash_servers)
        self._ports()
        return list(dict.fromkeys(self.errors))     # a smoke variant repeats its stage's command

    def _ports(self) -> None:
        """A server's `port` comes to a TCP port with the plan's [vars]; two servers on one node never share one."""
        seen: dict[tuple[str | None, int], str] = {}
        for i, stage in enumerate(self.plan.stages):
            if stage.port is None:
                continue
            line, value = self.map.stage_key(i, "port"), self.expand(stage.port)
            port = tcp_port(value)
            if port is None:
                if "${" not in value:     # a builtin such as ${node.name} is known on the node only
                    source = f" (from {json.dumps(stage.port)})" if value != stage.port else ""
                    self.err(line, stage.id, f"port is {json.dumps(value)}{source}: expected a TCP port, 1 to 65535")
                continue
            other = seen.setdefault((stage.node or self.plan.node, port), stage.id)
            if other != stage.id:
                self.err(line, stage.id, f"port {port} is stage '{other}' port too: two servers cannot listen on one")

    def _declared(self, stage: Stage, smoke: bool) -> set[str]:
        paths = set(stage.outputs)
        if smoke and stage.smoke is not None:
            paths |= {c.args["path"] for c in stage.smoke.verify if c.kind == "file_exists" and c.args.get("fresh")}
        return {_norm(self.expand(p)) for p in paths}

    def _command(self, stage, line, cmd: SimpleCommand, trained_blocks, dflash_servers) -> None:
        tool, start = tool_of(cmd.words)
        if tool is None:
            return
        args = cmd.words[start:]
        tool = _SAME_PARSER.get(tool, tool)
        if tool in _SGLANG_BENCH and tool not in self.tables:
            pinned = next((t for t in _SGLANG_BENCH if t in self.tables), None)
            if pinned is not None:
                found = self.tables[pinned]
                self.err(line, stage.id, f"python -m {tool} is not in {found.version} ({found.table}): "
                                         f"use python -m {pinned}")
                tool = pinned
        flags = flags_of(args)
        table = self.tables.get(tool)
        if table is not None:
            for name, _ in flags:
                self._flag(stage, line, table, name)
        if tool in _SGLANG_BENCH:
            given = dict(flags)
            if given.get("--dataset-name", "sharegpt") == "sharegpt" and not given.get("--dataset-path"):
                self.err(line, stage.id, f"{tool}: --dataset-name sharegpt without --dataset-path downloads "
                                         "ShareGPT from the model hub at run time: give --dataset-path to a file "
                                         "the plan writes")
        if tool == "sglang.launch_server":
            given = dict(flags)
            if str(given.get("--speculative-algorithm", "")).upper() == "DFLASH":
                for f in ("--speculative-dflash-block-size", "--speculative-num-draft-tokens"):
                    if given.get(f):
                        dflash_servers.append((line, stage.id, f, given[f]))
        if tool == "vllm serve":
            self._vllm_spec(stage, line, flags, dflash_servers)
        if tool == "vllm bench serve" and "--temperature" not in dict(flags):
            self.err(line, stage.id, "vllm bench serve: no --temperature: vLLM's benchmark samples at the model's "
                                     "default temperature (SGLang's is greedy): give --temperature 0 to measure "
                                     "greedy acceptance, as the evaluation does, or the temperature you serve at")
        if posixpath.basename(tool) == "nodedeck-train" and args[:1] == ("train",):
            given = dict(flags_of(args[1:]))
            if given.get("--mode") == "dflash":
                trained_blocks.append((stage.id, given.get("--block-size") or ""))

    def _vllm_spec(self, stage, line, flags, dflash_servers) -> None:
        """A vLLM DFlash server's draft length, from --speculative-config JSON or its dotted sub-options."""
        try:
            spec = speculative_config(flags)
        except ValueError as e:
            self.err(line, stage.id, f"vllm serve: {e}")
            return
        if str(spec.get("method", "")).lower() != "dflash":
            return
        n = spec.get("num_speculative_tokens")
        if n is None:
            self.err(line, stage.id, "vllm serve: a dflash --speculative-config needs num_speculative_tokens "
                                     "(the drafter's block size - 1: vLLM does not read the block size)")
            return
        try:
            block = str(int(n) + 1)
        except (TypeError, ValueError):
            block = f"{n}+1"
        dflash_servers.append((line, stage.id, "num_speculative_tokens + 1 =", block))

    def _no_torchrun(self, stage, line, cmd: SimpleCommand) -> None:
        words = [w for w in cmd.words if not ASSIGN.match(w)]
        if words and posixpath.basename(words[0]) == "torchrun":
            self.err(line, stage.id, "a stage with nodes runs its command under torchrun on each node (--nnodes, "
                                     "--node-rank, the rendezvous): write what each worker runs, without torchrun")

    def _flag(self, stage, line, table: FlagTable, name: str) -> None:
        if table.accepts_underscores:
            name = vllm_option(name)
            if _vllm_accepts(table.flags, name):
                return
        if name in table.flags:
            return
        longer = sorted(f for f in table.flags if f.startswith(name) and name.startswith("--"))
        if longer:
            self.err(line, stage.id, f"{table.tool}: {name} is an argparse abbreviation of {longer[0]}: "
                                     f"write the full flag name")
            return
        close = difflib.get_close_matches(name, sorted(table.flags), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}? " if close else ""
        self.err(line, stage.id, f"{table.tool}: unknown flag {name} ({hint}{table.version} accepts no such option: "
                                 f"{table.table}, generated from {table.checked_against})")

    def _outputs(self, stage, line, command: str, declared: set[str]) -> None:
        made = {posixpath.dirname(d) for d in declared}   # the scheduler creates these
        for cmd in split_commands(self.expand.shell(command)):
            tool, start = tool_of(cmd.words)
            if tool == "mkdir":
                made |= {_norm(w) for w in cmd.words[start:] if not w.startswith("-")}
                continue
            written = list(cmd.redirected)
            if tool is not None and posixpath.basename(tool) != "nodedeck-train":
                written += [v for f, v in flags_of(cmd.words[start:]) if f in OUTPUT_FLAGS and v]
            for p in written:
                p = _norm(p)
                if p.startswith("/dev/") or p in declared or _covered(p, made):
                    continue
                self.err(line, stage.id, f"writes {p} but nothing creates {posixpath.dirname(p)}: "
                                         f"declare it in outputs or mkdir -p its directory first")

    def _dflash(self, trained_blocks, dflash_servers) -> None:
        for line, sid, flag, value in dflash_servers:
            for train_id, block in trained_blocks:
                if not block:
                    self.err(line, sid, f"DFLASH server sets {flag} {value} but stage '{train_id}' trains the drafter "
                                        "without --block-size: give the training its --block-size"
                                        + ("" if flag.startswith("num_") else
                                           f" (or drop {flag}: SGLang reads it from the drafter's config.json)"))
                elif block != value:
                    self.err(line, sid, f"DFLASH server sets {flag} {value} but stage '{train_id}' trains the drafter "
                                        f"with --block-size {block}")


def lint_plan(plan: Plan, text: str, filename: str, tables: dict[str, FlagTable] | None = None) -> list[str]:
    """Every static problem of a parsed plan (whose file text is `text`), one line each."""
    return [str(f) for f in PlanLinter(plan, text, filename, tables).run()]


def lint_file(plan: Plan, path: str | Path) -> list[str]:
    """`lint_plan` for a plan loaded from `path`."""
    return lint_plan(plan, Path(path).read_text(encoding="utf-8"), str(path))
