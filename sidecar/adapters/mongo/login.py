"""The app's own login to a MongoDB listener (``app_auth``), verified by the sidecar, as PgBouncer verifies
its clients: SCRAM-SHA-256 and SCRAM-SHA-1 with the sidecar as the server (``scram.ScramServer``), started by
``saslStart`` or by ``speculativeAuthenticate`` in the first ``hello`` (what current drivers send), finished
by ``saslContinue``.

:class:`AppUsers` is who may log in (``app_auth.users``, or the upstream's own user), each with the SCRAM
credentials made once from the configured password, as mongod keeps them; :class:`Login` is one connection's
login, an explicit state (``NONE`` -> ``CONVERSING`` -> ``DONE``; a failed exchange goes back to ``NONE``),
changed only through its methods. A failure is told after the full exchange, the same whatever was wrong (an
unknown user gets a decoy exchange). Pure: no sockets; ``server.py`` carries the messages and ``answer.py``
writes the replies.

Before a login, a connection may run only what mongod allows before one (:data:`OPEN`); anything else gets
``13 Unauthorized``, unless ``allow_unauthenticated`` (then it acts as the upstream's own identity).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import NoReturn

from .commands import HELLO
from .scram import MECHANISMS, Credential, ScramFailure, ScramServer

#: Commands mongod runs before a login (``requiresAuth`` false).
OPEN = HELLO | frozenset({"saslStart", "saslContinue", "ping", "buildInfo", "buildinfo", "logout"})


@dataclass(frozen=True)
class AppUser:
    """A user who may log in, and whose commands go upstream over connections logged in as them."""

    username: str
    password: str
    source: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.source, self.username)

    def __repr__(self) -> str:  # never the password
        return f"AppUser({self.source}.{self.username})"


class AppUsers:
    """Who may log in to one listener, with their credentials per mechanism."""

    def __init__(self, users: Iterable[AppUser], allow_unauthenticated: bool = False) -> None:
        self.allow_unauthenticated = allow_unauthenticated
        self.users: dict[tuple[str, str], AppUser] = {}
        self._credentials: dict[tuple[str, str, str], Credential] = {}
        for u in users:
            self.users[u.key] = u
            for mechanism in MECHANISMS:
                self._credentials[(u.source, u.username, mechanism)] = Credential.make(
                    mechanism, u.username, u.password
                )
        self.secret = os.urandom(32)  # decoy salts for unknown users, stable for this listener's life

    def credential(self, source: str, username: str, mechanism: str) -> Credential | None:
        return self._credentials.get((source, username, mechanism))

    def mechanisms(self, source: str, username: str) -> list[str]:
        """``saslSupportedMechs`` for ``source.username`` (empty for a user the sidecar does not know)."""
        return list(MECHANISMS) if (source, username) in self.users else []


class LoginFailed(Exception):
    """The exchange ended without a login: ``username`` and ``mechanism`` for the log line (never why:
    the app is told the same whatever was wrong)."""

    def __init__(self, username: str, mechanism: str, source: str) -> None:
        super().__init__(f"authentication failed for {source}.{username} ({mechanism})")
        self.username = username
        self.mechanism = mechanism
        self.source = source


class Phase(IntEnum):
    NONE = 0  # not logged in, no exchange
    CONVERSING = 1  # an exchange began (saslStart or speculativeAuthenticate)
    DONE = 2  # logged in as ``user``


@dataclass(frozen=True)
class Step:
    """A reply in an exchange: its ``conversationId``, whether it is over, the server's payload."""

    conversation: int
    done: bool
    payload: bytes


class Login:
    """One app connection's login (see the module docstring)."""

    __slots__ = (
        "users",
        "phase",
        "user",
        "speculative",
        "mechanism",
        "_server",
        "_source",
        "_skip_empty",
        "_conversation",
        "_final_sent",
    )

    def __init__(self, users: AppUsers) -> None:
        self.users = users
        self.phase = Phase.NONE
        self.user: AppUser | None = None
        self.speculative = False  # the exchange began in the hello (speculativeAuthenticate)
        self.mechanism = ""  # of the last login
        self._server: ScramServer | None = None
        self._source = ""
        self._skip_empty = False
        self._conversation = 0
        self._final_sent = False

    def allows(self, command: str) -> bool:
        """May this connection run ``command`` now?"""
        return self.phase is Phase.DONE or command in OPEN or self.users.allow_unauthenticated

    def start(
        self, source: str, mechanism: str, payload: bytes, skip_empty: bool, speculative: bool = False
    ) -> Step:
        """``saslStart`` (or the one inside ``speculativeAuthenticate``) for ``source``; a new exchange
        replaces one in progress, and a connection may log in again (as mongod allows)."""
        if self.phase is Phase.CONVERSING:
            self._server = None
        users = self.users
        server = ScramServer(
            mechanism, lambda name: users.credential(source, name, mechanism), users.secret
        )  # ScramFailure: an unknown mechanism
        try:
            first = server.first(payload)
        except ScramFailure:
            self.phase = Phase.NONE if self.user is None else Phase.DONE
            raise LoginFailed(server.username or "?", mechanism, source) from None
        self._server, self._source, self._skip_empty = server, source, skip_empty
        self.speculative = speculative
        self._conversation += 1
        self._final_sent = False
        self.phase = Phase.CONVERSING
        return Step(self._conversation, False, first)

    def proceed(self, conversation: object, payload: bytes) -> Step:
        """``saslContinue``: check the proof, or finish an exchange whose proof held."""
        server = self._server
        if self.phase is not Phase.CONVERSING or server is None:  # the app's mistake: an ordinary failure
            raise LoginFailed("?", "?", self._source or "?")
        if conversation != self._conversation:
            self._fail(server)
        if self._final_sent:  # the empty last step of an exchange without skipEmptyExchange
            return self._done(server, b"")
        try:
            final = server.final(payload)
        except ScramFailure:
            self._fail(server)
        if self._skip_empty:
            return self._done(server, final)
        self._final_sent = True
        return Step(self._conversation, False, final)

    def logout(self) -> None:
        self.phase, self.user, self._server = Phase.NONE, None, None

    def _done(self, server: ScramServer, payload: bytes) -> Step:
        user = self.users.users.get((self._source, server.username))
        assert user is not None and server.ok
        self.phase, self.user, self._server = Phase.DONE, user, None
        self.mechanism = server.mechanism
        return Step(self._conversation, True, payload)

    def _fail(self, server: ScramServer) -> NoReturn:
        self._server = None
        self.phase = Phase.NONE if self.user is None else Phase.DONE
        raise LoginFailed(server.username, server.mechanism, self._source)
