"""TLS origination for HTTP upstreams (issue 22), against a real nginx over TLS with certificates made here by
trustme: the name verified and sent (SNI chooses between two server names and their certificates; ALPN
http/1.1), a name
resolved by a real DNS server still verified as written, a wrong CA answered 502 after one attempt, mTLS,
``https://`` endpoints (IPv6 too), retries over TLS, one TLS connection for many requests, sessions resumed,
``insecure_skip_verify`` warned about; and the ``Host`` of an IPv6 absolute-form request bracketed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme

from sidecar.app import App
from sidecar.config import load_dict
from sidecar.testing.dns_server import DnsServer
from tests.metrics import metric

from .conftest import FAST
from .nginx import free_port, nginx

#: nginx says which server block answered, the name the client sent (SNI), whether its session was resumed,
#: which TLS connection carried the request and the client certificate's subject.
SAYS = (
    'return 200 "$server_name sni=$ssl_server_name reused=$ssl_session_reused conn=$connection '
    'alpn=$ssl_alpn_protocol dn=$ssl_client_s_dn\\n";'
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA and, from it, certificates for a.test, b.test (with 127.0.0.1, ::1 and localhost) and the
    sidecar's client certificate; another CA nobody issued from."""
    d = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    files = {"ca": d / "ca.pem", "other_ca": d / "other.pem"}
    ca.cert_pem.write_to_path(files["ca"])
    other.cert_pem.write_to_path(files["other_ca"])
    for name, sans in {
        "a": ("a.test", "127.0.0.1", "::1", "localhost"),
        "b": ("b.test",),
        "api": ("api.test",),
        "client": ("sidecar.client",),
    }.items():
        cert = ca.issue_cert(*sans)
        files[name] = d / f"{name}.pem"
        files[f"{name}_key"] = d / f"{name}.key"
        for i, blob in enumerate(cert.cert_chain_pems):
            blob.write_to_path(files[name], append=i > 0)
        cert.private_key_pem.write_to_path(files[f"{name}_key"])
    return files


def server(name: str, listen: str, pki: dict[str, Path], cert: str, extra: str = "") -> str:
    return (
        f"server {{ listen {listen} ssl; server_name {name}; ssl_certificate {pki[cert]}; "
        f"ssl_certificate_key {pki[cert + '_key']}; {extra} location / {{ {SAYS} }} }}\n"
    )


def tls_upstreams(**ups: dict[str, Any]) -> dict[str, Any]:
    """A listener per upstream, named after it, under http-default without backoff."""
    return {
        "admin": {"listen": None},
        "upstreams": ups,
        "policies": {"p": {"extends": "http-default", **FAST}},
        "listeners": [
            {"name": n, "protocol": "http", "listen": "127.0.0.1:0", "upstream": n, "policy": "p"}
            for n in ups
        ],
    }


class Running:
    def __init__(self, app: App) -> None:
        self.app = app

    def metric(self, name: str, **labels: str) -> float:
        return metric(self.app, name, **labels)


@asynccontextmanager
async def sidecar(cfg: dict[str, Any]) -> AsyncIterator[Running]:
    async with App(load_dict(cfg, {})) as app:
        yield Running(app)


async def get(http: aiohttp.ClientSession, app: Any, listener: str, path: str = "/") -> tuple[int, str]:
    host, port = app.address(listener)
    async with http.get(f"http://{host}:{port}{path}") as r:
        return r.status, await r.text()


async def test_the_name_is_verified_and_sent_and_sni_chooses_the_certificate(pki: dict[str, Path]) -> None:
    port = free_port()
    servers = server("a.test", f"127.0.0.1:{port}", pki, "a") + server(
        "b.test", f"127.0.0.1:{port}", pki, "b"
    )
    ep = [f"https://127.0.0.1:{port}"]
    cfg = tls_upstreams(
        a={"endpoints": ep, "tls": {"ca_file": str(pki["ca"]), "server_name": "a.test"}},
        b={"endpoints": ep, "tls": {"ca_file": str(pki["ca"]), "server_name": "b.test"}},
    )
    async with nginx(servers, [("127.0.0.1", port)]), sidecar(cfg) as sc, aiohttp.ClientSession() as http:
        status, body = await get(http, sc.app, "a")
        assert status == 200 and body.startswith("a.test sni=a.test ") and " alpn=http/1.1 " in body
        status, body = await get(http, sc.app, "b")
        # verified: nginx chose b.test's certificate (b.test alone) by the name sent (a Host of 127.0.0.1
        # finds no server block: nginx's default one answers)
        assert status == 200 and " sni=b.test " in body
        ok = sc.metric(
            "sidecar_upstream_tls_handshakes_total", upstream="a", endpoint=f"127.0.0.1:{port}", result="ok"
        )
        assert ok == 1


