"""JWT keys that rotate: one key set, loaded from files, re-read when they change, verified by ``kid``.

Shared by the proxy (``--auth-token jwt,...``) and, later, the store; it imports neither.

* ``priv-key`` is the signing key (for HS* its raw bytes are the secret, as in etcd). Tokens
  signed with an asymmetric key carry a ``kid`` header: the key's RFC 7638 thumbprint. HMAC
  tokens carry none (a kid derived from a secret would only help guess it; the set is small).
* ``pub-key`` names one PEM public key or certificate (as in etcd), a directory of them, or a
  JWKS file (parsed by PyJWT's ``PyJWK``; a JWKS key keeps its own ``kid`` and ``alg``).
  :func:`jwks_keys` is the one JWKS parser: workload identity's issuer keys go through it too.
* Files are re-read when they change (Kubernetes swaps a Secret volume by symlink: a new inode;
  raftgate/file_watch.py tells), looked at no more than once per poll interval. A new file that
  cannot be used (unparseable, a private key that does not match its public key) keeps the old
  keys and is reported once.
* A key that leaves the files (a rotated ``priv-key``) keeps verifying for ``retain_seconds``
  (the token TTL), counted from when the change is seen: every token it signed has expired by
  then. After that, nothing it signed verifies, whatever the token's ``exp``.
* ``generation()`` names the set of keys in force; it moves whenever a key stops verifying (rotated
  out, its retirement over, fetched keys too stale) or the set changes. Verifiers cache results
  under it (raftgate/trust_cache.py), so no cached verification outlives its key.
* Verification pins each key's algorithm: a token's ``alg`` header only has to equal it. A token
  with a known ``kid`` is checked with that key only; one without (etcd's own tokens) or with an
  unknown one with the keys in order, at most ``MAX_UNKEYED_TRIES`` of them.
* :class:`JwksFollower` keeps a verify-only set in step with another proxy's published JWKS
  (``jwks-url``): fetched in a thread (raftgate/bounded_get.py), bounded in size and time, refreshed
  periodically and (rate-limited) when a token names a kid nobody knows yet. How long fetched keys
  are trusted is raftgate/key_source.py's policy, the same as for workload identity's issuer keys:
  not refreshed for ``JWKS_MAX_STALE_SECONDS`` (an hour), they stop verifying (an outage of the
  signer is survived, but a key it removed is not trusted forever by a follower cut off from it);
  a failing refresh is logged once (then again only after a success).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import math
import os
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt as pyjwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, HMACAlgorithm, OKPAlgorithm, RSAAlgorithm

from raftgate import bounded_get
from raftgate.bounded_file import FileReadError, read_bounded
from raftgate.file_watch import FileWatch, stamps
from raftgate.key_source import FetchedKeys, Freshness

log = logging.getLogger(__name__)

HMAC_ALGORITHMS = {"HS256": HMACAlgorithm.SHA256, "HS384": HMACAlgorithm.SHA384, "HS512": HMACAlgorithm.SHA512}
RSA_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
EC_CURVES: dict[str, type[ec.EllipticCurve]] = {"ES256": ec.SECP256R1, "ES384": ec.SECP384R1, "ES512": ec.SECP521R1}
ASYMMETRIC_ALGORITHMS = frozenset({*RSA_ALGORITHMS, *EC_CURVES, "EdDSA"})
SUPPORTED_ALGORITHMS = frozenset({*HMAC_ALGORITHMS, *ASYMMETRIC_ALGORITHMS})

JWKS_PATH = "/.well-known/jwks.json"
MAX_KEY_FILE_BYTES = 1024 * 1024
MAX_DIR_ENTRIES = 64
MAX_JWKS_KEYS = 64
MAX_RETIRED = 16
MAX_UNKEYED_TRIES = 8
#: the largest token (JWT, workload token) any verifier looks at: the one definition, imported by the others
MAX_TOKEN_BYTES = 16 * 1024
POLL_INTERVAL_SECONDS = 1.0
JWKS_REFRESH_SECONDS = 60.0
JWKS_MIN_INTERVAL_SECONDS = 1.0
#: A fetch of keys (a jwks-url, a workload issuer's discovery document or JWKS) ends within this.
JWKS_TIMEOUT_SECONDS = 5.0
#: Keys fetched over HTTP (a jwks-url, a workload issuer) and not refreshed successfully for this
#: long stop verifying.
JWKS_MAX_STALE_SECONDS = 3600.0

#: Reload outcomes reported to ``on_reload(source, result)``: source ``files`` or ``jwks_url``.
OK, ERROR = "ok", "error"


class KeyLoadError(ValueError):
    """Keys that cannot be used; ``reason`` is ``invalid``, ``missing`` or ``mismatch`` (etcd's three
    start-up errors). The message names files, never key material."""

    INVALID, MISSING, MISMATCH = "invalid", "missing", "mismatch"

    def __init__(self, message: str, reason: str = INVALID) -> None:
        super().__init__(message)
        self.reason = reason


def unverified_header(token: str) -> dict[str, Any] | None:
    """A JWT's header, unverified (None: too large or malformed): it only picks the key, whose own
    pinned algorithm then decides."""
    if len(token) > MAX_TOKEN_BYTES:
        return None
    try:
        return pyjwt.get_unverified_header(token)
    except (pyjwt.PyJWTError, ValueError, TypeError):
        return None


class _RawHMAC(HMACAlgorithm):
    """HMAC whose secret is the key file's raw bytes, whatever they look like (etcd's rule).

    PyJWT refuses PEM-looking HMAC secrets to stop algorithm confusion; here every key has its own
    pinned algorithm and HMAC secrets never share a set with public keys, so the guard is not needed.
    """

    def prepare_key(self, key: str | bytes) -> bytes:
        key_bytes = key.encode() if isinstance(key, str) else bytes(key)
        if not key_bytes:
            raise pyjwt.InvalidKeyError("HMAC key must not be empty")
        return key_bytes

    def check_key_length(self, key: Any) -> str | None:
        return None


def new_jws() -> pyjwt.PyJWS:
    """A PyJWS knowing every supported algorithm, HMAC keyed by raw bytes. Callers always pass the
    one algorithm a key is pinned to."""
    jws = pyjwt.PyJWS(algorithms=sorted(SUPPORTED_ALGORITHMS))
    for name, digest in HMAC_ALGORITHMS.items():
        jws.unregister_algorithm(name)
        jws.register_algorithm(name, _RawHMAC(digest))
    return jws


@dataclass(frozen=True)
class VerifyKey:
    """One verification key, pinned to ``alg``. ``kid`` is None for HMAC secrets; ``jwk`` is the
    public JWK to publish (None: a secret, or a key learnt from someone else's JWKS)."""

    kid: str | None
    alg: str
    key: Any = field(repr=False)
    jwk: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    @property
    def ident(self) -> tuple[str, Any]:
        return ("kid", self.kid) if self.kid is not None else ("secret", self.key)


@dataclass(frozen=True)
class SigningKey:
    kid: str | None
    alg: str
    key: Any = field(repr=False)


@dataclass(frozen=True)
class KeyMaterial:
    """What one read of the key files gives: the signing key (if any) and the verification keys,
    the signing key's own public key first."""

    signing: SigningKey | None
    verify: tuple[VerifyKey, ...]


# -------------------------------------------------------------------------------------------------
# JWKs and thumbprints

_THUMBPRINT_MEMBERS = {"RSA": ("e", "kty", "n"), "EC": ("crv", "kty", "x", "y"), "OKP": ("crv", "kty", "x")}


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwk_thumbprint(jwk: dict[str, Any]) -> str:
    """RFC 7638: sha256 over the key type's required members, sorted, no whitespace; base64url."""
    members = {name: jwk[name] for name in _THUMBPRINT_MEMBERS[jwk["kty"]]}
    canonical = json.dumps(members, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return _b64url(hashlib.sha256(canonical.encode()).digest())


def public_jwk(key: Any) -> dict[str, Any]:
    """The public JWK of an asymmetric key (PyJWT writes it), public members only."""
    if isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey):
        key = key.public_key()
    if isinstance(key, rsa.RSAPublicKey):
        jwk = RSAAlgorithm.to_jwk(key, as_dict=True)
    elif isinstance(key, ec.EllipticCurvePublicKey):
        jwk = ECAlgorithm.to_jwk(key, as_dict=True)
    elif isinstance(key, ed25519.Ed25519PublicKey):
        jwk = OKPAlgorithm.to_jwk(key, as_dict=True)
    else:
        raise KeyLoadError(f"no JWK for a {type(key).__name__}")
    return {name: jwk[name] for name in _THUMBPRINT_MEMBERS[jwk["kty"]]}


def _published(alg: str, key: Any, kid: str) -> dict[str, Any]:
    return {**public_jwk(key), "kid": kid, "alg": alg, "use": "sig"}


def fits(alg: str, key: Any) -> bool:
    """Whether ``key`` (private or public) is of the family and curve ``alg`` needs."""
    if alg in RSA_ALGORITHMS:
        return isinstance(key, rsa.RSAPrivateKey | rsa.RSAPublicKey)
    if alg in EC_CURVES:
        return isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) and isinstance(
            key.curve, EC_CURVES[alg]
        )
    if alg == "EdDSA":
        return isinstance(key, ed25519.Ed25519PrivateKey | ed25519.Ed25519PublicKey)
    return False


