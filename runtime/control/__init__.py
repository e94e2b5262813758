"""The run's control plane: signed leader reports, the coordinator, its journal and the recovery
policy that decides which replica to relaunch, requeue or leave out."""
