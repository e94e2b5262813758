"""One rank of an FT-HSDP replica, behind the user facade `runtime.api.FTHSDP`.

Each module does one job: `step` runs the per-step quorum, gradient allreduce and commit vote;
`allreduce` is the step's one cross-replica allreduce of the gradient shards and the slot;
`heal` is the state a healing peer fetches and how it is written back into the local shards;
`control_wait` waits for the quorum service and out a control-plane restart; `manager` is
torchft's Manager as this protocol uses it; `errors` is the fatal failure with its exit code;
`outputs` names the files a worker leaves in the run directory (torch-free, for the launchers).
"""
