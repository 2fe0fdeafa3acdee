"""A MongoDB upstream written as a connection string (``upstreams.<name>.uri``): what pymongo's URI parser
reads from it becomes the explicit keys; a key given both ways, an option the sidecar does not use, and a
broken URI are path-named errors that never quote the password; ``check`` spells the effect out, redacted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.config import ConfigError, load_dict
from sidecar.config.effective import effective, effective_yaml
from sidecar.config.mongo_uri import parse, txt_options


def cfg(upstream: dict[str, Any], protocol: str = "mongodb") -> dict[str, Any]:
    return {
        "admin": {"listen": None},
        "upstreams": {"db": upstream},
        "listeners": [{"name": "m", "protocol": protocol, "listen": "127.0.0.1:0", "upstream": "db"}],
    }


def errors(upstream: dict[str, Any], environ: dict[str, str] | None = None, protocol: str = "mongodb") -> str:
    with pytest.raises(ConfigError) as e:
        load_dict(cfg(upstream, protocol), environ or {})
    return str(e.value)


def test_the_uri_fills_in_members_replica_set_tls_login_and_compressors(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    uri = (
        "mongodb://orders:${PW}@h1:27017,h2/?replicaSet=rs0&tls=true&tlsCAFile="
        + str(ca)
        + "&authSource=admin&authMechanism=SCRAM-SHA-1&compressors=zstd,snappy,zlib&connectTimeoutMS=3000"
        "&maxPoolSize=7"
    )
    up = load_dict(cfg({"uri": uri}), {"PW": "s3cret-pw"}).upstreams["db"]
    assert up.endpoints == ["h1:27017", "h2:27017"] and up.replica_set == "rs0"
    assert up.tls is not None and up.tls.ca_file == str(ca) and not up.tls.insecure_skip_verify
    assert up.auth is not None and (up.auth.username, up.auth.password) == ("orders", "s3cret-pw")
    assert (up.auth.source, up.auth.mechanism) == ("admin", "SCRAM-SHA-1")
    assert up.compressors == ["zstd", "snappy", "zlib"]
    assert (up.connect_timeout, up.max_connections) == (3.0, 7)


def test_check_spells_the_effect_out_with_secrets_redacted() -> None:
    config = load_dict(cfg({"uri": "mongodb://orders:${PW}@h1/?authSource=admin"}), {"PW": "s3cret-pw"})
    shown = effective(config)["upstreams"]["db"]
    assert shown["uri"] == "mongodb://<redacted>@h1/?authSource=admin"
    assert shown["auth"] == {
        "username": "orders",
        "password": "<redacted>",
        "source": "admin",
        "mechanism": "SCRAM-SHA-256",
    }
    assert "s3cret-pw" not in effective_yaml(config)
    srv = effective(load_dict(cfg({"uri": "mongodb+srv://cluster0.example.net/?compressors=zlib"}), {}))
    assert srv["upstreams"]["db"]["srv"] == {"name": "_mongodb._tcp.cluster0.example.net", "max_hosts": 0}
    assert srv["upstreams"]["db"]["tls"] is not None  # TLS by default for mongodb+srv://, as a driver


def test_a_key_given_both_ways_is_a_path_named_error() -> None:
    text = errors(
        {
            "uri": "mongodb://u:p@h1/?replicaSet=rs0&compressors=zlib&tls=true",
            "endpoints": ["h1:27017"],
            "replica_set": "rs0",
            "auth": {"username": "u", "password": "p"},
            "compressors": ["zlib"],
            "tls": {"insecure_skip_verify": True},
        }
    )
    for path, by in [
        ("endpoints", "the hosts it names"),
        ("replica_set", "replicaSet"),
        ("auth", "credentials"),
        ("compressors", "compressors"),
        ("tls", "tls"),
    ]:
        assert f"upstreams.db.{path}: also given by uri ({by}" in text, text


@pytest.mark.parametrize(
    ("uri", "said"),
    [
        ("mongodb://h1/?w=majority", "option 'w' does nothing in the sidecar's upstream URI"),
        ("mongodb://h1/?authMechanism=PLAIN", "authMechanism PLAIN"),
        ("mongodb://h1:99999/", "Port must be an integer"),
        ("http://h1/", "begins with mongodb:// or mongodb+srv://"),
        ("mongodb+srv://a.example.net:27017/", "one host, without a port"),
        ("mongodb://h1/?srvMaxHosts=2", "srvMaxHosts"),
        ("mongodb://h1/?loadBalanced=true", "loadBalanced=true is not supported yet"),
    ],
)
def test_a_uri_the_sidecar_cannot_use_is_refused(uri: str, said: str) -> None:
    text = errors({"uri": uri})
    assert "upstreams.db.uri: " in text and said in text, text


def test_an_error_never_quotes_the_password() -> None:
    text = errors({"uri": "mongodb://orders:${PW}@h1:99999/"}, {"PW": "s3cret-pw"})
    assert "upstreams.db.uri" in text and "s3cret-pw" not in text


def test_uri_on_an_http_upstream_does_nothing_and_says_so() -> None:
    text = errors({"uri": "mongodb://h1/", "endpoints": ["127.0.0.1:1"]}, protocol="http")
    assert "upstreams.db.uri: does nothing for an upstream used by http listeners" in text, text


def test_srv_and_txt() -> None:
    u = parse("mongodb+srv://u:p@cluster0.example.net/app?srvServiceName=mdb&srvMaxHosts=2")
    assert (u.srv, u.srv_service, u.srv_max_hosts, u.hosts, u.tls, u.source) == (
        "cluster0.example.net",
        "mdb",
        2,
        (),
        True,
        "app",
    )
    assert txt_options("authSource=admin&replicaSet=rs0") == {"authsource": "admin", "replicaset": "rs0"}
    with pytest.raises(ValueError, match="only authSource, replicaSet and loadBalanced"):
        txt_options("w=majority")


def test_listener_tls_files_are_checked_at_load(tmp_path: Path) -> None:
    config = cfg({"endpoints": ["127.0.0.1:27017"]})
    config["listeners"][0]["tls"] = {"cert_file": str(tmp_path / "missing.pem")}
    with pytest.raises(ConfigError) as e:
        load_dict(config, {})
    assert "listeners[0].tls: cannot load the certificate and key" in str(e.value)
    config["listeners"][0] = {**config["listeners"][0], "protocol": "http"}
    with pytest.raises(ConfigError) as e:
        load_dict(config, {})
    assert "listeners[0].tls: unknown key" in str(e.value)


def test_app_auth_without_users_needs_an_upstream_login() -> None:
    config = cfg({"endpoints": ["127.0.0.1:27017"]})
    config["listeners"][0]["app_auth"] = {}
    with pytest.raises(ConfigError) as e:
        load_dict(config, {})
    assert "listeners[0].app_auth.users: not given, and upstream 'db' has no login of its own" in str(e.value)


def test_srv_polling_rules() -> None:
    """The pure rules of seeds.py: the rescan wait, the domain rule, srvMaxHosts."""
    from sidecar.adapters.mongo.seeds import choose, in_domain, rescan_after

    assert (rescan_after(0.2), rescan_after(30), rescan_after(3600), rescan_after(None)) == (
        1.0,
        30,
        60.0,
        60.0,
    )
    assert in_domain("cluster0.example.net", "shard-00.example.net")
    assert not in_domain("cluster0.example.net", "evil.example.org")
    assert in_domain("cluster0.test", "r1.cluster0.test") and not in_domain("cluster0.test", "r1.other.test")
    assert not in_domain("cluster0.test", "cluster0.test")
    found = ["a:1", "b:1", "c:1", "d:1"]
    assert choose([], found, 0, lambda: 0.5) == found
    two = choose([], found, 2, lambda: 0.5)
    assert len(two) == 2 and set(two) <= set(found)
    assert choose(["c:1"], found, 2, lambda: 0.5)[0] == "c:1"  # the members in use stay
