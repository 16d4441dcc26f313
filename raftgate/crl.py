"""Client certificate revocation (etcd's ``--client-crl-file``) for raftgate's gRPC servers.

etcd reads the CRL at each TLS handshake and closes the connection of a certificate it lists; its
client sees UNAVAILABLE (grpc-go: the connection closed), and etcdctl a deadline exceeded once
its retries run out. gRPC-Python has no CRL hook at the handshake, so :class:`RevocationCheck`, a
server interceptor, checks the verified peer certificate of every call instead: at the start of
every call of every service, on every message a stream receives, and before every message a
stream sends. A listed certificate gets UNAVAILABLE, the code etcd's clients see; a stream opened
before the CRL listed it ends at its next action (a keep-alive, a watch create, an event).

Stricter than etcd, on purpose (a forged CRL is a denial of service; etcd trusts any file):
* each CRL must be signed by a CA of the client CA bundle, and revokes certificates of its own
  issuer (etcd matches a serial of any issuer);
* a file that cannot be used (broken, unsigned, deleted mid-rotation) keeps the last good list,
  logged once per broken state (etcd refuses every client while its file does not parse); at
  start it is an error naming the flag (exit code 2).
As in etcd, nextUpdate is not enforced: an outdated CRL still revokes what it lists.

The file is a PEM file of one or more ``X509 CRL`` blocks (one per CA of the bundle) or one DER
CRL. It is re-read when it or a CA file changes (inode, size, mtime: a mounted Secret's symlink
swap), checked by a ``stat`` per call, so the call after the new file lands is judged by it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
from cryptography import x509
from cryptography.x509.oid import NameOID

from raftgate.bounded_file import FileReadError, read_bounded
from raftgate.file_watch import FileWatch, Stamp, stamps
from raftgate.trust_cache import TrustCache

log = logging.getLogger("raftgate.crl")

#: the refusal's message (the serial follows in parentheses); code: grpc.StatusCode.UNAVAILABLE
REVOKED = "raftgate: client certificate revoked"
#: ``revoked()``'s answer for a presented chain holding a certificate that does not parse here
UNREADABLE = -1
UNREADABLE_MESSAGE = "raftgate: client certificate chain holds a certificate that does not parse"
#: a CRL of a large CA runs to megabytes; this bounds what one file makes the process parse and hold
MAX_CRL_BYTES = 32 * 1024 * 1024
MAX_CA_BYTES = 1024 * 1024
#: verdicts kept per certificate (a connection presents the same one on every call)
CACHE_SIZE = 1024
#: grpc-core's auth-context keys: the verified peer certificate and the chain it presented
PEM_CERT_KEY = "x509_pem_cert"
PEM_CHAIN_KEY = "x509_pem_cert_chain"

_BEGIN, _END = b"-----BEGIN X509 CRL-----", b"-----END X509 CRL-----"


class CRLError(ValueError):
    """A CRL file that cannot be used; the message names the flag."""


@dataclass(frozen=True)
class _Revoked:
    #: issuer -> the serials its CRL lists
    entries: dict[x509.Name, frozenset[int]]
    #: the files' identity when read
    stamp: tuple[Stamp, ...]


def _read(source: str, path: str, limit: int) -> bytes:
    try:
        return read_bounded(path, limit, not_blank=True)
    except FileReadError as e:
        raise CRLError(f"{source}: {e}") from None


def _pem_blocks(data: bytes) -> list[bytes]:
    """The ``X509 CRL`` blocks, in one pass (a lazy regular expression rescans the rest of the file
    for each BEGIN without an END)."""
    blocks, position = [], 0
    while (start := data.find(_BEGIN, position)) >= 0:
        end = data.find(_END, start)
        if end < 0:
            break
        position = end + len(_END)
        blocks.append(data[start:position])
    return blocks


_CERT_BEGIN, _CERT_END = b"-----BEGIN CERTIFICATE-----", b"-----END CERTIFICATE-----"


def _certificate_blocks(data: bytes) -> list[bytes]:
    """The ``CERTIFICATE`` blocks of a PEM chain, in one pass; text that is none (grpc-core
    prints only certificates) is one unreadable block, refused by the caller."""
    blocks, position = [], 0
    while (start := data.find(_CERT_BEGIN, position)) >= 0:
        end = data.find(_CERT_END, start)
        if end < 0:
            return [*blocks, data[start:]]
        position = end + len(_CERT_END)
        blocks.append(data[start:position])
    if not blocks and data.strip():
        return [data]
    return blocks


def parse(source: str, data: bytes) -> list[x509.CertificateRevocationList]:
    """PEM (one or more ``X509 CRL`` blocks) or one DER CRL."""
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            blocks = _pem_blocks(data)
            if not blocks:
                raise CRLError(f"{source}: holds no PEM 'X509 CRL' block")
            return [x509.load_pem_x509_crl(block) for block in blocks]
        return [x509.load_der_x509_crl(data)]
    except ValueError as e:
        if isinstance(e, CRLError):
            raise
        raise CRLError(f"{source}: not a PEM or DER certificate revocation list") from None


def load(crl_path: str, ca_paths: Sequence[str], *, source: str = "--client-crl-file",
         ca_source: str = "--trusted-ca-file") -> _Revoked:
    """Reads the CRL, checks each is signed by a CA of ``ca_paths``; raises CRLError."""
    try:
        stamp = stamps([crl_path, *ca_paths], strict=True)
    except OSError as e:
        which = source if e.filename == crl_path else ca_source
        raise CRLError(f"{which}: cannot read {e.filename!r}: {e.strerror}") from None
    crls = parse(source, _read(source, crl_path, MAX_CRL_BYTES))
    cas: list[x509.Certificate] = []
    for path in ca_paths:
        try:
            cas += x509.load_pem_x509_certificates(_read(ca_source, path, MAX_CA_BYTES))
        except ValueError as e:
            if isinstance(e, CRLError):
                raise CRLError(f"{source} needs the CA that signed it: {e}") from None
            raise CRLError(f"{source} needs the CA that signed it: {ca_source}: {path!r} holds no PEM "
                           "certificate") from None
    entries: dict[x509.Name, set[int]] = {}
    for crl in crls:
        issuer = crl.issuer
        if not any(ca.subject == issuer and _signed(crl, ca) for ca in cas):
            raise CRLError(f"{source}: the CRL of {issuer.rfc4514_string()!r} is not signed by a CA of "
                           f"{ca_source}")
        entries.setdefault(issuer, set()).update(revoked.serial_number for revoked in crl)
    return _Revoked({issuer: frozenset(serials) for issuer, serials in entries.items() if serials}, stamp)


def _signed(crl: x509.CertificateRevocationList, ca: x509.Certificate) -> bool:
    try:
        return crl.is_signature_valid(ca.public_key())  # type: ignore[arg-type]
    except (TypeError, ValueError):  # a key type CRLs cannot be signed with
        return False


class RevocationList:
    """The revoked certificates, following the file; :meth:`revoked` is cheap per call."""

    def __init__(self, crl_path: str, ca_paths: Sequence[str], *, source: str = "--client-crl-file",
                 ca_source: str = "--trusted-ca-file") -> None:
        self.path = crl_path
        self.ca_paths = tuple(ca_paths)
        self.source, self.ca_source = source, ca_source
        self._current = self._load()  # start-up: a bad file stops the program (CRLError)
        #: the files in force and the files that last failed (not read or logged again until they change)
        self._files = FileWatch([self.path, *self.ca_paths], in_force=self._current.stamp)
        #: chain -> (verdict,), under the list it was judged by (raftgate/trust_cache.py: by digest, bounded)
        self._verdicts: TrustCache[tuple[int | None]] = TrustCache(CACHE_SIZE)
        #: new lists taken (for tests and logs)
        self.reloads = 0

    def _load(self) -> _Revoked:
        return load(self.path, self.ca_paths, source=self.source, ca_source=self.ca_source)

    def refresh(self) -> None:
        """Takes the file anew when it (or a CA file) changed and loads; else keeps the current list."""
        stamp = self._files.changed()
        if stamp is None:
            return
        try:
            loaded = self._load()
        except (OSError, CRLError) as e:
            if self._files.failed(stamp):
                log.warning("%s changed but cannot be used (%s); keeping the last good list", self.source, e)
            return
        self._files.took(loaded.stamp)
        changed = loaded.entries != self._current.entries
        self._current = loaded
        if changed:
            self.reloads += 1  # the basis of the cached verdicts: none made under the old list is answered
            log.info("%s: a new list (%d revoked certificates) applies from the next call", self.source,
                     sum(len(serials) for serials in loaded.entries.values()))

    def revoked(self, pems: Sequence[bytes]) -> int | None:
        """The serial of the first certificate of ``pems`` (the peer's, then its chain) the list
        holds, else None."""
        self.refresh()
        if not self._current.entries:
            return None
        # by digest (the cache keeps sha256 only): a client may present a chain of ~100 KB
        chain = b"".join(pems)
        basis = self.reloads
        hit = self._verdicts.get(chain, basis)
        if hit is not None:
            return hit[0]
        verdict = self._judge(pems)
        self._verdicts.put(chain, (verdict,), basis=basis)
        return verdict

    def _judge(self, pems: Sequence[bytes]) -> int | None:
        """Every certificate presented, one PEM block at a time: the client chooses its chain, and
        one certificate this parser refuses (TLS stacks take some DER forbids) must not hide the
        others - a revoked intermediate among them. Such a chain is refused (UNREADABLE), as
        etcd's TLS stack refuses a chain it cannot parse."""
        for pem in pems:
            for block in _certificate_blocks(pem):
                try:
                    cert = x509.load_pem_x509_certificate(block)
                    serial, issuer = cert.serial_number, cert.issuer
                except Exception:  # noqa: BLE001 - ValueError, InvalidVersion, ...: not readable here
                    log.warning("%s: a client presented a certificate that does not parse: its calls are refused",
                                self.source)
                    return UNREADABLE
                if serial in self._current.entries.get(issuer, ()):
                    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
                    log.warning("%s lists the client certificate serial %x (CN %r): its calls are refused",
                                self.source, serial, names[-1].value if names else "")
                    return serial
        return None


def peer_certificates(context: Any) -> tuple[bytes, ...]:
    """The verified peer certificate and the chain it presented (PEM), or () without TLS."""
    try:
        auth = context.auth_context() or {}
    except AttributeError:  # not a gRPC call (the JSON gateway's stand-in context)
        return ()
    return tuple(auth.get(PEM_CERT_KEY) or ()) + tuple(auth.get(PEM_CHAIN_KEY) or ())


class RevocationCheck(grpc.aio.ServerInterceptor):
    """Refuses every call, and ends every stream at its next message, of a certificate the CRL lists."""

    def __init__(self, crl: RevocationList) -> None:
        self.crl = crl
        self._guarded: dict[int, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(self, continuation: Callable[[Any], Any], details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        hit = self._guarded.get(id(handler))
        if hit is not None and hit[0] is handler:
            return hit[1]
        guarded = guard(handler, self.crl)
        if len(self._guarded) >= CACHE_SIZE:  # the servers' handlers are few and live as long; never grow
            self._guarded.clear()
        self._guarded[id(handler)] = (handler, guarded)
        return guarded


async def _refuse(context: Any, serial: int) -> None:
    message = UNREADABLE_MESSAGE if serial == UNREADABLE else f"{REVOKED} (serial {serial:x})"
    await context.abort(grpc.StatusCode.UNAVAILABLE, message)


def guard(handler: grpc.RpcMethodHandler, crl: RevocationList) -> grpc.RpcMethodHandler:
    """``handler`` with each behaviour checking the peer's certificate against ``crl``."""
    options = {"request_deserializer": handler.request_deserializer,
               "response_serializer": handler.response_serializer}
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(_guard_call(handler.unary_unary, crl, False), **options)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(_guard_call(handler.unary_stream, crl, False), **options)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(_guard_call(handler.stream_unary, crl, True), **options)
    return grpc.stream_stream_rpc_method_handler(_guard_call(handler.stream_stream, crl, True), **options)


def _guard_call(behaviour: Callable[..., Any], crl: RevocationList, streaming_in: bool) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(behaviour):
        return _guard_generator(behaviour, crl, streaming_in)

    @functools.wraps(behaviour)
    async def call(request: Any, context: Any) -> Any:
        pems = peer_certificates(context)
        if pems:
            serial = crl.revoked(pems)
            if serial is not None:
                await _refuse(context, serial)
            if streaming_in:
                request = _checked(request, pems, crl, context)
        result = behaviour(request, context)
        return await result if inspect.isawaitable(result) else result

    return call


class _Stop:
    """Set by a received message of a revoked certificate: the serial, and whether the answer loop waits."""

    serial: int | None = None
    waiting = False


async def _checked(requests: AsyncIterator[Any], pems: tuple[bytes, ...], crl: RevocationList,
                   context: Any) -> AsyncIterator[Any]:
    """The client's messages, each let through only while its certificate is not revoked."""
    async for request in requests:
        serial = crl.revoked(pems)
        if serial is not None:
            await _refuse(context, serial)
        yield request


def _guard_generator(behaviour: Callable[..., AsyncIterator[Any]], crl: RevocationList,
                     streaming_in: bool) -> Callable[..., AsyncIterator[Any]]:
    @functools.wraps(behaviour)
    async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
        pems = peer_certificates(context)
        if not pems:
            async for answer in behaviour(request, context):
                yield answer
            return
        serial = crl.revoked(pems)
        if serial is not None:
            await _refuse(context, serial)
        stop = _Stop()
        task = asyncio.current_task()
        if streaming_in:
            # The handler may read the client in a task of its own (Watch) and serve on after the
            # client's side ends: a refused message interrupts the wait for the next answer.
            async def received(messages: AsyncIterator[Any]) -> AsyncIterator[Any]:
                async for message in messages:
                    listed = crl.revoked(pems)
                    if listed is not None:
                        stop.serial = listed
                        if stop.waiting and task is not None and task is not asyncio.current_task():
                            task.cancel()
                        return
                    yield message
            request = received(request)
        answers = behaviour(request, context)
        try:
            while stop.serial is None:
                stop.waiting = True
                try:
                    answer = await answers.__anext__()
                except StopAsyncIteration:
                    break
                finally:
                    stop.waiting = False
                listed = crl.revoked(pems)
                if listed is not None:  # never send a revoked certificate another answer
                    stop.serial = listed
                    break
                yield answer
        except asyncio.CancelledError:
            if stop.serial is None:
                raise
        finally:
            await answers.aclose()
        if stop.serial is not None:
            await _refuse(context, stop.serial)

    return stream
