"""Secrets in the configuration: what is redacted, from the load to the effective tree, errors and logs."""

from __future__ import annotations

import io
import logging

import pytest

from sidecar.config import ConfigError, effective, effective_yaml, load_text
from sidecar.config.effective import redactor
from sidecar.config.redact import is_secret_key, redact_userinfo
from sidecar.log_redaction import install as _redact_logs

SECRET = "s3cr3t-v4lue-42"

CONFIG = """
telemetry:
  traces: {exporter: otlp, protocol: http, endpoint: "http://collector:4318/v1/traces?api=${OTLP_SECRET}"}
upstreams:
  orders: {endpoints: ["127.0.0.1:8081"], overload_cooldown: "${COOLDOWN:-5s}"}
  db: {endpoints: ["127.0.0.1:27017"], auth: {username: app, password: literal-password}}
listeners:
  - {name: orders, protocol: http, listen: "127.0.0.1:15001", upstream: orders}
  - {name: db, protocol: mongodb, listen: "127.0.0.1:15002", upstream: db}
"""


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("password", True),
        ("Password", True),
        ("api_key", True),
        ("access_token", True),
        ("clientSecret", True),
        ("X-Api-Key", True),
        ("APIKey", True),
        ("credentials", True),
        ("key_file", False),
        ("key_prefix", False),
        ("max_tokens", False),
        ("token_ratio", False),
        ("secret_name", False),
        ("endpoint", False),
        ("pkg.Svc/RotateKey", False),
    ],
)
def test_a_key_is_secret_by_the_last_word_of_its_name(name: str, secret: bool) -> None:
    assert is_secret_key(name) is secret


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("otlp://user:pass@host:4317", "otlp://<redacted>@host:4317"),
        ("mongodb://u:p@h1:27017,h2:27017/db", "mongodb://<redacted>@h1:27017,h2:27017/db"),
        ("redis://:pw@h:6379/0", "redis://<redacted>@h:6379/0"),
        ("see http://a:b@x/ and https://c@y/", "see http://<redacted>@x/ and https://<redacted>@y/"),
        ("http://host/path?mail=a@b", "http://host/path?mail=a@b"),
    ],
)
def test_url_userinfo_is_redacted(url: str, shown: str) -> None:
    assert redact_userinfo(url) == shown


def test_expanded_values_are_masked_where_they_were_written() -> None:
    cfg = load_text(CONFIG, {"OTLP_SECRET": SECRET})
    assert cfg.telemetry.traces.endpoint == f"http://collector:4318/v1/traces?api={SECRET}"
    tree = effective(cfg)
    assert tree["telemetry"]["traces"]["endpoint"] == "http://collector:4318/v1/traces?api=<redacted>"
    # the default came through expansion as well: a normalised value is redacted whole
    assert tree["upstreams"]["orders"]["overload_cooldown"] == "<redacted>"
    assert tree["upstreams"]["db"]["auth"]["password"] == "<redacted>"
    assert tree["upstreams"]["db"]["auth"]["username"] == "app"
    text = effective_yaml(cfg)
    assert SECRET not in text and "literal-password" not in text
    # what was not expanded stays as written
    assert tree["listeners"][0]["listen"] == "127.0.0.1:15001"


def test_literal_dollar_is_not_a_secret() -> None:
    cfg = load_text(CONFIG.replace("?api=${OTLP_SECRET}", "?a=$${X}"), {})
    assert effective(cfg)["telemetry"]["traces"]["endpoint"] == "http://collector:4318/v1/traces?a=${X}"


def test_a_config_error_quoting_an_expanded_value_does_not_show_it() -> None:
    text = CONFIG.replace('"${COOLDOWN:-5s}"', '"${COOLDOWN}"')
    with pytest.raises(ConfigError) as e:
        load_text(text, {"OTLP_SECRET": SECRET, "COOLDOWN": "not-a-duration-" + SECRET})
    rendered = e.value.render()
    assert "upstreams.orders.overload_cooldown" in rendered
    assert SECRET not in rendered and "<redacted>" in rendered


def test_a_config_error_quoting_a_userinfo_url_does_not_show_it() -> None:
    text = CONFIG.replace('["127.0.0.1:8081"]', '["http://admin:hunter2hunter2@orders:8081"]')
    with pytest.raises(ConfigError) as e:
        load_text(text, {"OTLP_SECRET": SECRET})
    rendered = e.value.render()
    assert "upstreams.orders.endpoints[0]" in rendered
    assert "hunter2" not in rendered


def test_log_lines_are_redacted_message_arguments_and_traceback() -> None:
    cfg = load_text(CONFIG, {"OTLP_SECRET": SECRET})
    root = logging.getLogger()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    root.addHandler(handler)
    try:
        _redact_logs(redactor(cfg))
        log = logging.getLogger("sidecar.test-redact")
        log.warning("export to %s failed", cfg.telemetry.traces.endpoint)
        log.warning("auth with %s", "literal-password")
        try:
            raise ConnectionError("cannot reach otlp://user:pw@collector:4317")
        except ConnectionError:
            log.exception("exporter")
    finally:
        root.removeHandler(handler)
    out = stream.getvalue()
    assert "WARNING export to http://collector:4318/v1/traces?api=<redacted> failed" in out
    assert SECRET not in out and "literal-password" not in out and "user:pw" not in out
    assert "otlp://<redacted>@collector:4317" in out


def test_keys_named_like_secrets_are_redacted_whatever_their_place() -> None:
    # The schema has no free-form token key today; the rule holds for any tree the redactor is given.
    tree = {"fleet": {"redis": "redis://:pw@h:6379", "token": "abc", "api_key": {"a": 1}, "key_file": "/k"}}
    shown = redactor(load_text("", {})).tree(tree)
    assert shown == {
        "fleet": {
            "redis": "redis://<redacted>@h:6379",
            "token": "<redacted>",
            "api_key": "<redacted>",
            "key_file": "/k",
        }
    }


def test_an_endpoint_with_userinfo_is_refused_without_quoting_it() -> None:
    # Endpoints reach logs and spans (sidecar.endpoint): none may carry a credential.
    text = CONFIG.replace('["127.0.0.1:8081"]', '["tok3n-in-endpoint@orders:8081"]')
    with pytest.raises(ConfigError) as e:
        load_text(text, {"OTLP_SECRET": SECRET})
    assert e.value.errors == [
        (
            "upstreams.orders.endpoints[0]",
            "an endpoint is host:port, without user@ (credentials go in the upstream's auth)",
        )
    ]


def test_two_loads_of_the_same_file_are_equal() -> None:
    # A reload compares the new config with the live one: what expansion recorded must not differ.
    assert load_text(CONFIG, {"OTLP_SECRET": SECRET}) == load_text(CONFIG, {"OTLP_SECRET": SECRET})
    assert load_text(CONFIG, {"OTLP_SECRET": SECRET}) != load_text(CONFIG, {"OTLP_SECRET": "other-value"})
