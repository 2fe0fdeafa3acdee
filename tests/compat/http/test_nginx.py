"""nginx, directly and through the sidecar: the same answers (see conftest.py). nginx is strict where httpbin
is lenient: a PUT without a length gets 411, which is how a dropped ``Content-Length: 0`` showed."""

from __future__ import annotations

import socket

import requests

from .conftest import Sidecar, end_to_end, raw_exchange


def both(method: str, path: str, nginx: str, sc: Sidecar, **kw: object) -> tuple[requests.Response, ...]:
    kw.setdefault("allow_redirects", False)
    direct = requests.request(method, f"http://{nginx}{path}", timeout=20, **kw)  # type: ignore[arg-type]
    proxied = requests.request(method, sc.url("ngx") + path, timeout=20, **kw)  # type: ignore[arg-type]
    assert proxied.status_code == direct.status_code
    assert proxied.content == direct.content
    assert end_to_end(proxied.headers) == end_to_end(direct.headers)
    return direct, proxied


def test_put_and_delete_with_content_length_zero(nginx: str, nginx_sidecar: Sidecar) -> None:
    """Issue 11 item 4: nginx answers 411 to a PUT without a length; the sidecar must keep ``Content-Length: 0``."""
    for i, target in enumerate((f"http://{nginx}", nginx_sidecar.url("ngx"))):
        r = requests.put(f"{target}/dav/empty{i}", data=b"", timeout=20)
        assert r.status_code == 201, r.text
        r = requests.delete(f"{target}/dav/empty{i}", headers={"Content-Length": "0"}, timeout=20)
        assert r.status_code == 204, r.text
    port = nginx_sidecar.port("ngx")
    out = raw_exchange(
        port, b"PUT /dav/raw HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    assert out.startswith(b"HTTP/1.1 201 ")


def test_static_files_ranges_head_304_gzip(nginx: str, nginx_sidecar: Sidecar) -> None:
    _, r = both("GET", "/hello.txt", nginx, nginx_sidecar)
    etag, modified = r.headers["etag"], r.headers["last-modified"]
    both("HEAD", "/hello.txt", nginx, nginx_sidecar)
    both("GET", "/hello.txt", nginx, nginx_sidecar, headers={"If-None-Match": etag})
    _, r = both("GET", "/hello.txt", nginx, nginx_sidecar, headers={"If-Modified-Since": modified})
    assert r.status_code == 304
    _, r = both(
        "GET",
        "/hello.txt",
        nginx,
        nginx_sidecar,
        headers={"Range": "bytes=5-20", "Accept-Encoding": "identity"},
    )
    assert r.status_code == 206 and r.content == (b"hello from nginx\n" * 2)[5:21]
    # several ranges: nginx numbers its multipart boundaries per response, so compare what they frame
    ranges = {"Range": "bytes=5-20,40-50", "Accept-Encoding": "identity"}
    d = requests.get(f"http://{nginx}/hello.txt", headers=ranges, timeout=20)
    p = requests.get(nginx_sidecar.url("ngx") + "/hello.txt", headers=ranges, timeout=20)
    assert p.status_code == d.status_code == 206
    assert p.headers["content-type"].startswith("multipart/byteranges")
    d_boundary = d.headers["content-type"].split("boundary=")[1].encode()
    p_boundary = p.headers["content-type"].split("boundary=")[1].encode()
    assert p.content.replace(p_boundary, b"B") == d.content.replace(d_boundary, b"B")
    _, r = both("GET", "/hello.txt", nginx, nginx_sidecar, headers={"Accept-Encoding": "gzip"}, stream=True)
    assert r.headers["content-encoding"] == "gzip"
    both("GET", "/missing", nginx, nginx_sidecar)


def test_a_large_download_and_upload(nginx: str, nginx_sidecar: Sidecar) -> None:
    _, r = both("GET", "/big.bin", nginx, nginx_sidecar)
    assert len(r.content) == 8 * 1024 * 1024
    body = bytes(range(256)) * 12 * 1024  # 3 MiB: beyond the replay buffer, one attempt, streamed
    assert requests.put(nginx_sidecar.url("ngx") + "/dav/up.bin", data=body, timeout=60).status_code == 201
    assert requests.get(f"http://{nginx}/dav/up.bin", timeout=20).content == body


def test_a_client_aborting_mid_download_is_logged_as_gone(nginx: str, nginx_sidecar: Sidecar, caplog) -> None:  # noqa: ANN001
    """Issue 11 item 8: not as the upstream's fault; the sidecar carries on."""
    caplog.set_level("INFO", logger="sidecar.http")
    with socket.create_connection(("127.0.0.1", nginx_sidecar.port("ngx"))) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200 ")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
    both("GET", "/hello.txt", nginx, nginx_sidecar)  # the next request is served once the abort was handled
    messages = [r.getMessage() for r in caplog.records]
    assert not any("upstream connection lost" in m for m in messages), messages
