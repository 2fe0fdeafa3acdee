"""The gRPC listener: a generic proxy that forwards any ``/package.Service/Method`` as raw bytes (no
generated code) and applies the policy engine to it with gRPC's A6 semantics (retries, hedging, throttling,
pushback, ``grpc-previous-rpc-attempts``, deadlines). See docs/grpc.md."""
