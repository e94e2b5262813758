"""The one error type for bad input, shared by every part of fthsdp.

A user who mistypes a spec field, a CLI option or a config value should get one line that names
the field, the value given and what is allowed, and exit code 2. Library code raises
`InputError`; the CLI turns it into that line. Keeping the type in `slurm/` (the lightest part,
imported by all others) lets the prolog, the runtime and the simulator raise it without
importing each other.
"""

from __future__ import annotations

from typing import Any


class InputError(ValueError):
    """Bad input from a user: a spec field, an option, a config value, an environment variable."""

    def __init__(self, field: str, value: Any, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}: got {value!r}; {allowed}")


class EnvironmentProblem(RuntimeError):
    """The machine lacks something fthsdp needs (not root, a binary missing, a port in use)."""
