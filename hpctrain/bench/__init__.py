"""Benchmarks that run real jobs on a cluster (``hpctrain bench``): scaling efficiency."""
