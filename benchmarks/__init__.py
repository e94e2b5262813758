"""Benchmark scripts: each prints its figures and writes JSON to benchmarks/results/."""
