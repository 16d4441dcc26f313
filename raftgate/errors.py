"""The one table of etcd errors: gRPC code and exact wire message, used by store and proxy alike.

etcd clients compare errors by message string (``rpctypes.Error``), so every message here is
byte-for-byte etcd's. Handlers raise :class:`EtcdError` with a member of :class:`Err`; nothing
else builds an error message.
"""

from __future__ import annotations

import enum

import grpc

C = grpc.StatusCode

#: raftgate-internal (store -> proxy, never seen by clients): ABORTED with this text refuses an
#: Authenticate entry whose password was checked at an auth revision that has since moved.
REVISION_MOVED = "raftgate: auth revision moved"

#: grpc-go's status message for a request that does not unmarshal (code Internal); the reason
#: follows the colon.
UNMARSHAL_ERROR_PREFIX = "grpc: error unmarshalling request: "
#: grpc-go's status message (code Internal) for a streaming call's message that does not unmarshal
#: (Watch, LeaseKeepAlive, Snapshot, RangeStream); etcd 3.5.1's older grpc-go leaves out the colon.
STREAM_UNMARSHAL_ERROR_PREFIX = "grpc: failed to unmarshal the received message: "


class Err(enum.Enum):
    # auth (server/auth/store.go, mapped in v3rpc/util.go)
    ROOT_USER_NOT_EXIST = (C.FAILED_PRECONDITION, "etcdserver: root user does not exist")
    ROOT_ROLE_NOT_EXIST = (C.FAILED_PRECONDITION, "etcdserver: root user does not have root role")
    USER_ALREADY_EXIST = (C.FAILED_PRECONDITION, "etcdserver: user name already exists")
    USER_EMPTY = (C.INVALID_ARGUMENT, "etcdserver: user name is empty")
    USER_NOT_FOUND = (C.FAILED_PRECONDITION, "etcdserver: user name not found")
    ROLE_ALREADY_EXIST = (C.FAILED_PRECONDITION, "etcdserver: role name already exists")
    ROLE_NOT_FOUND = (C.FAILED_PRECONDITION, "etcdserver: role name not found")
    ROLE_EMPTY = (C.INVALID_ARGUMENT, "etcdserver: role name is empty")
    AUTH_FAILED = (C.INVALID_ARGUMENT, "etcdserver: authentication failed, invalid user ID or password")
    PERMISSION_NOT_GIVEN = (C.INVALID_ARGUMENT, "etcdserver: permission not given")
    PERMISSION_DENIED = (C.PERMISSION_DENIED, "etcdserver: permission denied")
    ROLE_NOT_GRANTED = (C.FAILED_PRECONDITION, "etcdserver: role is not granted to the user")
    PERMISSION_NOT_GRANTED = (C.FAILED_PRECONDITION, "etcdserver: permission is not granted to the role")
    AUTH_NOT_ENABLED = (C.FAILED_PRECONDITION, "etcdserver: authentication is not enabled")
    INVALID_AUTH_TOKEN = (C.UNAUTHENTICATED, "etcdserver: invalid auth token")
    INVALID_AUTH_MGMT = (C.INVALID_ARGUMENT, "etcdserver: invalid auth management")
    AUTH_OLD_REVISION = (C.INVALID_ARGUMENT, "etcdserver: revision of auth store is old")
    NO_PASSWORD_USER = (C.UNKNOWN, "auth: authentication failed, password was given for no password user")
    VERIFY_ONLY = (C.UNKNOWN, "auth: token signing attempted with verify-only key")
    # golang.org/x/crypto/bcrypt.ErrPasswordTooLong, returned unmapped by UserAdd/UserChangePassword
    PASSWORD_TOO_LONG = (C.UNKNOWN, "bcrypt: password length exceeds 72 bytes")
    # KV / MVCC
    EMPTY_KEY = (C.INVALID_ARGUMENT, "etcdserver: key is not provided")
    KEY_NOT_FOUND = (C.INVALID_ARGUMENT, "etcdserver: key not found")
    VALUE_PROVIDED = (C.INVALID_ARGUMENT, "etcdserver: value is provided")
    LEASE_PROVIDED = (C.INVALID_ARGUMENT, "etcdserver: lease is provided")
    TOO_MANY_OPS = (C.INVALID_ARGUMENT, "etcdserver: too many operations in txn request")
    DUPLICATE_KEY = (C.INVALID_ARGUMENT, "etcdserver: duplicate key given in txn request")
    INVALID_SORT_OPTION = (C.INVALID_ARGUMENT, "etcdserver: invalid sort option")
    COMPACTED = (C.OUT_OF_RANGE, "etcdserver: mvcc: required revision has been compacted")
    FUTURE_REV = (C.OUT_OF_RANGE, "etcdserver: mvcc: required revision is a future revision")
    NO_SPACE = (C.RESOURCE_EXHAUSTED, "etcdserver: mvcc: database space exceeded")
    # lease
    LEASE_NOT_FOUND = (C.NOT_FOUND, "etcdserver: requested lease not found")
    LEASE_EXIST = (C.FAILED_PRECONDITION, "etcdserver: lease already exists")
    LEASE_TTL_TOO_LARGE = (C.OUT_OF_RANGE, "etcdserver: too large lease TTL")
    WATCH_CANCELED = (C.CANCELLED, "etcdserver: watch canceled")
    # cluster
    MEMBER_EXIST = (C.FAILED_PRECONDITION, "etcdserver: member ID already exist")
    PEER_URL_EXIST = (C.FAILED_PRECONDITION, "etcdserver: Peer URLs already exists")
    MEMBER_NOT_ENOUGH_STARTED = (C.FAILED_PRECONDITION, "etcdserver: re-configuration failed due to not enough started members")
    MEMBER_BAD_URLS = (C.INVALID_ARGUMENT, "etcdserver: given member URLs are invalid")
    MEMBER_NOT_FOUND = (C.NOT_FOUND, "etcdserver: member not found")
    MEMBER_NOT_LEARNER = (C.FAILED_PRECONDITION, "etcdserver: can only promote a learner member")
    LEARNER_NOT_READY = (C.FAILED_PRECONDITION, "etcdserver: can only promote a learner member which is in sync with leader")
    TOO_MANY_LEARNERS = (C.FAILED_PRECONDITION, "etcdserver: too many learner members in cluster")
    # server
    REQUEST_TOO_LARGE = (C.INVALID_ARGUMENT, "etcdserver: request is too large")
    TOO_MANY_REQUESTS = (C.RESOURCE_EXHAUSTED, "etcdserver: too many requests")
    # raftgate's watch caps (etcd has none): answered in a watch's cancel_reason, the stream goes on
    TOO_MANY_WATCHES_STREAM = (C.RESOURCE_EXHAUSTED, "etcdserver: too many watches on this stream")
    TOO_MANY_WATCHES_USER = (C.RESOURCE_EXHAUSTED, "etcdserver: too many watches for this user")
    NO_LEADER = (C.UNAVAILABLE, "etcdserver: no leader")
    NOT_LEADER = (C.FAILED_PRECONDITION, "etcdserver: not leader")
    LEADER_CHANGED = (C.UNAVAILABLE, "etcdserver: leader changed")
    NOT_CAPABLE = (C.FAILED_PRECONDITION, "etcdserver: not capable")
    STOPPED = (C.UNAVAILABLE, "etcdserver: server stopped")
    TIMEOUT = (C.UNAVAILABLE, "etcdserver: request timed out")
    TIMEOUT_DUE_TO_LEADER_FAIL = (C.UNAVAILABLE, "etcdserver: request timed out, possibly due to previous leader failure")
    TIMEOUT_DUE_TO_CONNECTION_LOST = (C.UNAVAILABLE, "etcdserver: request timed out, possibly due to connection lost")
    UNHEALTHY = (C.UNAVAILABLE, "etcdserver: unhealthy cluster")
    CORRUPT = (C.DATA_LOSS, "etcdserver: corrupt cluster")
    BAD_LEADER_TRANSFEREE = (C.FAILED_PRECONDITION, "etcdserver: bad leader transferee")
    NOT_SUPPORTED_FOR_LEARNER = (C.FAILED_PRECONDITION, "etcdserver: rpc not supported for learner")
    INVALID_DOWNGRADE_TARGET = (C.INVALID_ARGUMENT, "etcdserver: invalid downgrade target version")
    # raftgate's audit log (--audit-fail-closed; etcd has no audit log): the request was not served
    # because its record could not be written. Unavailable: a client may try again later.
    AUDIT_UNAVAILABLE = (C.UNAVAILABLE, "raftgate: audit log unavailable")
    # Snapshot failures: etcd answers them with code Unknown and its database's own error text;
    # raftgate's texts say which side failed. Unknown is not retried by etcd's clients.
    SNAPSHOT_FAILED = (C.UNKNOWN, "snapshot: the store could not copy its database")
    SNAPSHOT_LOST = (C.UNKNOWN, "snapshot: the connection to the store was lost")

    @property
    def code(self) -> grpc.StatusCode:
        return self.value[0]

    @property
    def message(self) -> str:
        return self.value[1]


