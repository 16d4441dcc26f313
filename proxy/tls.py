"""TLS on the client port (etcd's ``--cert-file``, ``--key-file``, ``--trusted-ca-file``,
``--client-cert-auth``), with the files re-read when they change.

cert-manager rotates a mounted Secret by swapping a symlink: the server must take the new
certificate and CA without restarting. grpc-core asks ``ServerTLS.fetch`` before each new
handshake; it answers a new configuration when a file's identity (inode, size, mtime) changed and
the new files load, and None (keep the current one) otherwise, so a half-written rotation never
breaks the port. Established connections keep the certificate they were made with.

As in etcd, a trusted CA makes the port require and verify a client certificate; only
``--client-cert-auth`` makes the verified certificate's CN the user of token-less requests.
``--client-crl-file`` revokes client certificates; grpc-core cannot check a CRL at the handshake,
so raftgate/crl.py checks it on every call (``revocation_list``).
"""

from __future__ import annotations

import functools
import logging
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from cryptography import x509
from cryptography.x509.oid import NameOID

from raftgate.bounded_file import FileReadError, read_bounded
from raftgate.crl import RevocationList
from raftgate.file_watch import FileWatch, Stamp, stamps

log = logging.getLogger(__name__)

#: the auth-context key grpc-core fills with the verified client certificate's subject CN
COMMON_NAME_KEY = "x509_common_name"
#: ... and with the verified client certificate itself (PEM)
PEM_CERT_KEY = "x509_pem_cert"
MAX_PEM_BYTES = 1024 * 1024


class TLSFileError(ValueError):
    """A certificate, key or CA file that cannot be used; the message names the file's flag."""


@dataclass(frozen=True)
class ClientTLS:
    """The client port's TLS files and etcd's client-cert-auth switch."""

    cert_file: str
    key_file: str
    #: --trusted-ca-file: client certificates are then required and verified (None: not asked for)
    ca_file: str | None = None
    #: --client-cert-auth: a verified certificate's CN is the user of token-less requests
    client_cert_auth: bool = False
    #: each file's flag as the user gave it (``--cert-file`` or the environment variable), for messages
    sources: tuple[str, str, str] = ("--cert-file", "--key-file", "--trusted-ca-file")
    #: --client-crl-file: client certificates it lists are refused (raftgate/crl.py), re-read on change
    crl_file: str | None = None
    crl_source: str = "--client-crl-file"

    @property
    def require_client_certificate(self) -> bool:
        return self.ca_file is not None


@dataclass(frozen=True)
class _Loaded:
    cert: bytes
    key: bytes
    ca: bytes | None
    stamp: tuple[Stamp, ...]


def _read(source: str, path: str) -> bytes:
    try:
        return read_bounded(path, MAX_PEM_BYTES, not_blank=True)
    except FileReadError as e:
        raise TLSFileError(f"{source}: {e}") from None


def load(spec: ClientTLS) -> _Loaded:
    """Reads and checks the files: the key matches the certificate, the CA bundle parses.

    The check uses the standard library's TLS (the same OpenSSL checks grpc-core would do, with a
    message that names the flag instead of a failed bind later). Raises TLSFileError.
    """
    cert_src, key_src, ca_src = spec.sources
    paths = [spec.cert_file, spec.key_file] + ([spec.ca_file] if spec.ca_file else [])
    try:
        stamp = stamps(paths, strict=True)
    except OSError as e:
        which = {spec.cert_file: cert_src, spec.key_file: key_src, spec.ca_file: ca_src}.get(e.filename, cert_src)
        raise TLSFileError(f"{which}: cannot read {e.filename!r}: {e.strerror}") from None
    cert = _read(cert_src, spec.cert_file)
    key = _read(key_src, spec.key_file)
    ca = _read(ca_src, spec.ca_file) if spec.ca_file else None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(spec.cert_file, spec.key_file)
    except ssl.SSLError as e:
        if "KEY_VALUES_MISMATCH" in str(e):
            raise TLSFileError(f"{key_src}: the key does not match the certificate of {cert_src}") from None
        raise TLSFileError(f"{cert_src}/{key_src}: not a PEM certificate and its private key ({e.reason})") from None
    except OSError as e:
        raise TLSFileError(f"{cert_src}/{key_src}: cannot load: {e}") from None
    if ca is not None:
        try:
            context.load_verify_locations(cadata=ca.decode("ascii"))
        except (ssl.SSLError, UnicodeDecodeError, ValueError):
            raise TLSFileError(f"{ca_src}: {spec.ca_file!r} holds no PEM certificate") from None
    return _Loaded(cert, key, ca, stamp)


