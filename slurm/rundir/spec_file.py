"""spec.json: the resolved spec a submit leaves in the run directory, and its strict reader.

`fthsdp submit` writes the spec with defaults filled in and overrides applied; the control plane
reads it back at start. A control plane started by hand may write only what it needs, so fields
may be missing, but every field present must be of the type its spec field has, and a whole spec
must also pass the spec's cross-field rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_type_hints

from slurm.errors import InputError
from slurm.rundir.paths import SPEC_FILE
from slurm.rundir.shape import an_object, bad, is_int, read_json, want


def check_spec_data(path: Path, data: Any) -> dict[str, Any]:
    """spec.json: every section an object, every field of the type its spec field has.

    Fields may be missing (a control plane started by hand writes only what it needs), but
    `replicas.count` must be there: it is what the control plane cannot guess.
    """
    from slurm.spec import parse_spec
    from slurm.spec.model import SECTIONS

    top = an_object(path, "the file", data)
    sections: Mapping[str, type] = SECTIONS
    for name, value in top.items():
        if name == "source":
            want(path, name, value, isinstance(value, str), "a string")
            continue
        if name not in sections:
            raise bad(path, f"unknown section {name!r} (allowed: {', '.join(sorted(sections))})")
        section = an_object(path, name, value)
        _check_fields(path, sections[name], name, section)
    replicas = top.get("replicas")
    if not isinstance(replicas, dict) or "count" not in replicas:
        raise bad(path, "lacks replicas.count")
    count = replicas["count"]
    want(path, "replicas.count", count, is_int(count) and count >= 1, "an integer >= 1")
    if {"job", "replicas", "train"} <= set(top):
        # A whole spec (what submit writes): its cross-field rules hold too.
        plain = {name: _without_nulls(table) for name, table in top.items() if name != "source"}
        try:
            parse_spec(plain)
        except InputError as exc:
            raise bad(path, str(exc)) from None
    return top


def _without_nulls(table: dict[str, Any]) -> dict[str, Any]:
    """`table` without its null fields, nested tables (replicas.helper) included: the spec
    writes unset optional fields as null, and the spec parser reads a missing one as unset."""
    kept = {k: v for k, v in table.items() if v is not None}
    return {k: _without_nulls(v) if isinstance(v, dict) else v for k, v in kept.items()}


def _check_fields(path: Path, cls: type, where: str, table: dict[str, Any]) -> None:
    from slurm.spec.coerce import coerce
    from slurm.spec.model import NESTED

    hints = get_type_hints(cls)
    for key, value in table.items():
        dotted = f"{where}.{key}"
        if key not in hints:
            raise bad(path, f"unknown field {dotted}")
        nested = NESTED.get((cls, key))
        if nested is not None:
            if value is not None:
                _check_fields(path, nested, dotted, an_object(path, dotted, value))
            continue
        if value is None:
            continue  # optional fields are written as null
        try:
            coerce(dotted, value, hints[key])
        except InputError as exc:
            raise bad(path, f"{dotted}: got {value!r:.60}; {exc.allowed}") from None


def read_spec_data(run_dir: Path) -> dict[str, Any] | None:
    """`run_dir/spec.json` checked field by field (None when there is none)."""
    path = Path(run_dir) / SPEC_FILE
    data = read_json(path)
    return None if data is None else check_spec_data(path, data)
