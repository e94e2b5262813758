"""Judge a finished run from its run directory alone: same final weights, exactly-once data.

Whoever started the run (the local launcher, `fthsdp submit` on Slurm, a test, the demo) asks the
same two questions at the end, from files the workers left: do the final local shards of every
finished replica agree rank by rank (`final/rK_rankW.pt`, written by `FTHSDP.finish`), and do the
ledger records (`ledger/rK.jsonl`) tile the sample stream with no gap or overlap over exactly the
target number of steps. torch is imported only to read the shards.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from runtime import ledger
from runtime.worker.outputs import list_final_shards


@dataclass(frozen=True)
class LedgerCheck:
    ok: bool
    steps: int
    problems: list[str] = field(default_factory=list)
    #: Steps committed, lost to a rollback and trained again (`LedgerVerdict.rolled_back`).
    rolled_back: int = 0


def check_ledger(run_dir: Path, target_steps: int | None = None) -> LedgerCheck:
    """`runtime.ledger.verify` over every replica's ledger, plus the step count when given."""
    records = ledger.read_log(sorted((run_dir / "ledger").glob("r*.jsonl")))
    verdict = ledger.verify(records)
    steps = max((r.step for r in records), default=-1) + 1
    problems = list(verdict.problems)
    if target_steps is not None and steps != target_steps:
        problems.append(f"{steps} steps committed, expected {target_steps}")
    return LedgerCheck(
        ok=not problems, steps=steps, problems=problems, rolled_back=verdict.rolled_back
    )


def final_weights_agree(run_dir: Path, replicas: Iterable[int] | None = None) -> bool:
    """Final local shards of `replicas` (default: every replica that wrote them) are allclose,
    rank by rank, at the same step and cursor. False when none finished."""
    shards = list_final_shards(run_dir)
    finished = sorted(shards) if replicas is None else [r for r in replicas if r in shards]
    if not finished:
        return False
    import torch

    reference = {
        rank: torch.load(path, weights_only=True) for rank, path in shards[finished[0]].items()
    }
    for replica in finished[1:]:
        if set(shards[replica]) != set(reference):
            return False
        for rank, path in shards[replica].items():
            other = torch.load(path, weights_only=True)
            ref = reference[rank]
            if other["step"] != ref["step"] or other["cursor"] != ref["cursor"]:
                return False
            for name, tensor in ref["params"].items():
                if not torch.allclose(tensor, other["params"][name], rtol=1e-5, atol=1e-6):
                    return False
    return True
