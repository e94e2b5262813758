"""`--set section.key=value` overrides, applied to raw spec data before it is validated.

An override is typed by the field it targets: a string field takes the text as is, any other
parses it as a TOML value, so a wrong type is reported against the field like one in the file.
"""

from __future__ import annotations

import tomllib
import types
from collections.abc import Mapping, Sequence
from typing import Any, Union, get_args, get_origin, get_type_hints

from slurm.errors import InputError
from slurm.spec.coerce import did_you_mean
from slurm.spec.model import NESTED, SECTIONS, JobSpec


def _field_type(path: list[str]) -> Any:
    """The type hint of the field a dotted override path targets (None = a free-form table)."""
    cls: type = JobSpec
    for k, key in enumerate(path):
        if cls is JobSpec:
            if key not in SECTIONS:
                raise InputError("--set", ".".join(path), did_you_mean(key, list(SECTIONS)))
            cls = SECTIONS[key]
            continue
        hints = get_type_hints(cls)
        if key not in hints:
            raise InputError("--set", ".".join(path), did_you_mean(key, list(hints)))
        nested = NESTED.get((cls, key))
        if nested is not None:
            cls = nested
            continue
        if get_origin(hints[key]) is Mapping:
            if k + 2 != len(path):
                raise InputError("--set", ".".join(path), f"{'.'.join(path[: k + 1])}.NAME=VALUE")
            return str
        if k + 1 != len(path):
            raise InputError("--set", ".".join(path), f"{'.'.join(path[: k + 1])} is not a table")
        return hints[key]
    raise InputError("--set", ".".join(path), "a field, not a section")


def _parse_literal(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply `section.key=value` overrides to raw spec data, typed by the target field.

    A string field takes the text as is; any other field parses it as a TOML value
    (`4`, `2.5`, `true`, `["a", "b"]`), so validation reports a wrong type against the field.
    """
    out: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    for item in overrides:
        key, sep, text = item.partition("=")
        path = key.strip().split(".")
        if not sep or not all(path):
            raise InputError("--set", item, "KEY=VALUE, e.g. replicas.count=4")
        tp = _field_type(path)
        accepts_str = tp is str or (
            get_origin(tp) in (Union, types.UnionType) and str in get_args(tp)
        )
        value: Any = _parse_literal(text)
        if accepts_str and not isinstance(value, list):
            value = text
        node = out
        for part in path[:-1]:
            child = node.get(part)
            child = dict(child) if isinstance(child, dict) else {}
            node[part] = child
            node = child
        node[path[-1]] = value
    return out