def _public_der(key: Any) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


# -------------------------------------------------------------------------------------------------
# loading


def read_key_file(path: str | Path) -> bytes:
    try:
        return read_bounded(path, MAX_KEY_FILE_BYTES)
    except FileReadError as e:
        raise KeyLoadError(f"key file: {e}") from None


def load_private(alg: str, data: bytes) -> Any:
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise KeyLoadError(f"priv-key is not a PEM private key for {alg} ({e})") from None
    if not fits(alg, key):
        raise KeyLoadError(f"priv-key is not a key for {alg}")
    return key


def load_public(alg: str, data: bytes, what: str = "pub-key") -> Any:
    """A PEM public key, or the public key of a PEM X.509 certificate (etcd accepts both)."""
    try:
        if b"-----BEGIN CERTIFICATE-----" in data:
            key = x509.load_pem_x509_certificate(data).public_key()
        else:
            key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as e:
        raise KeyLoadError(f"{what} is not a PEM public key for {alg} ({e})") from None
    if not fits(alg, key):
        raise KeyLoadError(f"{what} is not a key for {alg}")
    return key


def pem_key(alg: str, key: Any) -> VerifyKey:
    """A verification key from a PEM key: kid = its thumbprint, pinned to the configured algorithm."""
    jwk = public_jwk(key)
    kid = jwk_thumbprint(jwk)
    public = key.public_key() if hasattr(key, "private_bytes") else key
    return VerifyKey(kid, alg, public, _published(alg, public, kid))


