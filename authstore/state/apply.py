"""The apply stage: the one place where a logged request is authorized and executed.

Each entry is applied in a nested LMDB transaction inside the batch's transaction, so an entry
refused with an etcd error leaves nothing behind, while the applied index is recorded in the same
transaction as the entries it covers. Order per entry: etcd's request validation, then the one
authorization function, then the state change. Apply reads no clock: time comes from the entry.

Apply is deterministic: it decides from the log and the replicated state alone, never from this
node's clock or page count (a node restored from a compacted snapshot holds the same data in
fewer pages). The NOSPACE quota is an alarm the leader puts into the log (authstore/api/quota.py);
apply only reads it. An entry that fails for any other reason than an etcd refusal - a bug, a
full LMDB map - fails its whole batch: nothing of it is committed and the node stops
(:class:`ApplyFailed`, fail-stop in the driver) rather than answer and skip an entry the other
nodes apply.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lmdb
from google.protobuf.message import DecodeError, Message

from authstore import failpoints, metrics
from authstore.raft.codec import decode_conf_change
from authstore.raft.types import Entry, EntryType
from authstore.state.auth.authorize import authorize, request_kind
from authstore.state.auth.store import AuthStore, RevisionMoved
from authstore.state.backend import Backend
from authstore.state.lease.lessor import DEFAULT_MIN_TTL, Lessor
from authstore.state.membership import Membership
from authstore.state.mvcc import validate
from authstore.state.mvcc.kvstore import KVStore
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from raftgate.errors import Err, EtcdError
from raftgate.methods import Route, checked, requests

log = logging.getLogger("raftgate.store.apply")

#: Requests the leader parsed and handed to apply, not yet applied (``Applier.remember``); past
#: this many (proposals that never reach the log are forgotten by their callers) all are dropped.
PREPARED_MAX = 4096

#: Requests whose apply changes the membership (a conf change entry does too): the node re-reads it.
MEMBERSHIP_KINDS = frozenset({"member_update", "member_attr_set"})

#: What the apply stage executes: the method table's LOG and READ routes.
APPLIED_KINDS = requests(routes=(Route.LOG, Route.READ))


class AuthRevisionMoved(Exception):
    """Authenticate was refused because the auth revision moved after the password check."""


class ApplyFailed(Exception):
    """An entry failed for a reason local to this node; its batch is not committed, the node stops."""


def validate_request(kind: str, body: Message, max_txn_ops: int) -> None:
    """etcd checks request shape before identity: an empty key fails the same for everybody."""
    if kind == "range":
        validate.check_range(body)
    elif kind == "put":
        validate.check_put(body)
    elif kind == "delete_range":
        validate.check_delete_range(body)
    elif kind == "txn":
        validate.check_txn(body, max_txn_ops)


def adds_data(req: ipb.InternalRaftRequest) -> bool:
    """What etcd's quota weighs (its Cost above 0): Put, Txn with a Put, LeaseGrant."""
    return req.HasField("put") or req.HasField("lease_grant") or (req.HasField("txn") and _txn_puts(req.txn))


def _txn_puts(txn: pb.TxnRequest) -> bool:
    for op in (*txn.success, *txn.failure):
        which = op.WhichOneof("request")
        if which == "request_put" or (which == "request_txn" and _txn_puts(op.request_txn)):
            return True
    return False


def is_read_only_txn(txn: pb.TxnRequest) -> bool:
    for op in (*txn.success, *txn.failure):
        which = op.WhichOneof("request")
        if which in ("request_put", "request_delete_range"):
            return False
        if which == "request_txn" and not is_read_only_txn(op.request_txn):
            return False
    return True


