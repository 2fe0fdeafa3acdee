"""The admission runtime: the asyncio half of ``sidecar/admission`` (whose algorithms are pure).

- ``door.py``: one listener's request and connection buckets and their queues (``Door``);
- ``accept_gate.py``: a new connection held unread until the door gives it a token;
- ``concurrency.py``: an upstream's endpoints' ticket pools and their probers (execution control);
- ``ticket_gate.py``: every attempt takes its endpoint's ticket (the runtime's ``AttemptGate``).
"""
