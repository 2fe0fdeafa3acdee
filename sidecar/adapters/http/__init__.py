"""The HTTP/1.1 listener: an asyncio Protocol server and upstream connection pool on httptools (llhttp),
forwarding under the unified retry policy (retries, pushback, hedging, userver deadline propagation)."""