def load_jwks(default_alg: str, data: bytes, where: str, *, publish: bool = True) -> tuple[VerifyKey, ...]:
    """The usable signature keys of a ``pub-key`` or ``jwks-url`` JWKS document (see
    :func:`jwks_keys`); more than ``MAX_JWKS_KEYS`` keys is an error, skipped keys are logged."""
    found, skipped = jwks_keys(data, where, default_alg=default_alg, name_unnamed=True)
    if skipped:
        log.warning("%s: %d key(s) skipped (symmetric, not for signatures, or not usable for JWT here)",
                    where, skipped)
    return tuple(key if publish else VerifyKey(key.kid, key.alg, key.key) for _, key in found)


def jwks_keys(data: bytes, where: str, *, default_alg: str | None = None, name_unnamed: bool = True,
              truncate: bool = False) -> tuple[list[tuple[str | None, VerifyKey]], int]:
    """The usable signature keys of a JWKS document, each with the ``kid`` the document gave it
    (None: none), and how many were skipped; the one JWKS parser (raftgate's JWT keys and workload
    identity's issuer keys alike). PyJWT's ``PyJWK`` parses each key.

    A key's ``alg`` pins it; without one, ``default_alg`` if the key is of its family, else what
    PyJWT infers from the key type. Symmetric (``oct``) keys, encryption keys and algorithms etcd
    does not have are skipped: a shared secret never comes from a key set. A key without a ``kid``
    is named by its RFC 7638 thumbprint when ``name_unnamed``. More than ``MAX_JWKS_KEYS`` keys is
    an error, or with ``truncate`` only the first ones are looked at. Raises KeyLoadError when no
    key is usable.
    """
    try:
        doc = json.loads(data)
    except ValueError:
        raise KeyLoadError(f"{where} is not a JSON JWKS document") from None
    raw_keys = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(raw_keys, list):
        raise KeyLoadError(f"{where} is not a JWKS document (no \"keys\" list)")
    if len(raw_keys) > MAX_JWKS_KEYS:
        if not truncate:
            raise KeyLoadError(f"{where} holds more than {MAX_JWKS_KEYS} keys")
        raw_keys = raw_keys[:MAX_JWKS_KEYS]
    out: list[tuple[str | None, VerifyKey]] = []
    skipped = 0
    for raw in raw_keys:
        key = _jwks_key(default_alg, raw, name_unnamed)
        if key is None:
            skipped += 1
        else:
            out.append(key)
    if not out:
        raise KeyLoadError(f"{where} holds no usable signature key")
    return out, skipped


