"""The live engine: the scenario with real processes and sockets on 127.0.0.1.

One process per part, so they do not share a core's time: the model server (one per replica), the
sidecar (``sidecar`` strategy), the clients. :mod:`.engine` starts them, hands them a shared start time
on the monotonic clock (system-wide on Linux), stops the server with SIGSTOP and SIGCONT for a ``stop``
outage, and collects each part's record. Every part speaks JSON lines: its settings on stdin, ``ready``
on stdout, the start time on stdin, its record on stdout at the end.
"""
