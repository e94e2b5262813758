"""Spare-pool slots that the tests of the pool's decisions and of its I/O adapter share: two idle
slots and one that hosts replica 1."""

from __future__ import annotations

from slurm.rundir import Slot

IDLE = Slot("11")
IDLE2 = Slot("12")
BUSY = Slot("13", replica=1, script="replica-01.sbatch", since=5.0)
