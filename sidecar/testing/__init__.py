"""Fault-injecting upstreams shared by the tests, the demo and the benchmarks."""
