"""TLS to the upstream (the upstream's ``tls`` settings) and clear startup errors."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sidecar.app import App
from sidecar.config import load_dict
from sidecar.testing.grpc_upstream import GrpcUpstream

from ..tls import server_certificate
from .conftest import config, sidecar


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    crt, key = server_certificate(tmp_path_factory.mktemp("tls"), "upstream.test", "DNS:upstream.test")
    return key, crt


async def test_tls_upstream_with_a_private_ca(cert: tuple[Path, Path]) -> None:
    key, crt = cert
    async with GrpcUpstream(tls=(key.read_bytes(), crt.read_bytes())) as up:
        cfg = config([up.endpoint])
        cfg["upstreams"]["u"]["tls"] = {"ca_file": str(crt), "server_name": "upstream.test"}
        async with sidecar(cfg) as sc:
            assert await sc.unary()(b"secret") == b"secret"
            assert len(up.calls) == 1


async def test_unreadable_ca_file_fails_at_start_naming_it() -> None:
    cfg = config(["127.0.0.1:1"])
    cfg["upstreams"]["u"]["tls"] = {"ca_file": "/nonexistent/ca.pem"}
    with pytest.raises(OSError, match="listener 'g', upstream 'u': tls: cannot read '/nonexistent/ca.pem'"):
        App(load_dict(cfg, {}))


async def test_a_taken_port_fails_at_start_naming_the_listener() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        cfg = config(["127.0.0.1:1"])
        cfg["listeners"][0]["listen"] = f"127.0.0.1:{s.getsockname()[1]}"
        app = App(load_dict(cfg, {}))
        with pytest.raises(OSError, match="listener 'g': cannot listen on"):
            await app.start()
