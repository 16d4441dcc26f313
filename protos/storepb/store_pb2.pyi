from protos.etcdserverpb import rpc_pb2 as _rpc_pb2
from protos.etcdserverpb import raft_internal_pb2 as _raft_internal_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChallengeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ChallengeResponse(_message.Message):
    __slots__ = ("nonce", "member_id")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    member_id: int
    def __init__(self, nonce: _Optional[bytes] = ..., member_id: _Optional[int] = ...) -> None: ...

class WatchStreamRequest(_message.Message):
    __slots__ = ("header", "request", "resume", "current_revision", "token_digest", "token")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    CURRENT_REVISION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_DIGEST_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    header: _raft_internal_pb2.RequestHeader
    request: _rpc_pb2.WatchRequest
    resume: bool
    current_revision: bool
    token_digest: bytes
    token: str
    def __init__(self, header: _Optional[_Union[_raft_internal_pb2.RequestHeader, _Mapping]] = ..., request: _Optional[_Union[_rpc_pb2.WatchRequest, _Mapping]] = ..., resume: _Optional[bool] = ..., current_revision: _Optional[bool] = ..., token_digest: _Optional[bytes] = ..., token: _Optional[str] = ...) -> None: ...

class WatchBatch(_message.Message):
    __slots__ = ("responses",)
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, responses: _Optional[_Iterable[bytes]] = ...) -> None: ...

class WatchSharedRequest(_message.Message):
    __slots__ = ("sub", "request", "close")
    SUB_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    sub: int
    request: bytes
    close: bool
    def __init__(self, sub: _Optional[int] = ..., request: _Optional[bytes] = ..., close: _Optional[bool] = ...) -> None: ...

class WatchSharedPart(_message.Message):
    __slots__ = ("sub", "batch", "end", "code", "message")
    SUB_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    sub: int
    batch: bytes
    end: bool
    code: int
    message: str
    def __init__(self, sub: _Optional[int] = ..., batch: _Optional[bytes] = ..., end: _Optional[bool] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class WatchSharedBatch(_message.Message):
    __slots__ = ("parts",)
    PARTS_FIELD_NUMBER: _ClassVar[int]
    parts: _containers.RepeatedCompositeFieldContainer[WatchSharedPart]
    def __init__(self, parts: _Optional[_Iterable[_Union[WatchSharedPart, _Mapping]]] = ...) -> None: ...

class LeaderRequest(_message.Message):
    __slots__ = ("alarms",)
    ALARMS_FIELD_NUMBER: _ClassVar[int]
    alarms: bool
    def __init__(self, alarms: _Optional[bool] = ...) -> None: ...

class LeaderResponse(_message.Message):
    __slots__ = ("member_id", "leader_id", "raft_term", "members", "alarms")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    RAFT_TERM_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    ALARMS_FIELD_NUMBER: _ClassVar[int]
    member_id: int
    leader_id: int
    raft_term: int
    members: _containers.RepeatedCompositeFieldContainer[StoreMember]
    alarms: _containers.RepeatedCompositeFieldContainer[_rpc_pb2.AlarmMember]
    def __init__(self, member_id: _Optional[int] = ..., leader_id: _Optional[int] = ..., raft_term: _Optional[int] = ..., members: _Optional[_Iterable[_Union[StoreMember, _Mapping]]] = ..., alarms: _Optional[_Iterable[_Union[_rpc_pb2.AlarmMember, _Mapping]]] = ...) -> None: ...

class StoreMember(_message.Message):
    __slots__ = ("id", "internal_urls", "is_learner", "gateway_urls")
    ID_FIELD_NUMBER: _ClassVar[int]
    INTERNAL_URLS_FIELD_NUMBER: _ClassVar[int]
    IS_LEARNER_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_URLS_FIELD_NUMBER: _ClassVar[int]
    id: int
    internal_urls: _containers.RepeatedScalarFieldContainer[str]
    is_learner: bool
    gateway_urls: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[int] = ..., internal_urls: _Optional[_Iterable[str]] = ..., is_learner: _Optional[bool] = ..., gateway_urls: _Optional[_Iterable[str]] = ...) -> None: ...

