"""``sidecar simulate``: the overload lab.

Many clients, a server with the seed's latency law, an outage; three ways to retry (fixed interval,
exponential backoff, the sidecar) compared in one report. Two engines run the same scenario: ``live``
(real processes and sockets on 127.0.0.1) and ``des`` (virtual time, driving the real policy engine).
See docs/simulate.md.
"""
