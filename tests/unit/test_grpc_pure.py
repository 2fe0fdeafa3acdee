"""The gRPC adapter's pure parts: metadata rules, pushback, classification, routing, final answers."""

from __future__ import annotations

import grpc
import pytest

from sidecar.adapters.grpc.answer import DEADLINE_DETAILS, answer
from sidecar.adapters.grpc.classify import GrpcClassifier, UpstreamStatus
from sidecar.adapters.grpc.metadata import (
    attempt_metadata,
    parse_pushback,
    request_metadata,
    response_metadata,
)
from sidecar.adapters.grpc.routing import MethodRoutes
from sidecar.policy import PUSHBACK_STOP, Finish, Outcome, OutcomeClass, Pushback, Reason

S = grpc.StatusCode
C = OutcomeClass
A6 = GrpcClassifier.from_names(["UNAVAILABLE"], ["RESOURCE_EXHAUSTED"])


# -- metadata ---------------------------------------------------------------------------------------
def test_request_metadata_drops_hop_by_hop_and_own_keys() -> None:
    incoming = [
        ("user-agent", "x"),
        ("x-app", "1"),
        ("x-bin", b"\x00"),
        ("grpc-previous-rpc-attempts", "7"),
        ("traceparent", "00-a-b-01"),
        ("x-yataxi-client-timeoutms", "300"),
        ("te", "trailers"),
    ]
    assert request_metadata(incoming, "X-YaTaxi-Client-TimeoutMs") == [("x-app", "1"), ("x-bin", b"\x00")]


def test_attempt_metadata_adds_trace_previous_attempts_and_the_renewed_deadline_header() -> None:
    base = [("x-app", "1")]
    assert attempt_metadata(base, 0, {}) == (("x-app", "1"),)
    md = attempt_metadata(base, 2, {"traceparent": "t"}, "X-YaTaxi-Client-TimeoutMs", 120)
    assert md == (
        ("x-app", "1"),
        ("traceparent", "t"),
        ("grpc-previous-rpc-attempts", "2"),
        ("x-yataxi-client-timeoutms", "120"),
    )


def test_response_metadata_keeps_binary_keys() -> None:
    md = [("grpc-status-details-bin", b"\x08\x0e"), ("x-a", "1"), ("grpc-previous-rpc-attempts", "3")]
    assert response_metadata(md) == [("grpc-status-details-bin", b"\x08\x0e"), ("x-a", "1")]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], None),
        (["250"], Pushback(0.25)),
        (["0"], Pushback(0.0)),
        (["-1"], PUSHBACK_STOP),
        (["soon"], PUSHBACK_STOP),
        (["1.5"], PUSHBACK_STOP),
        (["10", "10"], PUSHBACK_STOP),
        ([b"40"], Pushback(0.04)),
    ],
)
def test_pushback(values: list, expected: Pushback | None) -> None:
    assert parse_pushback([("x", "1"), *(("grpc-retry-pushback-ms", v) for v in values)]) == expected


# -- classification ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("code", "details", "cls"),
    [
        (S.OK, "", C.SUCCESS),
        (S.UNAVAILABLE, "injected", C.UNAVAILABLE),
        (S.RESOURCE_EXHAUSTED, "", C.OVERLOADED),
        (S.INVALID_ARGUMENT, "", C.FATAL),
        (S.INTERNAL, "", C.FATAL),
        (S.DEADLINE_EXCEEDED, "", C.TIMEOUT),
        (
            S.UNAVAILABLE,
            "failed to connect to all addresses; last error: Connection refused",
            C.CONNECT_FAILURE,
        ),
        (S.UNAVAILABLE, "Socket closed", C.RESET),
        (S.RESOURCE_EXHAUSTED, "Received message larger than max (5000 vs. 4096)", C.FATAL),
        (S.UNAVAILABLE, "recvmsg:Connection reset by peer", C.RESET),
    ],
)
def test_classification(code: grpc.StatusCode, details: str, cls: OutcomeClass) -> None:
    assert A6.classify(code, details).cls is cls


def test_transport_texts_count_only_before_the_upstream_responded() -> None:
    assert A6.classify(S.UNAVAILABLE, "Socket closed", responded=True).cls is C.UNAVAILABLE


def test_configured_codes_and_pushback() -> None:
    c = GrpcClassifier.from_names(["UNAVAILABLE", "ABORTED"], [])
    assert c.classify(S.ABORTED, "").cls is C.UNAVAILABLE
    assert c.classify(S.RESOURCE_EXHAUSTED, "").cls is C.FATAL
    out = c.classify(S.UNAVAILABLE, "", [("grpc-retry-pushback-ms", "-1")])
    assert out.pushback is PUSHBACK_STOP or out.pushback == PUSHBACK_STOP
    assert c.classify(S.OK, "", [("grpc-retry-pushback-ms", "5")]).pushback is None


