"""What fthsdp gives a foreign torchft trainer (`[train] mode = "torchft"`), and how it reads one.

A foreign trainer sends fthsdp nothing. Its replica supervisor (Slurm) or `fthsdp run --local`
fills in the environment torchft and torchrun expect (`group_env`) and learns the group's step
from what the trainer already writes: group rank 0's output lines matched by
`[train] progress_regex` (named group `step`; `LineProgress`), or the JSONL file
`[train] progress_file` with a `step` field (`FileProgress`). Everything here is pure or reads
only what the run itself wrote; no torch import.

Under `srun --label` every output line starts with its task id (`0: ...`); only task 0's lines
count, since a trainer's other ranks may print other ranks' steps.

`stop_leftovers` finds the processes a step left behind (a torchrun worker survives its agent's
`kill -9`: it runs in its own session) by the step's incarnation in their environment and kills
them, so a dead group never keeps training as a ghost replica.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from slurm import contract
from slurm.contract import dump_dir

log = logging.getLogger("fthsdp.foreign")

#: `srun --label`'s prefix: the task id, a colon and a space.
TASK_LABEL = re.compile(r"^\s*(\d+): ")


def progress_path(template: str, run_dir: Path, replica: int) -> Path:
    """`[train] progress_file` with `{dump_dir}` and `{replica}` filled in (relative paths are
    under the run directory)."""
    path = Path(template.format(dump_dir=dump_dir(run_dir, replica), replica=replica))
    return path if path.is_absolute() else run_dir / path


@dataclass(frozen=True)
class GroupEndpoints:
    """One launch's dynamic values: the Lighthouse and the group's own rendezvous."""

    lighthouse: str
    master_addr: str
    master_port: int


def launch_env(found: GroupEndpoints) -> dict[str, str]:
    """The torchft-mode variables of one launch (the Lighthouse can move with the control job;
    the rendezvous port is picked free per launch)."""
    endpoint = f"{found.master_addr}:{found.master_port}"
    return {
        contract.TORCHFT_LIGHTHOUSE: found.lighthouse,
        contract.MASTER_ADDR: found.master_addr,
        contract.MASTER_PORT: str(found.master_port),
        contract.RDZV_ENDPOINT: endpoint,
    }


class LineProgress:
    """The step from group rank 0's output lines (`[train] progress_regex`)."""

    def __init__(self, pattern: str) -> None:
        self.pattern = re.compile(pattern)
        self.step: int | None = None

    def feed(self, line: str) -> int | None:
        """The step this line announces (None if it announces none); keeps the highest."""
        label = TASK_LABEL.match(line)
        if label is not None:
            if label.group(1) != "0":
                return None
            line = line[label.end() :]
        found = self.pattern.search(line)
        if found is None:
            return None
        try:
            step = int(found.group("step"))
        except (TypeError, ValueError):
            return None
        if step < 0:
            return None
        self.step = step if self.step is None else max(self.step, step)
        return step


class FileProgress:
    """The step from a JSONL file a trainer appends to (`[train] progress_file`).

    Only whole lines are read; a line that is not a JSON object with an integer `step` is
    skipped with one warning per file (the trainer's file, not ours to fail on). A file that
    shrank was rewritten by a new launch and is read again from the start.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.step: int | None = None
        self._warned = False

    def poll(self) -> int | None:
        """Read what was appended; returns the highest step seen so far (None before any)."""
        try:
            size = self.path.stat().st_size
            if size < self.offset:
                self.offset = 0
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read(1 << 20)
        except OSError:
            return self.step
        end = chunk.rfind(b"\n")
        if end < 0:
            return self.step
        self.offset += end + 1
        for raw in chunk[:end].splitlines():
            step = _json_step(raw)
            if step is None:
                if raw.strip() and not self._warned:
                    log.warning("%s: line without an integer 'step': %.80r", self.path, raw)
                    self._warned = True
                continue
            self.step = step if self.step is None else max(self.step, step)
        return self.step


def _json_step(raw: bytes) -> int | None:
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    step = data.get("step") if isinstance(data, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return None
    return step


def marked_processes(var: str, value: str, proc: Path = Path("/proc")) -> list[int]:
    """Pids of this user's processes whose environment has `var=value` (not this process)."""
    needle = f"{var}={value}".encode()
    me, uid = os.getpid(), os.getuid()
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def stop_leftovers(incarnation: str) -> list[int]:
    """SIGKILL every process of this user on this host still carrying `incarnation`; returns
    their pids (empty when the step left nothing behind)."""
    pids = marked_processes(contract.INCARNATION, incarnation)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if pids:
        log.warning(
            "stopped %d leftover process(es) of launch %s: %s", len(pids), incarnation, pids
        )
    return pids
