"""Bearer tokens with roles: who may read, who may act, who may arm.

The service config holds only the SHA-256 of each token (``tokens: [{name, role, sha256}]``),
never the token itself; a presented token is hashed and compared against every entry with
:func:`hmac.compare_digest`, so neither a wrong token nor a right one answers faster.
Roles are ordered ``viewer < operator < admin``: viewers read, operators act on nodes and
approve, admins also arm/disarm automation, close the breaker and manage models.

With no config the service makes one admin token (:meth:`Auth.generate_admin`) and prints
it once beside the URL, as Jupyter does; only its hash stays in memory.

Make a token and its config entry with::

    python -c "import secrets, hashlib; t = secrets.token_urlsafe(32); print(t, hashlib.sha256(t.encode()).hexdigest())"
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class Role(enum.IntEnum):
    """What a caller may do; a higher role may do everything a lower one may."""

    VIEWER = 1
    OPERATOR = 2
    ADMIN = 3

    @classmethod
    def parse(cls, value: object) -> "Role":
        """From its name (``viewer``, ``operator``, ``admin``) or a str enum holding one."""
        value = getattr(value, "value", value)
        if isinstance(value, int) and not isinstance(value, bool) and value in cls._value2member_map_:
            return cls(value)
        try:
            return cls[str(value).upper()]
        except KeyError:
            raise ValueError(f"unknown role {value!r}: expected one of viewer, operator, admin") from None


class AuthConfigError(ValueError):
    """The token config is unusable (start-up fails with this message)."""


@dataclass(frozen=True)
class TokenEntry:
    """One configured token: its name (recorded as the actor), role and SHA-256 hex digest."""

    name: str
    role: Role
    sha256: str


@dataclass(frozen=True)
class Principal:
    """An authenticated caller."""

    name: str
    role: Role

    @property
    def actor(self) -> str:
        """How the caller is recorded on actions and settings changes."""
        return f"operator:{self.name}"


def token_hash(token: str) -> str:
    """The SHA-256 hex digest the config stores for *token*."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class Auth:
    """The configured tokens; :meth:`authenticate` turns a presented token into a :class:`Principal`."""

    def __init__(self, entries: Iterable[TokenEntry] = (),
                 token_factory: Callable[[], str] = lambda: secrets.token_urlsafe(32)) -> None:
        self._entries: list[TokenEntry] = []
        self._token_factory = token_factory
        for e in entries:
            self.add(e)

    @classmethod
    def from_config(cls, tokens: Iterable[Mapping[str, Any]]) -> "Auth":
        """From ``tokens: [{name, role, sha256}]``; :class:`AuthConfigError` naming the bad entry."""
        entries = []
        for i, t in enumerate(tokens):
            try:
                name, role, digest = str(t["name"]), Role.parse(t["role"]), str(t["sha256"]).lower()
            except (KeyError, TypeError, ValueError) as e:
                raise AuthConfigError(f"tokens[{i}]: {e}; each entry needs name, role "
                                      "(viewer|operator|admin) and sha256") from None
            entries.append(TokenEntry(name, role, digest))
        return cls(entries)

    def add(self, entry: TokenEntry) -> None:
        if not entry.name.strip():
            raise AuthConfigError("a token needs a non-blank name (it is recorded as the actor)")
        if not _SHA256.fullmatch(entry.sha256):
            raise AuthConfigError(f"token {entry.name!r}: sha256 must be 64 hex digits (the token's "
                                  "SHA-256), never the token itself")
        if any(e.name == entry.name for e in self._entries):
            raise AuthConfigError(f"token name {entry.name!r} is used twice")
        self._entries.append(entry)

    def generate_admin(self, name: str = "admin") -> str:
        """Make a random admin token, keep its hash, return the token (shown once, never stored)."""
        token = self._token_factory()
        self.add(TokenEntry(name, Role.ADMIN, token_hash(token)))
        return token

    def authenticate(self, token: str | None) -> Principal | None:
        """The caller holding *token*, or None. Compares with every entry (constant time per entry)."""
        if not token:
            return None
        digest = token_hash(token).encode()
        found: TokenEntry | None = None
        for e in self._entries:
            if hmac.compare_digest(digest, e.sha256.encode()):
                found = e
        return None if found is None else Principal(found.name, found.role)

    def __len__(self) -> int:
        return len(self._entries)
