"""Benchmarks: placement quality against the published baseline, and decision latency."""