class Applier:
    def __init__(self, backend: Backend, member_id: int, max_txn_ops: int = 128,
                 min_lease_ttl: int = DEFAULT_MIN_TTL) -> None:
        self.backend = backend
        self.min_lease_ttl = min_lease_ttl
        self.member_id = member_id
        self.max_txn_ops = max_txn_ops
        self.term = 1
        self._entry_subscribers: list[Callable[[lmdb.Transaction], None]] = []
        #: entry bytes -> (the request they parse to, its kind): the leader's own parse (remember)
        self._prepared: dict[bytes, tuple[ipb.InternalRaftRequest, str]] = {}
        self._decided_hooks: list[Callable[[int, list[tuple[int, Any]], bool], None]] = []
        #: whether the batch being applied (or the last one) changed the membership
        self._membership_changed = False
        #: whether a NOSPACE alarm is set, read once per batch (None: not read since the batch
        #: began or since an entry changed the alarms)
        self._nospace: bool | None = None
        self._open()
        # One per request the method table routes to the log or to the read path; Authenticate is
        # answered by execute() itself (it needs the entry's index).
        self._handlers: dict[str, Callable[[lmdb.Transaction, Message, ipb.InternalRaftRequest], Message]] = checked({
            "put": lambda t, b, r: self.kv.put(t, b),
            "delete_range": lambda t, b, r: self.kv.delete_range(t, b),
            "txn": lambda t, b, r: self.kv.txn(t, b),
            "range": lambda t, b, r: self.kv.range(t, b),
            "compaction": lambda t, b, r: self.kv.compact(t, b),
            "lease_grant": lambda t, b, r: self.lessor.grant(t, b, r.time_unix_ms),
            "lease_revoke": self._lease_revoke,
            "lease_renew": self._lease_renew,
            "lease_expire": self._lease_expire,
            "alarm": self._alarm,
            "store_alarm": self._store_alarm,
            "auth_enable": lambda t, b, r: self.auth.enable(t, b),
            "auth_disable": lambda t, b, r: self.auth.disable(t, b),
            "auth_status": lambda t, b, r: self.auth.status(t, b),
            "auth_user_add": lambda t, b, r: self.auth.user_add(t, b),
            "auth_user_delete": lambda t, b, r: self.auth.user_delete(t, b),
            "auth_user_get": lambda t, b, r: self.auth.user_get(t, b),
            "auth_user_list": lambda t, b, r: self.auth.user_list(t, b),
            "auth_user_change_password": lambda t, b, r: self.auth.user_change_password(t, b),
            "auth_user_grant_role": lambda t, b, r: self.auth.user_grant_role(t, b),
            "auth_user_revoke_role": lambda t, b, r: self.auth.user_revoke_role(t, b),
            "auth_role_add": lambda t, b, r: self.auth.role_add(t, b),
            "auth_role_delete": lambda t, b, r: self.auth.role_delete(t, b),
            "auth_role_get": lambda t, b, r: self.auth.role_get(t, b),
            "auth_role_list": lambda t, b, r: self.auth.role_list(t, b),
            "auth_role_grant_permission": lambda t, b, r: self.auth.role_grant_permission(t, b),
            "auth_role_revoke_permission": lambda t, b, r: self.auth.role_revoke_permission(t, b),
            "expire_tokens": self._expire_tokens,
            "auth_failures": self._auth_failures,
            "member_update": self._member_update,
            "member_attr_set": self._member_attr_set,
        }, APPLIED_KINDS - {"authenticate"}, "Applier")

    def _open(self) -> None:
        """Opens every component on the backend's environment (again, after a snapshot restore)."""
        self.env: lmdb.Environment = self.backend.env
        self.kv = KVStore(self.env)
        self.lessor = Lessor(self.env, self.kv, min_ttl=self.min_lease_ttl)
        self.auth = AuthStore(self.env)
        self.membership = Membership(self.env)
        with self.env.begin() as txn:
            self.cluster_id = self.membership.cluster_id(txn)
            metrics.AUTH_REVISION.set(self.auth.revision(txn))
            metrics.observe_alarms(self._alarm_names(txn))

    def subscribe_entries(self, fn: Callable[[lmdb.Transaction], None]) -> None:
        """``fn`` is called on the apply thread after each applied request entry, inside the
        batch's transaction (authstore/api/watch/hub.py); it must only read and never wait."""
        self._entry_subscribers.append(fn)

    def on_decided(self, fn: Callable[[int, list[tuple[int, Any]], bool], None]) -> None:
        """``fn(last index, results, membership changed)`` is called on the apply thread once a batch is fully
        executed, just before its transaction commits (and syncs). The entries are durable in
        the log and apply is deterministic, so the results are final: a crash before the commit
        replays the batch to the same results. The node answers its callers from here, so a
        client does not wait for the store's own fsync (only for the log's, as with etcd)."""
        self._decided_hooks.append(fn)

    # ---- the node's contract (authstore/node/fsm.py: StateMachine) ----
    def apply(self, entries: Sequence[Entry], term: int) -> tuple[list[tuple[int, Any]], bool]:
        """Applies a committed batch; ``term`` is the node's Raft term, stamped into headers.
        Returns the results and whether the batch changed the membership."""
        self.term = term
        results = self.apply_batch(entries)
        return results, self._membership_changed

    def snapshot(self, directory: Path) -> Path:
        """A consistent copy of the whole store in ``directory`` (a client's Snapshot, a follower's catch-up)."""
        return self.backend.copy_to(directory)

    def sync(self) -> None:
        self.backend.sync()

    def restore(self, snapshot_file: Path) -> int:
        """Replaces the whole state with a snapshot received from the leader; returns its index."""
        self.backend.replace(snapshot_file)
        self._open()
        with self.env.begin() as txn:
            return self.backend.applied_index(txn)

    def applied_index(self) -> int:
        with self.env.begin() as txn:
            return self.backend.applied_index(txn)

    # ---- the log path ----
    def apply_batch(self, entries: Sequence[Entry]) -> list[tuple[int, Any]]:
        """Applies committed entries in order.

        Returns, per entry, the ID of the request it carries (0 for none) and the response or the
        exception refusing it. Entries at or below the recorded applied index are skipped: the
        store already holds them (a replay after a crash, or entries a snapshot covered).
        """
        results: list[tuple[int, Any]] = []
        started = metrics.stopwatch()
        self._nospace = None
        self._membership_changed = False
        with self.env.begin(write=True) as batch:
            applied = self.backend.applied_index(batch)
            for entry in entries:
                if entry.index <= applied:
                    results.append((0, None))
                elif entry.type == EntryType.CONF_CHANGE:
                    results.append(self._apply_conf_change(batch, entry))
                elif not entry.data:
                    results.append((0, None))  # a new leader's empty entry
                else:
                    results.append(self._apply_entry(batch, entry))
                    for subscriber in self._entry_subscribers:
                        subscriber(batch)  # the watch hub's tap: events and auth changes
            last = entries[-1]
            if last.index > applied:
                self.backend.set_applied(batch, last.index, last.term)
            auth_revision = self.auth.revision(batch)
            alarms = self._alarm_names(batch)
            if last.index > applied:
                for hook in self._decided_hooks:
                    hook(last.index, results, self._membership_changed)
            failpoints.hit("applyBeforeCommit")
            committing = metrics.stopwatch()
        committed = metrics.stopwatch()  # leaving the block committed the batch (and synced it)
        metrics.LMDB_COMMIT_DURATION.observe(committed - committing)
        metrics.observe_apply(committed - started, len(entries), auth_revision)
        metrics.observe_alarms(alarms)
        return results

    def _apply_conf_change(self, batch: lmdb.Transaction, entry: Entry) -> tuple[int, Any]:
        cc = decode_conf_change(entry.data)
        request_id = self.membership.apply_conf_change(batch, cc)
        self._membership_changed = True
        if not self.cluster_id:
            self.cluster_id = self.membership.cluster_id(batch)
        resp = pb.MemberListResponse(members=self.membership.members(batch))
        self.stamp(batch, resp)
        return request_id, resp

    def remember(self, payload: bytes, req: ipb.InternalRaftRequest, kind: str) -> None:
        """The leader's parse of the entry it is about to log as ``payload``: ``req`` must be
        what parsing ``payload`` gives (the store parsed the request and set the ID and time
        the node appended), ``kind`` its kind. Apply takes it for the entry whose bytes are
        ``payload`` instead of parsing them again; any other entry (a follower's, a replay's) is
        parsed. Called on the event loop; the apply thread takes it (a dict is safe across them)."""
        if len(self._prepared) >= PREPARED_MAX:
            self._prepared.clear()
        self._prepared[payload] = (req, kind)

    def forget(self, payload: bytes) -> None:
        """A remembered request that was not applied (its proposal failed or timed out)."""
        self._prepared.pop(payload, None)

    def _apply_entry(self, batch: lmdb.Transaction, entry: Entry) -> tuple[int, Any]:
        prepared = self._prepared.pop(entry.data, None) if self._prepared else None
        kind: str | None
        if prepared is not None:
            req, kind = prepared
        else:
            try:
                req = ipb.InternalRaftRequest.FromString(entry.data)
            except DecodeError:
                log.error("entry %d does not decode; skipped", entry.index)
                return 0, EtcdError(Err.NOT_CAPABLE)
            kind = None
        if self._refused_for_space(batch, req):
            return req.ID, EtcdError(Err.NO_SPACE)
        txn = self.env.begin(write=True, parent=batch)
        try:
            if kind is None:
                kind = request_kind(req)
            resp = self.execute(txn, req, index=entry.index, read=False, kind=kind)
        except (EtcdError, AuthRevisionMoved) as exc:
            txn.abort()
            return req.ID, exc
        except lmdb.MapFullError as exc:
            txn.abort()
            raise ApplyFailed(f"entry {entry.index}: the LMDB map ({self.backend.map_size} bytes) is full; "
                              "give the store a larger map (it is twice --quota-backend-bytes)") from exc
        except Exception as exc:
            txn.abort()
            raise ApplyFailed(f"entry {entry.index}: {type(exc).__name__}: {exc}") from exc
        txn.commit()
        if req.HasField("alarm") or req.HasField("store_alarm"):
            self._nospace = None
        if kind in MEMBERSHIP_KINDS:
            self._membership_changed = True
        return req.ID, resp

    def execute(self, txn: lmdb.Transaction, req: ipb.InternalRaftRequest, *, index: int, read: bool,
                kind: str | None = None) -> Message:
        """Validates, authorizes and runs one request; used by apply (read=False) and reads.
        ``kind`` is ``request_kind(req)`` when the caller has it already."""
        if kind is None:
            kind = request_kind(req)
        body = getattr(req, kind)
        if kind == "authenticate":
            if req.time_unix_ms:
                body.issued_at_unix_ms = req.time_unix_ms  # one clock: the node that logged the entry
            try:
                token = self.auth.authenticate(txn, body, index)
            except RevisionMoved as exc:
                raise AuthRevisionMoved() from exc
            resp: Message = pb.AuthenticateResponse(token=token)
        else:
            validate_request(kind, body, self.max_txn_ops)
            authorize(self.auth, txn, req.header, req, self._lease_keys_fn(txn), read=read,
                      all_leases=self._all_leases_fn(txn), kind=kind)
            handler = self._handlers.get(kind)
            if handler is None:
                raise EtcdError(Err.NOT_CAPABLE)
            resp = handler(txn, body, req)
        self.stamp(txn, resp)
        return resp

    def _refused_for_space(self, batch: lmdb.Transaction, req: ipb.InternalRaftRequest) -> bool:
        """etcd's applierV3Capped: while a NOSPACE alarm is set (the leader logged it), writes that
        add data (Put, Txn with a Put, LeaseGrant) are refused until it is disarmed; deletes and
        compaction still go through, so space can be won back. Only replicated state is read."""
        if not adds_data(req):
            return False
        if self._nospace is None:
            self._nospace = any(a.alarm == pb.NOSPACE for a in self.alarms(batch).alarms)
        return self._nospace

    def check(self, txn: lmdb.Transaction, req: ipb.InternalRaftRequest, *, read: bool) -> str:
        """Validation and authorization alone, for requests answered outside the handlers here."""
        kind = request_kind(req)
        validate_request(kind, getattr(req, kind), self.max_txn_ops)
        authorize(self.auth, txn, req.header, req, self._lease_keys_fn(txn), read=read,
                  all_leases=self._all_leases_fn(txn), kind=kind)
        return kind

    def _lease_keys_fn(self, txn: lmdb.Transaction) -> Callable[[int], list[bytes]]:
        return lambda lease_id: self.lessor.attached_keys(txn, lease_id)

    def _all_leases_fn(self, txn: lmdb.Transaction) -> Callable[[], list[int]]:
        return lambda: [status.ID for status in self.lessor.leases(txn).leases]

    def stamp(self, txn: lmdb.Transaction, resp: Message) -> None:
        header = resp.header
        header.cluster_id = self.cluster_id
        header.member_id = self.member_id
        header.revision = self.kv.current_revision(txn)
        header.raft_term = self.term

    def _lease_revoke(self, txn: lmdb.Transaction, body: pb.LeaseRevokeRequest, _r: Any) -> Message:
        self.lessor.revoke(txn, body.ID)
        return pb.LeaseRevokeResponse()

    def _lease_renew(self, txn: lmdb.Transaction, body: ipb.LeaseRenewEntry, r: ipb.InternalRaftRequest) -> Message:
        """A keep-alive the leader logged: the deadline is the entry's time + TTL (no clock read)."""
        ttl = self.lessor.renew(txn, body.ID, r.time_unix_ms)
        return pb.LeaseKeepAliveResponse(ID=body.ID, TTL=ttl)

    def _lease_expire(self, txn: lmdb.Transaction, body: ipb.LeaseExpireEntry, _r: Any) -> Message:
        """The leader's revoke of an expired lease (no client identity: an internal kind)."""
        self.lessor.expire(txn, body.ID, body.deadline_ms)
        return pb.LeaseRevokeResponse()

    def _expire_tokens(self, txn: lmdb.Transaction, body: ipb.ExpireTokensRequest, _r: Any) -> Message:
        self.auth.expire_tokens(txn, list(body.token_digests))
        return pb.AuthStatusResponse()

    def _auth_failures(self, txn: lmdb.Transaction, body: ipb.AuthFailuresEntry, r: ipb.InternalRaftRequest) -> Message:
        """Failed password checks a proxy recorded, counted at the entry's time (lockout.py)."""
        locked = self.auth.record_failures(txn, body, r.time_unix_ms)
        if locked:
            metrics.AUTH_LOCKOUTS.inc(locked)
        return pb.AuthStatusResponse()

    def _member_update(self, txn: lmdb.Transaction, body: pb.MemberUpdateRequest, _r: Any) -> Message:
        self.membership.update_peer_urls(txn, body.ID, list(body.peerURLs))
        return pb.MemberUpdateResponse(members=self.membership.members(txn))

    def _member_attr_set(self, txn: lmdb.Transaction, body: ipb.MemberAttrSetRequest, _r: Any) -> Message:
        self.membership.set_attributes(txn, body.member_ID, body.name, list(body.client_urls),
                                       list(body.internal_urls), list(body.gateway_urls))
        return pb.MemberListResponse()

    _ALARMS = b"alarms"

    def alarms(self, txn: lmdb.Transaction) -> pb.AlarmResponse:
        raw = self.backend.meta_get(txn, self._ALARMS)
        return pb.AlarmResponse.FromString(raw) if raw else pb.AlarmResponse()

    def _alarm_names(self, txn: lmdb.Transaction) -> set[str]:
        """The alarm types any member has raised, for the metric (not for any decision)."""
        return {pb.AlarmType.Name(a.alarm) for a in self.alarms(txn).alarms}

    def _store_alarm(self, txn: lmdb.Transaction, body: pb.AlarmRequest, r: Any) -> Message:
        """An alarm the store raised itself (the leader's NOSPACE): it can only be activated."""
        if body.action != pb.AlarmRequest.ACTIVATE:
            return pb.AlarmResponse()
        resp = self._alarm(txn, body, r)
        if resp.alarms:
            log.warning("alarm %s of member %x raised", pb.AlarmType.Name(body.alarm), body.memberID)
        return resp

    def _alarm(self, txn: lmdb.Transaction, body: pb.AlarmRequest, _r: Any) -> Message:
        current = self.alarms(txn)
        if body.action == pb.AlarmRequest.GET:
            return current
        match = [a for a in current.alarms if a.memberID == body.memberID and a.alarm == body.alarm]
        if body.action == pb.AlarmRequest.ACTIVATE and body.alarm != pb.NONE and not match:
            current.alarms.add(memberID=body.memberID, alarm=body.alarm)
            self.backend.meta_put(txn, self._ALARMS, current.SerializeToString())
            return pb.AlarmResponse(alarms=[pb.AlarmMember(memberID=body.memberID, alarm=body.alarm)])
        if body.action == pb.AlarmRequest.DEACTIVATE and match:
            keep = [a for a in current.alarms if a not in match]
            self.backend.meta_put(txn, self._ALARMS, pb.AlarmResponse(alarms=keep).SerializeToString())
            return pb.AlarmResponse(alarms=match)
        return pb.AlarmResponse()
