"""httpbin on gunicorn, directly and through the sidecar: the same answers (see conftest.py)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests

from .conftest import Sidecar, echoed, end_to_end, raw_exchange, sidecar_config


def both(method: str, path: str, httpbin: str, sidecar: Sidecar, **kw: Any) -> tuple[requests.Response, ...]:
    """The same request with ``requests``, directly and through the sidecar; no redirects followed unless
    asked (a redirect is an answer to compare)."""
    kw.setdefault("allow_redirects", False)
    direct = requests.request(method, f"http://{httpbin}{path}", timeout=20, **kw)
    proxied = requests.request(method, sidecar.url("bin") + path, timeout=20, **kw)
    return direct, proxied


def assert_same(direct: requests.Response, proxied: requests.Response) -> None:
    assert proxied.status_code == direct.status_code
    assert proxied.content == direct.content
    assert end_to_end(proxied.headers) == end_to_end(direct.headers)


def assert_same_echo(direct: requests.Response, proxied: requests.Response) -> dict[str, Any]:
    """httpbin echoed the request: the same, but for the headers the sidecar adds on purpose."""
    assert proxied.status_code == direct.status_code
    d, p = direct.json(), proxied.json()
    assert echoed(p.pop("headers")) == echoed(d.pop("headers"))
    assert p == d
    assert end_to_end(proxied.headers) | {"content-length": []} == end_to_end(direct.headers) | {
        "content-length": []
    }
    return p


@pytest.mark.parametrize("path", ["/get?a=1&b=2", "/status/418", "/status/404", "/headers", "/ip", "/uuid"])
def test_plain_gets_are_answered_alike(httpbin: str, sidecar: Sidecar, path: str) -> None:
    direct, proxied = both("GET", path, httpbin, sidecar)
    if path in ("/get?a=1&b=2", "/headers"):
        assert_same_echo(direct, proxied)
    elif path == "/uuid":
        assert proxied.status_code == direct.status_code == 200 and "uuid" in proxied.json()
    else:
        assert_same(direct, proxied)


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "GET"])
def test_content_length_zero_is_kept(httpbin: str, sidecar: Sidecar, method: str) -> None:
    """Issue 11 item 4: an empty body with ``Content-Length: 0`` arrives with it."""
    direct, proxied = both(method, "/anything", httpbin, sidecar, headers={"Content-Length": "0"})
    echo = assert_same_echo(direct, proxied)
    assert echo["method"] == method
    assert proxied.json()["headers"].get("Content-Length") == "0"


@pytest.mark.parametrize("method", ["BREW", "X-CUSTOM", "get", "M.1_~", "PROPFIND"])
def test_extension_methods_are_forwarded(httpbin: str, sidecar: Sidecar, method: str) -> None:
    """Issue 11 item 6: any RFC 9110 token is a method, forwarded as it came: the upstream answers it
    (gunicorn refuses methods that are not upper case, httpbin's routes answer 405 to the others). Raw
    sockets: ``requests`` would upper-case the method."""
    req = f"{method} /status/200 HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\nConnection: close\r\n\r\ncoffee"
    direct = raw_exchange(int(httpbin.rsplit(":", 1)[1]), req.encode())
    proxied = raw_exchange(sidecar.port("bin"), req.encode())
    d_head, _, d_body = direct.partition(b"\r\n\r\n")
    p_head, _, p_body = proxied.partition(b"\r\n\r\n")
    assert p_head.split(b"\r\n")[0] == d_head.split(b"\r\n")[0] and p_body == d_body
    assert b"retry-sidecar" not in p_body


def test_extension_methods_pipelined_and_split_across_packets(httpbin: str, sidecar: Sidecar) -> None:
    """A token method behind another request in one packet, and one whose method comes in two packets."""
    port = sidecar.port("bin")
    two = (
        b"GET /get HTTP/1.1\r\nHost: x\r\n\r\n"
        b"BREW /anything HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\ntea"
    )
    answers = raw_exchange(port, two)
    assert answers.count(b"HTTP/1.1 200 OK") == 1 and answers.count(b"HTTP/1.1 405 METHOD NOT ALLOWED") == 1
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(b"BR")
        s.sendall(b"EW /anything HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert s.makefile("rb").read().startswith(b"HTTP/1.1 405 ")


def test_a_client_that_half_closes_gets_its_answer(httpbin: str, sidecar: Sidecar) -> None:
    """Issue 11 item 7: ``shutdown(SHUT_WR)`` after a complete request (``nc -N``): answered, then closed."""
    req = b"GET /get?half=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    proxied = raw_exchange(sidecar.port("bin"), req, shut_wr=True)
    assert proxied.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b'"half": "1"' in proxied
    two = req + b"GET /get?half=2 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    both_answers = raw_exchange(sidecar.port("bin"), two, shut_wr=True)
    assert both_answers.count(b"HTTP/1.1 200 OK\r\n") == 2 and b'"half": "2"' in both_answers


def test_half_close_with_nc(httpbin: str, sidecar: Sidecar) -> None:
    nc = shutil.which("nc")
    if nc is None or b"-N" not in subprocess.run([nc, "-h"], capture_output=True).stderr:
        pytest.fail("no nc with -N on this machine: tools/test-deps.sh installs netcat-openbsd (make test runs it)")
    out = subprocess.run(
        [nc, "-N", "127.0.0.1", str(sidecar.port("bin"))],
        input=b"GET /status/201 HTTP/1.1\r\nHost: x\r\n\r\n",
        capture_output=True,
        timeout=20,
    ).stdout
    assert out.startswith(b"HTTP/1.1 201 CREATED\r\n")


def test_absolute_form_in_upper_case_and_localhost(httpbin: str, sidecar: Sidecar) -> None:
    """Issue 11 item 8: scheme and host match case-insensitively; ``localhost`` names a loopback endpoint."""
    port = httpbin.rsplit(":", 1)[1]
    for target in (
        f"HTTP://127.0.0.1:{port}/get",
        f"http://localhost:{port}/get",
        f"Http://LOCALHOST:{port}/get",
    ):
        out = raw_exchange(
            sidecar.port("bin"), f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
        )
        assert out.startswith(b"HTTP/1.1 200 OK\r\n"), (target, out[:200])
    out = raw_exchange(
        sidecar.port("bin"), b"GET http://example.com/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert out.startswith(b"HTTP/1.1 403 ")


def test_requests_through_http_proxy_absolute_form(httpbin: str, sidecar: Sidecar) -> None:
    direct = requests.get(f"http://{httpbin}/anything/p?q=1", timeout=20)
    s = requests.Session()
    s.trust_env = False
    s.proxies = {"http": sidecar.url("bin")}
    proxied = s.get(f"http://{httpbin}/anything/p?q=1", timeout=20)
    assert_same_echo(direct, proxied)
    env = dict(os.environ, HTTP_PROXY=sidecar.url("bin"), NO_PROXY="")
    code = f"import requests; print(requests.get('http://{httpbin}/status/207', timeout=20).status_code)"
    out = subprocess.run(["python", "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "207", out.stderr


def test_chunked_upload_and_chunked_download(httpbin: str, sidecar: Sidecar) -> None:
    def gen() -> Any:
        yield b"a" * 1000
        yield b"b" * 70000
        yield b"c"

    direct = requests.post(f"http://{httpbin}/anything", data=gen(), timeout=20)
    proxied = requests.post(sidecar.url("bin") + "/anything", data=gen(), timeout=20)
    assert assert_same_echo(direct, proxied)["data"] == "a" * 1000 + "b" * 70000 + "c"
    direct, proxied = both("GET", "/stream/20", httpbin, sidecar)
    assert proxied.status_code == 200 and proxied.headers.get("transfer-encoding") == "chunked"
    assert len(proxied.content.splitlines()) == len(direct.content.splitlines()) == 20


def test_gzip_passes_through_unchanged(httpbin: str, sidecar: Sidecar) -> None:
    direct, proxied = both("GET", "/gzip", httpbin, sidecar, stream=True)
    d, p = direct.raw.read(decode_content=False), proxied.raw.read(decode_content=False)
    assert proxied.headers["content-encoding"] == direct.headers["content-encoding"] == "gzip"
    assert int(proxied.headers["content-length"]) == len(p)  # the compressed bytes, not re-encoded
    de, pe = json.loads(gzip.decompress(d)), json.loads(gzip.decompress(p))
    assert echoed(pe.pop("headers")) == echoed(de.pop("headers")) and pe == de


def test_redirects_and_cookies(httpbin: str, sidecar: Sidecar) -> None:
    direct, proxied = both("GET", "/redirect-to?url=/get&status_code=307", httpbin, sidecar)
    assert_same(direct, proxied)
    direct, proxied = both("GET", "/cookies/set?flavour=oat&size=big", httpbin, sidecar)
    assert_same(direct, proxied)
    assert proxied.headers["set-cookie"] == direct.headers["set-cookie"]
    with requests.Session() as s:
        r = s.get(
            sidecar.url("bin") + "/cookies/set?a=1", timeout=20
        )  # follows the redirect, keeps the cookie
        assert r.json() == {"cookies": {"a": "1"}}


def test_ranges_and_large_bodies_both_ways(httpbin: str, sidecar: Sidecar) -> None:
    direct, proxied = both("GET", "/range/4096", httpbin, sidecar, headers={"Range": "bytes=100-299"})
    assert_same(direct, proxied)
    assert proxied.status_code == 206 and len(proxied.content) == 200
    big = os.urandom(3 * 1024 * 1024)  # over the replay buffer: streamed, one attempt
    direct, proxied = both("POST", "/anything", httpbin, sidecar, data=big)
    assert proxied.status_code == direct.status_code == 200
    assert len(proxied.json()["data"]) == len(direct.json()["data"])
    direct, proxied = both("GET", "/bytes/102400?seed=7", httpbin, sidecar)
    assert_same(direct, proxied)


def test_head_204_and_304(httpbin: str, sidecar: Sidecar) -> None:
    for method, path, headers in (
        ("HEAD", "/robots.txt", {}),
        ("HEAD", "/bytes/300?seed=1", {}),
        ("GET", "/status/204", {}),
        ("GET", "/etag/abc", {"If-None-Match": '"abc"'}),
        ("GET", "/cache", {"If-Modified-Since": "Wed, 21 Oct 2015 07:28:00 GMT"}),
    ):
        direct, proxied = both(method, path, httpbin, sidecar, headers=headers)
        assert_same(direct, proxied)
    raw = raw_exchange(
        sidecar.port("bin"), b"HEAD /bytes/100 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert raw.startswith(b"HTTP/1.1 200 OK\r\n") and raw.endswith(b"\r\n\r\n")


def test_pipelined_requests_are_answered_in_order(httpbin: str, sidecar: Sidecar) -> None:
    reqs = b"".join(b"GET /anything/%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(5))
    out = raw_exchange(
        sidecar.port("bin"), reqs + b"GET /status/202 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    positions = [out.index(b'"url": "http://x/anything/%d"' % i) for i in range(5)]
    assert positions == sorted(positions) and out.count(b"HTTP/1.1 ") == 6


def test_http_1_0_client_never_gets_chunked(httpbin: str, sidecar: Sidecar) -> None:
    """Issue 11 item 4: a streamed (chunked upstream) answer goes to an HTTP/1.0 client close-delimited."""
    out = raw_exchange(sidecar.port("bin"), b"GET /stream/3 HTTP/1.0\r\nHost: x\r\n\r\n")
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"transfer-encoding" not in head.lower()
    assert len(body.splitlines()) == 3
    out = raw_exchange(
        sidecar.port("bin"), b"GET /stream/2 HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n"
    )
    assert b"transfer-encoding" not in out.partition(b"\r\n\r\n")[0].lower()


async def test_aiohttp_client(httpbin: str, sidecar: Sidecar) -> None:
    async with aiohttp.ClientSession() as s:
        for base in (f"http://{httpbin}", sidecar.url("bin")):
            async with s.post(base + "/post", json={"k": [1, 2]}) as r:
                assert r.status == 200 and (await r.json())["json"] == {"k": [1, 2]}
            async with s.get(base + "/drip?numbytes=5&duration=0.2&delay=0") as r:
                assert r.status == 200 and await r.read() == b"*****"


def test_a_client_resetting_its_connection_cancels_the_request(httpbin: str, sidecar: Sidecar) -> None:
    """The client gives up (a reset) while httpbin takes its time: the request ends ``cancelled``."""
    before = sidecar.metric("sidecar_requests_total", reason="cancelled")
    with socket.create_connection(("127.0.0.1", sidecar.port("bin"))) as s:
        s.sendall(b"GET /delay/10 HTTP/1.1\r\nHost: x\r\n\r\n")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    deadline = time.monotonic() + 8  # well before httpbin would answer (10 s)
    while sidecar.metric("sidecar_requests_total", reason="cancelled") == before:
        assert time.monotonic() < deadline, "the request was not cancelled"
        time.sleep(0.02)  # polling a counter of another thread's loop: the condition waited on
    assert sidecar.metric("sidecar_requests_total", reason="cancelled") == before + 1


def test_a_client_deadline_is_honoured_and_propagated(httpbin: str, sidecar: Sidecar) -> None:
    r = requests.get(
        sidecar.url("bin") + "/anything", headers={"X-YaTaxi-Client-TimeoutMs": "5000"}, timeout=20
    )
    told = int(r.json()["headers"]["X-Yataxi-Client-Timeoutms"])
    assert 0 < told <= 5000
    r = requests.get(
        sidecar.url("bin") + "/delay/5", headers={"X-YaTaxi-Client-TimeoutMs": "200"}, timeout=20
    )
    assert r.status_code == 498 and r.headers["X-YaTaxi-Deadline-Expired"] == "1"


@pytest.fixture(scope="module")
def hurried(httpbin: str) -> Iterator[Sidecar]:
    """A sidecar whose per-try timeout (300 ms) and default deadline (600 ms) are far shorter than the slow
    uploads below, and whose ``request_body_timeout`` is 1 s."""
    sc = Sidecar(
        sidecar_config(
            {"bin": httpbin},
            policy={"per_try_timeout": "300ms", "deadline": {"default": "600ms"}},
            listener={"request_body_timeout": "1s"},
        )
    )
    try:
        yield sc
    finally:
        sc.close()


def test_a_slow_curl_upload_is_answered_as_it_is_directly(
    httpbin: str, hurried: Sidecar, tmp_path: Path
) -> None:
    """Issue 11 item 3: ``curl --limit-rate -T`` taking ~2 s, through a sidecar with a 300 ms per-try timeout:
    200, as direct (it was 504: the per-try timeout ran while the client was still uploading)."""
    curl = shutil.which("curl")
    if curl is None:
        pytest.fail("curl is not installed: tools/test-deps.sh installs it (make test runs it)")
    f = tmp_path / "upload.bin"
    f.write_bytes(os.urandom(400 * 1024))
    codes = []
    for base in (f"http://{httpbin}", hurried.url("bin")):
        out = subprocess.run(
            [
                curl,
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--limit-rate",
                "200k",
                "-T",
                str(f),
                base + "/put",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        codes.append(out.stdout)
    assert codes == ["200", "200"]


def test_a_stalled_upload_gets_408(hurried: Sidecar) -> None:
    out = raw_exchange(
        hurried.port("bin"), b"PUT /put HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly some"
    )
    assert out.startswith(b"HTTP/1.1 408 Request Timeout\r\n") and b"request_body_timeout" in out


def test_request_trailers_are_dropped_and_the_body_arrives(httpbin: str, sidecar: Sidecar) -> None:
    """Trailers are not forwarded (docs/http.md, Limits); the chunked body they follow arrives whole."""
    req = (
        b"POST /anything HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n"
        b"Connection: close\r\n\r\n5\r\nhello\r\n0\r\nX-Sum: 5\r\n\r\n"
    )
    out = raw_exchange(sidecar.port("bin"), req)
    assert out.startswith(b"HTTP/1.1 200 OK\r\n")
    echo = json.loads(out.partition(b"\r\n\r\n")[2])
    assert echo["data"] == "hello" and "X-Sum" not in echo["headers"]


def test_a_failing_upstream_answer_is_delivered_as_is_after_the_retries(httpbin: str, sidecar: Sidecar) -> None:
    """503 is retried (three attempts) and then delivered unchanged, as direct."""
    direct, proxied = both("GET", "/status/503", httpbin, sidecar)
    assert_same(direct, proxied)
    assert proxied.status_code == 503


def test_the_sidecars_own_deadline_is_not_a_userver_498(hurried: Sidecar) -> None:
    """No client deadline and no upstream answer within the route's default (600 ms): 504, not 498."""
    r = requests.get(hurried.url("bin") + "/delay/3", timeout=20)
    assert r.status_code == 504 and "X-YaTaxi-Deadline-Expired" not in r.headers
