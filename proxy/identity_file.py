"""The sidecar identity's files: a user name and password, or an externally minted JWT, as mounted.

Formats (``--identity-file PATH``):

* a **directory** holding the files ``username`` and ``password``: how Kubernetes mounts a Secret
  volume (e.g. a ``kubernetes.io/basic-auth`` Secret, whose keys are exactly these two);
* a **file** of two lines: the user name, then the password.

``--identity-jwt-file PATH``: a file holding the token (or a directory holding the file ``token``,
as a projected volume mounts it). Surrounding whitespace is ignored. ``--identity-oidc-token-file
PATH``: the same, for the pod's projected ServiceAccount token (kubelet rewrites it before it
expires; the new one is picked up like any changed file).

Trailing line ends are dropped (``echo`` adds one); every other character, spaces included, is
part of the value. Files are bounded in size, must be UTF-8, and nothing read from them is ever
logged.

Kubernetes updates a Secret volume by swapping a symlink (``..data``), so a change shows up as a
new inode (or mtime, for files rewritten in place) of the file a path resolves to.
:class:`IdentityFiles` compares those at most once per poll interval, re-reads only when they
moved, and keeps the last good content when a read fails halfway through a swap.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from proxy import metrics
from raftgate.bounded_file import FileReadError, read_bounded
from raftgate.file_watch import FileWatch, missing

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 64 * 1024
POLL_INTERVAL_SECONDS = 1.0
USERNAME_FILE, PASSWORD_FILE, TOKEN_FILE = "username", "password", "token"

PASSWORD, JWT, OIDC = "password", "jwt", "oidc"
#: The kinds whose file holds one token, lent as it is.
TOKEN_KINDS = (JWT, OIDC)


class IdentityFileError(ValueError):
    """An identity file is missing, unreadable or malformed; the message names no secret."""


@dataclass(frozen=True)
class PasswordCredential:
    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class JwtCredential:
    token: str = field(repr=False)


Credential = PasswordCredential | JwtCredential


@dataclass(frozen=True)
class IdentitySpec:
    """Which identity files the sidecar mode reads: ``kind`` is ``password``, ``jwt`` or ``oidc``."""

    kind: str
    path: str


def _read_text(path: Path) -> str:
    try:
        data = read_bounded(path, MAX_FILE_BYTES)
    except FileReadError as e:
        raise IdentityFileError(str(e)) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise IdentityFileError(f"{str(path)!r} is not UTF-8") from None


def _files(kind: str, path: Path) -> list[Path]:
    """The files a credential is read from."""
    try:
        is_dir = path.is_dir()
    except OSError:  # a name too long, a loop: reading it says why
        is_dir = False
    if is_dir:
        return [path / USERNAME_FILE, path / PASSWORD_FILE] if kind == PASSWORD else [path / TOKEN_FILE]
    return [path]


def read_credential(kind: str, path: Path) -> Credential:
    """Reads and checks a credential of ``kind`` (``password``, ``jwt`` or ``oidc``); raises IdentityFileError."""
    files = _files(kind, path)
    if kind in TOKEN_KINDS:
        token = _read_text(files[0]).strip()
        if not token or any(c.isspace() for c in token):
            raise IdentityFileError(f"{str(files[0])!r} does not hold one token")
        return JwtCredential(token)
    if len(files) == 2:
        username = _read_text(files[0]).rstrip("\r\n")
        password = _read_text(files[1]).rstrip("\r\n")
    else:
        lines = _read_text(files[0]).split("\n")
        while len(lines) > 2 and not lines[-1].strip("\r"):
            lines.pop()
        if len(lines) != 2:
            raise IdentityFileError(f"{str(files[0])!r} must hold two lines: the user name, then the password")
        username, password = lines[0].rstrip("\r"), lines[1].rstrip("\r")
    if not username or "\n" in username:
        raise IdentityFileError(f"no user name in {str(path)!r}")
    if not password:
        raise IdentityFileError(f"no password in {str(path)!r}")
    return PasswordCredential(username, password)


class IdentityFiles:
    """The current credential, re-read when its files change (checked at most once per interval)."""

    def __init__(
        self,
        kind: str,
        path: str | Path,
        *,
        poll_interval: float = POLL_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Reads the credential now: a bad file is a start-up error, not a first-request surprise."""
        if kind not in (PASSWORD, *TOKEN_KINDS):
            raise ValueError(f"unknown identity kind {kind!r}")
        self.kind = kind
        self.path = Path(path)
        self._files = FileWatch(_files(kind, self.path), poll_interval=poll_interval, clock=clock)
        self.current: Credential = read_credential(kind, self.path)
        #: Bumped whenever ``current`` changes.
        self.version = 0

    @property
    def poll_interval(self) -> float:
        return self._files.poll_interval

    def poll(self, *, force: bool = False) -> bool:
        """Re-reads the files if they changed; True when the credential changed.

        Without ``force``, files are looked at no more than once per poll interval.
        """
        if not self._files.due(force=force):
            return False
        signature = self._files.changed(_files(self.kind, self.path))
        if signature is None or missing(signature):
            return False
        try:
            credential = read_credential(self.kind, self.path)
        except IdentityFileError as e:
            # Mid-swap, or a bad update: keep what worked, look again next time.
            log.warning("identity file changed but cannot be used yet: %s", e)
            metrics.IDENTITY_RELOADS.labels("error").inc()
            return False
        self._files.took(signature)
        metrics.IDENTITY_RELOADS.labels("ok").inc()
        if credential == self.current:
            return False
        self.current = credential
        self.version += 1
        log.info("identity file %s changed; using the new credential", self.path)
        return True
