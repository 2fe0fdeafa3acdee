"""HTTP responses in the engine's words, and server pushback (no sockets)."""

from __future__ import annotations

import pytest

from sidecar.adapters.http.classify import HttpClassifier
from sidecar.adapters.http.headers import header_list
from sidecar.adapters.http.pushback import millis, pushback, retry_after
from sidecar.config.schema import PolicyConfig
from sidecar.policy import PUSHBACK_STOP, OutcomeClass, Pushback

C = OutcomeClass
NOW = 1_700_000_000.0  # Tue, 14 Nov 2023 22:13:20 GMT
_classifier = HttpClassifier.from_policy(PolicyConfig(pushback_header="X-Retry-After-Ms"))


class classify:  # noqa: N801 - reads like the classifier, with headers as (name, value) pairs
    @staticmethod
    def response(status, pairs, now):  # noqa: ANN001, ANN205
        return _classifier.response(status, header_list(pairs), now)


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (200, C.SUCCESS),
        (204, C.SUCCESS),
        (304, C.SUCCESS),
        (404, C.SUCCESS),
        (429, C.OVERLOADED),
        (503, C.OVERLOADED),  # in both lists: overloaded wins
        (502, C.UNAVAILABLE),
        (504, C.UNAVAILABLE),
        (500, C.FATAL),
        (501, C.FATAL),
    ],
)
def test_status_classes(status: int, cls: OutcomeClass) -> None:
    o = classify.response(status, [], NOW)
    assert o.cls is cls and o.detail == str(status)


def test_lists_are_configurable() -> None:
    c = HttpClassifier.from_policy(
        PolicyConfig(retryable_status=[500, 503], overload_status=[429])
    )  # no headers
    assert c.response(500, [], NOW).cls is C.UNAVAILABLE
    assert c.response(503, [], NOW).cls is C.UNAVAILABLE
    assert c.response(502, [], NOW).cls is C.FATAL


def test_deadline_expired_header_is_a_timeout_whatever_the_status() -> None:
    for status in (200, 498, 503, 500):
        o = classify.response(status, [(b"X-YaTaxi-Deadline-Expired", b"1")], NOW)
        assert o.cls is C.TIMEOUT and o.deadline_expired
    assert classify.response(200, [(b"X-YaTaxi-Deadline-Expired", b"")], NOW).cls is C.SUCCESS


def test_pushback_is_read_on_retryable_answers_only() -> None:
    h = [(b"Retry-After", b"3")]
    assert classify.response(503, h, NOW).pushback == Pushback(3.0)
    assert classify.response(429, h, NOW).pushback == Pushback(3.0)
    assert classify.response(200, h, NOW).pushback is None
    assert classify.response(500, h, NOW).pushback is None
    ms = [(b"Retry-After", b"3"), (b"x-retry-after-ms", b"250")]
    assert classify.response(503, ms, NOW).pushback == Pushback(0.25)  # the precise header wins
    assert classify.response(429, [(b"X-Retry-After-Ms", b"-1")], NOW).pushback is PUSHBACK_STOP


def test_retry_after_both_forms() -> None:
    assert retry_after(b"120", NOW) == 120.0
    assert retry_after(b"Tue, 14 Nov 2023 22:13:25 GMT", NOW) == pytest.approx(5.0)
    assert retry_after(b"Tue, 14 Nov 2023 22:00:00 GMT", NOW) == 0.0  # in the past: now
    assert retry_after(b"Sunday, 06-Nov-94 08:49:37 GMT", NOW) == 0.0  # RFC 850 form
    for bad in (b"", b"soon", b"-5", b"1.5", b"Tue, 14 Nov 2023 22:13:25", None):
        assert retry_after(bad, NOW) is None
    assert retry_after(b"999999999", NOW) == 24 * 3600.0  # capped


def test_millisecond_header() -> None:
    assert millis(b"250") == Pushback(0.25)
    assert millis(b"0") == Pushback(0.0)
    assert millis(b"-1") is PUSHBACK_STOP
    assert millis(b"nan") is None and millis(b"x") is None and millis(None) is None
    assert pushback(None, None, NOW) is None
    assert pushback(b"2", b"oops", NOW) == Pushback(2.0)  # an unreadable ms header falls back
