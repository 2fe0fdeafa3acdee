"""The HTTP/1.1 listener: an asyncio Protocol server and upstream connection pool on httptools (llhttp),
forwarding under the unified retry policy (retries, pushback, hedging, userver deadline propagation).

The six rooms every adapter has:

server.py      the listener: accept, drain, sweep (+ connection.py: one client connection, parsing requests
               and writing answers in order; it offers a request only ``request.ClientConnection``)
request.py     one request: what was read (IncomingRequest), its route and setup, the engine driven, answered
attempt.py     one attempt: take a pooled connection, send, hand the response head to classify, report
classify.py    a response head or a transport failure -> the engine's outcome class (pure)
answer.py      the sidecar's own answers, one per way a request can end or be refused (pure)
upstream.py    connections to the endpoints, the responses they read, and their pools

What HTTP needs besides:

replay.py      the request body, streamed to the attempts and kept for replay
headers.py     hop-by-hop rules, the request and response heads (pure)
routing.py     path/Host routes and absolute-form targets -> upstream and policy (pure)
plan.py        what a request needs from its target, resolved once per target
pushback.py    Retry-After and a millisecond pushback header (pure)
methods.py     extension methods that llhttp does not know
"""