def _jwks_key(default_alg: str | None, raw: Any, name_unnamed: bool) -> tuple[str | None, VerifyKey] | None:
    if not isinstance(raw, dict) or raw.get("kty") == "oct" or raw.get("use", "sig") != "sig":
        return None
    alg = raw.get("alg")
    if alg is None and default_alg is not None and default_alg in ASYMMETRIC_ALGORITHMS:
        family = "RSA" if default_alg in RSA_ALGORITHMS else "EC" if default_alg in EC_CURVES else "OKP"
        alg = default_alg if raw.get("kty") == family else None
    if alg is not None and alg not in ASYMMETRIC_ALGORITHMS:
        return None
    try:
        jwk = pyjwt.PyJWK(raw, algorithm=alg)
    except pyjwt.PyJWTError:
        return None
    key = jwk.key
    if hasattr(key, "private_bytes"):
        key = key.public_key()  # a private JWK by mistake: only its public half is used
    if jwk.algorithm_name not in ASYMMETRIC_ALGORITHMS or not fits(jwk.algorithm_name, key):
        return None
    given = jwk.key_id if isinstance(jwk.key_id, str) and jwk.key_id else None
    kid = given if given is not None or not name_unnamed else jwk_thumbprint(public_jwk(key))
    published = _published(jwk.algorithm_name, key, kid) if kid is not None else None
    return given, VerifyKey(kid, jwk.algorithm_name, key, published)


def _keys_from(alg: str, data: bytes, where: str) -> tuple[VerifyKey, ...]:
    if data.lstrip().startswith(b"{"):
        return load_jwks(alg, data, where)
    return (pem_key(alg, load_public(alg, data)),)


def load_public_keys(alg: str, path: str | Path) -> tuple[VerifyKey, ...]:
    """``pub-key``: a PEM key or certificate, a JWKS file, or a directory of those (entries starting
    with ``.`` skipped: Kubernetes keeps its ``..data`` machinery there)."""
    p = Path(path)
    if not is_directory(p):
        return _keys_from(alg, read_key_file(p), "pub-key")
    names = _dir_names(p)
    keys: list[VerifyKey] = []
    for name in names:
        entry = p / name
        if is_directory(entry):
            continue
        keys.extend(_keys_from(alg, read_key_file(entry), f"pub-key {name!r}"))
    if not keys:
        raise KeyLoadError(f"pub-key directory {str(p)!r} holds no key")
    return _unique(keys)


def is_directory(path: str | Path) -> bool:
    try:
        return Path(path).is_dir()
    except OSError:
        return False


def _dir_names(p: Path) -> list[str]:
    try:
        names = sorted(n for n in os.listdir(p) if not n.startswith("."))
    except OSError as e:
        raise KeyLoadError(f"cannot list pub-key directory {str(p)!r}: {e.strerror}") from None
    if len(names) > MAX_DIR_ENTRIES:
        raise KeyLoadError(f"pub-key directory {str(p)!r} holds more than {MAX_DIR_ENTRIES} entries")
    return names


def _unique(keys: list[VerifyKey]) -> tuple[VerifyKey, ...]:
    seen: set[tuple[str, Any]] = set()
    out = []
    for k in keys:
        if k.ident not in seen:
            seen.add(k.ident)
            out.append(k)
    return tuple(out)


def material_from_bytes(alg: str, private_key: bytes | None, public_key: bytes | None) -> KeyMaterial:
    """The key material of ``priv-key`` / ``pub-key`` contents (``public_key``: a PEM or a JWKS)."""
    if alg in HMAC_ALGORITHMS:
        if not private_key:
            raise KeyLoadError(f"{alg} needs priv-key (the shared secret)", KeyLoadError.MISSING)
        secret = bytes(private_key)
        return KeyMaterial(SigningKey(None, alg, secret), (VerifyKey(None, alg, secret),))
    priv = load_private(alg, private_key) if private_key else None
    pub = _keys_from(alg, public_key, "pub-key") if public_key else ()
    return _asymmetric(alg, priv, pub, single_pub=public_key is not None and not public_key.lstrip().startswith(b"{"))