class MemberContext(_message.Message):
    __slots__ = ("member", "request_id", "cluster_id")
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    member: _rpc_pb2.Member
    request_id: int
    cluster_id: int
    def __init__(self, member: _Optional[_Union[_rpc_pb2.Member, _Mapping]] = ..., request_id: _Optional[int] = ..., cluster_id: _Optional[int] = ...) -> None: ...

class InternalResponse(_message.Message):
    __slots__ = ("range", "put", "delete_range", "txn", "compaction", "lease_grant", "lease_revoke", "alarm", "lease_checkpoint", "auth_enable", "auth_disable", "authenticate", "auth_status", "auth_user_add", "auth_user_delete", "auth_user_get", "auth_user_change_password", "auth_user_grant_role", "auth_user_revoke_role", "auth_user_list", "auth_role_list", "auth_role_add", "auth_role_delete", "auth_role_get", "auth_role_grant_permission", "auth_role_revoke_permission", "status", "defragment", "hash", "hash_kv", "move_leader", "downgrade", "member_list", "member_add", "member_remove", "member_update", "member_promote", "lease_time_to_live", "lease_leases", "lease_keep_alive")
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
    range: _rpc_pb2.RangeResponse
    put: _rpc_pb2.PutResponse
    delete_range: _rpc_pb2.DeleteRangeResponse
    txn: _rpc_pb2.TxnResponse
    compaction: _rpc_pb2.CompactionResponse
    lease_grant: _rpc_pb2.LeaseGrantResponse
    lease_revoke: _rpc_pb2.LeaseRevokeResponse
    alarm: _rpc_pb2.AlarmResponse
    lease_checkpoint: _rpc_pb2.LeaseCheckpointResponse
    auth_enable: _rpc_pb2.AuthEnableResponse
    auth_disable: _rpc_pb2.AuthDisableResponse
    authenticate: _rpc_pb2.AuthenticateResponse
    auth_status: _rpc_pb2.AuthStatusResponse
    auth_user_add: _rpc_pb2.AuthUserAddResponse
    auth_user_delete: _rpc_pb2.AuthUserDeleteResponse
    auth_user_get: _rpc_pb2.AuthUserGetResponse
    auth_user_change_password: _rpc_pb2.AuthUserChangePasswordResponse
    auth_user_grant_role: _rpc_pb2.AuthUserGrantRoleResponse
    auth_user_revoke_role: _rpc_pb2.AuthUserRevokeRoleResponse
    auth_user_list: _rpc_pb2.AuthUserListResponse
    auth_role_list: _rpc_pb2.AuthRoleListResponse
    auth_role_add: _rpc_pb2.AuthRoleAddResponse
    auth_role_delete: _rpc_pb2.AuthRoleDeleteResponse
    auth_role_get: _rpc_pb2.AuthRoleGetResponse
    auth_role_grant_permission: _rpc_pb2.AuthRoleGrantPermissionResponse
    auth_role_revoke_permission: _rpc_pb2.AuthRoleRevokePermissionResponse
    status: _rpc_pb2.StatusResponse
    defragment: _rpc_pb2.DefragmentResponse
    hash: _rpc_pb2.HashResponse
    hash_kv: _rpc_pb2.HashKVResponse
    move_leader: _rpc_pb2.MoveLeaderResponse
    downgrade: _rpc_pb2.DowngradeResponse
    member_list: _rpc_pb2.MemberListResponse
    member_add: _rpc_pb2.MemberAddResponse
    member_remove: _rpc_pb2.MemberRemoveResponse
    member_update: _rpc_pb2.MemberUpdateResponse
    member_promote: _rpc_pb2.MemberPromoteResponse
    lease_time_to_live: _rpc_pb2.LeaseTimeToLiveResponse
    lease_leases: _rpc_pb2.LeaseLeasesResponse
    lease_keep_alive: _rpc_pb2.LeaseKeepAliveResponse
    def __init__(self, range: _Optional[_Union[_rpc_pb2.RangeResponse, _Mapping]] = ..., put: _Optional[_Union[_rpc_pb2.PutResponse, _Mapping]] = ..., delete_range: _Optional[_Union[_rpc_pb2.DeleteRangeResponse, _Mapping]] = ..., txn: _Optional[_Union[_rpc_pb2.TxnResponse, _Mapping]] = ..., compaction: _Optional[_Union[_rpc_pb2.CompactionResponse, _Mapping]] = ..., lease_grant: _Optional[_Union[_rpc_pb2.LeaseGrantResponse, _Mapping]] = ..., lease_revoke: _Optional[_Union[_rpc_pb2.LeaseRevokeResponse, _Mapping]] = ..., alarm: _Optional[_Union[_rpc_pb2.AlarmResponse, _Mapping]] = ..., lease_checkpoint: _Optional[_Union[_rpc_pb2.LeaseCheckpointResponse, _Mapping]] = ..., auth_enable: _Optional[_Union[_rpc_pb2.AuthEnableResponse, _Mapping]] = ..., auth_disable: _Optional[_Union[_rpc_pb2.AuthDisableResponse, _Mapping]] = ..., authenticate: _Optional[_Union[_rpc_pb2.AuthenticateResponse, _Mapping]] = ..., auth_status: _Optional[_Union[_rpc_pb2.AuthStatusResponse, _Mapping]] = ..., auth_user_add: _Optional[_Union[_rpc_pb2.AuthUserAddResponse, _Mapping]] = ..., auth_user_delete: _Optional[_Union[_rpc_pb2.AuthUserDeleteResponse, _Mapping]] = ..., auth_user_get: _Optional[_Union[_rpc_pb2.AuthUserGetResponse, _Mapping]] = ..., auth_user_change_password: _Optional[_Union[_rpc_pb2.AuthUserChangePasswordResponse, _Mapping]] = ..., auth_user_grant_role: _Optional[_Union[_rpc_pb2.AuthUserGrantRoleResponse, _Mapping]] = ..., auth_user_revoke_role: _Optional[_Union[_rpc_pb2.AuthUserRevokeRoleResponse, _Mapping]] = ..., auth_user_list: _Optional[_Union[_rpc_pb2.AuthUserListResponse, _Mapping]] = ..., auth_role_list: _Optional[_Union[_rpc_pb2.AuthRoleListResponse, _Mapping]] = ..., auth_role_add: _Optional[_Union[_rpc_pb2.AuthRoleAddResponse, _Mapping]] = ..., auth_role_delete: _Optional[_Union[_rpc_pb2.AuthRoleDeleteResponse, _Mapping]] = ..., auth_role_get: _Optional[_Union[_rpc_pb2.AuthRoleGetResponse, _Mapping]] = ..., auth_role_grant_permission: _Optional[_Union[_rpc_pb2.AuthRoleGrantPermissionResponse, _Mapping]] = ..., auth_role_revoke_permission: _Optional[_Union[_rpc_pb2.AuthRoleRevokePermissionResponse, _Mapping]] = ..., status: _Optional[_Union[_rpc_pb2.StatusResponse, _Mapping]] = ..., defragment: _Optional[_Union[_rpc_pb2.DefragmentResponse, _Mapping]] = ..., hash: _Optional[_Union[_rpc_pb2.HashResponse, _Mapping]] = ..., hash_kv: _Optional[_Union[_rpc_pb2.HashKVResponse, _Mapping]] = ..., move_leader: _Optional[_Union[_rpc_pb2.MoveLeaderResponse, _Mapping]] = ..., downgrade: _Optional[_Union[_rpc_pb2.DowngradeResponse, _Mapping]] = ..., member_list: _Optional[_Union[_rpc_pb2.MemberListResponse, _Mapping]] = ..., member_add: _Optional[_Union[_rpc_pb2.MemberAddResponse, _Mapping]] = ..., member_remove: _Optional[_Union[_rpc_pb2.MemberRemoveResponse, _Mapping]] = ..., member_update: _Optional[_Union[_rpc_pb2.MemberUpdateResponse, _Mapping]] = ..., member_promote: _Optional[_Union[_rpc_pb2.MemberPromoteResponse, _Mapping]] = ..., lease_time_to_live: _Optional[_Union[_rpc_pb2.LeaseTimeToLiveResponse, _Mapping]] = ..., lease_leases: _Optional[_Union[_rpc_pb2.LeaseLeasesResponse, _Mapping]] = ..., lease_keep_alive: _Optional[_Union[_rpc_pb2.LeaseKeepAliveResponse, _Mapping]] = ...) -> None: ...

