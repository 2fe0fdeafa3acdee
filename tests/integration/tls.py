"""A server certificate for TLS tests, made at test time by trustme (a test certificate authority)."""

from __future__ import annotations

from pathlib import Path

import trustme


def server_certificate(directory: Path, common_name: str, alt_names: str) -> tuple[Path, Path]:
    """``(cert, key)`` PEM files valid for ``alt_names`` (``"DNS:upstream.test"``, ``"IP:127.0.0.1,..."``),
    issued by a certificate authority made for the call. ``cert`` holds the server's certificate followed by
    its authority's: the server presents it as its chain, and a client given it as its trust root (a
    ``ca_file``) trusts that authority, and so this server only. (``common_name`` names the certificate's
    subject; what a client checks is ``alt_names``.)"""
    names = [entry.split(":", 1)[1] for entry in alt_names.split(",")]
    ca = trustme.CA()
    server = ca.issue_cert(*names, common_name=common_name)
    cert, key = directory / "cert.pem", directory / "key.pem"
    server.private_key_pem.write_to_path(str(key))
    cert.write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems) + ca.cert_pem.bytes())
    return cert, key
