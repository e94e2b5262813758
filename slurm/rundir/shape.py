"""How a run file is read and its shape checked: the error every strict reader raises.

Every file of a run directory is read by a pure loader that checks its whole shape before
anything acts on it: a missing, empty, truncated or hand-edited file is a `RunFileError` (an
`InputError`) naming the file and what is wrong, one line, exit 2; never a traceback and never a
half-understood record that a command would drain or requeue by. The helpers here are what those
loaders (`jobs`, `control`, `spec_file`, `spares`, `secret`) share.

A run file is trusted only when it is this user's own and nobody else can write it
(`read_trusted`): the supervisors and the coordinator act on what control.json, jobs.json,
spares.json and spec.json say and sign with the secret, so a file another user wrote or could
rewrite (in a folder they could write, say) is refused like a corrupt one. The check is made on
the open file (`fstat`), so what is checked is what is read.
"""

from __future__ import annotations

import json
import os
import stat
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


def trust_problem(st: os.stat_result, private: bool = False) -> str | None:
    """Why a run file with this status is not to be trusted, or None: not a plain file, not
    this user's, or writable by group or others (readable by them too, when `private`)."""
    if stat.S_ISDIR(st.st_mode):
        return "is a directory, not a file"
    if not stat.S_ISREG(st.st_mode):
        return "is not a plain file"
    me = os.geteuid()
    if st.st_uid != me:
        return f"is owned by uid {st.st_uid}, not by this user (uid {me}): not this run's file"
    mode = stat.S_IMODE(st.st_mode)
    if mode & (0o077 if private else 0o022):
        wanted = "0600" if private else "0600, or at least not writable by group or others"
        return f"has mode {mode:04o}; it must be {wanted}"
    return None


def read_trusted(path: Path, private: bool = False) -> str | None:
    """The text of run file `path`, None when it does not exist; `RunFileError` when it cannot
    be read or is not to be trusted (`trust_problem`, judged on the file opened)."""
    try:
        # O_NONBLOCK: a FIFO in its place is refused below instead of blocking the open.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise bad(path, "is a directory, not a file") from None
    except OSError as exc:
        raise bad(path, f"cannot be read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        problem = trust_problem(os.fstat(fd), private)
        if problem:
            raise bad(path, problem)
        try:
            return f.read().decode()
        except (OSError, UnicodeDecodeError) as exc:
            raise bad(path, f"cannot be read ({exc})") from None


def read_json(path: Path, missing: str | None = None) -> Any:
    """The JSON value of `path`, a trusted run file (`read_trusted`). A missing file is an
    InputError saying `missing` (what was expected there), or None when `missing` is None;
    unreadable, untrusted, empty or bad JSON is too."""
    text = read_trusted(Path(path))
    if text is None:
        if missing is None:
            return None
        raise InputError("RUN_DIR", str(Path(path).parent), missing)
    return parse_json_file(path, text)
