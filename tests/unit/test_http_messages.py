"""Request and response heads as the proxy rewrites them, the sidecar's own answers, and the replay
buffer (no sockets)."""

from __future__ import annotations

import pytest

from sidecar.adapters.http import answer as answers
from sidecar.adapters.http.headers import header_list, request_head, response_head
from sidecar.adapters.http.replay import WATERMARK, RequestBody
from sidecar.buffer_budget import BufferBudget
from sidecar.policy import Finish, Outcome, OutcomeClass, Reason

C = OutcomeClass


def head(headers, **kw):  # noqa: ANN001, ANN201
    kw.setdefault("client_ip", b"10.9.8.7")
    kw.setdefault("deadline_header", b"x-yataxi-client-timeoutms")
    kw.setdefault("body_length", None)
    kw.setdefault("chunked", False)
    return request_head(b"GET", b"/a?b=1", header_list(headers), **kw)


def test_request_head_drops_hop_by_hop_and_restates_framing() -> None:
    rh = head(
        [
            (b"Host", b"orders.internal"),
            (b"Connection", b"keep-alive, X-Secret"),
            (b"X-Secret", b"1"),
            (b"Transfer-Encoding", b"chunked"),
            (b"Expect", b"100-continue"),
            (b"Accept", b"*/*"),
            (b"X-YaTaxi-Client-TimeoutMs", b"250"),
            (b"X-Sidecar-Attempt", b"9"),
        ],
        chunked=True,
    )
    assert rh.head == (
        b"GET /a?b=1 HTTP/1.1\r\nAccept: */*\r\nHost: orders.internal\r\nX-Forwarded-For: 10.9.8.7\r\n"
        b"X-Forwarded-Proto: http\r\nTransfer-Encoding: chunked\r\n"
    )
    assert rh.deadline == b"250" and rh.host == b"orders.internal" and rh.trace is None


def test_request_head_host_rules() -> None:
    assert head([(b"Host", b"127.0.0.1:15001")], is_self=lambda h: True).host is None  # name the endpoint
    assert head([], is_self=lambda h: True).host is None
    rh = head([(b"Host", b"ignored")], authority=b"api:8080", body_length=5)
    assert rh.host == b"api:8080" and rh.client_host == b"ignored"
    assert rh.head.endswith(
        b"Host: api:8080\r\nX-Forwarded-For: 10.9.8.7\r\nX-Forwarded-Proto: http\r\nContent-Length: 5\r\n"
    )


def test_forwarding_headers_append_and_keep_an_earlier_proxy_word() -> None:
    rh = head(
        [(b"X-Forwarded-For", b"1.1.1.1"), (b"x-forwarded-for", b"2.2.2.2"), (b"X-Forwarded-Proto", b"https")]
    )
    assert b"X-Forwarded-For: 1.1.1.1, 2.2.2.2, 10.9.8.7\r\n" in rh.head
    assert b"X-Forwarded-Proto: https\r\n" in rh.head and b"X-Forwarded-Proto: http\r\n" not in rh.head


def test_trace_context_is_taken_out_when_attempts_carry_their_own() -> None:
    h = [(b"traceparent", b"00-abc-def-01"), (b"tracestate", b"k=v")]
    assert b"traceparent" in head(h).head
    rh = head(h, replace_trace=True)
    assert b"traceparent" not in rh.head and rh.trace == {"traceparent": "00-abc-def-01", "tracestate": "k=v"}