def test_deadline_exceeded_is_the_requests_deadline_only_when_one_was_sent() -> None:
    assert A6.classify(S.DEADLINE_EXCEEDED, "", had_deadline=True).deadline_expired
    assert not A6.classify(S.DEADLINE_EXCEEDED, "", had_deadline=False).deadline_expired


# -- routing ----------------------------------------------------------------------------------------
def test_routing_order_and_timeout_caps() -> None:
    routes = MethodRoutes(
        {"a.S/Get": "exact", "a.S": "service", "*": "default"}, "listener", {"a.S": 1.0, "a.S/Get": 0.5}
    )
    assert routes.resolve("/a.S/Get").policy == "exact"
    assert routes.resolve("/a.S/Get").timeout_cap == 0.5
    assert routes.resolve("/a.S/Put").policy == "service"
    assert routes.resolve("/a.S/Put").timeout_cap == 1.0
    other = routes.resolve("/b.T/X")
    assert (other.policy, other.timeout_cap, other.name, other.service, other.method) == (
        "default",
        None,
        "b.T/X",
        "b.T",
        "X",
    )
    assert MethodRoutes({}, "listener", {}).resolve("/b.T/X").policy == "listener"


# -- answers ----------------------------------------------------------------------------------------
def finish(reason: Reason, attempt: int | None, attempts: int, outcome: Outcome | None = None) -> Finish:
    return Finish(reason, attempt, outcome, attempts)


def test_upstream_status_passes_through_with_previous_attempts() -> None:
    st = UpstreamStatus(S.OK, "", (("x-a", "1"), ("grpc-status-details-bin", b"\x01")))
    a = answer(finish(Reason.SUCCESS, 2, 2), st, upstream="u", give_up_pushback=True)
    assert a.code is S.OK and a.trailing == [
        ("x-a", "1"),
        ("grpc-status-details-bin", b"\x01"),
        ("grpc-previous-rpc-attempts", "1"),
    ]
    first = answer(finish(Reason.SUCCESS, 1, 1), st, upstream="u", give_up_pushback=True)
    assert ("grpc-previous-rpc-attempts", "1") not in first.trailing


def test_giving_up_adds_pushback_stop_replacing_the_upstreams() -> None:
    st = UpstreamStatus(S.UNAVAILABLE, "down", (("grpc-retry-pushback-ms", "10"),))
    a = answer(finish(Reason.ATTEMPTS_EXHAUSTED, 3, 3), st, upstream="u", give_up_pushback=True)
    assert a.code is S.UNAVAILABLE and a.details == "down"
    assert a.trailing == [("grpc-retry-pushback-ms", "-1"), ("grpc-previous-rpc-attempts", "2")]
    kept = answer(finish(Reason.NOT_RETRYABLE, 1, 1), st, upstream="u", give_up_pushback=True)
    assert kept.trailing == [("grpc-retry-pushback-ms", "10")]
    off = answer(finish(Reason.THROTTLED, 1, 1), st, upstream="u", give_up_pushback=False)
    assert off.trailing == [("grpc-retry-pushback-ms", "10")]


def test_every_reason_without_a_status_has_one_answer() -> None:
    dl = answer(finish(Reason.DEADLINE, None, 2), None, upstream="u", give_up_pushback=False)
    assert (dl.code, dl.details) == (S.DEADLINE_EXCEEDED, DEADLINE_DETAILS)
    assert ("grpc-previous-rpc-attempts", "2") in dl.trailing
    st = UpstreamStatus(S.UNAVAILABLE, "down")
    assert (
        answer(finish(Reason.DEADLINE, 1, 1), st, upstream="u", give_up_pushback=False).code
        is S.DEADLINE_EXCEEDED
    )
    ne = answer(finish(Reason.NO_ENDPOINT, None, 0), None, upstream="orders", give_up_pushback=False)
    assert ne.code is S.UNAVAILABLE and "'orders'" in ne.details
    pt = answer(
        finish(Reason.ATTEMPTS_EXHAUSTED, 2, 2, Outcome(C.TIMEOUT)),
        None,
        upstream="u",
        give_up_pushback=False,
    )
    assert pt.code is S.DEADLINE_EXCEEDED and "per-try" in pt.details
    assert (
        answer(finish(Reason.CANCELLED, None, 1), None, upstream="u", give_up_pushback=False).code
        is S.CANCELLED
    )


def test_the_clients_address_from_grpcs_peer_string() -> None:
    from sidecar.adapters.grpc.request import peer_host

    assert peer_host("ipv4:127.0.0.1:50051") == "127.0.0.1"
    assert peer_host("ipv6:[::1]:50051") == "::1"
    assert peer_host("ipv6:[fe80::1%25eth0]:50051") == "fe80::1%eth0"
    assert peer_host("unix:/tmp/s.sock") == "" and peer_host(None) == "" and peer_host("") == ""
