"""The user's files declared once as pydantic models (a plan, nodes.toml), and their errors as typed `Problem`s.

A file's schema is a tree of `Table`s: unknown keys are refused and nothing is coerced (TOML's own types are
what a key gets: "3" is no integer). A type says what it must be in words with `must("an integer >= 0")`; a
rule beyond types raises `broken(how, text)`. `validate` returns every problem of the document at once, each
with its path in the document (`loc`), from which the file's reader finds the line and words the message.
The JSON Schema of a declaration is pydantic's `model_json_schema()`.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WrapValidator
from pydantic_core import PydanticCustomError

from ops.inputfile import too_deep

How = Literal["must", "is", "at", "say", "missing", "unknown", "tag"]
"""must: `KEY must be TEXT, got VALUE`; is: `KEY TEXT`; at: `KEY: TEXT`; say: TEXT alone; missing: `KEY is
required`; unknown: a key the table does not take (`known` lists those it does); tag: a table whose `kind`
names no known kind (`known` lists them)."""

_SEP = "\x1f"   # between the problems one error carries (a value's repr never holds it)
_TYPES = {"string_type": "a string", "int_type": "an integer", "float_type": "a number", "bool_type": "a boolean",
          "list_type": "an array", "dict_type": "a table", "model_type": "a table", "model_attributes_type": "a table"}


class Table(BaseModel):
    """A TOML table of a user's file: unknown keys refused, values taken as TOML typed them."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a document: where (`loc`, keys and indexes), how, and the value found there."""

    loc: tuple[str | int, ...]
    how: How
    text: str = ""
    got: Any = None
    known: tuple[str, ...] = ()


def brief(value: Any) -> str:
    """A value for a one-line message: its repr on one line, at most 40 characters."""
    if too_deep(value, 4):
        return "(a value nested deeper than 4 levels)"
    text = repr(value).replace("\n", "\\n").replace("\r", "\\r")
    return text if len(text) <= 40 else text[:37] + "..."


def broken(how: How, *texts: str) -> PydanticCustomError:
    """The error a validator raises for broken rules (each text one problem), worded as `how` says."""
    return PydanticCustomError(how, _SEP.join(texts))


def must(phrase: str) -> WrapValidator:
    """Any error inside the value becomes one: `KEY must be PHRASE, got VALUE`."""
    def wrap(value: Any, handler: Any) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise broken("must", phrase) from None
    return WrapValidator(wrap)


def listed(value: Any) -> Any:
    """A lone string or table where an array of them may be given: the array of it."""
    return [value] if isinstance(value, (str, dict)) else value


Text = Annotated[str, Field(pattern=r"\S"), must("a non-empty string")]


def validate(model: type[Table], data: Any, context: Any = None) -> tuple[Table | None, list[Problem]]:
    """(the document as `model`, no problems) or (None, every problem found)."""
    try:
        return model.model_validate(data, context=context), []
    except ValidationError as e:
        found = [_problem(model, err) for err in e.errors(include_url=False)]
    return None, [replace(p, text=text) for p in found for text in p.text.split(_SEP)]


def _problem(model: type[Table], err: Any) -> Problem:
    loc, kind, got = tuple(err["loc"]), err["type"], err.get("input")
    if kind in typing.get_args(How):
        return Problem(loc, kind, err["msg"], got)
    if kind == "missing":
        return Problem(loc, "missing")
    if kind == "extra_forbidden":
        return Problem(loc, "unknown", str(loc[-1]), got, _keys(_table_at(model, loc[:-1])))
    if kind.startswith("union_tag"):
        known = tuple(t.strip(" '") for t in err.get("ctx", {}).get("expected_tags", "").split(","))
        tag = got.get("kind") if isinstance(got, dict) else None
        return Problem(loc, "tag", "", tag, known)
    if kind in _TYPES:
        return Problem(loc, "must", _TYPES[kind], got)
    return Problem(loc, "at", err["msg"][:1].lower() + err["msg"][1:], got)


def _keys(table: type[Table] | None) -> tuple[str, ...]:
    return tuple(sorted(table.model_fields)) if table is not None else ()


def _table_at(model: type[Table], loc: tuple[str | int, ...]) -> type[Table] | None:
    """The Table class that holds the value at loc (for an unknown key: the keys it takes)."""
    hint: Any = model
    for part in loc:
        hint = _strip(hint)
        if isinstance(hint, type) and issubclass(hint, BaseModel):
            field = hint.model_fields.get(str(part))
            if field is None:
                return None
            hint = field.annotation
            continue
        args = [_strip(a) for a in typing.get_args(hint)]
        origin = typing.get_origin(hint)
        if origin in (list, tuple) and args:
            hint = args[0]
        elif origin is dict and len(args) == 2:
            hint = args[1]
        else:   # a union of tables: the one whose `kind` is this part
            hint = next((a for a in args if _kind_of(a) == (part,)), None)
    hint = _strip(hint)
    return hint if isinstance(hint, type) and issubclass(hint, Table) else None


def _kind_of(hint: Any) -> tuple:
    """The values of a table's `kind` (its Literal), or ()."""
    field = hint.model_fields.get("kind") if isinstance(hint, type) and issubclass(hint, BaseModel) else None
    return typing.get_args(field.annotation) if field is not None else ()


def _strip(hint: Any) -> Any:
    """hint without Annotated[...] and `| None`; a union of several types stays a union."""
    while True:
        if typing.get_origin(hint) is typing.Annotated:
            hint = typing.get_args(hint)[0]
            continue
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            rest = [a for a in typing.get_args(hint) if a is not type(None)]
            if len(rest) == 1:
                hint = rest[0]
                continue
        return hint
