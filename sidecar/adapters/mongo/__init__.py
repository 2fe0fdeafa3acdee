"""The MongoDB listener: the Client Backpressure retry policy as a wire-protocol proxy (docs/mongodb.md).

The six rooms every adapter has:

server.py      the listener: accept, the app's handshake, read each message, drain (+ connection.py: one app
               connection)
request.py     one command from the app: routing and pins, the engine driven to its finish
attempt.py     one attempt at one server: maxTimeMS, send, read the reply, classify, report
classify.py    an upstream's answer -> the engine's outcome class (pure)
answer.py      every way a command ends -> the app's reply; the documents the sidecar writes itself (pure)
upstream.py    connections (TLS, backpressure handshake, compression, SCRAM), pools, one set per login

What MongoDB needs besides:

wire.py        OP_MSG / OP_QUERY / OP_REPLY framing, CRC-32C (pure)
compression.py OP_COMPRESSED: negotiate, wrap, inflate within a cap (pure)
login.py       the app's own login to the listener (app_auth): users, one connection's SCRAM exchange (pure)
patch.py       set maxTimeMS in a command's bytes without re-encoding it (pure)
commands.py    what a command is: name, namespace, session, read preference, retry rules (pure)
pinning.py     cursor and transaction pins (pure)
members.py     the upstream's servers as monitoring saw them; which may take a command (pure)
scram.py       SCRAM-SHA-256 / SHA-1, client side (upstream) and server side (the app's login) (pure)
topology.py    monitoring; waiting for an eligible server
"""