def _asymmetric(alg: str, priv: Any, pub: tuple[VerifyKey, ...], *, single_pub: bool) -> KeyMaterial:
    if priv is None and not pub:
        raise KeyLoadError(f"{alg} needs priv-key and/or pub-key", KeyLoadError.MISSING)
    if priv is None:
        return KeyMaterial(None, pub)
    own = pem_key(alg, priv)
    if single_pub and pub and _public_der(priv.public_key()) != _public_der(pub[0].key):
        raise KeyLoadError("public and private keys don't match", KeyLoadError.MISMATCH)
    material = KeyMaterial(SigningKey(own.kid, alg, priv), _unique([own, *pub]))
    _probe(material)
    return material


def _probe(material: KeyMaterial) -> None:
    """Signs and verifies once, so a key that cannot work fails now, not at the first login."""
    assert material.signing is not None
    jws, s = new_jws(), material.signing
    try:
        token = jws.encode(b"{}", s.key, algorithm=s.alg)
        jws.decode_complete(token, key=material.verify[0].key, algorithms=[s.alg])
    except Exception as e:  # any failure means the key is unusable
        raise KeyLoadError(f"cannot sign and verify with priv-key: {type(e).__name__}") from None


def material_from_files(alg: str, priv_path: str | None, pub_path: str | None) -> KeyMaterial:
    """Reads ``priv-key`` and ``pub-key`` now (HMAC: ``pub-key`` is ignored, as in etcd)."""
    if alg in HMAC_ALGORITHMS:
        return material_from_bytes(alg, read_key_file(priv_path) if priv_path else None, None)
    priv = load_private(alg, read_key_file(priv_path)) if priv_path else None
    if not pub_path:
        return _asymmetric(alg, priv, (), single_pub=False)
    if is_directory(Path(pub_path)):
        return _asymmetric(alg, priv, load_public_keys(alg, pub_path), single_pub=False)
    data = read_key_file(pub_path)
    return _asymmetric(alg, priv, _keys_from(alg, data, "pub-key"), single_pub=not data.lstrip().startswith(b"{"))


# -------------------------------------------------------------------------------------------------
# the key ring


@dataclass(frozen=True)
class _Snapshot:
    signing: SigningKey | None
    current: tuple[VerifyKey, ...]
    retired: tuple[tuple[VerifyKey, float], ...]  # (key, verifies until)
    remote: tuple[VerifyKey, ...]
    by_kid: dict[str, tuple[VerifyKey, float | None]]
    generation: int
    #: the first retired key's end (clock), inf without one: then the set changes by itself
    retired_until: float


def _snapshot(signing: SigningKey | None, current: tuple[VerifyKey, ...],
              retired: tuple[tuple[VerifyKey, float], ...], remote: tuple[VerifyKey, ...],
              generation: int) -> _Snapshot:
    by_kid: dict[str, tuple[VerifyKey, float | None]] = {}
    for key in remote:  # the files win over a fetched key with the same kid
        if key.kid is not None:
            by_kid[key.kid] = (key, None)
    for key, until in retired:
        if key.kid is not None:
            by_kid[key.kid] = (key, until)
    for key in current:
        if key.kid is not None:
            by_kid[key.kid] = (key, None)
    retired_until = min((until for _, until in retired), default=math.inf)
    return _Snapshot(signing, current, retired, remote, by_kid, generation, retired_until)


def _material_ids(keys: tuple[VerifyKey, ...]) -> frozenset[tuple[Any, ...]]:
    """What tells two fetched key sets apart: kid, algorithm and the public key itself (a kid
    reused for another key is another key)."""
    return frozenset((k.kid, k.alg, _public_der(k.key) if hasattr(k.key, "public_bytes") else k.key) for k in keys)


