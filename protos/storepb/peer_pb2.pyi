from protos.raftpb import raft_pb2 as _raft_pb2
from protos.etcdserverpb import rpc_pb2 as _rpc_pb2
from protos.storepb import store_pb2 as _store_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PeerAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MessageBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_raft_pb2.Message]
    def __init__(self, messages: _Optional[_Iterable[_Union[_raft_pb2.Message, _Mapping]]] = ...) -> None: ...

class SnapshotChunk(_message.Message):
    __slots__ = ("data", "message", "sha256")
    DATA_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    message: _raft_pb2.Message
    sha256: bytes
    def __init__(self, data: _Optional[bytes] = ..., message: _Optional[_Union[_raft_pb2.Message, _Mapping]] = ..., sha256: _Optional[bytes] = ...) -> None: ...
