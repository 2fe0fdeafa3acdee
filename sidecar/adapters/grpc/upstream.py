"""Channels to the upstream's endpoints: one ``grpc.aio`` channel per endpoint, made on first use, with
grpcio's own retries switched off (``grpc.enable_retries: 0``) so that only the sidecar retries. Calls are
raw bytes: no serializers. With the upstream's ``tls`` settings the channels use TLS (CA, client
certificate, ``server_name`` as the name to verify)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from ...config.schema import TlsConfig

_MULTICALLABLE_LIMIT = 4096


class Channels:
    def __init__(
        self, *, max_message_size: int, connect_timeout: float, tls: TlsConfig | None = None
    ) -> None:
        self.credentials = _credentials(tls)
        self.options: tuple[tuple[str, object], ...] = (
            ("grpc.enable_retries", 0),
            ("grpc.max_send_message_length", max_message_size),
            ("grpc.max_receive_message_length", max_message_size),
            # Come back quickly after an endpoint restarts (grpc's default backoff grows to 120 s).
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2000),
            ("grpc.min_reconnect_backoff_ms", max(100, int(connect_timeout * 1000))),
        )
        if tls is not None and tls.server_name:
            self.options += (("grpc.ssl_target_name_override", tls.server_name),)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stream: dict[tuple[str, str], Any] = {}  # (endpoint, method) -> StreamStreamMultiCallable
        self._unary: dict[tuple[str, str], Any] = {}  # (endpoint, method) -> UnaryStreamMultiCallable

    def channel(self, endpoint: str) -> grpc.aio.Channel:
        ch = self._channels.get(endpoint)
        if ch is None:
            if self.credentials is None:
                ch = grpc.aio.insecure_channel(endpoint, options=self.options)
            else:
                ch = grpc.aio.secure_channel(endpoint, self.credentials, options=self.options)
            self._channels[endpoint] = ch
        return ch

    def stream_stream(self, endpoint: str, method: str) -> grpc.aio.StreamStreamMultiCallable:
        """A call goes upstream as a stream (unless its method is in ``unary_requests``): its request
        messages are forwarded as they arrive."""
        return self._callable(self._stream, endpoint, method, "stream_stream")

    def unary_stream(self, endpoint: str, method: str) -> grpc.aio.UnaryStreamMultiCallable:
        """A method whose request is one message (``unary_requests``): the response may still stream."""
        return self._callable(self._unary, endpoint, method, "unary_stream")

    def _callable(self, cache: dict[tuple[str, str], Any], endpoint: str, method: str, form: str) -> Any:
        """The channel's multi-callable of ``form`` for ``method``, made once (clients choose method names:
        the cache is bounded)."""
        key = (endpoint, method)
        mc = cache.get(key)
        if mc is None:
            if len(cache) >= _MULTICALLABLE_LIMIT:
                cache.clear()
            mc = cache[key] = getattr(self.channel(endpoint), form)(method)
        return mc

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        self._stream.clear()
        self._unary.clear()
        for ch in channels:
            await ch.close()


def _credentials(tls: TlsConfig | None) -> grpc.ChannelCredentials | None:
    """TLS credentials from the upstream's ``tls`` settings; files are read once, at start."""
    if tls is None:
        return None
    if tls.insecure_skip_verify:
        raise OSError("tls.insecure_skip_verify is not supported for gRPC upstreams (grpcio always verifies)")
    if (tls.cert_file is None) != (tls.key_file is None):
        raise OSError("tls: a client certificate needs both cert_file and key_file")

    def read(path: str | None) -> bytes | None:
        if path is None:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as e:
            raise OSError(f"tls: cannot read {path!r}: {e.strerror or e}") from None

    return grpc.ssl_channel_credentials(read(tls.ca_file), read(tls.key_file), read(tls.cert_file))
