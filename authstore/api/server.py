"""The store node's internal gRPC service, reached only by authenticated proxies.

Requests arrive as InternalRaftRequest bytes stamped by a proxy. Writes and auth changes go
through the log; reads are answered at a linearizable read point (or from local state when
serializable) after the same validation and authorization the apply stage uses. Responses go
back as raw bytes framed as InternalResponse, so nothing is encoded twice.

The parts it serves over (watch hub, quota, simple tokens, token verifiers, the sidecars' login)
are built by authstore/main.py and passed in. Beside it: the gate every handler runs behind
(interceptors.py), DoStream's answer framing (outbox.py), decoy hashes for unknown users (decoy.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import shutil
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import grpc
import lmdb
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from authstore import metrics
from authstore.api.callers import Classifier, metadata_value
from authstore.api.decoy import DecoyHashes
from authstore.api.interceptors import CALLER, Gate, Refusal, admit, health_without_reading
from authstore.api.login import StoreLogin
from authstore.api.maintenance import STORAGE_VERSION, Maintenance
from authstore.api.outbox import Outbox
from authstore.api.proposer import Proposer
from authstore.api.quota import Quota
from authstore.api.simple_tokens import SimpleTokens, now_ms
from authstore.api.watch.hub import Vouched, WatchHub
from authstore.api.watch.shared import SharedWatches, SubContext
from authstore.etcd_format.export import command as export_command
from authstore.node.driver import RaftNode
from authstore.state.apply import Applier, AuthRevisionMoved, is_read_only_txn
from authstore.state.auth.authorize import kind_of, request_kind
from authstore.state.auth.store import token_digest
from protos import wire
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from protos.internal import INTERNAL_TOKEN_METADATA, MAX_ANSWER_BYTES, STORE_MESSAGE_BYTES
from protos.storepb import store_pb2 as spb
from raftgate import grpc_listen, secret_proof, stages
from raftgate.crl import RevocationCheck, RevocationList
from raftgate.errors import REVISION_MOVED, UNMARSHAL_ERROR_PREFIX, Err, EtcdError
from raftgate.flow_windows import FIXED_RECEIVE_WINDOW
from raftgate.internal_access import (
    CALL_DO,
    CHALLENGE,
    DO,
    OPEN_TO_NONE,
    SNAPSHOT,
    STORE_SERVICE,
    UNAUTHENTICATED,
    Caller,
    stream_call,
)
from raftgate.methods import Route, requests
from raftgate.private_files import PRIVATE_DIR_MODE
from raftgate.stop_signals import STOP_PING_TIMEOUT
from raftgate.token_verifier import TokenVerifier, Verified

log = logging.getLogger("raftgate.store.server")

MAX_MESSAGE = STORE_MESSAGE_BYTES
#: Calls taken from one DoStream and not yet written back (running, or answered and waiting in
#: its outbox), and answer bytes waiting (the outbox's STREAM_BYTES_HELD): beyond either the store
#: reads no more calls from that stream until the caller reads answers (HTTP/2 flow control then
#: holds the sender back), so a caller that never reads - a sidecar's credential is held by whoever
#: reads its namespace's Secrets - cannot make the store buffer answers without end.
STREAM_CALLS_HELD = 1024
SNAPSHOT_CHUNK = 32 << 10
#: client snapshots copying or streaming at once on one node; each is a full copy of the store on
#: the data volume, kept while its client reads, so more wait for a turn instead of filling it
CLIENT_SNAPSHOTS = 1
READ_WORKERS = 4
FIELD_NUMBERS = {f.name: f.number for f in ipb.InternalRaftRequest.DESCRIPTOR.fields}
FIELD_CLASSES = {f.name: type(getattr(ipb.InternalRaftRequest(), f.name))
                 for f in ipb.InternalRaftRequest.DESCRIPTOR.fields if f.message_type is not None}

# Answered from applied state, after authorization: nothing to put into the log (the method table's
# READ route; a Txn without writes and an Alarm GET join them by their body, in _dispatch).
READ_KINDS = requests(routes=(Route.READ,))
#: Each DoStream call method's name in the access table (``stream_call``), by its number.
_STREAM_CALLS = {number: stream_call(name) for name, number in spb.DoCall.Method.items()}


class _Writer:
    """The process writing one client snapshot in etcd's format, which the call's cancellation
    ends (from the event loop, while a worker thread waits for it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._cancelled = False

    def check(self) -> None:
        if self._cancelled:
            raise OSError("the client's snapshot was cancelled")

    def run(self, argv: list[str]) -> tuple[int, bytes]:
        """(exit code, stderr) of the writer; never started once cancelled."""
        with self._lock:
            self.check()
            self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE)
        _, stderr = self._proc.communicate()
        return self._proc.returncode, stderr

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()


