"""No setting is silently ignored (issue 22): a key written where it does nothing is a path-named error,
found by ``sidecar check`` as by start (both load through ``load_text``)."""

from __future__ import annotations

from sidecar.config import load_text

from .test_config import errors_of

HTTP = 'listeners: [{name: web, protocol: http, listen: "127.0.0.1:0", upstream: u, policy: p}]\n'
GRPC = 'listeners: [{name: rpc, protocol: grpc, listen: "127.0.0.1:0", upstream: u, policy: p}]\n'
MONGO = 'listeners: [{name: db, protocol: mongodb, listen: "127.0.0.1:0", upstream: u, policy: p}]\n'
POLICY = "policies: {p: {max_attempts: 2}}\n"


def test_http_upstream_keys_that_do_nothing_are_refused_with_their_path() -> None:
    errors = dict(
        errors_of(
            'upstreams: {u: {endpoints: ["127.0.0.1:8080"], replica_set: rs0, '
            "auth: {username: a, password: b}, concurrency: {read_methods: ['/a.B/*']}}}\n" + POLICY + HTTP
        )
    )
    assert set(errors) == {
        "upstreams.u.replica_set",
        "upstreams.u.auth",
        "upstreams.u.concurrency.read_methods",
    }
    assert errors["upstreams.u.replica_set"].startswith(
        "does nothing for an upstream used by http listeners (listeners[0]): only a MongoDB upstream"
    )


def test_grpc_upstream_keys_that_do_nothing_are_refused_with_their_path() -> None:
    errors = dict(
        errors_of(
            'upstreams: {u: {endpoints: ["127.0.0.1:50051"], max_connections: 8, '
            "tls: {ca_file: /ca.pem, insecure_skip_verify: true}}}\n" + POLICY + GRPC
        )
    )
    assert set(errors) == {"upstreams.u.max_connections", "upstreams.u.tls.insecure_skip_verify"}
    assert "grpcio always verifies" in errors["upstreams.u.tls.insecure_skip_verify"]


def test_mongodb_upstream_keys_that_do_nothing_are_refused_with_their_path() -> None:
    errors = dict(
        errors_of(
            'upstreams: {u: {endpoints: ["127.0.0.1:27017"], outlier_detection: {enabled: false}}}\n'
            + POLICY
            + MONGO
        )
    )
    assert set(errors) == {"upstreams.u.outlier_detection"}


def test_policy_keys_that_no_listener_of_the_policy_reads_are_refused() -> None:
    policy = (
        "policies: {p: {retryable_status: [503], retryable_codes: [UNAVAILABLE], final_error_labels: keep}}\n"
    )
    up = 'upstreams: {u: {endpoints: ["127.0.0.1:1"]}}\n'
    assert set(dict(errors_of(up + policy + HTTP))) == {
        "policies.p.retryable_codes",
        "policies.p.final_error_labels",
    }
    assert set(dict(errors_of(up + policy + MONGO))) == {
        "policies.p.retryable_status",
        "policies.p.retryable_codes",
    }


def test_a_policy_shared_by_two_protocols_may_hold_each_ones_keys() -> None:
    """Each protocol reads its own keys of a shared policy: a key one of them reads does something."""
    load_text(
        'upstreams: {u: {endpoints: ["127.0.0.1:1"]}, g: {endpoints: ["127.0.0.1:2"]}}\n'
        "policies: {p: {retryable_status: [503], retryable_codes: [UNAVAILABLE]}}\n"
        "listeners:\n"
        '  - {name: web, protocol: http, listen: "127.0.0.1:0", upstream: u, policy: p}\n'
        '  - {name: rpc, protocol: grpc, listen: "127.0.0.1:0", upstream: g, policy: p}\n',
        {},
    )


def test_a_key_inherited_through_extends_counts_for_the_extending_policy_users() -> None:
    text = (
        'upstreams: {u: {endpoints: ["127.0.0.1:1"]}}\n'
        "policies: {base: {retryable_codes: [UNAVAILABLE]}, p: {extends: base, max_attempts: 2}}\n" + HTTP
    )
    assert set(dict(errors_of(text))) == {"policies.base.retryable_codes"}


def test_an_upstream_used_by_two_protocols_may_set_only_keys_that_apply_to_both() -> None:
    text = (
        'upstreams: {u: {endpoints: ["127.0.0.1:1"], max_connections: 4, replica_set: rs0}}\n'
        "listeners:\n"
        '  - {name: web, protocol: http, listen: "127.0.0.1:0", upstream: u}\n'
        '  - {name: db, protocol: mongodb, listen: "127.0.0.1:0", upstream: u}\n'
    )
    errors = dict(errors_of(text))
    assert set(errors) == {"upstreams.u.replica_set"}  # max_connections applies to both
    assert "used by http listeners (listeners[0])" in errors["upstreams.u.replica_set"]


def test_an_http_route_makes_its_upstream_an_http_one() -> None:
    text = (
        'upstreams: {u: {endpoints: ["127.0.0.1:1"]}, r: {endpoints: ["127.0.0.1:2"], auth: {username: a, password: b}}}\n'
        "listeners:\n"
        '  - {name: web, protocol: http, listen: "127.0.0.1:0", upstream: u,'
        " routes: [{match: {path_prefix: /r}, upstream: r}]}\n"
    )
    assert dict(errors_of(text))["upstreams.r.auth"].startswith(
        "does nothing for an upstream used by http listeners (listeners[0].routes[0])"
    )


