"""The gRPC listener: a generic proxy that forwards any ``/package.Service/Method`` as raw bytes (no
generated code) and applies the policy engine to it with gRPC's A6 semantics (retries, hedging, throttling,
pushback, ``grpc-previous-rpc-attempts``, deadlines). See docs/grpc.md.

The six rooms every adapter has:

server.py      the listener: the generic handler, TLS, limits, drain
request.py     one call: route, deadline, the engine driven to its finish, the status delivered
attempt.py     one attempt: send the request upstream, classify its status, pass the response on once ours
classify.py    an upstream status -> the engine's outcome class (pure)
answer.py      every way a call ends -> its status (pure)
upstream.py    channels to each endpoint

What gRPC needs besides:

downstream.py  the client's side of the call: the one owner of what goes to it (headers, messages, status)
crash.py       grpc.aio's server loop watched; what grpcio gives no public way to do, in one place

replay.py      the client's messages, forwarded as they arrive and kept for replay
metadata.py    what is passed on, added or dropped in metadata; pushback and timeouts (pure)
routing.py     method -> policy, from the config and a service config (pure)
"""
