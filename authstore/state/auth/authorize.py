"""THE authorization function: every request kind, from every path, is decided here.

Why one function: etcd spreads its checks over the API layer (``v3_server.go``, the v3rpc
``authMaintenanceServer``) and the applier (``apply/auth.go``); each request path that forgot a
check became a CVE (nested txns, prev_kv, leases, Compact). raftgate walks the whole
``InternalRaftRequest`` in one place — every compare, both branches of every (nested) Txn,
``prev_kv``, the keys already attached to a lease — with etcd 3.7.1's rules and order of checks
(reference §3, §5.2):

* auth disabled: everything is allowed; Authenticate and AuthStatus are never checked.
* a header marked ``invalid_token`` (the proxy could not resolve the client's token), auth
  enabled: ``invalid auth token`` for everything but Authenticate, before any other check.
* key checks (etcd ``isOpPermitted``): no user -> ``user name is empty``; header revision older
  than the store's -> ``revision of auth store is old``; unknown user -> ``permission denied``;
  role root -> allowed; otherwise the interval check -> ``permission denied``.
* admin checks (etcd ``IsAdminPermitted``, no revision check): no user -> ``user name is empty``;
  unknown user -> ``user name not found``; no role root -> ``permission denied``.
* "authenticated" checks (etcd ``requireAuthInfo``): only a non-empty user name is required.
* a header marked ``simple_token`` (a revocable identity the proxy may have cached) whose revision
  is older than the store's: ``revision of auth store is old`` for every checked kind, so that no
  check - admin and "authenticated" ones included - passes on a token revoked meanwhile.

Reads (``read=True``) follow etcd's ``doSerialize`` for Range and Txn: the key checks run as in
apply, and once they pass, a header revision that differs from the store's in either direction
is refused as old (so a follower lagging behind the revision the proxy saw does not answer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import lmdb

from authstore import metrics
from authstore.state.auth.permissions import UserPermissions
from authstore.state.auth.store import AuthStore, has_root_role
from protos.authpb import auth_pb2
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from raftgate.errors import Err, EtcdError
from raftgate.methods import BODY_PERMS, REQUESTS, Perm, checked, requests

#: Never checked (etcd 3.7: Authenticate checks the password itself, AuthStatus is public).
OPEN_KINDS = requests(perms=(Perm.OPEN,))

#: Any caller with a user name (the user need not exist), etcd's ``requireAuthInfo``.
AUTHENTICATED_KINDS = requests(perms=(Perm.AUTHENTICATED,))

#: Entries only the store proposes (lease checkpoints, token expiry), with no caller identity. No
#: client RPC maps to them: the proxy only ever forwards a client's bytes under the field number of
#: the RPC it serves. Checking them would add nothing either: whoever can reach the internal port
#: can stamp any header, so the trust boundary there is mTLS / the shared secret, not this function.
INTERNAL_KINDS = requests(perms=(Perm.INTERNAL,))

#: Each request's permission kind, from the method table (raftgate/methods.py).
PERMS = {name: request.perm for name, request in REQUESTS.items()}

LeaseKeys = Callable[[int], list[bytes]]
AllLeases = Callable[[], Iterable[int]]


#: InternalRaftRequest's request fields: field number -> kind (the header and scalars are none).
KIND_OF_FIELD: dict[int, str] = {
    f.number: f.name for f in ipb.InternalRaftRequest.DESCRIPTOR.fields
    if f.message_type is not None and f.name != "header"}


def request_kind(req: ipb.InternalRaftRequest) -> str:
    """The one request message set besides the header (scalars such as ID are not requests),
    named by its field number (``KIND_OF_FIELD``)."""
    kind = None
    for field, _ in req.ListFields():
        name = KIND_OF_FIELD.get(field.number)
        if name is not None:
            if kind is not None:
                raise EtcdError(Err.NOT_CAPABLE)
            kind = name
    if kind is None:
        raise EtcdError(Err.NOT_CAPABLE)
    return kind


def kind_of(data: bytes, req: ipb.InternalRaftRequest) -> str:
    """``request_kind(req)`` for ``req`` parsed from ``data``, read from the field numbers in
    ``data``: for a proxy's request (a header and the request, no scalars) a walk of the top-level
    tags costs a fraction of listing the parsed message's fields; for an entry (with its ID and
    time) it does not, and apply uses ``request_kind``.

    Anything but plain length-delimited, varint and fixed fields at the top level (which the
    store's own requests never hold) is left to ``request_kind``, so both always agree."""
    pos = 0
    end = len(data)
    kind: str | None = None
    try:
        while pos < end:
            b = data[pos]
            pos += 1
            key = b & 0x7F
            shift = 7
            while b & 0x80:
                b = data[pos]
                pos += 1
                key |= (b & 0x7F) << shift
                shift += 7
            wire_type = key & 7
            if wire_type == 2 or wire_type == 0:
                b = data[pos]
                pos += 1
                value = b & 0x7F
                shift = 7
                while b & 0x80:
                    b = data[pos]
                    pos += 1
                    value |= (b & 0x7F) << shift
                    shift += 7
                if wire_type == 2:
                    pos += value
                    name = KIND_OF_FIELD.get(key >> 3)
                    if name is not None:
                        if kind is None:
                            kind = name
                        elif kind != name:
                            return request_kind(req)  # two requests: refused as the message is
            elif wire_type == 1:
                pos += 8
            elif wire_type == 5:
                pos += 4
            else:
                return request_kind(req)
    except IndexError:
        return request_kind(req)
    if kind is None or pos != end:
        return request_kind(req)
    return kind


def authorize(
    auth: AuthStore,
    txn: lmdb.Transaction,
    header: ipb.RequestHeader,
    req: ipb.InternalRaftRequest,
    lease_keys: LeaseKeys,
    *,
    read: bool,
    all_leases: AllLeases | None = None,
    kind: str | None = None,
) -> None:
    """Raises the EtcdError etcd would answer with, or returns if `req` may run.

    `lease_keys(lease_id)` lists the keys attached to a lease and raises EtcdError
    LEASE_NOT_FOUND for an unknown lease (then the lease check is skipped and the lease code
    reports the missing lease, as etcd does). `all_leases()` lists every lease id; it is needed
    only for LeaseLeases by a non-root user, and without it such a request is refused.
    `read` is True on the read path (linearizable or serializable), False in apply. `kind` is
    ``request_kind(req)`` when the caller has it already.
    """
    if kind is None:
        kind = request_kind(req)
    if kind in INTERNAL_KINDS:
        return
    # The proxy could not resolve the caller's token: the request's shape has been validated
    # already (etcd checks it before the token), now refuse as etcd's API layer does - for every
    # request but Authenticate, AuthStatus included. Auth off: etcd ignores tokens altogether.
    if header.invalid_token and kind != "authenticate" and auth.is_enabled(txn):
        raise EtcdError(Err.INVALID_AUTH_TOKEN)
    if kind in OPEN_KINDS or not auth.is_enabled(txn):
        return
    try:
        check = _Check(auth, txn, header, lease_keys, all_leases, read)
        if header.simple_token and header.username and header.auth_revision < check.current_revision():
            # The proxy resolved the token before an auth change that may have revoked it: it
            # resolves it again (the request had no effect) instead of relying on a stale cache.
            raise EtcdError(Err.AUTH_OLD_REVISION)
        check.request(kind, getattr(req, kind))
    except EtcdError as exc:
        metrics.count_refusal(exc.err, kind, read=read)
        raise


class _Check:
    """One authorization: the caller's identity is looked up once, lazily."""

    def __init__(
        self,
        auth: AuthStore,
        txn: lmdb.Transaction,
        header: ipb.RequestHeader,
        lease_keys: LeaseKeys,
        all_leases: AllLeases | None,
        read: bool,
    ) -> None:
        self.auth = auth
        self.txn = txn
        self.username = header.username
        self.auth_revision = header.auth_revision
        self.lease_keys = lease_keys
        self.all_leases = all_leases
        self.read = read
        #: the caller's stored record and its parse (AuthStore.user_record); False: not looked up yet
        self._record: tuple[bytes, auth_pb2.User] | None | bool = False
        self._perms: UserPermissions | None = None
        self._revision: int | None = None

    def current_revision(self) -> int:
        if self._revision is None:
            self._revision = self.auth.revision(self.txn)
        return self._revision

    def user(self) -> auth_pb2.User | None:
        """The caller's record; nothing changes it while one request is being authorized."""
        if self._record is False:
            self._record = self.auth.user_record(self.txn, self.username)
        assert not isinstance(self._record, bool)
        return None if self._record is None else self._record[1]

    # ---- the three kinds of check -------------------------------------------------------------

    def authenticated(self) -> None:
        if not self.username:
            raise EtcdError(Err.USER_EMPTY)

    def admin_error(self) -> EtcdError | None:
        """etcd's IsAdminPermitted as a value, because UserGet/RoleGet and leases branch on it."""
        if not self.username:
            return EtcdError(Err.USER_EMPTY)
        user = self.user()
        if user is None:
            return EtcdError(Err.USER_NOT_FOUND)
        if not has_root_role(user):
            return EtcdError(Err.PERMISSION_DENIED)
        return None

    def admin(self) -> None:
        err = self.admin_error()
        if err is not None:
            raise err

    def key(self, key: bytes, range_end: bytes, *, write: bool) -> None:
        """etcd's isOpPermitted, in its order."""
        if not self.username or self.auth_revision == 0:
            raise EtcdError(Err.USER_EMPTY)  # etcd: revision 0 is how "no user" reaches this check
        if self.auth_revision < self.current_revision():
            raise EtcdError(Err.AUTH_OLD_REVISION)
        user = self.user()
        if user is None:
            raise EtcdError(Err.PERMISSION_DENIED)
        if has_root_role(user):
            return
        if self._perms is None:
            assert not isinstance(self._record, bool)  # user() looked it up
            self._perms = self.auth.user_permissions(self.txn, self.username, self._record)
        perms = self._perms
        if perms is None or not perms.covers(key, range_end, write=write):
            raise EtcdError(Err.PERMISSION_DENIED)

    def serialized_revision(self) -> None:
        """doSerialize's after-check: a read answered at another auth revision than the caller's."""
        if self.auth_revision != 0 and self.auth_revision != self.current_revision():
            raise EtcdError(Err.AUTH_OLD_REVISION)

    # ---- dispatch -----------------------------------------------------------------------------

    def request(self, kind: str, body: object) -> None:
        perm = PERMS.get(kind, Perm.ADMIN)
        if perm is Perm.AUTHENTICATED:
            self.authenticated()
        elif perm in BODY_PERMS:
            RULES[kind](self, body)
        else:
            # Every auth management call, Compact, the Maintenance and Cluster calls that change
            # or expose the whole store, and anything unknown: root only.
            self.admin()

    # ---- the rules that read the request (the method table's BODY_PERMS), one per request -----

    def range_rule(self, body: object) -> None:
        assert isinstance(body, pb.RangeRequest)
        self.key(body.key, body.range_end, write=False)
        if self.read:
            self.serialized_revision()

    def delete_range(self, body: object) -> None:
        assert isinstance(body, pb.DeleteRangeRequest)
        self.key(body.key, body.range_end, write=True)
        if body.prev_kv:
            self.key(body.key, body.range_end, write=False)

    def txn_rule(self, body: object) -> None:
        assert isinstance(body, pb.TxnRequest)
        self.txn_request(body)
        if self.read:
            self.serialized_revision()

    def alarm(self, body: object) -> None:
        assert isinstance(body, pb.AlarmRequest)
        if body.action == pb.AlarmRequest.GET:
            self.authenticated()
        else:
            self.admin()

    def lease_revoke(self, body: object) -> None:
        assert isinstance(body, pb.LeaseRevokeRequest)
        self.authenticated()
        self.lease_keys_writable(body.ID)

    def lease_keep_alive(self, body: object) -> None:
        assert isinstance(body, pb.LeaseKeepAliveRequest)
        self.authenticated()
        self.lease_keys_writable(body.ID)

    def lease_time_to_live(self, body: object) -> None:
        assert isinstance(body, pb.LeaseTimeToLiveRequest)
        self.authenticated()
        if body.keys:
            self.lease_keys_readable([body.ID])

    def lease_leases(self, _body: object) -> None:
        self.authenticated()
        if self.all_leases is None:
            self.lease_keys_readable(None)
        else:
            self.lease_keys_readable(self.all_leases())

    def auth_user_get(self, body: object) -> None:
        assert isinstance(body, pb.AuthUserGetRequest)
        err = self.admin_error()
        if err is not None and body.name != self.username:
            raise err

    def auth_role_get(self, body: object) -> None:
        assert isinstance(body, pb.AuthRoleGetRequest)
        err = self.admin_error()
        if err is not None and not self.auth.has_role(self.txn, self.username, body.role):
            raise err

    def put(self, body: object) -> None:
        """etcd's checkPutAuth: WRITE key, then the lease's keys, then READ for prev_kv."""
        assert isinstance(body, pb.PutRequest)
        self.key(body.key, b"", write=True)
        if body.lease != 0:
            self.lease_keys_writable(body.lease)
        if body.prev_kv:
            self.key(body.key, b"", write=False)

    def txn_request(self, body: pb.TxnRequest) -> None:
        """Every compare, then every op of both branches, whichever branch will run."""
        for cmp in body.compare:
            self.key(cmp.key, cmp.range_end, write=False)
        for op in (*body.success, *body.failure):
            which = op.WhichOneof("request")
            if which == "request_range":
                self.key(op.request_range.key, op.request_range.range_end, write=False)
            elif which == "request_put":
                self.put(op.request_put)
            elif which == "request_delete_range":
                dr = op.request_delete_range
                if dr.prev_kv:
                    self.key(dr.key, dr.range_end, write=False)
                self.key(dr.key, dr.range_end, write=True)
            elif which == "request_txn":
                self.txn_request(op.request_txn)

    # ---- leases: no owner, so a lease is as writable/readable as the keys attached to it -------

    def _attached(self, lease_id: int) -> list[bytes] | None:
        try:
            return self.lease_keys(lease_id)
        except EtcdError as exc:
            if exc.err is Err.LEASE_NOT_FOUND:
                return None  # the lease code reports it, after authorization, as in etcd
            raise

    def lease_keys_writable(self, lease_id: int) -> None:
        keys = self._attached(lease_id)
        if not keys or self.admin_error() is None:
            return
        for k in keys:
            self.key(k, b"", write=True)

    def lease_keys_readable(self, lease_ids: Iterable[int] | None) -> None:
        if self.admin_error() is None:
            return
        if lease_ids is None:
            raise EtcdError(Err.PERMISSION_DENIED)  # cannot see the leases: refuse rather than guess
        for lease_id in lease_ids:
            for k in self._attached(lease_id) or ():
                self.key(k, b"", write=False)


#: The check of each request whose rule reads its body (the method table's BODY_PERMS).
RULES: dict[str, Callable[[_Check, Any], None]] = checked({
    "range": _Check.range_rule,
    "put": _Check.put,
    "delete_range": _Check.delete_range,
    "txn": _Check.txn_rule,
    "alarm": _Check.alarm,
    "lease_revoke": _Check.lease_revoke,
    "lease_keep_alive": _Check.lease_keep_alive,
    "lease_time_to_live": _Check.lease_time_to_live,
    "lease_leases": _Check.lease_leases,
    "auth_user_get": _Check.auth_user_get,
    "auth_role_get": _Check.auth_role_get,
}, requests(perms=BODY_PERMS), "authorize")
