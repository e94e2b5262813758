"""`fthsdp run --local`: a run of R replicas as local processes, the stand-in for Slurm.

`config` says what a run is, `launcher` supervises the native API's processes (start, progress,
restart, stop), `faults` decides when an injected kill strikes, `summary` judges the run from
the workers' files, `run_state` owns what a fresh local run clears, and `foreign` is the same
supervision for a foreign torchft trainer.
"""
