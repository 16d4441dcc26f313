from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EntryType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NORMAL: _ClassVar[EntryType]
    CONF_CHANGE: _ClassVar[EntryType]

class MessageType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MsgHup: _ClassVar[MessageType]
    MsgBeat: _ClassVar[MessageType]
    MsgProp: _ClassVar[MessageType]
    MsgApp: _ClassVar[MessageType]
    MsgAppResp: _ClassVar[MessageType]
    MsgVote: _ClassVar[MessageType]
    MsgVoteResp: _ClassVar[MessageType]
    MsgSnap: _ClassVar[MessageType]
    MsgHeartbeat: _ClassVar[MessageType]
    MsgHeartbeatResp: _ClassVar[MessageType]
    MsgUnreachable: _ClassVar[MessageType]
    MsgSnapStatus: _ClassVar[MessageType]
    MsgCheckQuorum: _ClassVar[MessageType]
    MsgTransferLeader: _ClassVar[MessageType]
    MsgTimeoutNow: _ClassVar[MessageType]
    MsgReadIndex: _ClassVar[MessageType]
    MsgReadIndexResp: _ClassVar[MessageType]
    MsgPreVote: _ClassVar[MessageType]
    MsgPreVoteResp: _ClassVar[MessageType]

class ConfChangeType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ADD_NODE: _ClassVar[ConfChangeType]
    REMOVE_NODE: _ClassVar[ConfChangeType]
    ADD_LEARNER_NODE: _ClassVar[ConfChangeType]
NORMAL: EntryType
CONF_CHANGE: EntryType
MsgHup: MessageType
MsgBeat: MessageType
MsgProp: MessageType
MsgApp: MessageType
MsgAppResp: MessageType
MsgVote: MessageType
MsgVoteResp: MessageType
MsgSnap: MessageType
MsgHeartbeat: MessageType
MsgHeartbeatResp: MessageType
MsgUnreachable: MessageType
MsgSnapStatus: MessageType
MsgCheckQuorum: MessageType
MsgTransferLeader: MessageType
MsgTimeoutNow: MessageType
MsgReadIndex: MessageType
MsgReadIndexResp: MessageType
MsgPreVote: MessageType
MsgPreVoteResp: MessageType
ADD_NODE: ConfChangeType
REMOVE_NODE: ConfChangeType
ADD_LEARNER_NODE: ConfChangeType

class Entry(_message.Message):
    __slots__ = ("term", "index", "type", "data")
    TERM_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    term: int
    index: int
    type: EntryType
    data: bytes
    def __init__(self, term: _Optional[int] = ..., index: _Optional[int] = ..., type: _Optional[_Union[EntryType, str]] = ..., data: _Optional[bytes] = ...) -> None: ...

class HardState(_message.Message):
    __slots__ = ("term", "vote", "commit")
    TERM_FIELD_NUMBER: _ClassVar[int]
    VOTE_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    term: int
    vote: int
    commit: int
    def __init__(self, term: _Optional[int] = ..., vote: _Optional[int] = ..., commit: _Optional[int] = ...) -> None: ...

class ConfState(_message.Message):
    __slots__ = ("voters", "learners")
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    voters: _containers.RepeatedScalarFieldContainer[int]
    learners: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, voters: _Optional[_Iterable[int]] = ..., learners: _Optional[_Iterable[int]] = ...) -> None: ...

class SnapshotMetadata(_message.Message):
    __slots__ = ("conf_state", "index", "term")
    CONF_STATE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    conf_state: ConfState
    index: int
    term: int
    def __init__(self, conf_state: _Optional[_Union[ConfState, _Mapping]] = ..., index: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("data", "metadata")
    DATA_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    metadata: SnapshotMetadata
    def __init__(self, data: _Optional[bytes] = ..., metadata: _Optional[_Union[SnapshotMetadata, _Mapping]] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("type", "to", "term", "log_term", "index", "entries", "commit", "snapshot", "reject", "reject_hint", "context")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    FROM_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LOG_TERM_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    REJECT_FIELD_NUMBER: _ClassVar[int]
    REJECT_HINT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    type: MessageType
    to: int
    term: int
    log_term: int
    index: int
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    commit: int
    snapshot: Snapshot
    reject: bool
    reject_hint: int
    context: bytes
    def __init__(self, type: _Optional[_Union[MessageType, str]] = ..., to: _Optional[int] = ..., term: _Optional[int] = ..., log_term: _Optional[int] = ..., index: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., commit: _Optional[int] = ..., snapshot: _Optional[_Union[Snapshot, _Mapping]] = ..., reject: _Optional[bool] = ..., reject_hint: _Optional[int] = ..., context: _Optional[bytes] = ..., **kwargs) -> None: ...

class ConfChange(_message.Message):
    __slots__ = ("type", "node_id", "context")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    type: ConfChangeType
    node_id: int
    context: bytes
    def __init__(self, type: _Optional[_Union[ConfChangeType, str]] = ..., node_id: _Optional[int] = ..., context: _Optional[bytes] = ...) -> None: ...
