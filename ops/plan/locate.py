"""Line numbers for plan errors that tomllib cannot give (it has none for values).

`SourceMap` scans the raw TOML text once: the line of each `[[stage]]` header,
of each `key =` line inside a table (per stage, per sub-table such as
`[stage.smoke]`), of each `[[stage.verify]]` header, and every `kind =`
occurrence, skipping the contents of multi-line strings and comments.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\[\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_\-]+)(\s*\.\s*("[^"]*"|'[^']*'|[A-Za-z0-9_\-]+))*\s*=""")
_KIND = re.compile(r"""(?<![A-Za-z0-9_\-])kind\s*=""")


def _norm_key(raw: str) -> str:
    parts = [p.strip().strip("\"'") for p in re.split(r"\.(?=(?:[^\"']*[\"'][^\"']*[\"'])*[^\"']*$)", raw)]
    return ".".join(parts)


@dataclass
class _Stage:
    header: int
    keys: dict[str, int] = field(default_factory=dict)            # stage-level key -> line
    sub_keys: dict[str, dict[str, int]] = field(default_factory=dict)  # "smoke" -> key -> line
    sub_headers: dict[str, list[int]] = field(default_factory=dict)    # "verify"/"smoke"/"smoke.verify" -> lines
    kinds: list[int] = field(default_factory=list)                 # every `kind =` line, in order
    end: int = 0


class SourceMap:
    """Where things are in a plan file's text (1-based lines)."""

    def __init__(self, text: str):
        self.n_lines = max(1, text.count("\n") + (0 if text.endswith("\n") else 1))
        self.top: dict[str, dict[str, int]] = {}     # "plan"/"vars"/"" -> key -> line
        self.top_headers: dict[str, int] = {}
        self.stages: list[_Stage] = []
        self._scan(text)

    def _scan(self, text: str) -> None:
        table = ""
        stage: _Stage | None = None
        sub = ""
        in_ml: str | None = None   # the delimiter of the multi-line string we are in
        for no, line in enumerate(text.splitlines(), start=1):
            if in_ml is not None:
                if line.count(in_ml) % 2 == 1:
                    in_ml = None
                continue
            code = _strip_comment(line)
            m = _HEADER.match(code)
            if m:
                name = _norm_key(m.group(2))
                double = m.group(1) == "[["
                if name == "stage" and double:
                    if stage is not None:
                        stage.end = no - 1
                    stage = _Stage(header=no)
                    self.stages.append(stage)
                    table, sub = "stage", ""
                elif name.startswith("stage.") and stage is not None:
                    table, sub = "stage", name[len("stage."):]
                    stage.sub_headers.setdefault(sub, []).append(no)
                else:
                    if stage is not None:
                        stage.end = no - 1
                    stage = None
                    table, sub = name, ""
                    self.top_headers.setdefault(name, no)
                continue
            km = _KEY.match(code)
            if km:
                key = _norm_key(code[: code.index("=")].strip())
                if table == "stage" and stage is not None:
                    if sub:
                        stage.sub_keys.setdefault(sub, {}).setdefault(key, no)
                    else:
                        stage.keys.setdefault(key, no)
                else:
                    self.top.setdefault(table, {}).setdefault(key, no)
            if stage is not None:
                stage.kinds.extend(no for _ in _KIND.finditer(_blank_strings(code)))
            for delim in ('"""', "'''"):
                if code.count(delim) % 2 == 1:
                    in_ml = delim
                    break
        if stage is not None:
            stage.end = self.n_lines

    # -- lookups (each falls back to something sensible) -------------------
    def plan_key(self, table: str, key: str | None = None) -> int:
        if key is not None and key in self.top.get(table, {}):
            return self.top[table][key]
        return self.top_headers.get(table, 1)

    def stage_line(self, index: int) -> int:
        return self.stages[index].header if index < len(self.stages) else 1

    def stage_key(self, index: int, key: str, sub: str = "") -> int:
        if index >= len(self.stages):
            return 1
        st = self.stages[index]
        if sub:
            if key in st.sub_keys.get(sub, {}):
                return st.sub_keys[sub][key]
            if sub in st.sub_headers:
                return st.sub_headers[sub][0]
            if sub in st.keys:
                return st.keys[sub]
            return st.header
        return st.keys.get(key, st.header)

    def line_of(self, loc: tuple[str | int, ...]) -> int:
        """The line of what sits at loc in the plan document (`("stage", 0, "verify", 1, "min_lines", "min")`)."""
        if len(loc) >= 2 and loc[0] == "stage" and isinstance(loc[1], int):
            i, rest = loc[1], loc[2:]
            if not rest:
                return self.stage_line(i)
            if rest[0] == "verify" and len(rest) > 1 and isinstance(rest[1], int):
                return self.check_line(i, "", rest[1])
            if rest[:2] == ("smoke", "verify") and len(rest) > 2 and isinstance(rest[2], int):
                return self.check_line(i, "smoke", rest[2])
            if rest[0] in ("smoke", "env") and len(rest) > 1:
                return self.stage_key(i, str(rest[1]), str(rest[0]))
            return self.stage_key(i, str(rest[0]))
        if len(loc) >= 2:
            return self.plan_key(str(loc[0]), str(loc[1]))
        key = str(loc[0]) if loc else ""
        return self.top.get("", {}).get(key) or self.top_headers.get(key, 1)

    def check_line(self, index: int, variant: str, n: int) -> int:
        """Line of check n of `verify` ("") or of the smoke's verify ("smoke")."""
        if index >= len(self.stages):
            return 1
        st = self.stages[index]
        table_key = "verify" if not variant else f"{variant}.verify"
        headers = st.sub_headers.get(table_key)
        if headers and n < len(headers):
            return headers[n]
        if not variant:
            start = st.keys.get("verify")
        else:
            start = st.sub_keys.get(variant, {}).get("verify") or st.keys.get(variant)
            if start is None and st.sub_headers.get(variant):
                start = st.sub_headers[variant][0]
        if start is None:
            return st.header
        after = [ln for ln in st.kinds if ln >= start]
        return after[n] if n < len(after) else start


def _strip_comment(line: str) -> str:
    """The line without a trailing # comment (a # inside a string is kept)."""
    quote = None
    i = 0
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 2
                continue
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return line[:i]
        i += 1
    return line


def _blank_strings(code: str) -> str:
    """Replace the contents of one-line strings by spaces, so `kind =` inside a command is not counted."""
    return re.sub(r'"(?:\\.|[^"\\])*"|\'[^\']*\'', lambda m: " " * len(m.group(0)), code)