def test_response_head_reframes_for_the_client() -> None:
    up = [
        (b"Content-Type", b"text/plain"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Connection", b"close, X-Hop"),
        (b"X-Hop", b"1"),
    ]
    up = header_list(up)
    lines, chunked, keep = response_head(
        200, b"OK", up, length=None, with_body=True, client_version="1.1", keep_alive=True
    )
    assert (
        b"".join(lines)
        == b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    assert chunked and keep
    lines, chunked, keep = response_head(
        200, b"", up, length=None, with_body=True, client_version="1.0", keep_alive=True
    )
    assert (
        not chunked and not keep and b"Connection: close\r\n" in lines
    )  # HTTP/1.0: ends with the connection
    lines, chunked, keep = response_head(
        204, b"", [], length=None, with_body=False, client_version="1.0", keep_alive=True
    )
    assert lines[0] == b"HTTP/1.1 204 No Content\r\n" and b"Connection: keep-alive\r\n" in lines and keep


def test_every_finish_has_one_answer() -> None:
    def fin(reason: Reason, cls: OutcomeClass | None, detail: str = "") -> Finish:
        return Finish(reason, 1 if cls else None, Outcome(cls, detail=detail) if cls else None, 3)

    dl = answers.for_finish(fin(Reason.DEADLINE, C.UNAVAILABLE), 498)
    assert dl == answers.Answer(498, b"Deadline expired", ((b"X-YaTaxi-Deadline-Expired", b"1"),))
    assert answers.for_finish(fin(Reason.CANCELLED, None), 498) is None
    assert answers.for_finish(fin(Reason.ATTEMPTS_EXHAUSTED, C.TIMEOUT, "per-try timeout"), 498).status == 504
    cf = answers.for_finish(fin(Reason.ATTEMPTS_EXHAUSTED, C.CONNECT_FAILURE, "refused"), 498)
    assert cf.status == 502 and b"connect failure after 3 attempts (refused)" in cf.body
    assert answers.for_finish(fin(Reason.NOT_RETRYABLE, C.RESET), 498).status == 502
    no_endpoint = answers.for_finish(fin(Reason.NO_ENDPOINT, None), 498, "orders")
    assert no_endpoint.status == 503 and b"no healthy upstream: 'orders' has no endpoint" in no_endpoint.body
    wire = answers.encode(dl, keep_alive=False)
    assert wire.startswith(b"HTTP/1.1 498 Deadline Expired\r\n") and wire.endswith(
        b"Connection: close\r\n\r\nDeadline expired"
    )
    assert answers.encode(dl, keep_alive=True, head_only=True).endswith(
        b"X-YaTaxi-Deadline-Expired: 1\r\n\r\n"
    )


class Control:
    def __init__(self) -> None:
        self.paused = False

    def pause_body(self) -> None:
        self.paused = True

    def resume_body(self) -> None:
        self.paused = False

    def pause_budget(self) -> None:
        self.paused = True

    def resume_budget(self) -> None:
        self.paused = False


PLENTY = BufferBudget(1 << 40)


class Sink:
    def __init__(self) -> None:
        self.data = b""
        self.ended = False

    def body_data(self, data: bytes) -> None:
        self.data += data

    def body_end(self) -> None:
        self.ended = True


def test_replay_buffer_replays_to_a_later_attempt() -> None:
    body = RequestBody(None, 100, Control(), PLENTY)
    first = Sink()
    body.attach(first)
    body.feed(b"abc")
    body.detach(first)  # attempt 1 failed mid-body
    body.feed(b"def")
    second = Sink()
    body.attach(second)
    body.feed(b"g")
    body.end()
    assert first.data == b"abc" and not first.ended
    assert second.data == b"abcdefg" and second.ended and body.replayable


class Owner:
    """A body's owner (``replay.BodyOwner``): what it was told."""

    def __init__(self) -> None:
        self.told: list[str] = []

    def body_attached(self) -> None:
        self.told.append("attached")

    def body_overflowed(self) -> None:
        self.told.append("overflowed")

    def body_complete(self) -> None:
        self.told.append("complete")


def test_replay_buffer_overflow_is_reported_once_and_the_body_let_go() -> None:
    body = RequestBody(None, 4, Control(), PLENTY)
    owner = body.owner = Owner()
    sink = Sink()
    body.attach(sink)
    body.feed(b"abc")
    body.feed(b"de")
    body.feed(b"f")
    assert owner.told == ["attached", "overflowed"] and not body.replayable and body.kept.pieces == []
    assert sink.data == b"abcdef"
    try:
        body.attach(Sink())
    except RuntimeError:
        pass
    else:  # pragma: no cover
        raise AssertionError("a body that was let go cannot be sent again")
    big = RequestBody(1000, 4, Control(), PLENTY)
    assert not big.replayable  # declared too large: one attempt from the start


def test_flow_control_holds_the_client_back() -> None:
    ctl = Control()
    body = RequestBody(None, 10 * WATERMARK, ctl, PLENTY)
    body.feed(b"x" * (WATERMARK + 1))  # nobody takes it yet
    assert ctl.paused
    sink = Sink()
    body.attach(sink)
    assert not ctl.paused
    body.sink_paused(sink)  # the upstream socket backs up
    assert ctl.paused
    body.sink_resumed(sink)
    assert not ctl.paused


def test_kept_chunks_count_against_the_shared_budget_and_reading_waits_for_room() -> None:
    budget = BufferBudget(100)
    ctl1, ctl2 = Control(), Control()
    one = RequestBody(None, 1000, ctl1, budget)
    two = RequestBody(None, 1000, ctl2, budget)
    one.feed(b"x" * 60)
    assert budget.used == 60 and not ctl1.paused
    two.feed(b"y" * 50)  # kept whole (it arrived), and now the budget is full: both stop reading
    assert budget.used == 110 and ctl1.paused is False and ctl2.paused
    one.feed(b"z")
    assert ctl1.paused
    one.release()  # the first request is over: its share goes back, the second reads on
    assert budget.used == 50 and not ctl2.paused
    two.end()
    two.release()
    assert budget.used == 0 and two.kept.pieces == []


def test_content_length_reads_digits_like_int() -> None:
    from sidecar.adapters.http.headers import content_length

    for raw in (b"0", b"7", b"42", b"1048576", b"99999999999999999999999"):
        assert content_length(raw) == int(raw)
    for bad in (b"", b"1x", b" "):
        with pytest.raises(ValueError):
            content_length(bad)


def test_body_framing_one_rule_for_requests_and_responses() -> None:
    from sidecar.adapters.http.headers import CHUNKED, NOT_CHUNKED, UNSTATED, body_framing

    def framing(*pairs: tuple[bytes, bytes]) -> int:
        return body_framing(header_list(pairs))

    assert framing((b"Host", b"a")) == UNSTATED
    assert framing((b"Content-Length", b"12")) == 12
    assert framing((b"Content-Length", b"0")) == 0
    assert framing((b"Transfer-Encoding", b"gzip, Chunked")) == CHUNKED
    assert framing((b"Transfer-Encoding", b"gzip"), (b"Transfer-Encoding", b"chunked")) == CHUNKED
    assert framing((b"Content-Length", b"5"), (b"Transfer-Encoding", b"chunked")) == CHUNKED  # TE wins
    assert framing((b"Transfer-Encoding", b"xchunked")) == NOT_CHUNKED  # not "contains chunked"
    assert framing((b"Transfer-Encoding", b"chunked, gzip")) == NOT_CHUNKED  # chunked must be last
