"""How a run file is read and its shape checked: the error every strict reader raises.

Every file of a run directory is read by a pure loader that checks its whole shape before
anything acts on it: a missing, empty, truncated or hand-edited file is a `RunFileError` (an
`InputError`) naming the file and what is wrong, one line, exit 2; never a traceback and never a
half-understood record that a command would drain or requeue by. The helpers here are what those
loaders (`jobs`, `control`, `spec_file`) share.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slurm.errors import InputError


class RunFileError(InputError):
    """A run file that is missing a part, corrupt or of the wrong shape: `PATH: problem`."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(str(path), None, problem)

    def __str__(self) -> str:
        return f"{self.field}: {self.allowed}"


def bad(path: Path, problem: str) -> InputError:
    return RunFileError(path, problem)


def parse_json_file(path: Path, text: str) -> Any:
    """The JSON value in `text` (the contents of `path`); InputError when empty or not JSON."""
    if not text.strip():
        raise bad(path, "the file is empty (a crash while it was written?)")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise bad(path, f"not valid JSON ({exc})") from None


def type_of(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false"}.get(
        type(value), "a number" if isinstance(value, int | float) else "null"
    )


def want(path: Path, where: str, value: Any, ok: bool, wanted: str) -> None:
    if not ok:
        raise bad(path, f"{where} must be {wanted}, not {type_of(value)} {value!r:.60}")


def an_object(path: Path, where: str, value: Any) -> dict[str, Any]:
    want(path, where, value, isinstance(value, dict), "an object")
    out: dict[str, Any] = value
    return out


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def read_json(path: Path, missing: str | None = None) -> Any:
    """The JSON value of `path`. A missing file is an InputError saying `missing` (what was
    expected there), or None when `missing` is None; unreadable, empty or bad JSON is too."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        if missing is None:
            return None
        raise InputError("RUN_DIR", str(Path(path).parent), missing) from None
    except IsADirectoryError:
        raise bad(path, "is a directory, not a file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise bad(path, f"cannot be read ({exc})") from None
    return parse_json_file(path, text)
