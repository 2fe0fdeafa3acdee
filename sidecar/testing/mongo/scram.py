"""The server side of SCRAM-SHA-256 and SCRAM-SHA-1 (RFC 5802/7677, as MongoDB runs them)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass

from pymongo.saslprep import saslprep

MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-1": "sha1"}
ITERATIONS = {"SCRAM-SHA-256": 15000, "SCRAM-SHA-1": 10000}


class ScramError(Exception):
    pass


def _password_input(mechanism: str, user: str, password: str) -> bytes:
    if mechanism == "SCRAM-SHA-1":  # MongoDB hashes the password first for SHA-1
        return hashlib.md5(f"{user}:mongo:{password}".encode()).hexdigest().encode()
    return saslprep(password).encode()


@dataclass
class Credential:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def make(cls, mechanism: str, user: str, password: str) -> Credential:
        digest = MECHANISMS[mechanism]
        salt = os.urandom(16)
        iterations = ITERATIONS[mechanism]
        salted = hashlib.pbkdf2_hmac(digest, _password_input(mechanism, user, password), salt, iterations)
        client_key = hmac.digest(salted, b"Client Key", digest)
        return cls(
            salt,
            iterations,
            hashlib.new(digest, client_key).digest(),
            hmac.digest(salted, b"Server Key", digest),
        )


def _fields(message: bytes) -> dict[str, str]:
    out = {}
    for part in message.decode().split(","):
        if "=" in part:
            k, _, v = part.partition("=")
            out[k] = v
    return out


class Conversation:
    """One SCRAM exchange: ``start(payload)`` -> server-first, ``finish(payload)`` -> server-final."""

    def __init__(self, mechanism: str, users: dict[str, dict[str, Credential]]) -> None:
        if mechanism not in MECHANISMS:
            raise ScramError(f"Received authentication for mechanism {mechanism} which is not enabled")
        self.mechanism = mechanism
        self.digest = MECHANISMS[mechanism]
        self.users = users
        self.user = ""
        self.auth_message = b""
        self.credential: Credential | None = None
        self.nonce = ""

    def start(self, payload: bytes) -> bytes:
        if not payload.startswith(b"n,"):
            raise ScramError("SCRAM: channel binding is not supported")
        bare = payload.split(b",", 2)[2]
        f = _fields(bare)
        self.user = f.get("n", "").replace("=2C", ",").replace("=3D", "=")
        cred = self.users.get(self.user, {}).get(self.mechanism)
        if cred is None:
            raise ScramError("Authentication failed.")
        self.credential = cred
        self.nonce = f.get("r", "") + base64.b64encode(os.urandom(18)).decode()
        first = f"r={self.nonce},s={base64.b64encode(cred.salt).decode()},i={cred.iterations}".encode()
        self.auth_message = bare + b"," + first
        return first

    def finish(self, payload: bytes) -> bytes:
        cred = self.credential
        assert cred is not None
        without_proof, _, proof_part = payload.rpartition(b",p=")
        f = _fields(without_proof)
        if f.get("r") != self.nonce:
            raise ScramError("Authentication failed.")
        auth_message = self.auth_message + b"," + without_proof
        signature = hmac.digest(cred.stored_key, auth_message, self.digest)
        proof = base64.b64decode(proof_part)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=False))
        if hashlib.new(self.digest, client_key).digest() != cred.stored_key:
            raise ScramError("Authentication failed.")
        return b"v=" + base64.b64encode(hmac.digest(cred.server_key, auth_message, self.digest))