async def test_a_name_resolved_to_an_address_is_verified_and_sent_as_written(pki: dict[str, Path]) -> None:
    port = free_port()
    servers = server("api.test", f"127.0.0.1:{port}", pki, "api")
    async with DnsServer(ttl=1) as dns, nginx(servers, [("127.0.0.1", port)]):
        await dns.set("api.test", ["127.0.0.1"])
        cfg = tls_upstreams(
            api={"endpoints": [f"https://api.test:{port}"], "tls": {"ca_file": str(pki["ca"])}}
        )
        cfg["resolver"] = {"nameservers": [dns.address]}
        async with sidecar(cfg) as sc, aiohttp.ClientSession() as http:
            status, body = await get(http, sc.app, "api")
            assert status == 200 and body.startswith("api.test sni=api.test "), body


async def test_a_certificate_that_does_not_verify_is_one_attempt_and_a_502_naming_it(
    pki: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    servers = server("a.test", f"127.0.0.1:{port}", pki, "a")
    cfg = tls_upstreams(
        a={
            "endpoints": [f"https://127.0.0.1:{port}"],
            "tls": {"ca_file": str(pki["other_ca"]), "server_name": "a.test"},
        }
    )
    async with nginx(servers, [("127.0.0.1", port)]), sidecar(cfg) as sc, aiohttp.ClientSession() as http:
        for _ in range(5):
            status, body = await get(http, sc.app, "a")
            assert status == 502
            assert "certificate verify failed" in body and f"127.0.0.1:{port}" in body and "'a.test'" in body
        assert sc.metric("sidecar_attempts_total", listener="a", upstream="a", outcome="fatal") == 5  # not 15
        failed = sc.metric(
            "sidecar_upstream_tls_handshakes_total",
            upstream="a",
            endpoint=f"127.0.0.1:{port}",
            result="failed",
        )
        assert failed == 5
    warned = [r for r in caplog.records if "certificate verify failed" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING  # said once, not per request


async def test_mtls_without_and_with_the_client_certificate(pki: dict[str, Path]) -> None:
    port = free_port()
    mtls = f"ssl_client_certificate {pki['ca']}; ssl_verify_client on;"
    servers = server("a.test", f"127.0.0.1:{port}", pki, "a", mtls)
    tls = {"ca_file": str(pki["ca"]), "server_name": "a.test"}
    cfg = tls_upstreams(
        anon={"endpoints": [f"https://127.0.0.1:{port}"], "tls": tls},
        mtls={
            "endpoints": [f"https://127.0.0.1:{port}"],
            "tls": {**tls, "cert_file": str(pki["client"]), "key_file": str(pki["client_key"])},
        },
    )
    async with nginx(servers, [("127.0.0.1", port)]), sidecar(cfg) as sc, aiohttp.ClientSession() as http:
        status, body = await get(http, sc.app, "anon")
        assert status == 400 and "No required SSL certificate was sent" in body  # nginx's own answer
        status, body = await get(http, sc.app, "mtls")
        assert status == 200 and "dn=OU=Testing cert" in body  # trustme's subject for the client certificate


async def test_https_endpoints_on_ipv6_and_retries_over_tls(pki: dict[str, Path]) -> None:
    port, stopped = free_port("::1"), free_port("::1")
    servers = server("a.test", f"[::1]:{port}", pki, "a")
    tls = {"ca_file": str(pki["ca"])}  # verified as ::1: the certificate's IP address
    cfg = tls_upstreams(a={"endpoints": [f"https://[::1]:{stopped}", f"https://[::1]:{port}"], "tls": tls})
    async with nginx(servers, [("::1", port)]), sidecar(cfg) as sc, aiohttp.ClientSession() as http:
        statuses = [(await get(http, sc.app, "a"))[0] for _ in range(6)]
        assert statuses == [200] * 6  # the stopped endpoint's connect failures went to the other
        assert sc.metric("sidecar_attempts_total", listener="a", upstream="a", outcome="connect-failure") >= 1


async def test_one_tls_connection_carries_many_requests_and_new_ones_resume_the_session(
    pki: dict[str, Path],
) -> None:
    port, short = free_port(), free_port()
    servers = server("a.test", f"127.0.0.1:{port}", pki, "a") + server(
        "a.test",
        f"127.0.0.1:{short}",
        pki,
        "a",
        "keepalive_requests 1;",  # a new connection per request
    )
    tls = {"ca_file": str(pki["ca"]), "server_name": "a.test"}
    cfg = tls_upstreams(
        a={"endpoints": [f"https://127.0.0.1:{port}"], "tls": tls},
        s={"endpoints": [f"https://127.0.0.1:{short}"], "tls": tls},
    )
    async with nginx(servers, [("127.0.0.1", port), ("127.0.0.1", short)]), sidecar(cfg) as sc:
        async with aiohttp.ClientSession() as http:
            bodies = [(await get(http, sc.app, "a"))[1] for _ in range(20)]
            assert len({b.split("conn=")[1].split()[0] for b in bodies}) == 1  # nginx saw one connection
            bodies = [(await get(http, sc.app, "s"))[1] for _ in range(4)]
        assert [b.split("reused=")[1].split()[0] for b in bodies] == [".", "r", "r", "r"]
        ep = f"127.0.0.1:{short}"
        assert sc.metric("sidecar_upstream_tls_handshakes_total", upstream="s", endpoint=ep, result="ok") == 1
        assert (
            sc.metric("sidecar_upstream_tls_handshakes_total", upstream="s", endpoint=ep, result="resumed")
            == 3
        )


async def test_insecure_skip_verify_encrypts_without_verifying_and_says_so(
    pki: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    servers = server("a.test", f"127.0.0.1:{port}", pki, "a")
    cfg = tls_upstreams(a={"endpoints": [f"https://127.0.0.1:{port}"], "tls": {"insecure_skip_verify": True}})
    with caplog.at_level(logging.WARNING, logger="sidecar.http"):
        async with nginx(servers, [("127.0.0.1", port)]), sidecar(cfg) as sc, aiohttp.ClientSession() as http:
            assert (await get(http, sc.app, "a"))[0] == 200  # a CA nobody gave the sidecar
    assert any(
        "insecure_skip_verify" in r.getMessage() and "NOT verified" in r.getMessage() for r in caplog.records
    )


async def test_a_tls_file_that_cannot_be_loaded_fails_the_start_naming_it(tmp_path: Path) -> None:
    from sidecar.config import ConfigError

    cfg = tls_upstreams(
        a={"endpoints": ["https://127.0.0.1:1"], "tls": {"ca_file": str(tmp_path / "none.pem")}}
    )
    with pytest.raises(ConfigError, match=r"upstreams\.a\.tls\.ca_file: cannot load"):
        async with sidecar(cfg):
            pass


async def test_ipv6_host_of_an_absolute_form_request_is_bracketed() -> None:
    """``curl -x http://sidecar http://[::1]:PORT/y``: nginx gets ``Host: [::1]:PORT`` (a bare ``::1:PORT`` is
    a 400 there)."""
    port = free_port("::1")
    servers = f'server {{ listen [::1]:{port}; location / {{ return 200 "host=$http_host\\n"; }} }}\n'
    cfg = tls_upstreams(v6={"endpoints": [f"[::1]:{port}"]})
    async with nginx(servers, [("::1", port)]), sidecar(cfg) as sc:
        host, sport = sc.app.address("v6")
        proc = await asyncio.create_subprocess_exec(
            "curl",
            "-s",
            "-x",
            f"http://{host}:{sport}",
            f"http://[::1]:{port}/y",
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await proc.communicate()
        assert out.decode() == f"host=[::1]:{port}\n"


async def test_a_reload_whose_tls_file_cannot_be_loaded_leaves_the_listener_as_it_was(
    pki: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    servers = server("a.test", f"127.0.0.1:{port}", pki, "a")
    tls = {"ca_file": str(pki["ca"]), "server_name": "a.test"}
    cfg = tls_upstreams(a={"endpoints": [f"https://127.0.0.1:{port}"], "tls": tls})
    async with nginx(servers, [("127.0.0.1", port)]), sidecar(cfg) as sc, aiohttp.ClientSession() as http:
        broken = tls_upstreams(
            a={
                "endpoints": [f"https://127.0.0.1:{port}"],
                "tls": {**tls, "ca_file": str(tmp_path / "gone.pem")},
            }
        )
        sc.app.apply(load_dict(broken, {}))
        assert any("keeps its previous configuration" in r.getMessage() for r in caplog.records)
        status, body = await get(http, sc.app, "a")  # still over TLS, verified with the CA it had
        assert status == 200 and " sni=a.test " in body