_BY_MESSAGE = {e.message: e for e in Err}


class EtcdError(Exception):
    """An etcd error as the client must see it."""

    def __init__(self, err: Err) -> None:
        super().__init__(err.message)
        self.err = err

    @property
    def code(self) -> grpc.StatusCode:
        return self.err.code

    @property
    def message(self) -> str:
        return self.err.message

    def status_string(self) -> str:
        """The Go ``status.Error(...).Error()`` form etcd puts into a watch's ``cancel_reason``."""
        return f"rpc error: code = {_GO_CODE_NAMES[self.code]} desc = {self.message}"


def from_message(message: str) -> Err | None:
    """Maps a wire message back to its error, as etcd's ``rpctypes.Error`` does."""
    return _BY_MESSAGE.get(message)


_GO_CODE_NAMES = {
    C.OK: "OK", C.CANCELLED: "Canceled", C.UNKNOWN: "Unknown", C.INVALID_ARGUMENT: "InvalidArgument",
    C.DEADLINE_EXCEEDED: "DeadlineExceeded", C.NOT_FOUND: "NotFound", C.ALREADY_EXISTS: "AlreadyExists",
    C.PERMISSION_DENIED: "PermissionDenied", C.RESOURCE_EXHAUSTED: "ResourceExhausted",
    C.FAILED_PRECONDITION: "FailedPrecondition", C.ABORTED: "Aborted", C.OUT_OF_RANGE: "OutOfRange",
    C.UNIMPLEMENTED: "Unimplemented", C.INTERNAL: "Internal", C.UNAVAILABLE: "Unavailable",
    C.DATA_LOSS: "DataLoss", C.UNAUTHENTICATED: "Unauthenticated",
}