class ServerTLS:
    """grpc server credentials that follow the files (one per client-port server)."""

    def __init__(self, spec: ClientTLS, *, loader: Callable[[ClientTLS], _Loaded] = load) -> None:
        self.spec = spec
        self._loader = loader
        self._current = loader(spec)  # start-up: a bad file stops the program
        self._lock = threading.Lock()
        #: the files in force and the files that last failed to load (not tried or logged again
        #: until they change)
        paths = [spec.cert_file, spec.key_file] + ([spec.ca_file] if spec.ca_file else [])
        self._files = FileWatch(paths, in_force=self._current.stamp)
        #: rotations taken (for tests and logs)
        self.reloads = 0

    def _config(self, loaded: _Loaded) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration([(loaded.key, loaded.cert)], root_certificates=loaded.ca)

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._config(self._current), self.fetch,
            require_client_authentication=self.spec.require_client_certificate,
        )

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by grpc-core before a handshake (on its own thread): a new configuration when
        the files changed and load, else None (keep the current one)."""
        with self._lock:
            stamp = self._files.changed()
            if stamp is None:
                return None  # unchanged, or still the files that failed (tried once, not per handshake)
            try:
                loaded = self._loader(self.spec)
            except (OSError, TLSFileError) as e:
                # mid-rotation (one file swapped, not the other yet) or a broken file: keep serving
                if self._files.failed(stamp):
                    log.warning("client TLS files changed but cannot be used yet (%s); keeping the current ones", e)
                return None
            self._files.took(loaded.stamp)
            if (loaded.cert, loaded.key, loaded.ca) == (self._current.cert, self._current.key, self._current.ca):
                self._current = loaded
                return None
            self._current = loaded
            self.reloads += 1
            log.info("client TLS: certificate files changed; new connections use the new ones")
            return self._config(loaded)


def revocation_list(spec: ClientTLS) -> RevocationList | None:
    """The CRL of ``--client-crl-file``, verified against the client CA (raises CRLError)."""
    if spec.crl_file is None:
        return None
    assert spec.ca_file is not None, "a CRL needs the CA that signs client certificates"
    return RevocationList(spec.crl_file, [spec.ca_file], source=spec.crl_source, ca_source=spec.sources[2])


def common_name(auth_context: dict[str, list[bytes]] | None) -> str | None:
    """The verified client certificate's CN from grpc's auth context, or None."""
    if not auth_context:
        return None
    values = auth_context.get(COMMON_NAME_KEY)
    if not values:
        return None
    pem = auth_context.get(PEM_CERT_KEY)
    last = _last_common_name(pem[0]) if pem else None
    return last if last is not None else values[0].decode("utf-8", "replace")


@functools.lru_cache(maxsize=256)
def _last_common_name(pem: bytes) -> str | None:
    """The subject's last CN, as Go's x509 (etcd's AuthInfoFromTLS) reads it: grpc-core's
    ``x509_common_name`` is the first, so a certificate with several CNs would name another user
    here than in etcd. Cached by the certificate (a connection presents the same one each call)."""
    try:
        names = x509.load_pem_x509_certificate(pem).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    except ValueError:
        return None
    strings = [n.value for n in names if isinstance(n.value, str)]
    return strings[-1] if strings else None
