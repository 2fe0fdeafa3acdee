"""retry-sidecar: one retry policy for MongoDB, HTTP and gRPC traffic."""

__version__ = "0.1.0"
