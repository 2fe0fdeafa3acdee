"""The client side of SCRAM-SHA-256 / SCRAM-SHA-1 as MongoDB runs it (saslStart, saslContinue).

Pure: ``ScramClient`` turns server messages into client messages; ``upstream.py`` carries them. The
password never leaves this object except as a salted proof.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

_DIGESTS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-1": "sha1"}


class ScramFailure(Exception):
    pass


def _escape(user: str) -> str:
    return user.replace("=", "=3D").replace(",", "=2C")


class ScramClient:
    def __init__(self, mechanism: str, username: str, password: str, nonce: str | None = None) -> None:
        if mechanism not in _DIGESTS:
            raise ScramFailure(f"unsupported mechanism {mechanism}")
        self.mechanism = mechanism
        self.digest = _DIGESTS[mechanism]
        if mechanism == "SCRAM-SHA-1":
            self.username = username
            self._password = hashlib.md5(f"{username}:mongo:{password}".encode()).hexdigest().encode()
        else:
            # pymongo's SASLprep (RFC 4013), imported only here: importing any of pymongo loads the whole
            # driver (~8 MB), which a MongoDB listener needs for nothing else (its codec is bson's).
            from pymongo.saslprep import saslprep

            self.username = saslprep(username)
            self._password = saslprep(password).encode()
        self.nonce = nonce or base64.b64encode(os.urandom(24)).decode()
        self.first_bare = f"n={_escape(self.username)},r={self.nonce}".encode()
        self._server_signature = b""

    def first(self) -> bytes:
        return b"n,," + self.first_bare

    def final(self, server_first: bytes) -> bytes:
        fields = dict(part.split(b"=", 1) for part in server_first.split(b",") if b"=" in part)
        try:
            nonce, salt, iterations = fields[b"r"], base64.b64decode(fields[b"s"]), int(fields[b"i"])
        except (KeyError, ValueError) as e:
            raise ScramFailure(f"malformed server-first message: {e}") from None
        if not nonce.startswith(self.nonce.encode()):
            raise ScramFailure("the server's nonce does not extend ours")
        if iterations < 4096:
            raise ScramFailure(f"the server asks for only {iterations} iterations")
        salted = hashlib.pbkdf2_hmac(self.digest, self._password, salt, iterations)
        client_key = hmac.digest(salted, b"Client Key", self.digest)
        stored_key = hashlib.new(self.digest, client_key).digest()
        without_proof = b"c=biws,r=" + nonce
        auth_message = self.first_bare + b"," + server_first + b"," + without_proof
        signature = hmac.digest(stored_key, auth_message, self.digest)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.digest(salted, b"Server Key", self.digest)
        self._server_signature = hmac.digest(server_key, auth_message, self.digest)
        return without_proof + b",p=" + base64.b64encode(proof)

    def verify(self, server_final: bytes) -> None:
        fields = dict(part.split(b"=", 1) for part in server_final.split(b",") if b"=" in part)
        if b"e" in fields:
            raise ScramFailure(f"the server refused: {fields[b'e'].decode(errors='replace')}")
        v = fields.get(b"v")
        if v is None or not hmac.compare_digest(base64.b64decode(v), self._server_signature):
            raise ScramFailure("the server's signature does not match: it does not know the password")
