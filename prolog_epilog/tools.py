"""Run an external tool (nvidia-smi, dcgmi, dmesg) under a hard timeout.

`nvidia-smi` hanging on a dying GPU is a real failure mode, and a wrapper script can leave a
grandchild holding the output pipe. So every tool runs in its own session, and on timeout the
whole process group is killed with SIGKILL; the final wait is bounded too (a process stuck in
uninterruptible sleep cannot be reaped, and the runner's per-check thread timeout is the last
line of defence). Nothing in `prolog_epilog` starts a process any other way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass


class ToolError(RuntimeError):
    """The tool could not run, timed out, or failed; the message is one short line."""


@dataclass(frozen=True)
class ToolResult:
    returncode: int
    stdout: str
    stderr: str


def run_tool(
    argv: Sequence[str],
    timeout: float,
    ok_codes: Sequence[int] = (0,),
    env: dict[str, str] | None = None,
) -> ToolResult:
    """Run `argv`; raise ToolError on timeout, a missing binary or an exit code not in ok_codes."""
    if timeout <= 0:
        raise ToolError(f"{os.path.basename(argv[0])}: no time left in the budget")
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
            env=env,
        )
    except FileNotFoundError:
        raise ToolError(f"{argv[0]}: not found") from None
    except OSError as exc:
        raise ToolError(f"{argv[0]}: {exc.strerror or exc}") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=1.0)
        raise ToolError(f"{os.path.basename(argv[0])} timed out after {timeout:.1f}s") from None
    if proc.returncode not in ok_codes:
        last = (err or out).strip().splitlines()[-1:] or [""]
        raise ToolError(f"{os.path.basename(argv[0])} exited {proc.returncode}: {last[0][:120]}")
    return ToolResult(proc.returncode, out, err)