def test_defaults_and_presets_are_not_settings_written() -> None:
    """A preset's protocol keys (http-default's retryable_status) are no error for a gRPC listener using
    a policy that extends it: only what the configuration writes counts."""
    load_text(
        'upstreams: {u: {endpoints: ["127.0.0.1:1"]}}\n'
        "policies: {p: {extends: http-default, max_attempts: 2}}\n" + GRPC,
        {},
    )


def test_a_mongodb_message_cap_larger_than_every_buffer_together_is_refused() -> None:
    """docs/hardening.md: a message is held whole, so one larger than limits.max_buffered_bytes could
    never be read."""
    errors = dict(
        errors_of(
            "limits: {max_buffered_bytes: 1MiB}\n"
            'upstreams: {u: {endpoints: ["127.0.0.1:1"]}}\n'
            'listeners: [{name: db, protocol: mongodb, listen: "127.0.0.1:0", upstream: u, max_message_size: 2MiB}]\n'
        )
    )
    assert errors == {
        "listeners[0].max_message_size": "2097152 bytes is more than limits.max_buffered_bytes (1048576 bytes)"
    }


def test_tls_on_an_http_upstream_is_taken_and_its_http_only_keys_refused_elsewhere() -> None:
    """The sidecar originates TLS for HTTP upstreams (issue 22): a tls block, https:// endpoints,
    insecure_skip_verify and min_version are HTTP's; min_version does nothing for gRPC or MongoDB."""
    load_text(
        'upstreams: {u: {endpoints: ["https://api.example"], tls: {insecure_skip_verify: true, min_version: "1.3"}}}\n'
        + POLICY
        + HTTP,
        {},
    )
    errors = dict(
        errors_of('upstreams: {u: {endpoints: ["127.0.0.1:1"], tls: {min_version: "1.2"}}}\n' + POLICY + GRPC)
    )
    assert list(errors) == ["upstreams.u.tls.min_version"]
    assert errors["upstreams.u.tls.min_version"].startswith(
        "does nothing for an upstream used by grpc listeners"
    )
    errors = dict(
        errors_of('upstreams: {u: {endpoints: ["127.0.0.1:1"], tls: {min_version: "1.0"}}}\n' + POLICY + HTTP)
    )
    assert list(errors) == ["upstreams.u.tls.min_version"]  # "1.2" or "1.3"


def test_url_endpoints_are_an_http_upstream_s_and_of_one_scheme() -> None:
    errors = dict(errors_of('upstreams: {u: {endpoints: ["https://api.example"]}}\n' + POLICY + GRPC))
    assert (
        list(errors) == ["upstreams.u.endpoints[0]"]
        and "a URL is an HTTP upstream's" in errors["upstreams.u.endpoints[0]"]
    )
    errors = dict(
        errors_of('upstreams: {u: {endpoints: ["https://a.example", "b.example:443"]}}\n' + POLICY + HTTP)
    )
    assert (
        list(errors) == ["upstreams.u.endpoints[1]"]
        and "one scheme (https://" in errors["upstreams.u.endpoints[1]"]
    )
    errors = dict(errors_of('upstreams: {u: {endpoints: ["http://a.example"], tls: {}}}\n' + POLICY + HTTP))
    assert list(errors) == ["upstreams.u.tls"] and "http:// (plain text)" in errors["upstreams.u.tls"]
    errors = dict(errors_of('upstreams: {u: {endpoints: ["https://a.example/v1"]}}\n' + POLICY + HTTP))
    assert (
        list(errors) == ["upstreams.u.endpoints[0]"]
        and "without a path" in errors["upstreams.u.endpoints[0]"]
    )


def test_console_keys_without_an_admin_port_are_refused() -> None:
    up = 'upstreams: {u: {endpoints: ["127.0.0.1:8080"]}}\n' + POLICY + HTTP
    errors = dict(
        errors_of("admin: {listen: null, console_allow: [10.0.0.0/8], console_hosts: [a.example]}\n" + up)
    )
    assert set(errors) == {"admin.console_allow", "admin.console_hosts"}
    assert errors["admin.console_hosts"].startswith("does nothing while admin.listen is null")
    load_text('admin: {listen: "127.0.0.1:0", console_hosts: [a.example]}\n' + up, {})  # with a port: taken
    load_text("admin: {listen: null}\n" + up, {})


def test_trace_keys_the_exporter_does_not_read_are_refused() -> None:
    up = 'upstreams: {u: {endpoints: ["127.0.0.1:8080"]}}\n' + POLICY + HTTP
    errors = dict(
        errors_of(
            'telemetry: {traces: {endpoint: "http://c:4317", protocol: http, sample_ratio: 0.5}}\n' + up
        )
    )
    assert set(errors) == {
        "telemetry.traces.endpoint",
        "telemetry.traces.protocol",
        "telemetry.traces.sample_ratio",
    }
    assert errors["telemetry.traces.endpoint"] == (
        "does nothing with exporter none: only the otlp exporter sends spans to an endpoint"
    )
    errors = dict(errors_of('telemetry: {traces: {exporter: console, endpoint: "http://c:4317"}}\n' + up))
    assert set(errors) == {"telemetry.traces.endpoint"}
    load_text("telemetry: {traces: {exporter: console, sample_ratio: 0.5}}\n" + up, {})
    cfg = load_text(
        'telemetry: {traces: {exporter: otlp, endpoint: "http://c:4318/v1/traces", protocol: http, '
        "sample_ratio: 0.1}}\n" + up,
        {},
    )
    assert cfg.telemetry.traces.sample_ratio == 0.1
