"""The simple-token format (``--auth-token simple``), defined once for both programs.

A token is ``<16 ASCII letters>.<log index>``: the proxy draws the letters from a CSPRNG, the
store's apply stage appends the index of the entry that issued it. The proxy checks the shape
before asking the store, the store parses the index out of it; both use this one definition, so
nothing the proxy lets through is read differently by the store.
"""

from __future__ import annotations

import re
import secrets
import string

PREFIX_LENGTH = 16
MAX_INDEX_DIGITS = 20
_LETTERS = string.ascii_letters
_FORMAT = re.compile(rf"[A-Za-z]{{{PREFIX_LENGTH}}}\.([0-9]{{1,{MAX_INDEX_DIGITS}}})")


def generate_prefix() -> str:
    """16 letters from a CSPRNG, the part of the token nobody can guess."""
    return "".join(secrets.choice(_LETTERS) for _ in range(PREFIX_LENGTH))


def make_token(prefix: str, index: int) -> str:
    """The token the entry at ``index`` issues for ``prefix``."""
    return f"{prefix}.{index}"


def looks_like_simple_token(token: str) -> bool:
    """Cheap shape check so junk never reaches the store."""
    return _FORMAT.fullmatch(token) is not None


def token_index(token: str) -> int | None:
    """The log index a simple token names, or None for anything not of the shape."""
    match = _FORMAT.fullmatch(token)
    return int(match[1]) if match else None
