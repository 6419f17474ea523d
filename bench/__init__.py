"""Benchmarks: what the orchestration costs, side by side with what users would do instead (`make bench`)."""
