"""SCRAM-SHA-256 / SCRAM-SHA-1 as MongoDB runs them (saslStart, saslContinue; RFC 5802 and 7677), both
sides.

Pure: ``ScramClient`` turns server messages into client messages (``upstream.py`` carries them: the
sidecar's login upstream); ``ScramServer`` the other way round (``login.py``: an app logging in to the
sidecar), against a :class:`Credential` made once from the configured password, as mongod stores it (salt,
iterations, StoredKey, ServerKey). The password never leaves these objects except as a salted proof. A
server that does not know the user still answers the first message (with a salt derived from the name), so
that a failure at the end never says which part was wrong.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Callable

_DIGESTS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-1": "sha1"}
#: mongod's defaults (scramIterationCount, scramSHA256IterationCount).
ITERATIONS = {"SCRAM-SHA-256": 15000, "SCRAM-SHA-1": 10000}
MECHANISMS = tuple(_DIGESTS)


class ScramFailure(Exception):
    pass


def _escape(user: str) -> str:
    return user.replace("=", "=3D").replace(",", "=2C")


def saslprep(text: str) -> str:
    """pymongo's SASLprep (RFC 4013), imported only when a login is made: importing any of pymongo loads the
    whole driver (~8 MB), which a MongoDB listener without logins needs for nothing else (its codec is bson's)."""
    from pymongo.saslprep import saslprep as prepare

    return prepare(text)


def _password_input(mechanism: str, username: str, password: str) -> bytes:
    if mechanism == "SCRAM-SHA-1":  # MongoDB hashes the password first for SHA-1
        return hashlib.md5(f"{username}:mongo:{password}".encode()).hexdigest().encode()
    return saslprep(password).encode()


def _fields(message: bytes) -> dict[bytes, bytes]:
    return dict(part.split(b"=", 1) for part in message.split(b",") if b"=" in part)


class Credential:
    """What a SCRAM server keeps of one user's password for one mechanism."""

    __slots__ = ("mechanism", "salt", "iterations", "stored_key", "server_key")

    def __init__(
        self, mechanism: str, salt: bytes, iterations: int, stored_key: bytes, server_key: bytes
    ) -> None:
        self.mechanism = mechanism
        self.salt = salt
        self.iterations = iterations
        self.stored_key = stored_key
        self.server_key = server_key

    @classmethod
    def make(cls, mechanism: str, username: str, password: str, salt: bytes | None = None) -> Credential:
        digest = _DIGESTS[mechanism]
        salt = salt if salt is not None else os.urandom(16)
        iterations = ITERATIONS[mechanism]
        salted = hashlib.pbkdf2_hmac(digest, _password_input(mechanism, username, password), salt, iterations)
        client_key = hmac.digest(salted, b"Client Key", digest)
        return cls(
            mechanism,
            salt,
            iterations,
            hashlib.new(digest, client_key).digest(),
            hmac.digest(salted, b"Server Key", digest),
        )


class ScramServer:
    """One SCRAM exchange with the sidecar as the server: :meth:`first` answers the client-first message,
    :meth:`final` checks the client's proof and answers with the server's signature. ``lookup(username)``
    gives the user's credential for this mechanism, or ``None`` (unknown: the exchange goes on with a
    decoy and fails at its end). ``username`` is the name the client sent; ``ok`` once the proof held."""

    def __init__(self, mechanism: str, lookup: Callable[[str], Credential | None], secret: bytes) -> None:
        if mechanism not in _DIGESTS:
            raise ScramFailure(f"mechanism {mechanism} is not supported")
        self.mechanism = mechanism
        self.digest = _DIGESTS[mechanism]
        self._lookup = lookup
        self._secret = secret  # derives a decoy's salt: the same name always gets the same salt
        self.username = ""
        self.ok = False
        self._credential: Credential | None = None
        self._nonce = b""
        self._auth_message = b""

    def first(self, client_first: bytes) -> bytes:
        if not client_first.startswith(b"n,"):
            raise ScramFailure("channel binding is not supported")
        parts = client_first.split(b",", 2)
        if len(parts) != 3:
            raise ScramFailure("malformed client-first message")
        bare = parts[2]
        f = _fields(bare)
        try:
            name = f[b"n"].decode().replace("=2C", ",").replace("=3D", "=")
            client_nonce = f[b"r"]
        except (KeyError, UnicodeDecodeError):
            raise ScramFailure("malformed client-first message") from None
        self.username = name
        credential = self._lookup(name)
        if credential is None:  # unknown user: a decoy with a stable salt; the proof cannot hold
            salt = hmac.digest(self._secret, name.encode(), "sha256")[:16]
            credential = Credential(self.mechanism, salt, ITERATIONS[self.mechanism], b"", b"")
        else:
            self._credential = credential
        self._nonce = client_nonce + base64.b64encode(os.urandom(24))
        server_first = (
            b"r="
            + self._nonce
            + b",s="
            + base64.b64encode(credential.salt)
            + b",i="
            + str(credential.iterations).encode()
        )
        self._auth_message = bare + b"," + server_first
        return server_first

    def final(self, client_final: bytes) -> bytes:
        """The server-final message; ``ScramFailure`` when the proof does not hold (or the user is
        unknown)."""
        without_proof, sep, proof_b64 = client_final.rpartition(b",p=")
        f = _fields(without_proof)
        cred = self._credential
        if not sep or f.get(b"r") != self._nonce or f.get(b"c") != b"biws" or cred is None:
            raise ScramFailure("authentication failed")
        auth_message = self._auth_message + b"," + without_proof
        signature = hmac.digest(cred.stored_key, auth_message, self.digest)
        try:
            proof = base64.b64decode(proof_b64, validate=True)
        except ValueError:
            raise ScramFailure("authentication failed") from None
        if len(proof) != len(signature):
            raise ScramFailure("authentication failed")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(self.digest, client_key).digest(), cred.stored_key):
            raise ScramFailure("authentication failed")
        self.ok = True
        return b"v=" + base64.b64encode(hmac.digest(cred.server_key, auth_message, self.digest))


class ScramClient:
    def __init__(self, mechanism: str, username: str, password: str, nonce: str | None = None) -> None:
        if mechanism not in _DIGESTS:
            raise ScramFailure(f"unsupported mechanism {mechanism}")
        self.mechanism = mechanism
        self.digest = _DIGESTS[mechanism]
        self.username = username if mechanism == "SCRAM-SHA-1" else saslprep(username)
        self._password = _password_input(mechanism, username, password)
        self.nonce = nonce or base64.b64encode(os.urandom(24)).decode()
        self.first_bare = f"n={_escape(self.username)},r={self.nonce}".encode()
        self._server_signature = b""

    def first(self) -> bytes:
        return b"n,," + self.first_bare

    def final(self, server_first: bytes) -> bytes:
        fields = _fields(server_first)
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
        fields = _fields(server_final)
        if b"e" in fields:
            raise ScramFailure(f"the server refused: {fields[b'e'].decode(errors='replace')}")
        v = fields.get(b"v")
        if v is None or not hmac.compare_digest(base64.b64decode(v), self._server_signature):
            raise ScramFailure("the server's signature does not match: it does not know the password")
