"""The MongoDB listener: the Client Backpressure retry policy as a wire-protocol proxy (docs/mongodb.md).

wire.py        OP_MSG / OP_QUERY / OP_REPLY framing, CRC-32C (pure)
patch.py       set maxTimeMS in a command's bytes without re-encoding it (pure)
commands.py    what a command is: name, namespace, session, read preference, retry rules (pure)
classify.py    an upstream's answer -> the engine's outcome class (pure)
replies.py     the documents the sidecar writes itself: hello, errors, labels removed (pure)
pinning.py     cursor and transaction pins (pure)
members.py     the upstream's servers as monitoring saw them; which may take a command (pure)
scram.py       SCRAM-SHA-256 / SHA-1, client side (pure)
upstream.py    connections (TLS, backpressure handshake, SCRAM) and pools
topology.py    monitoring; waiting for an eligible server
forward.py     one command under the policy, and the one answer the app gets
connection.py  one app connection
server.py      the listener
"""
