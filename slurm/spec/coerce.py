"""TOML data to a `JobSpec`: every value checked against the type of the field it fills.

The parser is driven by the schema (the section dataclasses and their type hints), so a new
field needs no parsing code. A key no section has is an error with a did-you-mean (the whitelist
idea from submitit, applied to a whole spec); a value of the wrong type names the type expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
from collections.abc import Mapping, Sequence
from typing import Any, Union, get_args, get_origin, get_type_hints

from slurm.errors import InputError
from slurm.spec.model import NESTED, SECTIONS, JobSpec


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "none"
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp) if a is not type(None))
    if origin is tuple:
        return f"list of {_type_name(get_args(tp)[0])}"
    if origin is Mapping:
        return "table of strings"
    names = {int: "integer", float: "number", str: "string", bool: "true/false"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def coerce(where: str, value: Any, tp: Any) -> Any:
    """Check `value` (from TOML) against the field type `tp`; return it in the field's form."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        errors = []
        for alt in get_args(tp):
            if alt is type(None):
                continue
            try:
                return coerce(where, value, alt)
            except InputError as exc:
                errors.append(exc)
        raise InputError(where, value, f"expected {_type_name(tp)}")
    if origin is tuple:
        if isinstance(value, str) and where.endswith("setup"):
            value = [value]
        if not isinstance(value, list):
            raise InputError(where, value, f"expected {_type_name(tp)}")
        inner = get_args(tp)[0]
        return tuple(coerce(f"{where}[{k}]", v, inner) for k, v in enumerate(value))
    if origin is Mapping:
        if not isinstance(value, dict):
            raise InputError(where, value, "expected a table of string values")
        out = {}
        for k, v in value.items():
            if isinstance(v, bool) or not isinstance(v, str | int | float):
                raise InputError(f"{where}.{k}", v, "expected a string (or number)")
            out[k] = str(v)
        return out
    if tp is bool:
        if not isinstance(value, bool):
            raise InputError(where, value, "expected true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(where, value, "expected an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InputError(where, value, "expected a number")
        return float(value)
    if tp is str:
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and where.endswith(("time", "_wait"))
        ):
            return str(value)  # `time = 30` means 30 minutes, as in sbatch
        if not isinstance(value, str):
            raise InputError(where, value, "expected a string")
        return value
    raise TypeError(f"unsupported field type {tp!r}")  # pragma: no cover - schema bug


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    close = close or sorted(c for c in choices if c.startswith(word) or word.startswith(c))[:1]
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"allowed keys: {', '.join(sorted(choices))}{hint}"


def _build(cls: type, where: str, table: Any) -> Any:
    if not isinstance(table, dict):
        raise InputError(where, table, "expected a table")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "source"}
    for key in table:
        if key not in fields:
            raise InputError(
                f"{where}.{key}" if where else key, key, did_you_mean(key, list(fields))
            )
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        dotted = f"{where}.{name}" if where else name
        if name not in table:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise InputError(dotted, None, "required")
            continue
        nested = NESTED.get((cls, name)) or (SECTIONS.get(name) if cls is JobSpec else None)
        if nested is not None:
            kwargs[name] = _build(nested, dotted, table[name])
        else:
            kwargs[name] = coerce(dotted, table[name], hints[name])
    return cls(**kwargs)


def parse_spec(data: Mapping[str, Any], source: str = "") -> JobSpec:
    """Validate a spec given as plain data (what tomllib returns)."""
    spec: JobSpec = _build(JobSpec, "", dict(data))
    return dataclasses.replace(spec, source=source) if source else spec