class DoCall(_message.Message):
    __slots__ = ("id", "request", "method", "token", "trace")
    class Method(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        DO: _ClassVar[DoCall.Method]
        CREDENTIALS: _ClassVar[DoCall.Method]
        RESOLVE_TOKEN: _ClassVar[DoCall.Method]
        AUTHENTICATE: _ClassVar[DoCall.Method]
    DO: DoCall.Method
    CREDENTIALS: DoCall.Method
    RESOLVE_TOKEN: DoCall.Method
    AUTHENTICATE: DoCall.Method
    ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    id: int
    request: bytes
    method: DoCall.Method
    token: str
    trace: bool
    def __init__(self, id: _Optional[int] = ..., request: _Optional[bytes] = ..., method: _Optional[_Union[DoCall.Method, str]] = ..., token: _Optional[str] = ..., trace: _Optional[bool] = ...) -> None: ...

class DoBatch(_message.Message):
    __slots__ = ("calls",)
    CALLS_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[DoCall]
    def __init__(self, calls: _Optional[_Iterable[_Union[DoCall, _Mapping]]] = ...) -> None: ...

class DoResult(_message.Message):
    __slots__ = ("id", "response", "code", "message", "size", "rest", "user", "stages")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    REST_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    id: int
    response: bytes
    code: int
    message: str
    size: int
    rest: bool
    user: str
    stages: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, id: _Optional[int] = ..., response: _Optional[bytes] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., size: _Optional[int] = ..., rest: _Optional[bool] = ..., user: _Optional[str] = ..., stages: _Optional[_Iterable[int]] = ...) -> None: ...

class DoResultBatch(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[DoResult]
    def __init__(self, results: _Optional[_Iterable[_Union[DoResult, _Mapping]]] = ...) -> None: ...

class CredentialsRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class CredentialsResponse(_message.Message):
    __slots__ = ("auth_enabled", "auth_revision", "found", "no_password", "password_hash", "lockout", "locked")
    AUTH_ENABLED_FIELD_NUMBER: _ClassVar[int]
    AUTH_REVISION_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    NO_PASSWORD_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_HASH_FIELD_NUMBER: _ClassVar[int]
    LOCKOUT_FIELD_NUMBER: _ClassVar[int]
    LOCKED_FIELD_NUMBER: _ClassVar[int]
    auth_enabled: bool
    auth_revision: int
    found: bool
    no_password: bool
    password_hash: bytes
    lockout: bool
    locked: bool
    def __init__(self, auth_enabled: _Optional[bool] = ..., auth_revision: _Optional[int] = ..., found: _Optional[bool] = ..., no_password: _Optional[bool] = ..., password_hash: _Optional[bytes] = ..., lockout: _Optional[bool] = ..., locked: _Optional[bool] = ...) -> None: ...

class ResolveTokenRequest(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: str
    def __init__(self, token: _Optional[str] = ...) -> None: ...

class ResolveTokenResponse(_message.Message):
    __slots__ = ("auth_enabled", "auth_revision", "valid", "username")
    AUTH_ENABLED_FIELD_NUMBER: _ClassVar[int]
    AUTH_REVISION_FIELD_NUMBER: _ClassVar[int]
    VALID_FIELD_NUMBER: _ClassVar[int]
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    auth_enabled: bool
    auth_revision: int
    valid: bool
    username: str
    def __init__(self, auth_enabled: _Optional[bool] = ..., auth_revision: _Optional[int] = ..., valid: _Optional[bool] = ..., username: _Optional[str] = ...) -> None: ...
