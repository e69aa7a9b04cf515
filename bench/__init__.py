"""Benchmarks: each figure beside its baseline, measured in the same run, as a ratio."""
