"""The replica job's supervisor: runs the replica's srun step and, when it ends, asks what next.

The replica's batch script runs `fthsdp replica --run-dir D --replica K -- srun ...`. When the step
ends with a failure, the supervisor sends a signed fatal report of its own (the worker's leader
may have died before it could; the coordinator treats both reports of one death as one failure,
keyed by job, restart count and launch number), then asks the coordinator for a directive:

- `relaunch`: run the step again inside this allocation (tier 1), after the given delay;
- `requeue`: the coordinator is requeuing this job (tier 2); wait to be stopped by Slurm;
- `exit`: leave for good (tier 3, a user error, or a superseded run);
- `continue`: no decision yet; ask again shortly.

One job per module:

- `config`: what the supervisor is told (`SupervisorConfig`, from Slurm's and the launch
  contract's variables);
- `exits`: its own exit codes and the failure class of a step's exit code;
- `control_plane`: whether the run's control plane is up, and the wait for it before a launch;
- `coordinator_link`: the talk with the coordinator after a failed step (report, directive);
- `torchft_mode`: a foreign torchft trainer's launch, which the supervisor reports for;
- `loop`: the launch loop itself (`Supervisor`), the SIGTERM forwarding and the self-requeue.

`fthsdp_cli.commands.control` (`fthsdp replica`) builds the config and runs `loop.Supervisor`.
"""
