"""Slurm side of fthsdp: job specs, sbatch rendering, the Slurm backend and the local dev cluster.

Nothing here imports torch, so the CLI that renders and submits stays fast.
"""
