"""Extension methods: where the request llhttp refused begins, and how it is parsed again (no sockets)."""

from __future__ import annotations

import httptools

from sidecar.adapters.http.methods import STAND_IN, message_start, rewrite


def test_a_lone_request_begins_at_the_start() -> None:
    data = b"BREW /pot HTTP/1.1\r\nHost: x\r\n\r\n"
    assert message_start(data) == 0
    found = rewrite(data)
    assert found is not None and found.method == b"BREW"
    assert found.rest == STAND_IN + b" /pot HTTP/1.1\r\nHost: x\r\n\r\n"


def test_behind_whole_requests_with_bodies_in_the_same_packet() -> None:
    body = b"BREW / HTTP/1.1\r\n\r\nxx"  # a body that looks like a refused head
    first = b"POST /a HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    second = b"GET /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    data = first + second + b"\r\nX-CUSTOM /c HTTP/1.1\r\n\r\n"
    assert message_start(data) == len(first + second)
    found = rewrite(data)
    assert found is not None and found.method == b"X-CUSTOM"
    assert found.rest.startswith(STAND_IN + b" /c HTTP/1.1")


def test_a_method_not_yet_whole_is_held_and_a_non_token_refused() -> None:
    held = rewrite(b"BR")
    assert held is not None and held.method == b"" and held.rest == b"BR"
    assert rewrite(b"BR\x01EW / HTTP/1.1\r\n\r\n") is None
    assert rewrite(b"(x) / HTTP/1.1\r\n\r\n") is None
    assert rewrite(b"A" * 100) is None  # too long to be held


def test_the_rewritten_request_parses() -> None:
    found = rewrite(b"M.1_~ /x HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi")
    assert found is not None

    class Sink:
        body = b""

        def on_body(self, b: bytes) -> None:
            self.body += b

    sink = Sink()
    parser = httptools.HttpRequestParser(sink)
    parser.feed_data(found.rest)
    assert parser.get_method() == STAND_IN and sink.body == b"hi"