def _same_signing(a: SigningKey | None, b: SigningKey | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.alg == b.alg and (a.kid == b.kid if a.kid is not None else a.key == b.key)


class KeyRing:
    """The keys in force: the files' keys now, the keys that left them (until ``retain_seconds``
    after), and keys fetched from a JWKS URL. Thread-safe (the JWKS endpoint runs in the metrics
    server's thread); a reload swaps one immutable snapshot."""

    def __init__(
        self,
        algorithm: str,
        material: KeyMaterial,
        *,
        retain_seconds: float,
        load: Callable[[], KeyMaterial] | None = None,
        watch: list[Path] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        poll_interval: float = POLL_INTERVAL_SECONDS,
        on_reload: Callable[[str, str], None] | None = None,
    ) -> None:
        if algorithm not in SUPPORTED_ALGORITHMS:
            raise KeyLoadError(f"unsupported sign-method {algorithm!r}")
        self.algorithm = algorithm
        self.retain_seconds = retain_seconds
        self.poll_interval = poll_interval
        self._load = load
        self._files = FileWatch(watch or [], poll_interval=poll_interval, dir_entries=MAX_DIR_ENTRIES,
                                clock=monotonic)
        self._clock = clock
        self._monotonic = monotonic
        self._on_reload = on_reload or (lambda source, result: None)
        self._lock = threading.Lock()
        self._jws = new_jws()
        self._snap = _snapshot(material.signing, material.verify, (), (), 0)
        #: keys fetched from a JWKS URL (raftgate/key_source.py decides how long they are trusted)
        self._remote: FetchedKeys[tuple[VerifyKey, ...]] | None = None

    @classmethod
    def from_files(cls, algorithm: str, priv_path: str | None, pub_path: str | None, *, retain_seconds: float,
                   **kw: Any) -> KeyRing:
        """Reads the files now (a bad file is a start-up error) and re-reads them when they change."""
        watch = [Path(p) for p in (priv_path, pub_path if algorithm not in HMAC_ALGORITHMS else None) if p]
        # Take the stamps before reading: a change during the read is seen at the next poll.
        signature = stamps(watch, dir_entries=MAX_DIR_ENTRIES)

        def load() -> KeyMaterial:
            return material_from_files(algorithm, priv_path, pub_path)

        ring = cls(algorithm, load(), retain_seconds=retain_seconds, load=load, watch=watch, **kw)
        ring._files.took(signature)
        return ring

    # -- what is in force
    @property
    def signing(self) -> SigningKey | None:
        return self._snap.signing

    def generation(self) -> int:
        """The key set in force now (files re-read if due; keys past their end dropped): a cached
        verification is answered only under the generation it was verified under."""
        self.poll()
        return self._current().generation

    def _fetched(self) -> tuple[VerifyKey, ...]:
        """The fetched keys in force (none past their staleness bound)."""
        return (self._remote.keys() or ()) if self._remote is not None else ()

    def _current(self) -> _Snapshot:
        """The snapshot, without the retired keys whose grace is over, with the fetched keys in
        force (each drop, and each fetch of other keys, is a new generation)."""
        snap = self._snap
        remote = self._fetched()
        if (remote is snap.remote or not (remote or snap.remote)) and self._clock() < snap.retired_until:
            return snap
        with self._lock:
            snap, now = self._snap, self._clock()
            retired = tuple((k, until) for k, until in snap.retired if now < until)
            remote = self._fetched()
            if retired != snap.retired or remote is not snap.remote:
                moved = retired != snap.retired or _material_ids(remote) != _material_ids(snap.remote)
                self._snap = _snapshot(snap.signing, snap.current, retired, remote, snap.generation + moved)
            return self._snap

    def knows(self, kid: str) -> bool:
        found = self._current().by_kid.get(kid)
        return found is not None and (found[1] is None or self._clock() < found[1])

    def verification_keys(self) -> list[VerifyKey]:
        """Current file keys, live retired keys, fetched keys: the order unkeyed tokens try them."""
        snap, now = self._current(), self._clock()
        return [*snap.current, *(k for k, until in snap.retired if now < until), *snap.remote]

    def jwks(self) -> dict[str, Any] | None:
        """The public keys of the files (current and retired) as a JWKS; None when there are none
        (HMAC: a secret is never published)."""
        self.poll()
        snap, now = self._current(), self._clock()
        keys = [k.jwk for k in snap.current if k.jwk is not None]
        keys += [k.jwk for k, until in snap.retired if k.jwk is not None and now < until]
        return {"keys": keys} if keys else None

    def jwks_document(self) -> bytes | None:
        doc = self.jwks()
        return None if doc is None else json.dumps(doc, separators=(",", ":")).encode()

    # -- change
    def poll(self, *, force: bool = False) -> bool:
        """Re-reads the files if they changed (looked at no more than once per poll interval); True
        when new keys are in force. A bad new file keeps the old keys and is reported once."""
        if self._load is None or not self._files.due(force=force):
            return False
        with self._lock:
            signature = self._files.changed()
            if signature is None:
                return False
            try:
                material = self._load()
            except KeyLoadError as e:
                self._files.failed(signature)
                log.warning("JWT key files changed but cannot be used; keeping the keys in force: %s", e)
                self._on_reload("files", ERROR)
                return False
            self._files.took(signature)
            changed = self._install(material)
        self._on_reload("files", OK)
        if changed:
            log.info("JWT key files changed: signing with %s, %d verification key(s)",
                     (material.signing.kid or "the new secret") if material.signing else "nothing (verify-only)",
                     len(self.verification_keys()))
        return changed

    def _install(self, material: KeyMaterial) -> bool:
        snap, now = self._snap, self._clock()
        new = {k.ident for k in material.verify}
        if new == {k.ident for k in snap.current} and _same_signing(material.signing, snap.signing):
            return False
        retired = [(k, until) for k, until in snap.retired if now < until and k.ident not in new]
        retired += [(k, now + self.retain_seconds) for k in snap.current if k.ident not in new]
        self._snap = _snapshot(material.signing, material.verify, tuple(retired[-MAX_RETIRED:]), snap.remote,
                               snap.generation + 1)
        return True

    def follow(self, fetched: FetchedKeys[tuple[VerifyKey, ...]]) -> None:
        """Verifies with the keys ``fetched`` holds too (a JWKS URL's), while it trusts them."""
        self._remote = fetched

    # -- tokens
    def sign(self, payload: bytes) -> str:
        """A compact JWS of ``payload`` with the current signing key (``kid`` header if it has one)."""
        self.poll()
        signing = self._snap.signing
        if signing is None:
            raise KeyLoadError("no signing key (verify-only)", KeyLoadError.MISSING)
        headers = {"kid": signing.kid} if signing.kid is not None else None
        return self._jws.encode(payload, signing.key, algorithm=signing.alg, headers=headers)

    def verify(self, token: str) -> bytes | None:
        """The payload of a token one of the keys signed, each key with its own pinned algorithm."""
        if len(token) > MAX_TOKEN_BYTES:
            return None
        self.poll()
        header = unverified_header(token)
        if header is None:
            return None
        alg, kid = header.get("alg"), header.get("kid")
        found = self._current().by_kid.get(kid) if isinstance(kid, str) else None
        if found is not None:
            key, until = found
            candidates = [key] if until is None or self._clock() < until else []
        else:
            candidates = self.verification_keys()
        tried = 0
        for key in candidates:
            if key.alg != alg:  # never the token's choice: the key's algorithm or nothing
                continue
            tried += 1
            if tried > MAX_UNKEYED_TRIES:
                break
            try:
                decoded = self._jws.decode_complete(token, key=key.key, algorithms=[key.alg])
            except (pyjwt.PyJWTError, ValueError, TypeError):
                continue
            payload: bytes = decoded["payload"]
            return payload
        return None

    @staticmethod
    def kid_of(token: str) -> str | None:
        """The ``kid`` header of a token, unverified (None if it has none or is malformed)."""
        header = unverified_header(token)
        kid = header.get("kid") if header is not None else None
        return kid if isinstance(kid, str) else None


# -------------------------------------------------------------------------------------------------
# following a published JWKS


def jwks_context(url: str, ca_file: str | None) -> ssl.SSLContext | None:
    """The TLS context for an https JWKS URL: the system CAs, or only ``ca_file``'s."""
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("http", "https") or not urllib.parse.urlsplit(url).hostname:
        raise KeyLoadError(f"jwks-url {url!r} is not an http:// or https:// URL")
    if scheme == "http":
        return None
    try:
        return bounded_get.tls_context(ca_file)
    except (OSError, ssl.SSLError) as e:
        raise KeyLoadError(f"jwks-ca {ca_file!r} cannot be used: {e}") from None


def fetch(url: str, context: ssl.SSLContext | None, *, timeout: float = JWKS_TIMEOUT_SECONDS,
          max_bytes: int = MAX_KEY_FILE_BYTES) -> bytes:
    """GET ``url`` (no proxy from the environment, no redirects), at most ``max_bytes``, the whole
    answer within ``timeout`` seconds (a watchdog lets go of a trickling one); raises KeyLoadError."""
    try:
        status, data = bounded_get.get(url, context, timeout=timeout, max_bytes=max_bytes)
    except bounded_get.GetError as e:
        raise KeyLoadError(f"cannot fetch: {e}") from None
    if status != 200:
        refused = " (redirect refused)" if 300 <= status < 400 else ""
        raise KeyLoadError(f"cannot fetch {url}: HTTP {status}{refused}")
    if len(data) > max_bytes:
        raise KeyLoadError(f"{url} answered more than {max_bytes} bytes")
    return data


def same_keys(a: tuple[VerifyKey, ...], b: tuple[VerifyKey, ...]) -> bool:
    """Whether two fetches brought the same keys (kid, algorithm and the public key itself)."""
    return _material_ids(a) == _material_ids(b)


class JwksFollower:
    """Keeps ``ring``'s fetched keys equal to the JWKS at ``url``, as raftgate/key_source.py's policy
    says: ``run()`` refreshes every ``refresh_seconds``; ``refresh_for(kid)`` fetches now for a kid
    nobody knows, at most once per ``min_interval`` (the callers waiting then share one fetch, and
    wait out the rate limit on the event loop). Keys not refreshed for ``max_stale`` stop verifying."""

    def __init__(self, ring: KeyRing, url: str, *, ca_file: str | None = None,
                 refresh_seconds: float = JWKS_REFRESH_SECONDS, min_interval: float = JWKS_MIN_INTERVAL_SECONDS,
                 timeout: float = JWKS_TIMEOUT_SECONDS, monotonic: Callable[[], float] = time.monotonic,
                 on_reload: Callable[[str, str], None] | None = None,
                 max_stale: float = JWKS_MAX_STALE_SECONDS) -> None:
        self.ring = ring
        self.url = url
        self.timeout = timeout
        self._context = jwks_context(url, ca_file)
        self._monotonic = monotonic
        self._on_reload = on_reload or (lambda source, result: None)
        self.keys: FetchedKeys[tuple[VerifyKey, ...]] = FetchedKeys(
            self.fetch_now, f"JWKS from {url}", Freshness(refresh_seconds, min_interval, max_stale),
            same=same_keys, clock=monotonic, logger=log, on_fetch=self._fetched)
        self._lock: asyncio.Lock | None = None

    def _fetched(self, ok: bool) -> None:
        """The ring verifies with the keys of the follower that last fetched successfully (until
        then, a follower that never could changes nothing)."""
        if ok:
            self.ring.follow(self.keys)
        self._on_reload("jwks_url", OK if ok else ERROR)

    @property
    def refresh_seconds(self) -> float:
        return self.keys.freshness.max_age

    @property
    def min_interval(self) -> float:
        return self.keys.freshness.refetch_interval

    @property
    def max_stale(self) -> float:
        return self.keys.freshness.max_stale

    def fetch_now(self) -> tuple[VerifyKey, ...]:
        """One blocking fetch and parse (run in a thread); raises KeyLoadError."""
        data = fetch(self.url, self._context, timeout=self.timeout)
        return load_jwks(self.ring.algorithm, data, self.url, publish=False)

    async def refresh(self) -> bool:
        """Fetches now (one fetch at a time); True when it succeeded."""
        async with self._get_lock():
            return await asyncio.to_thread(self.keys.refresh_now) is None

    async def refresh_for(self, kid: str) -> None:
        """Fetches once more for an unknown ``kid`` unless a fetch started since the caller came,
        waiting out the rate limit; bounded by the fetch timeout plus ``min_interval``."""
        arrived = self._monotonic()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.timeout + self.min_interval):
                await self._refresh_for(kid, arrived)

    async def _refresh_for(self, kid: str, arrived: float) -> None:
        async with self._get_lock():
            if self.ring.knows(kid) or self.keys.started_since(arrived):
                return
            wait = self.keys.refetch_wait(self._monotonic())
            if wait > 0:
                await asyncio.sleep(wait)
            await asyncio.to_thread(self.keys.refresh_now)

    async def run(self) -> None:
        """Refreshes every ``refresh_seconds`` until cancelled."""
        while True:
            await asyncio.sleep(self.refresh_seconds)
            await self.refresh()

    def _get_lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock
