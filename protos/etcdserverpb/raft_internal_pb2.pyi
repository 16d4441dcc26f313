from protos.etcdserverpb import rpc_pb2 as _rpc_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RequestHeader(_message.Message):
    __slots__ = ("ID", "username", "auth_revision", "invalid_token", "simple_token")
    ID_FIELD_NUMBER: _ClassVar[int]
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    AUTH_REVISION_FIELD_NUMBER: _ClassVar[int]
    INVALID_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SIMPLE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ID: int
    username: str
    auth_revision: int
    invalid_token: bool
    simple_token: bool
    def __init__(self, ID: _Optional[int] = ..., username: _Optional[str] = ..., auth_revision: _Optional[int] = ..., invalid_token: _Optional[bool] = ..., simple_token: _Optional[bool] = ...) -> None: ...

class InternalRaftRequest(_message.Message):
    __slots__ = ("header", "ID", "range", "put", "delete_range", "txn", "compaction", "lease_grant", "lease_revoke", "alarm", "lease_checkpoint", "auth_enable", "auth_disable", "authenticate", "auth_status", "auth_user_add", "auth_user_delete", "auth_user_get", "auth_user_change_password", "auth_user_grant_role", "auth_user_revoke_role", "auth_user_list", "auth_role_list", "auth_role_add", "auth_role_delete", "auth_role_get", "auth_role_grant_permission", "auth_role_revoke_permission", "status", "defragment", "hash", "hash_kv", "snapshot", "move_leader", "downgrade", "member_list", "member_add", "member_remove", "member_update", "member_promote", "lease_time_to_live", "lease_leases", "lease_keep_alive", "member_attr_set", "expire_tokens", "auth_failures", "lease_renew", "lease_expire", "store_alarm", "time_unix_ms")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    RANGE_FIELD_NUMBER: _ClassVar[int]
    PUT_FIELD_NUMBER: _ClassVar[int]
    DELETE_RANGE_FIELD_NUMBER: _ClassVar[int]
    TXN_FIELD_NUMBER: _ClassVar[int]
    COMPACTION_FIELD_NUMBER: _ClassVar[int]
    LEASE_GRANT_FIELD_NUMBER: _ClassVar[int]
    LEASE_REVOKE_FIELD_NUMBER: _ClassVar[int]
    ALARM_FIELD_NUMBER: _ClassVar[int]
    LEASE_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    AUTH_ENABLE_FIELD_NUMBER: _ClassVar[int]
    AUTH_DISABLE_FIELD_NUMBER: _ClassVar[int]
    AUTHENTICATE_FIELD_NUMBER: _ClassVar[int]
    AUTH_STATUS_FIELD_NUMBER: _ClassVar[int]
    AUTH_USER_ADD_FIELD_NUMBER: _ClassVar[int]
    AUTH_USER_DELETE_FIELD_NUMBER: _ClassVar[int]
    AUTH_USER_GET_FIELD_NUMBER: _ClassVar[int]
    AUTH_USER_CHANGE_PASSWORD_FIELD_NUMBER: _ClassVar[int]
    AUTH_USER_GRANT_ROLE_FIELD_NUMBER: _ClassVar[int]
    AUTH_USER_REVOKE_ROLE_FIELD_NUMBER: _ClassVar[int]
    AUTH_USER_LIST_FIELD_NUMBER: _ClassVar[int]
    AUTH_ROLE_LIST_FIELD_NUMBER: _ClassVar[int]
    AUTH_ROLE_ADD_FIELD_NUMBER: _ClassVar[int]
    AUTH_ROLE_DELETE_FIELD_NUMBER: _ClassVar[int]
    AUTH_ROLE_GET_FIELD_NUMBER: _ClassVar[int]
    AUTH_ROLE_GRANT_PERMISSION_FIELD_NUMBER: _ClassVar[int]
    AUTH_ROLE_REVOKE_PERMISSION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DEFRAGMENT_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    HASH_KV_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    MOVE_LEADER_FIELD_NUMBER: _ClassVar[int]
    DOWNGRADE_FIELD_NUMBER: _ClassVar[int]
    MEMBER_LIST_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ADD_FIELD_NUMBER: _ClassVar[int]
    MEMBER_REMOVE_FIELD_NUMBER: _ClassVar[int]
    MEMBER_UPDATE_FIELD_NUMBER: _ClassVar[int]
    MEMBER_PROMOTE_FIELD_NUMBER: _ClassVar[int]
    LEASE_TIME_TO_LIVE_FIELD_NUMBER: _ClassVar[int]
    LEASE_LEASES_FIELD_NUMBER: _ClassVar[int]
    LEASE_KEEP_ALIVE_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ATTR_SET_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    AUTH_FAILURES_FIELD_NUMBER: _ClassVar[int]
    LEASE_RENEW_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRE_FIELD_NUMBER: _ClassVar[int]
    STORE_ALARM_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    ID: int
    range: _rpc_pb2.RangeRequest
    put: _rpc_pb2.PutRequest
    delete_range: _rpc_pb2.DeleteRangeRequest
    txn: _rpc_pb2.TxnRequest
    compaction: _rpc_pb2.CompactionRequest
    lease_grant: _rpc_pb2.LeaseGrantRequest
    lease_revoke: _rpc_pb2.LeaseRevokeRequest
    alarm: _rpc_pb2.AlarmRequest
    lease_checkpoint: _rpc_pb2.LeaseCheckpointRequest
    auth_enable: _rpc_pb2.AuthEnableRequest
    auth_disable: _rpc_pb2.AuthDisableRequest
    authenticate: InternalAuthenticateRequest
    auth_status: _rpc_pb2.AuthStatusRequest
    auth_user_add: _rpc_pb2.AuthUserAddRequest
    auth_user_delete: _rpc_pb2.AuthUserDeleteRequest
    auth_user_get: _rpc_pb2.AuthUserGetRequest
    auth_user_change_password: _rpc_pb2.AuthUserChangePasswordRequest
    auth_user_grant_role: _rpc_pb2.AuthUserGrantRoleRequest
    auth_user_revoke_role: _rpc_pb2.AuthUserRevokeRoleRequest
    auth_user_list: _rpc_pb2.AuthUserListRequest
    auth_role_list: _rpc_pb2.AuthRoleListRequest
    auth_role_add: _rpc_pb2.AuthRoleAddRequest
    auth_role_delete: _rpc_pb2.AuthRoleDeleteRequest
    auth_role_get: _rpc_pb2.AuthRoleGetRequest
    auth_role_grant_permission: _rpc_pb2.AuthRoleGrantPermissionRequest
    auth_role_revoke_permission: _rpc_pb2.AuthRoleRevokePermissionRequest
    status: _rpc_pb2.StatusRequest
    defragment: _rpc_pb2.DefragmentRequest
    hash: _rpc_pb2.HashRequest
    hash_kv: _rpc_pb2.HashKVRequest
    snapshot: _rpc_pb2.SnapshotRequest
    move_leader: _rpc_pb2.MoveLeaderRequest
    downgrade: _rpc_pb2.DowngradeRequest
    member_list: _rpc_pb2.MemberListRequest
    member_add: _rpc_pb2.MemberAddRequest
    member_remove: _rpc_pb2.MemberRemoveRequest
    member_update: _rpc_pb2.MemberUpdateRequest
    member_promote: _rpc_pb2.MemberPromoteRequest
    lease_time_to_live: _rpc_pb2.LeaseTimeToLiveRequest
    lease_leases: _rpc_pb2.LeaseLeasesRequest
    lease_keep_alive: _rpc_pb2.LeaseKeepAliveRequest
    member_attr_set: MemberAttrSetRequest
    expire_tokens: ExpireTokensRequest
    auth_failures: AuthFailuresEntry
    lease_renew: LeaseRenewEntry
    lease_expire: LeaseExpireEntry
    store_alarm: _rpc_pb2.AlarmRequest
    time_unix_ms: int
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., ID: _Optional[int] = ..., range: _Optional[_Union[_rpc_pb2.RangeRequest, _Mapping]] = ..., put: _Optional[_Union[_rpc_pb2.PutRequest, _Mapping]] = ..., delete_range: _Optional[_Union[_rpc_pb2.DeleteRangeRequest, _Mapping]] = ..., txn: _Optional[_Union[_rpc_pb2.TxnRequest, _Mapping]] = ..., compaction: _Optional[_Union[_rpc_pb2.CompactionRequest, _Mapping]] = ..., lease_grant: _Optional[_Union[_rpc_pb2.LeaseGrantRequest, _Mapping]] = ..., lease_revoke: _Optional[_Union[_rpc_pb2.LeaseRevokeRequest, _Mapping]] = ..., alarm: _Optional[_Union[_rpc_pb2.AlarmRequest, _Mapping]] = ..., lease_checkpoint: _Optional[_Union[_rpc_pb2.LeaseCheckpointRequest, _Mapping]] = ..., auth_enable: _Optional[_Union[_rpc_pb2.AuthEnableRequest, _Mapping]] = ..., auth_disable: _Optional[_Union[_rpc_pb2.AuthDisableRequest, _Mapping]] = ..., authenticate: _Optional[_Union[InternalAuthenticateRequest, _Mapping]] = ..., auth_status: _Optional[_Union[_rpc_pb2.AuthStatusRequest, _Mapping]] = ..., auth_user_add: _Optional[_Union[_rpc_pb2.AuthUserAddRequest, _Mapping]] = ..., auth_user_delete: _Optional[_Union[_rpc_pb2.AuthUserDeleteRequest, _Mapping]] = ..., auth_user_get: _Optional[_Union[_rpc_pb2.AuthUserGetRequest, _Mapping]] = ..., auth_user_change_password: _Optional[_Union[_rpc_pb2.AuthUserChangePasswordRequest, _Mapping]] = ..., auth_user_grant_role: _Optional[_Union[_rpc_pb2.AuthUserGrantRoleRequest, _Mapping]] = ..., auth_user_revoke_role: _Optional[_Union[_rpc_pb2.AuthUserRevokeRoleRequest, _Mapping]] = ..., auth_user_list: _Optional[_Union[_rpc_pb2.AuthUserListRequest, _Mapping]] = ..., auth_role_list: _Optional[_Union[_rpc_pb2.AuthRoleListRequest, _Mapping]] = ..., auth_role_add: _Optional[_Union[_rpc_pb2.AuthRoleAddRequest, _Mapping]] = ..., auth_role_delete: _Optional[_Union[_rpc_pb2.AuthRoleDeleteRequest, _Mapping]] = ..., auth_role_get: _Optional[_Union[_rpc_pb2.AuthRoleGetRequest, _Mapping]] = ..., auth_role_grant_permission: _Optional[_Union[_rpc_pb2.AuthRoleGrantPermissionRequest, _Mapping]] = ..., auth_role_revoke_permission: _Optional[_Union[_rpc_pb2.AuthRoleRevokePermissionRequest, _Mapping]] = ..., status: _Optional[_Union[_rpc_pb2.StatusRequest, _Mapping]] = ..., defragment: _Optional[_Union[_rpc_pb2.DefragmentRequest, _Mapping]] = ..., hash: _Optional[_Union[_rpc_pb2.HashRequest, _Mapping]] = ..., hash_kv: _Optional[_Union[_rpc_pb2.HashKVRequest, _Mapping]] = ..., snapshot: _Optional[_Union[_rpc_pb2.SnapshotRequest, _Mapping]] = ..., move_leader: _Optional[_Union[_rpc_pb2.MoveLeaderRequest, _Mapping]] = ..., downgrade: _Optional[_Union[_rpc_pb2.DowngradeRequest, _Mapping]] = ..., member_list: _Optional[_Union[_rpc_pb2.MemberListRequest, _Mapping]] = ..., member_add: _Optional[_Union[_rpc_pb2.MemberAddRequest, _Mapping]] = ..., member_remove: _Optional[_Union[_rpc_pb2.MemberRemoveRequest, _Mapping]] = ..., member_update: _Optional[_Union[_rpc_pb2.MemberUpdateRequest, _Mapping]] = ..., member_promote: _Optional[_Union[_rpc_pb2.MemberPromoteRequest, _Mapping]] = ..., lease_time_to_live: _Optional[_Union[_rpc_pb2.LeaseTimeToLiveRequest, _Mapping]] = ..., lease_leases: _Optional[_Union[_rpc_pb2.LeaseLeasesRequest, _Mapping]] = ..., lease_keep_alive: _Optional[_Union[_rpc_pb2.LeaseKeepAliveRequest, _Mapping]] = ..., member_attr_set: _Optional[_Union[MemberAttrSetRequest, _Mapping]] = ..., expire_tokens: _Optional[_Union[ExpireTokensRequest, _Mapping]] = ..., auth_failures: _Optional[_Union[AuthFailuresEntry, _Mapping]] = ..., lease_renew: _Optional[_Union[LeaseRenewEntry, _Mapping]] = ..., lease_expire: _Optional[_Union[LeaseExpireEntry, _Mapping]] = ..., store_alarm: _Optional[_Union[_rpc_pb2.AlarmRequest, _Mapping]] = ..., time_unix_ms: _Optional[int] = ...) -> None: ...

