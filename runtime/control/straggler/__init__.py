"""Stragglers: detection, the evict-or-tolerate decision, and the coordinator's monitor.

In FT-HSDP every step waits for the slowest participating replica, so one replica on a thermally
throttled GPU or a degraded link slows the whole run without ever failing: a gray failure. The
textbook's rule is to treat a severe straggler as a hard failure once the time it costs exceeds
what a recovery costs; per-replica requeue makes that recovery cheap (the other replicas keep
training), so evicting a straggler is often the right call. This package decides *when*.

The package is split by job: `detect` (the pure detector: pace, standing among the peers,
episodes and verdicts), `evict` (the pure decision: when an eviction pays), `monitor` (the
detector state plus the run's eviction bookkeeping, fed by reports), `service` (the glue that
feeds the monitor from the coordinator's accepted reports and policy state), and `steptiming`
(the worker's side: each rank's own compute time per step, which the reports carry, and the
simulated slow fault).
"""
