"""A MongoDB test server (mongod/mongos stand-in) for tests, the demo and benchmarks."""

from .server import LoggedCommand, MongoTestServer, TestReplicaSet

__all__ = ["LoggedCommand", "MongoTestServer", "TestReplicaSet"]