async def _uncancellable(work: asyncio.Future[Any]) -> None:
    """Waits for ``work`` to end however often this task is cancelled meanwhile (its outcome is not wanted)."""
    while not work.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({work})
    if not work.cancelled():
        work.exception()  # retrieved: a cancelled call's failure is not an unhandled one


class StoreService:
    """The Store service's handlers over parts built outside it (authstore/main.py builds each
    and passes it in): the watch hub, the quota, simple tokens and the token verifiers. The
    sidecars' login (``StoreLogin``) is built on this service's reads and writes, so it comes
    after, through ``serve_logins``."""

    def __init__(self, applier: Applier, node: RaftNode, maintenance: Maintenance, *, proposer: Proposer,
                 watch_hub: WatchHub, quota: Quota, tokens: SimpleTokens, verifiers: Sequence[TokenVerifier],
                 classifier: Classifier, lockout_attempts: int = 0, lockout_duration_ms: int = 0) -> None:
        """``verifiers``: how the store verifies a sidecar-class caller's token, the first that
        recognizes it decides (raftgate/token_verifier.py). ``lockout_*``: the policy stamped into
        the auth_failures entries this node logs (authstore/state/auth/lockout.py); 0 attempts:
        failures are not recorded. ``proposer``: how requests reach the log (stamped with their ID
        and time)."""
        self.applier = applier
        self.proposer = proposer
        self.lockout_attempts = lockout_attempts if lockout_duration_ms > 0 else 0
        self.lockout_duration_ms = lockout_duration_ms
        self.node = node
        self.maintenance = maintenance
        self.draining = False
        self._decoys = DecoyHashes()
        self.watch_hub = watch_hub
        # Reads run off the event loop (a large Range must not stall every other request); each
        # LMDB read transaction lives and dies in the worker thread that opened it.
        self._reads = ThreadPoolExecutor(max_workers=READ_WORKERS, thread_name_prefix="read")
        self.quota = quota
        self._client_snapshots = asyncio.Semaphore(CLIENT_SNAPSHOTS)
        metrics.AUTH_LOCKED_NAMES.set_function(self._locked_names)
        self.tokens = tokens
        self.classifier = classifier
        self.verifiers = list(verifiers)
        #: sidecars' Authenticate calls (DoStream's AUTHENTICATE), once ``serve_logins`` hands it over
        self.login: StoreLogin | None = None

    def serve_logins(self, login: StoreLogin) -> None:
        """Sidecars' logins are answered by ``login``, built on this service's ``credentials``,
        ``commit_authenticate``, ``may_login`` and ``record_failure``."""
        self.login = login

    @property
    def env(self) -> lmdb.Environment:
        """The applier's environment, which a snapshot from the leader replaces."""
        return self.applier.env

    # ---- Do ----
    async def do(self, data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        caller = CALLER.get()
        try:
            token = _token_metadata(context) if caller is Caller.SIDECAR else None
            return await self.answer(data, caller=caller, method=DO, token=token)
        except Refusal as exc:
            await context.abort(exc.code, exc.message)

    async def do_stream(self, batches: AsyncIterator[bytes],
                        context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """Store.DoStream: every call runs as its own task, as a Do call would, and the answers
        that are ready when the stream can write travel as one batch (``Outbox``)."""
        # Opening the stream at once tells the proxy that whatever fails from now on may have been
        # taken, and whatever failed before was not.
        await context.send_initial_metadata(())
        ready = Outbox()
        wake = asyncio.Event()
        room = asyncio.Event()
        running: set[asyncio.Task[None]] = set()
        reading = True

        def finished(task: asyncio.Task[None]) -> None:
            running.discard(task)
            room.set()

        caller = CALLER.get()
        sidecar = caller is Caller.SIDECAR
        peer = _peer_host(context.peer())

        async def login(request: bytes) -> bytes:
            if self.login is None:
                raise Refusal(grpc.StatusCode.UNIMPLEMENTED, "raftgate: this store takes no logins")
            return await self.login.authenticate(request, peer)

        methods: dict[int, Callable[[bytes], Awaitable[bytes]]] = {
            spb.DoCall.CREDENTIALS: self.credentials, spb.DoCall.RESOLVE_TOKEN: self.resolve_token,
            spb.DoCall.AUTHENTICATE: login}

        async def one(call_id: int, call: spb.DoCall) -> None:
            method = call.method
            who: list[str] = []  # the user a sidecar's token was verified as (answer fills it)
            try:
                if method != spb.DoCall.DO and method not in methods:
                    raise Refusal(grpc.StatusCode.UNIMPLEMENTED, f"raftgate: no stream method {method}")
                admit(_STREAM_CALLS[method], caller)
                if method == spb.DoCall.DO:
                    token = call.token if sidecar and call.HasField("token") else None
                    trace = stages.store_trace() if stages.ON and call.trace else None
                    answer = await self.answer(call.request, caller=caller, method=CALL_DO, token=token,
                                               verified=who, trace=trace)
                    ready.answer(call_id, answer, user=who[0] if who else "", trace=trace)
                else:
                    ready.answer(call_id, await methods[method](call.request))
            except (Refusal, EtcdError) as exc:
                ready.refuse(spb.DoResult(id=call_id, code=exc.code.value[0], message=exc.message,
                                          user=who[0] if who else ""))
            except Exception:
                log.exception("a streamed request failed")
                ready.refuse(spb.DoResult(id=call_id, code=grpc.StatusCode.UNKNOWN.value[0],
                                          message="raftgate: internal error in the store"))
            wake.set()

        async def read() -> None:
            nonlocal reading
            loop = asyncio.get_running_loop()
            try:
                async for raw in batches:
                    calls = spb.DoBatch.FromString(raw).calls
                    metrics.LINK_CALLS_PER_MESSAGE.observe(len(calls))
                    for call in calls:
                        while True:
                            if not ready.room.is_set():  # STREAM_BYTES_HELD of answers untaken
                                await ready.room.wait()
                            elif len(running) + ready.count >= STREAM_CALLS_HELD:
                                room.clear()
                                await room.wait()
                            else:
                                break
                        task = loop.create_task(one(call.id, call))
                        running.add(task)
                        task.add_done_callback(finished)
            finally:
                reading = False
                wake.set()

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while reading or running or ready:
                await wake.wait()
                await asyncio.sleep(0)  # calls finishing in this turn of the loop join the batch
                wake.clear()
                while ready:
                    yield ready.take()
                    room.set()
            await reader  # raises what ended the reader (a malformed batch, a broken stream)
        finally:
            reader.cancel()
            for task in running:
                task.cancel()

    def drain(self) -> None:
        """The node is stopping: calls still arriving on open streams are answered `server
        stopped` (never taken, so the proxy sends them to another node); calls under way finish."""
        self.draining = True

    async def answer(self, data: bytes, *, caller: Caller | None = None, method: str = DO, token: str | None = None,
                     verified: list[str] | None = None, trace: list[int] | None = None) -> bytes:
        """InternalRaftRequest bytes -> InternalResponse bytes; a refusal raises ``Refusal``.

        ``caller``: the class of the caller whose ``method`` (Do, or DoStream's DO call) carries
        the request: its kind must be one the table lets that class send (None: an entry of the
        store's own making). A sidecar's header is replaced by the identity of ``token`` (the
        client's, verified here; None: anonymous), whose user name is appended to ``verified``
        (for the sidecar's audit log). ``trace``: a sampled call's stage trace (raftgate/stages.py)."""
        if self.draining:
            raise Refusal(Err.STOPPED.code, Err.STOPPED.message)
        try:
            req = ipb.InternalRaftRequest.FromString(data)
            kind = kind_of(data, req)
        except DecodeError as exc:
            raise Refusal(grpc.StatusCode.INTERNAL, unmarshal_error(data, exc)) from None
        except EtcdError:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "raftgate: malformed internal request") from None
        if caller is not None:
            admit(method, caller, kind)
        if caller is Caller.SIDECAR:
            req.header.CopyFrom(await self.verified_header(token))
            if verified is not None:
                verified.append(req.header.username)
            data = req.SerializeToString()
        try:
            if req.header.invalid_token:
                # Refused before the log, as etcd refuses before Raft - but after validation.
                await self.node.settled()
                with self.env.begin() as txn:
                    self.applier.check(txn, req, read=True)
            resp = await self._dispatch(req, kind, data, trace)
            if kind.startswith("member_"):
                resp.header.revision = 0  # etcd's Cluster service header has no KV revision
        except EtcdError as exc:
            raise Refusal(exc.code, exc.message) from None
        except AuthRevisionMoved:
            raise Refusal(grpc.StatusCode.ABORTED, REVISION_MOVED) from None
        return wire.length_delimited(FIELD_NUMBERS[kind], check_answer_size(resp.SerializeToString()))

    async def _dispatch(self, req: ipb.InternalRaftRequest, kind: str, data: bytes,
                        trace: list[int] | None = None) -> Any:
        if kind in READ_KINDS or (kind == "txn" and is_read_only_txn(req.txn)) or (
                kind == "alarm" and req.alarm.action == pb.AlarmRequest.GET):
            if not _serializable(req, kind) or self._behind_auth(req.header):
                await self.node.wait_applied(await self.node.read_index())
            else:
                await self.node.settled()  # every write answered so far is visible
            if kind == "range" and not req.range.range_end:
                resp = self._read(req, kind)  # one key: microseconds, cheaper than a thread hop
            else:
                resp = await asyncio.get_running_loop().run_in_executor(self._reads, self._read, req, kind)
            if trace is not None:
                trace[stages.APPLIED] = stages.now()  # a read: executed against the applied state
            return resp
        if self.maintenance.handles(kind):
            await self.node.settled()
            return await self.maintenance.answer(req, kind, now_ms())
        if kind == "auth_failures":
            if not self.lockout_attempts:
                return pb.AuthStatusResponse()  # lockout is off here: nothing to count
            # this node's policy, whatever the proxy put there; the time is stamped by the proposer
            req.auth_failures.attempts = self.lockout_attempts
            req.auth_failures.duration_ms = self.lockout_duration_ms
            data = req.SerializeToString()
        elif kind == "authenticate":
            data = self._stamp_lockout(req)
        await self.node.must_lead()
        await self.quota.check(req, len(data))
        # ``data`` parses to ``req`` (re-encoded above wherever ``req`` was changed): apply on
        # this node takes ``req`` for the logged entry instead of parsing it again.
        handed: list[bytes] = []

        def prepared(payload: bytes, request_id: int, time_ms: int) -> None:
            req.ID = request_id  # the fields the node appended; the last occurrence wins
            req.time_unix_ms = time_ms
            self.applier.remember(payload, req, kind)
            handed.append(payload)

        try:
            return await self.proposer.propose(data, trace, prepared=prepared)
        finally:
            if handed:
                self.applier.forget(handed[0])

    def _behind_auth(self, header: ipb.RequestHeader) -> bool:
        """A serializable read stamped with an auth revision this node has not applied yet (a
        follower behind the node that resolved the caller's token): it first catches up to a read
        point (which holds that revision), so it never answers with older permissions than the
        proxy saw. A linearizable read is past such a point anyway."""
        if not header.auth_revision:
            return False
        with self.env.begin() as txn:
            return header.auth_revision > self.applier.auth.revision(txn)

    def _read(self, req: ipb.InternalRaftRequest, kind: str) -> Any:
        with self.env.begin() as txn:
            if kind == "alarm":
                self.applier.check(txn, req, read=True)
                resp = self.applier.alarms(txn)
                self.applier.stamp(txn, resp)
                return resp
            return self.applier.execute(txn, req, index=0, read=True, kind=kind)

    # ---- Snapshot ----
    async def snapshot(self, data: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """Store.Snapshot: the whole store, to a caller whose request is a snapshot request (the
        table lets it carry no other) that passes etcd's root-only check: a central proxy's
        stamped user, or the user the store finds in a sidecar's token."""
        caller = CALLER.get()
        try:
            try:
                req = ipb.InternalRaftRequest.FromString(data)
                kind = request_kind(req)
            except EtcdError:
                raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "raftgate: malformed internal request") from None
            admit(SNAPSHOT, caller, kind)
            await self.node.settled()
            if caller is Caller.SIDECAR:
                req.header.CopyFrom(await self.verified_header(_token_metadata(context)))
            with self.env.begin() as txn:
                self.applier.check(txn, req, read=True)
        except (Refusal, EtcdError) as exc:
            await context.abort(exc.code, exc.message)
        except DecodeError as exc:
            await context.abort(grpc.StatusCode.INTERNAL, unmarshal_error(data, exc))
        if self._client_snapshots.locked():
            log.info("a client's snapshot waits for the %d in progress", CLIENT_SNAPSHOTS)
        await self._client_snapshots.acquire()
        tmp: Path | None = None
        try:
            # Checked again once the turn comes, which may be hours later (a slow reader holds it):
            # a user who lost the root role meanwhile gets no copy of what the store holds now.
            try:
                with self.env.begin() as txn:
                    self.applier.check(txn, req, read=True)
            except (Refusal, EtcdError) as exc:
                await context.abort(exc.code, exc.message)
            try:
                # On the data volume, beside the copies sent to followers (never /tmp: on Kubernetes
                # a small memory-backed volume); what a crash leaves there goes when the node starts.
                self.node.snapshot_dir.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
                tmp = Path(tempfile.mkdtemp(prefix="client-out-", dir=self.node.snapshot_dir))
                writer = _Writer()
                work = asyncio.get_running_loop().run_in_executor(None, self._etcd_snapshot, tmp, writer)
                try:
                    path = await asyncio.shield(work)
                except asyncio.CancelledError:
                    # The client went away: its writer is ended, and the copy (LMDB's, which cannot
                    # be interrupted) finishes, before the turn passes on and the directory goes; a
                    # client that cancels and retries would otherwise run copies side by side.
                    writer.cancel()
                    await _uncancellable(work)
                    raise
            except (OSError, lmdb.Error, ValueError) as exc:
                # that call's failure (e.g. a full disk), never the node's
                log.warning("a client's snapshot failed: %s", exc.__class__.__name__)
                await context.abort(*Err.SNAPSHOT_FAILED.value)
            # As etcd does, the stream ends with the sha256 of everything before it, which
            # etcdctl checks before it keeps the file.
            total = path.stat().st_size + hashlib.sha256().digest_size
            first = pb.SnapshotResponse(version=STORAGE_VERSION)
            with self.env.begin() as txn:
                self.applier.stamp(txn, first)
            digest = hashlib.sha256()
            sent = 0
            with open(path, "rb") as f:
                while chunk := f.read(SNAPSHOT_CHUNK):
                    digest.update(chunk)
                    msg = first if sent == 0 else pb.SnapshotResponse()
                    sent += len(chunk)
                    msg.remaining_bytes = total - sent
                    msg.blob = chunk
                    yield msg.SerializeToString()
            yield pb.SnapshotResponse(remaining_bytes=0, blob=digest.digest()).SerializeToString()
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            self._client_snapshots.release()

    def _etcd_snapshot(self, tmp: Path, writer: _Writer) -> Path:
        """A client's snapshot in etcd's own format (a bbolt file), so etcd's tools read and
        restore it: a consistent copy of the store first (the point in time, taken quickly),
        then etcd's file written from the copy by a process of its own (Python work over every
        revision, which here would hold the GIL the event loop needs), then the copy goes."""
        writer.check()
        copy = self.applier.snapshot(tmp / "store")
        out = tmp / "etcd.db"
        try:
            returncode, stderr = writer.run(export_command(copy.parent, out))
        finally:
            shutil.rmtree(copy.parent, ignore_errors=True)
        if returncode != 0:
            # its message may name a key or a user: only the kind of error is logged
            kind = stderr.decode(errors="replace").strip().rsplit("\n", 1)[-1].split(":", 1)[0][:80]
            log.warning("writing a client's snapshot in etcd's format failed (exit %d, %s)", returncode, kind)
            raise OSError(f"writing etcd's snapshot format failed (exit {returncode})")
        return out

    # ---- Credentials and tokens ----
    async def verified_header(self, token: str | None) -> ipb.RequestHeader:
        """The header a sidecar-class caller's request runs with: the identity the store itself
        finds in the client's token (the caller's stamp is ignored). No token: anonymous; a token
        no verifier accepts: marked invalid (refused as `invalid auth token` when auth is on)."""
        return (await self._verified(token))[0]

    async def _verified(self, token: str | None) -> tuple[ipb.RequestHeader, Verified | None]:
        """``verified_header``'s header, and what the verifier found when the token is valid."""
        if token is None:
            return ipb.RequestHeader(), None
        verifier = next((v for v in self.verifiers if v.recognizes(token)), None)
        found: Verified | None = await verifier.verify(token) if verifier is not None else None
        if found is None:
            return ipb.RequestHeader(invalid_token=True), None
        revision = found.revision
        if revision is None:
            # judged now: the user the token maps to must exist (as the proxy's workload check)
            with self.env.begin() as txn:
                if self.applier.auth.get_user(txn, found.username) is None:
                    return ipb.RequestHeader(invalid_token=True), None
                revision = self.applier.auth.revision(txn)
        return ipb.RequestHeader(username=found.username, auth_revision=revision,
                                 simple_token=found.revocable), found

    async def may_login(self) -> None:
        """A login (StoreLogin) is taken only by a node that can log its failure: the leader, not
        stopping. Elsewhere the store's `not leader` / `no leader` / `server stopped`, answered
        before the password is read or checked; none was taken, so the sidecar sends it to the
        leader."""
        if self.draining:
            raise EtcdError(Err.STOPPED)
        await self.node.must_lead()

    async def record_failure(self, name: str) -> None:
        """A sidecar's failed Authenticate, logged as the central proxy logs its own (one
        ``auth_failures`` entry, this node's policy stamped by ``_dispatch``). Not recorded (this
        node no longer leads, the proposal timed out, ...): the store's error is raised and is the
        caller's answer - a failure the lockout did not count is never answered as a wrong
        password (the right password meets the same error), as proxy/lockout.py does."""
        entry = ipb.InternalRaftRequest(auth_failures=ipb.AuthFailuresEntry(names=[name]))
        try:
            await self.answer(entry.SerializeToString())
        except Exception as exc:
            log.warning("could not record a failed Authenticate: %s", getattr(exc, "message", type(exc).__name__))
            raise

    async def commit_authenticate(self, data: bytes) -> Any:
        """Proposes the `authenticate` entry of a password the store checked (StoreLogin)."""
        req = ipb.InternalRaftRequest.FromString(data)
        data = self._stamp_lockout(req)
        await self.node.must_lead()
        await self.quota.check(req, len(data))
        return await self.proposer.propose(data)

    def _stamp_lockout(self, req: ipb.InternalRaftRequest) -> bytes:
        """An authenticate entry carries this node's lockout switch, whatever the proxy put there:
        with lockout off (0 attempts) a lock taken while it was on no longer refuses the login."""
        req.authenticate.lockout_off = not self.lockout_attempts
        return req.SerializeToString()

    async def credentials(self, data: bytes, context: grpc.aio.ServicerContext | None = None) -> bytes:
        req = spb.CredentialsRequest.FromString(data)
        await self.node.wait_applied(await self.node.read_index())
        with self.env.begin() as txn:
            auth = self.applier.auth
            resp = spb.CredentialsResponse(auth_enabled=auth.is_enabled(txn), auth_revision=auth.revision(txn),
                                           lockout=self.lockout_attempts > 0)
            if resp.lockout:
                resp.locked = auth.lockout.is_locked(txn, req.name, now_ms())
            user = auth.get_user(txn, req.name)
            if user is not None:
                resp.found = True
                resp.no_password = user.options.no_password
                resp.password_hash = user.password
            else:
                resp.password_hash = self._decoys.hash(auth, txn, resp.auth_revision)
        return resp.SerializeToString()

    def _locked_names(self) -> int:
        """The gauge, read at scrape time from applied state at this node's clock."""
        try:
            with self.env.begin() as txn:
                return self.applier.auth.lockout.locked_names(txn, now_ms())
        except lmdb.Error:
            return 0

    async def resolve_token(self, data: bytes, context: grpc.aio.ServicerContext | None = None) -> bytes:
        token = spb.ResolveTokenRequest.FromString(data).token
        return (await self.tokens.resolve(token)).SerializeToString()

    async def watch(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        async for response in self._watch_serving(requests, context, CALLER.get()):
            yield response

    async def watch_shared(self, requests: AsyncIterator[bytes],
                           context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """Store.WatchShared: each sub-stream served exactly as ``watch`` serves a stream."""
        await context.send_initial_metadata(())  # opened: the proxy writes once it has the headers
        caller = CALLER.get()

        def serve(feed: AsyncIterator[bytes], sub: SubContext) -> AsyncIterator[bytes]:
            return self._watch_serving(feed, cast(grpc.aio.ServicerContext, sub), caller)

        async for message in SharedWatches(serve).serve(requests, context):
            yield message

    def _watch_serving(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext,
                       caller: Caller | None) -> AsyncIterator[bytes]:
        """One watch stream's WatchBatch messages, as the caller's class is served: a sidecar's
        tokens verified by the store, a central proxy's stamped header believed."""
        if caller is Caller.SIDECAR:
            return self.watch_hub.serve(self._verified_watch(requests), context, judge=self._judge_token)
        return self.watch_hub.serve(requests, context)

    async def _verified_watch(self, requests: AsyncIterator[bytes]) -> AsyncIterator[bytes | Vouched]:
        """A sidecar's watch requests, each with the identity the store finds in its token. A
        valid token the store cannot revoke by itself (a JWT, a workload token) comes ``Vouched``:
        the hub judges it again while the watches it created are open (``_judge_token``). A simple
        token travels as its digest, which every auth change re-checks."""
        async for raw in requests:
            try:
                msg = spb.WatchStreamRequest.FromString(raw)
            except DecodeError:  # the caller's bad input, not the store's failure: no traceback
                raise EtcdError(Err.NOT_CAPABLE) from None
            token = msg.token if msg.HasField("token") else None
            header, found = await self._verified(token)
            msg.header.CopyFrom(header)
            msg.current_revision = header.simple_token
            msg.token_digest = token_digest(token) if header.simple_token and token is not None else b""
            msg.ClearField("token")
            data = msg.SerializeToString()
            if token is not None and found is not None and not found.revocable and msg.request.HasField(
                    "create_request"):
                yield Vouched(data, token, header.username, found.expires_at)
            else:
                yield data

    async def _judge_token(self, token: str) -> tuple[str, float | None] | None:
        """A vouched token judged again (the hub's ``TokenJudge``): its user and ``exp`` while it
        verifies, None once it does not (its key rotated out, its map rule or its user gone, expired)."""
        header, found = await self._verified(token)
        if found is None or header.invalid_token:
            return None
        return header.username, found.expires_at

    async def leader(self, data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        answer = spb.LeaderResponse(member_id=self.node.id, leader_id=self.node.leader_id, raft_term=self.node.term,
                                    members=self.maintenance.store_members())
        if spb.LeaderRequest.FromString(data).alarms:
            await self.node.settled()  # an alarm whose ACTIVATE was answered is listed
            answer.alarms.extend(self.maintenance.alarms())
        return answer.SerializeToString()


def check_answer_size(body: bytes) -> bytes:
    """etcd's server refuses to send an answer over its gRPC limit (math.MaxInt32), with grpc-go's
    words; here the store refuses it, before it reaches the stream."""
    if len(body) > MAX_ANSWER_BYTES:
        raise Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED,
                      f"grpc: trying to send message larger than max ({len(body)} vs. {MAX_ANSWER_BYTES})")
    return body


def unmarshal_error(data: bytes, exc: DecodeError) -> str:
    """grpc-go's answer to a request that does not decode, with protobuf's reason.

    The proxy forwards the client's bytes unparsed (e.g. a string field with invalid UTF-8), so
    the store is where they fail. The client's own message is parsed again to get the reason, so
    it names the client's type (etcdserverpb.AuthUserGetRequest), not the internal envelope.
    """
    reason = str(exc)
    try:
        pos = 0
        while pos < len(data):
            key, pos = wire.decode_varint(data, pos)
            if key & 7 != 2:
                break
            length, pos = wire.decode_varint(data, pos)
            field = ipb.InternalRaftRequest.DESCRIPTOR.fields_by_number.get(key >> 3)
            if field is not None and field.name != "header" and field.message_type is not None:
                FIELD_CLASSES[field.name].FromString(data[pos : pos + length])
            pos += length
    except DecodeError as inner:
        reason = str(inner)
    except Exception:  # noqa: BLE001 - best effort; the envelope's reason stands
        pass
    return UNMARSHAL_ERROR_PREFIX + reason


def _serializable(req: ipb.InternalRaftRequest, kind: str) -> bool:
    if kind == "range":
        return req.range.serializable
    if kind == "txn":
        ranges = _txn_ranges(req.txn)
        return bool(ranges) and all(r.serializable for r in ranges)
    return False


def _txn_ranges(txn: pb.TxnRequest) -> list[pb.RangeRequest]:
    out: list[pb.RangeRequest] = []
    for op in (*txn.success, *txn.failure):
        which = op.WhichOneof("request")
        if which == "request_range":
            out.append(op.request_range)
        elif which == "request_txn":
            out.extend(_txn_ranges(op.request_txn))
    return out


def _token_metadata(context: grpc.aio.ServicerContext) -> str | None:
    value = metadata_value(context, INTERNAL_TOKEN_METADATA)
    return None if value is None else value.decode("utf-8", "replace")


def _peer_host(peer: str) -> str:
    host, sep, port = (peer or "").rpartition(":")
    return host if sep and port.isdigit() else peer


def store_handlers(service: StoreService) -> dict[str, grpc.RpcMethodHandler]:
    """The Store service's handlers, by method name (each has its row in the access table)."""
    return {
        "Do": grpc.unary_unary_rpc_method_handler(service.do),
        "DoStream": grpc.stream_stream_rpc_method_handler(service.do_stream),
        "Snapshot": grpc.unary_stream_rpc_method_handler(service.snapshot),
        "Credentials": grpc.unary_unary_rpc_method_handler(service.credentials),
        "ResolveToken": grpc.unary_unary_rpc_method_handler(service.resolve_token),
        "Leader": grpc.unary_unary_rpc_method_handler(service.leader),
        "WatchBatches": grpc.stream_stream_rpc_method_handler(service.watch),
        "WatchShared": grpc.stream_stream_rpc_method_handler(service.watch_shared),
        # with development secrets secret_proof.ProofCheck answers it before any handler
        "Challenge": grpc.unary_unary_rpc_method_handler(_no_challenge),
    }


async def _no_challenge(_request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, "raftgate: this port proves no secret (mTLS)")
    return b""


def build_server(service: StoreService, *, secret: bytes | None, credentials: grpc.ServerCredentials | None,
                 address: str, revocations: RevocationList | None = None,
                 ) -> tuple[grpc.aio.Server, health.aio.HealthServicer | None]:
    """``revocations``: --client-crl-file, every call of a listed client certificate refused (health too)."""
    # Development secrets: every call proves one before any message is read; what stays open to a
    # caller without one (health for probes, Challenge) is the table's NONE column.
    proofs = service.classifier.proofs
    if proofs is None and secret:
        proofs = secret_proof.Challenges(secret_proof.INTERNAL, (secret,))
    health_servicer = health.aio.HealthServicer()
    interceptors: list[grpc.aio.ServerInterceptor] = [RevocationCheck(revocations)] if revocations else []
    if proofs is not None:
        proofs.member_id = service.node.id
        interceptors.append(secret_proof.ProofCheck(proofs, UNAUTHENTICATED[1],
                                                    open_prefixes=tuple(m for m in OPEN_TO_NONE if m != CHALLENGE),
                                                    open_handler=health_without_reading(health_servicer)))
    interceptors.append(Gate(service.classifier))
    server = grpc.aio.server(interceptors=interceptors, options=[
        ("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.max_send_message_length", MAX_MESSAGE),
        *FIXED_RECEIVE_WINDOW,  # what a caller makes the store hold before its credentials are checked
        STOP_PING_TIMEOUT,  # a caller that stopped reading cannot hold a graceful stop
        ("grpc.so_reuseport", 0)])  # a port in use must fail, never be shared with another server
    handlers = store_handlers(service)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(STORE_SERVICE, handlers),))
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (STORE_SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server)
    if not grpc_listen.bind(server, address, credentials):
        raise OSError(f"--listen-internal-urls: cannot listen on {address}: the port is in use or the address is "
                      "not available here")
    return server, health_servicer