class InternalAuthenticateRequest(_message.Message):
    __slots__ = ("name", "password", "simple_token", "checked_revision", "issued_at_unix_ms", "ttl_seconds", "lockout_off")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    SIMPLE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CHECKED_REVISION_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LOCKOUT_OFF_FIELD_NUMBER: _ClassVar[int]
    name: str
    password: str
    simple_token: str
    checked_revision: int
    issued_at_unix_ms: int
    ttl_seconds: int
    lockout_off: bool
    def __init__(self, name: _Optional[str] = ..., password: _Optional[str] = ..., simple_token: _Optional[str] = ..., checked_revision: _Optional[int] = ..., issued_at_unix_ms: _Optional[int] = ..., ttl_seconds: _Optional[int] = ..., lockout_off: _Optional[bool] = ...) -> None: ...

class MemberAttrSetRequest(_message.Message):
    __slots__ = ("member_ID", "name", "client_urls", "internal_urls", "gateway_urls")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CLIENT_URLS_FIELD_NUMBER: _ClassVar[int]
    INTERNAL_URLS_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_URLS_FIELD_NUMBER: _ClassVar[int]
    member_ID: int
    name: str
    client_urls: _containers.RepeatedScalarFieldContainer[str]
    internal_urls: _containers.RepeatedScalarFieldContainer[str]
    gateway_urls: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, member_ID: _Optional[int] = ..., name: _Optional[str] = ..., client_urls: _Optional[_Iterable[str]] = ..., internal_urls: _Optional[_Iterable[str]] = ..., gateway_urls: _Optional[_Iterable[str]] = ...) -> None: ...

class AuthFailuresEntry(_message.Message):
    __slots__ = ("names", "attempts", "duration_ms")
    NAMES_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    attempts: int
    duration_ms: int
    def __init__(self, names: _Optional[_Iterable[str]] = ..., attempts: _Optional[int] = ..., duration_ms: _Optional[int] = ...) -> None: ...

class ExpireTokensRequest(_message.Message):
    __slots__ = ("token_digests",)
    TOKEN_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    token_digests: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, token_digests: _Optional[_Iterable[bytes]] = ...) -> None: ...

class LeaseRenewEntry(_message.Message):
    __slots__ = ("ID",)
    ID_FIELD_NUMBER: _ClassVar[int]
    ID: int
    def __init__(self, ID: _Optional[int] = ...) -> None: ...

class LeaseExpireEntry(_message.Message):
    __slots__ = ("ID", "deadline_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    ID: int
    deadline_ms: int
    def __init__(self, ID: _Optional[int] = ..., deadline_ms: _Optional[int] = ...) -> None: ...
