"""The protocols' fixtures (a real HTTP upstream and aiohttp client, a real gRPC upstream) for the admission
tests."""

from ..grpc.conftest import up
from ..http.conftest import client, upstream

__all__ = ["client", "up", "upstream"]
