"""Decoy password hashes: Credentials' answer for a user that does not exist.

A well-formed bcrypt hash that matches nothing, at the cost the users' hashes have, so the
proxy's check of a miss takes as long as a real one (no user enumeration by timing).
"""

from __future__ import annotations

import secrets

import lmdb

from authstore.state.auth.store import AuthStore

_BCRYPT_ALPHABET = "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


class DecoyHashes:
    """Decoys at the users' typical cost, recomputed only when the auth revision moves."""

    def __init__(self) -> None:
        #: (auth revision, the users' typical bcrypt cost); -1: not computed yet
        self._cost: tuple[int, int | None] = (-1, None)

    def hash(self, auth: AuthStore, txn: lmdb.Transaction, auth_revision: int) -> bytes:
        """A fresh decoy; empty when no user has a password (the proxy uses its own decoy)."""
        if self._cost[0] != auth_revision:
            self._cost = (auth_revision, auth.typical_bcrypt_cost(txn))
        cost = self._cost[1]
        if cost is None:
            return b""
        salt = "".join(secrets.choice(_BCRYPT_ALPHABET) for _ in range(21)) + secrets.choice(".Oeu")
        digest = "".join(secrets.choice(_BCRYPT_ALPHABET) for _ in range(31))
        return f"$2a${cost:02d}${salt}{digest}".encode()
