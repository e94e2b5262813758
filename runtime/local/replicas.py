"""One replica as the local launcher sees it: its processes, incarnation, state and commits.

The launcher updates it from the replica's progress file and its processes' exit codes; the
fault injector and the summary read it.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field


@dataclass
class LocalReplica:
    replica: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    incarnation: int = 0
    restarts: list[float] = field(default_factory=list)
    state: str = "starting"
    step: int = 0
    healing: bool = False
    last_commit_t: float | None = None
    commits: list[tuple[float, int, bool, str]] = field(default_factory=list)
    joined: dict[str, float] = field(default_factory=dict)
    offset: int = 0
    exit_codes: list[int] = field(default_factory=list)
    #: When (monotonic) it last began training after starting or healing.
    training_since: float | None = None
