"""Kubernetes workload identity: a pod's projected ServiceAccount token -> a raftgate user name.

Shared by the proxy (and, later, the store): pure, no import of either program, no event loop.
A :class:`WorkloadVerifier` is given the issuer, the audience, a :class:`KeySet` and a
:class:`UserMap`, and turns a token into a :class:`WorkloadIdentity` or raises
:class:`WorkloadRefused` (whose reason names no token). What is checked:

* the signature, with the issuer's key named by the token's ``kid`` (one key and no ``kid``: that
  key); the algorithm is the key's own (JWKS ``alg``, else what its ``kty``/``crv`` imply), never
  the token header's alone: a header naming another algorithm is refused, and so are symmetric
  (``oct``/HMAC) keys and ``none``;
* ``iss`` equal to the issuer, ``aud`` containing the audience, ``exp`` (required, no leeway: a
  token is never used after it), ``nbf`` and ``iat`` with NBF_LEEWAY_SECONDS of clock skew;
* ``sub`` mapped to a user by the first matching rule (the map file is re-read when it changes,
  e.g. a ConfigMap update). A map file that is deleted or no longer parses maps nobody: every
  workload token is refused, with one error logged, until a valid map is back (fail closed).

Keys come from a JWKS file or from the issuer's OIDC discovery document; they are fetched with
bounded sizes and timeouts, by whichever thread verifies (callers on an event loop run
:meth:`WorkloadVerifier.verify` in a worker thread and only :meth:`WorkloadVerifier.cached` on the
loop). A token whose ``kid`` is unknown makes the key set fetched again, at most once per
``refetch_interval``. A JWKS file that is deleted or no longer parses leaves no keys (fail
closed); keys fetched over HTTP survive failed refreshes (an issuer outage) for at most
``JWKS_MAX_STALE_SECONDS`` (an hour, as for a ``jwks-url``) after the last good fetch, then stop
verifying. Either failure is logged once, until a fetch succeeds again. These rules are
raftgate/key_source.py's, shared with etcd's ``jwks-url`` follower.

Results are cached (raftgate/trust_cache.py) by the token's sha256, bounded, never past ``exp``,
under the generations of the key set and of the user map they were made with: a key removed
(rotated out, its file deleted, too stale) or a changed map voids them at once; and a cached
result is not answered while the keys are due to be looked at again, so a rotation is seen within
the source's ``max_age`` even when every token is cached.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import ipaddress
import json
import logging
import math
import os
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import jwt as pyjwt

from raftgate.bounded_file import FileReadError, read_bounded
from raftgate.bounded_get import tls_context
from raftgate.file_watch import FileWatch, missing
from raftgate.jwt_keys import (
    JWKS_MAX_STALE_SECONDS,
    JWKS_TIMEOUT_SECONDS,
    MAX_TOKEN_BYTES,
    KeyLoadError,
    VerifyKey,
    fetch,
    jwks_keys,
    same_keys,
    unverified_header,
)
from raftgate.key_source import FetchedKeys, Freshness
from raftgate.token_verifier import Verified, fingerprint, unverified_claims
from raftgate.trust_cache import TrustCache

log = logging.getLogger(__name__)

#: Clock skew allowed on ``nbf`` and ``iat`` (kubelet's clock vs ours); ``exp`` gets none.
NBF_LEEWAY_SECONDS = 30
#: A discovery document, a JWKS, a user map: bigger is refused.
MAX_DOCUMENT_BYTES = 256 * 1024
MAX_RULES = 1024
#: Keys fetched over HTTP are fetched again after this long (a rotation needs no unknown kid).
KEYS_MAX_AGE_SECONDS = 300.0
#: An unknown ``kid`` fetches the keys again at most this often (a flood of made-up kids costs one).
REFETCH_INTERVAL_SECONDS = 30.0
CACHE_SIZE = 4096
DISCOVERY_PATH = "/.well-known/openid-configuration"



class WorkloadRefused(Exception):
    """A token that is not accepted; the message is the reason, never the token."""


class WorkloadConfigError(ValueError):
    """A bad issuer, audience, key file or user map (a start-up error)."""


@dataclass(frozen=True)
class WorkloadIdentity:
    user: str
    subject: str
    #: the token's ``exp`` (unix seconds)
    expires_at: float


# --- claim mapping ------------------------------------------------------------------------------

_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class Rule:
    match: str
    user: str

    @property
    def is_glob(self) -> bool:
        return any(c in _GLOB_CHARS for c in self.match)

    def matches(self, subject: str) -> bool:
        if self.is_glob:
            return fnmatch.fnmatchcase(subject, self.match)
        return subject == self.match


class UserMap:
    """``sub`` -> raftgate user: the first rule whose ``match`` fits; none fits -> no user.

    The file is JSON: a list of ``{"match": PATTERN, "user": NAME}``. A pattern with ``*``, ``?``
    or ``[`` is a glob (Python's fnmatch, case-sensitive; ``*`` also matches ``:``), any other is
    compared exactly.
    """

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = tuple(rules)

    @classmethod
    def from_json(cls, data: bytes | str, where: str = "user map") -> UserMap:
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise WorkloadConfigError(f"{where}: not JSON ({e})") from None
        if not isinstance(doc, list):
            raise WorkloadConfigError(f'{where}: want a JSON list of {{"match": ..., "user": ...}}')
        if len(doc) > MAX_RULES:
            raise WorkloadConfigError(f"{where}: more than {MAX_RULES} rules")
        rules = []
        for i, item in enumerate(doc):
            if not isinstance(item, dict) or set(item) != {"match", "user"}:
                raise WorkloadConfigError(f'{where}: rule {i} must have exactly the keys "match" and "user"')
            match, user = item["match"], item["user"]
            if not isinstance(match, str) or not match or not isinstance(user, str) or not user:
                raise WorkloadConfigError(f"{where}: rule {i}: match and user must be non-empty strings")
            rules.append(Rule(match, user))
        return cls(rules)

    @classmethod
    def from_file(cls, path: str) -> UserMap:
        return cls.from_json(_read_bounded(path), f"user map {path!r}")

    def user_for(self, subject: str) -> str | None:
        for rule in self.rules:
            if rule.matches(subject):
                return rule.user
        return None


class UserMapFile:
    """A user map file, re-read when it changes (looked at no more than once per ``poll_interval``).

    A file that is deleted or no longer parses leaves no rules (``error`` says why): the map is
    what decides who a workload is, and keeping rules the operator removed or broke would keep
    mapping tokens they meant to stop. The error is logged once, until a valid map is back.
    ``generation`` moves with every change of the rules in force."""

    def __init__(self, path: str, *, poll_interval: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._file = FileWatch([path], poll_interval=poll_interval, clock=clock)
        self.current = UserMap.from_file(path)
        #: why the file in place cannot be used (None: it can)
        self.error: str | None = None
        self.generation = 0
        self._lock = threading.Lock()

    @property
    def poll_interval(self) -> float:
        return self._file.poll_interval

    @poll_interval.setter
    def poll_interval(self, seconds: float) -> None:
        self._file.poll_interval = seconds

    def poll(self) -> bool:
        """True when the rules in force changed (an unusable file: to none)."""
        with self._lock:
            signature = self._file.look()
            if signature is None:
                return False
            # taken whether it parses or not: a broken map maps nobody until the file changes again
            self._file.took(signature)
            try:
                if missing(signature):
                    raise WorkloadConfigError(f"user map {self.path!r} is missing")
                rules = UserMap.from_file(self.path)
            except WorkloadConfigError as e:
                if self.error is None:
                    log.error("workload identity: the user map cannot be used, so no workload token maps to a "
                              "user until a valid map is back: %s", e)
                self.error = str(e)
                rules = UserMap([])
            else:
                if self.error is not None:
                    log.info("workload identity: user map %s usable again (%d rules)", self.path, len(rules.rules))
                self.error = None
            if rules.rules == self.current.rules:
                return False
            self.current = rules
            self.generation += 1
            log.info("workload identity: user map %s changed (%d rules)", self.path, len(rules.rules))
            return True


# --- keys ---------------------------------------------------------------------------------------


def _read_bounded(path: str) -> bytes:
    try:
        return read_bounded(path, MAX_DOCUMENT_BYTES)
    except FileReadError as e:
        raise WorkloadConfigError(str(e)) from None


def parse_jwks(data: bytes, where: str) -> dict[str | None, VerifyKey]:
    """kid -> key (the first of a kid; None: keys without one), asymmetric keys for signing only,
    the first ``MAX_JWKS_KEYS`` looked at (raftgate/jwt_keys.py parses); raises WorkloadConfigError when
    none is usable."""
    try:
        found, _ = jwks_keys(data, where, name_unnamed=False, truncate=True)
    except KeyLoadError as e:
        raise WorkloadConfigError(f"{where}: no usable signing key ({e})") from None
    keys: dict[str | None, VerifyKey] = {}
    for kid, key in found:
        keys.setdefault(kid, key)
    return keys


def _is_loopback_host(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_url(url: str, what: str) -> None:
    """https, or http to a loopback address only (a test issuer)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        raise WorkloadConfigError(f"{what} {url!r} is not a URL") from None
    if parts.scheme == "https" and parts.hostname:
        return
    if parts.scheme == "http" and _is_loopback_host(parts.hostname):
        return
    raise WorkloadConfigError(f"{what} {url!r} must be https:// (http:// only to a loopback address)")


class Fetcher:
    """GETs a bounded JSON document over https (the given CA, no redirects, no proxy from env),
    the whole answer within ``timeout`` however slowly the issuer trickles it: raftgate/bounded_get.py,
    as for a ``jwks-url``."""

    def __init__(self, ca_file: str | None = None, timeout: float = JWKS_TIMEOUT_SECONDS) -> None:
        self._context = tls_context(ca_file)
        self.timeout = timeout

    def get(self, url: str) -> bytes:
        """The document (raftgate/jwt_keys.py fetches, as for a ``jwks-url``); raises OSError. Any
        status but 200 is refused, a redirect too: keys come from the URL named, nowhere else."""
        check_url(url, "URL")
        try:
            return fetch(url, self._context, timeout=self.timeout, max_bytes=MAX_DOCUMENT_BYTES)
        except KeyLoadError as e:
            raise OSError(str(e)) from None


class FileSource:
    """A JWKS file (a mounted ConfigMap or Secret), read again only when it changed (as every file
    raftgate follows: raftgate/file_watch.py); looked at whenever its keys are due. One that is
    deleted or no longer parses leaves no keys (``max_stale`` 0): nothing is waiting to come back.
    Called by one fetch at a time (raftgate/key_source.py)."""

    max_age = 5.0
    refetch_interval = 1.0
    max_stale = 0.0

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = FileWatch([path], in_force=())  # nothing read yet
        #: what the file in force holds, or why the file that failed cannot be used
        self._data = b""
        self._error = ""

    def fetch(self) -> bytes:
        signature = self._file.changed()
        if signature is None:  # unchanged: what it held, or why it could not be used
            if self._file.bad is not None:
                raise OSError(self._error)
            return self._data
        try:
            data = _read_bounded(self.path)
        except WorkloadConfigError as e:
            self._file.failed(signature)
            self._error = str(e)
            raise OSError(self._error) from None
        self._file.took(signature)
        self._data = data
        return data

    def __str__(self) -> str:
        return f"JWKS file {self.path!r}"


class DiscoverySource:
    """The issuer's ``/.well-known/openid-configuration`` -> ``jwks_uri`` -> the JWKS."""

    max_age = KEYS_MAX_AGE_SECONDS
    refetch_interval = REFETCH_INTERVAL_SECONDS
    max_stale = JWKS_MAX_STALE_SECONDS

    def __init__(self, issuer: str, fetcher: Fetcher) -> None:
        check_url(issuer, "--oidc-issuer")
        self.issuer = issuer
        self.fetcher = fetcher
        self._jwks_uri: str | None = None

    def fetch(self) -> bytes:
        if self._jwks_uri is None:
            url = self.issuer.rstrip("/") + DISCOVERY_PATH
            try:
                doc = json.loads(self.fetcher.get(url))
            except ValueError:
                raise OSError(f"{url}: not JSON") from None
            if not isinstance(doc, dict) or doc.get("issuer") != self.issuer:
                raise OSError(f"{url}: its issuer is not {self.issuer!r}")
            jwks_uri = doc.get("jwks_uri")
            if not isinstance(jwks_uri, str):
                raise OSError(f"{url}: no jwks_uri")
            try:
                check_url(jwks_uri, "jwks_uri")
            except WorkloadConfigError as e:
                raise OSError(str(e)) from None
            self._jwks_uri = jwks_uri
        try:
            return self.fetcher.get(self._jwks_uri)
        except OSError:
            self._jwks_uri = None  # discovered again next time: the issuer may have moved its keys
            raise

    def __str__(self) -> str:
        return f"OIDC discovery of {self.issuer}"


class KeySet:
    """The issuer's current keys; thread-safe. Fetched lazily, as raftgate/key_source.py's policy
    says: when older than the source's ``max_age``, or for an unknown ``kid`` at most once per
    ``refetch_interval`` (a token is refused meanwhile: no thread waits the interval out). A failed
    fetch keeps the keys while the last good one is younger than ``max_stale`` (0: not at all);
    the failure is logged once, until a fetch succeeds. Only callers that need a fetch's answer
    (an unknown kid, no keys yet) wait for it.

    ``generation()`` moves whenever the keys in force change (fetched anew and different, or
    dropped): results cached under an older one are not answered."""

    def __init__(self, source: FileSource | DiscoverySource, *, clock: Callable[[], float] = time.monotonic,
                 max_age: float | None = None, refetch_interval: float | None = None,
                 max_stale: float | None = None) -> None:
        self.source = source
        if max_stale is None:  # a source that names no bound gets the HTTP one
            max_stale = getattr(source, "max_stale", JWKS_MAX_STALE_SECONDS)
        freshness = Freshness(source.max_age if max_age is None else max_age,
                              source.refetch_interval if refetch_interval is None else refetch_interval,
                              max_stale)
        self._keys: FetchedKeys[dict[str | None, VerifyKey]] = FetchedKeys(
            self._fetch, f"workload identity: keys from {source}", freshness,
            same=lambda a, b: same_keys(tuple(a.values()), tuple(b.values())) and list(a) == list(b),
            clock=clock, logger=log)
        self._clock = clock

    @property
    def max_age(self) -> float:
        return self._keys.freshness.max_age

    @max_age.setter
    def max_age(self, seconds: float) -> None:
        self._keys.freshness = dataclasses.replace(self._keys.freshness, max_age=seconds)

    @property
    def refetch_interval(self) -> float:
        return self._keys.freshness.refetch_interval

    @refetch_interval.setter
    def refetch_interval(self, seconds: float) -> None:
        self._keys.freshness = dataclasses.replace(self._keys.freshness, refetch_interval=seconds)

    @property
    def max_stale(self) -> float:
        return self._keys.freshness.max_stale

    @max_stale.setter
    def max_stale(self, seconds: float) -> None:
        self._keys.freshness = dataclasses.replace(self._keys.freshness, max_stale=seconds)

    @property
    def fetches(self) -> int:
        return self._keys.fetches

    def _fetch(self) -> dict[str | None, VerifyKey]:
        return parse_jwks(self.source.fetch(), str(self.source))

    def load(self) -> None:
        """Fetches now; raises WorkloadConfigError if that fails (used at start-up for a file)."""
        error = self._keys.refresh_now()
        if error is not None:
            raise WorkloadConfigError(error)

    def generation(self) -> int:
        """The keys in force now; drops keys fetched longer than ``max_stale`` ago (no I/O)."""
        return self._keys.generation()

    def refresh_due(self) -> bool:
        """Whether the keys are due to be fetched again (then a cached result is not answered: the
        caller verifies, which fetches, so a rotation is seen even when every token is cached)."""
        return self._keys.refresh_due()

    def refresh_if_due(self) -> None:
        """Fetches now if the keys are due (and no fetch is under way); may block on I/O."""
        self._keys.refresh_if_due()

    def key_for(self, kid: str | None) -> VerifyKey | None:
        # stale keys: whoever notices fetches; the others keep using the keys they have
        self._keys.refresh_if_due()
        key = self._find(kid)
        if key is None:
            self._keys.refresh(self._keys.may_refetch, wait=True)
            key = self._find(kid)
        return key

    def _find(self, kid: str | None) -> VerifyKey | None:
        keys = self._keys.keys() or {}
        if kid is None:
            return next(iter(keys.values())) if len(keys) == 1 else None
        return keys.get(kid)


# --- the verifier -------------------------------------------------------------------------------


class WorkloadVerifier:
    """Token -> WorkloadIdentity (or WorkloadRefused); thread-safe."""

    def __init__(self, issuer: str, audience: str, keys: KeySet, user_map: UserMap | UserMapFile, *,
                 clock: Callable[[], float] = time.time, cache_size: int = CACHE_SIZE) -> None:
        if not issuer:
            raise WorkloadConfigError("the issuer is empty")
        if not audience:
            raise WorkloadConfigError("the audience is empty")
        self.issuer = issuer
        self.audience = audience
        self.keys = keys
        self.user_map = user_map
        self._clock = clock
        #: token -> identity, under (key set generation, user map generation), until the token's exp
        self._cache: TrustCache[WorkloadIdentity] = TrustCache(cache_size, clock=clock)

    def is_workload_token(self, token: str) -> bool:
        """Whether ``token`` claims to come from this issuer (unverified: it only routes the
        token here, where it must then pass every check or be refused)."""
        claims = unverified_claims(token)
        return claims is not None and claims.get("iss") == self.issuer

    def _rules(self) -> UserMap:
        """The current rules (a map file is looked at again if due); an unusable map refuses."""
        if isinstance(self.user_map, UserMap):
            return self.user_map
        self.user_map.poll()
        if self.user_map.error is not None:
            raise WorkloadRefused("no usable user map (its error is in the log)")
        return self.user_map.current

    def _basis(self) -> tuple[int, int]:
        """What a result depends on: the key set's and the user map's generations (polled first)."""
        map_generation = 0
        if isinstance(self.user_map, UserMapFile):
            self.user_map.poll()
            map_generation = self.user_map.generation
        return self.keys.generation(), map_generation

    def cached(self, token: str) -> WorkloadIdentity | None:
        """A verified result still before its ``exp``, under the keys and map in force, or None;
        cheap (no signature, no fetch; a stat of the map file at most once a second). None too
        while the keys are due to be looked at again: the caller then verifies, which looks."""
        basis = self._basis()
        if self.keys.refresh_due():
            return None
        return self._cache.get(token, basis)

    def verify(self, token: str) -> WorkloadIdentity:
        """May fetch keys (blocking I/O): call it off the event loop."""
        self.keys.refresh_if_due()  # first: then the result is cached under the keys it used
        basis = self._basis()  # read before verifying: a change meanwhile voids the entry
        if not self.keys.refresh_due():
            hit = self._cache.get(token, basis)
            if hit is not None:
                return hit
        identity = self._verify(token)
        self._cache.put(token, identity, basis=basis, until=identity.expires_at)
        return identity

    def _verify(self, token: str) -> WorkloadIdentity:
        if len(token) > MAX_TOKEN_BYTES:
            raise WorkloadRefused("token too large")
        header = unverified_header(token)
        if header is None:
            raise WorkloadRefused("malformed token")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise WorkloadRefused("malformed kid")
        key = self.keys.key_for(kid)
        if key is None:
            raise WorkloadRefused("unknown key id" if kid is not None else "no kid and not exactly one key")
        algorithm = key.alg  # pinned to the key, never taken from the header
        if header.get("alg") != algorithm:
            raise WorkloadRefused(f"algorithm {str(header.get('alg'))[:16]!r} is not the key's ({algorithm})")
        try:
            claims = pyjwt.decode(
                token, key=key.key, algorithms=[algorithm], audience=self.audience, issuer=self.issuer,
                leeway=NBF_LEEWAY_SECONDS, options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except pyjwt.ExpiredSignatureError:
            raise WorkloadRefused("expired") from None
        except pyjwt.ImmatureSignatureError:
            raise WorkloadRefused("not yet valid") from None
        except pyjwt.InvalidAudienceError:
            raise WorkloadRefused("wrong audience") from None
        except pyjwt.InvalidIssuerError:
            raise WorkloadRefused("wrong issuer") from None
        except pyjwt.InvalidSignatureError:
            raise WorkloadRefused("bad signature") from None
        except pyjwt.PyJWTError as e:
            raise WorkloadRefused(f"invalid token ({type(e).__name__})") from None
        exp = claims["exp"]
        if not isinstance(exp, int | float) or isinstance(exp, bool) or not math.isfinite(exp):
            raise WorkloadRefused("bad exp")
        if not self._clock() < exp:  # no leeway on exp: never used (or cached) past it
            raise WorkloadRefused("expired")
        subject = claims["sub"]
        if not isinstance(subject, str) or not subject:
            raise WorkloadRefused("bad sub")
        user = self._rules().user_for(subject)
        if user is None:
            raise WorkloadRefused(f"no rule maps subject {subject!r}")
        return WorkloadIdentity(user, subject, float(exp))


class WorkloadTokens:
    """A :class:`WorkloadVerifier` as one of the store's token verifiers (raftgate/token_verifier.py):
    the store verifies the workload tokens sidecars forward. ``recognizes`` by ``iss`` (an
    unverified base64 + JSON read of the payload, a few microseconds). ``verify``: a cached result
    is a sha256 and a dict lookup on the event loop; a miss (once per token until its ``exp``) runs
    the signature check - and a key fetch, on an unknown ``kid``, bounded - in a worker thread."""

    def __init__(self, verifier: WorkloadVerifier) -> None:
        self.verifier = verifier

    def recognizes(self, token: str) -> bool:
        return self.verifier.is_workload_token(token)

    async def verify(self, token: str) -> Verified | None:
        found = self.verifier.cached(token)
        if found is None:
            try:
                found = await asyncio.to_thread(self.verifier.verify, token)
            except WorkloadRefused as e:
                log.info("workload token %s refused: %s", fingerprint(token), e)
                return None
        # no revision: the store judges it at its current auth revision, once it saw the user exists
        return Verified(found.user, None, expires_at=found.expires_at)


def build(issuer: str, audience: str, *, jwks_file: str | None, ca_file: str | None, user_map_file: str,
          clock: Callable[[], float] = time.time) -> WorkloadVerifier:
    """The verifier for the proxy's flags; a JWKS file is read now (a bad one fails start-up),
    discovery is left for the first token (the issuer may not be reachable yet)."""
    if ca_file and not os.path.isfile(ca_file):
        raise WorkloadConfigError(f"CA file {ca_file!r} does not exist")
    if jwks_file:
        keys = KeySet(FileSource(jwks_file))
        keys.load()
    else:
        try:
            fetcher = Fetcher(ca_file)
        except (OSError, ssl.SSLError) as e:
            raise WorkloadConfigError(f"CA file {ca_file!r}: {e}") from None
        keys = KeySet(DiscoverySource(issuer, fetcher))
    return WorkloadVerifier(issuer, audience, keys, UserMapFile(user_map_file), clock=clock)
