"""The coordinator's durable journal: SQLite in the run directory.

Everything the coordinator learns or does is written here before it matters: every accepted
event (leader reports, squeue observations, ticks that changed something, operator requests), the
actions the policy decided for it (in the same transaction, so a decision is never half-stored),
every attempt to carry out a Slurm action and its result, every refused request, and the nonces
of accepted reports (replay protection survives a restart).

After a restart (the control job itself was requeued, or the process was killed) the coordinator
replays the events through the pure policy to get its state back, and carries out only the Slurm
actions whose outcome was never recorded. Actions in state `started` may have reached Slurm
before the crash; the executor checks Slurm before repeating them (a Requeue whose job's restart
count already rose is done), so no decision is lost and none is carried out twice.

Size and restart time are bounded by the number of replicas, not by the run's age: a status
report that decided nothing is only needed until the next snapshot, so `compact` stores the
coordinator's state (a `snapshot` row, the policy state after event N) and deletes those reports
up to N in the same transaction; replay starts from the snapshot. Events that decided something,
their actions and attempts are kept (they are the run's history, and the exactly-once record of
every Slurm action). Nonces older than twice the clock-skew window can no longer be replayed
(the signature check refuses them as stale) and are dropped too. A `kill -9` during a compaction
rolls the whole transaction back: the snapshot and the deletions land together or not at all.

The package is split by job: `schema` (the tables, their one migration and the connection
settings: the file format), `writer` (every row a write adds, written once and used both by the
direct writes and by the `GroupWriter` that commits in groups), `store` (the `Journal` handle:
reads, replay, and the direct writes) and `describe` (the lines `fthsdp events` prints).
"""
