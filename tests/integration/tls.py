"""A self-signed certificate for TLS tests (made with the openssl command line; the test skips without it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def self_signed(directory: Path, common_name: str, alt_names: str) -> tuple[Path, Path]:
    """``(cert, key)`` PEM files valid for ``alt_names`` (``"DNS:upstream.test"``, ``"IP:127.0.0.1,..."``)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert)]
        + ["-days", "2", "-subj", f"/CN={common_name}", "-addext", f"subjectAltName={alt_names}"],
        check=True,
        capture_output=True,
    )
    return cert, key
