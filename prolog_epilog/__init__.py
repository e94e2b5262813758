"""Node health checks for Slurm Prolog, Epilog and HealthCheckProgram; drain bad nodes."""
