"""Fault-injecting test upstreams shared by tests, the demo and benchmarks."""
