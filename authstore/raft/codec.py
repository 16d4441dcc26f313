"""Conversion between the core's values (``types.py``) and the ``raftpb`` protobuf messages.

Only the edges use this: the WAL (entries, hard state, snapshots) and the peer transport
(messages). Conf changes travel inside entry data, so the core decodes them here as well.
"""

from __future__ import annotations

from protos.raftpb import raft_pb2 as pb

from .types import ConfChange, ConfState, Entry, HardState, Message, Snapshot, SnapshotMetadata


def entry_to_pb(e: Entry) -> pb.Entry:
    return pb.Entry(term=e.term, index=e.index, type=e.type, data=e.data)  # type: ignore[arg-type]


def entry_from_pb(p: pb.Entry) -> Entry:
    return Entry(p.term, p.index, p.type, p.data)


def hard_state_to_pb(hs: HardState) -> pb.HardState:
    return pb.HardState(term=hs.term, vote=hs.vote, commit=hs.commit)


def hard_state_from_pb(p: pb.HardState) -> HardState:
    return HardState(p.term, p.vote, p.commit)


def conf_state_to_pb(cs: ConfState) -> pb.ConfState:
    return pb.ConfState(voters=cs.voters, learners=cs.learners)


def conf_state_from_pb(p: pb.ConfState) -> ConfState:
    return ConfState(list(p.voters), list(p.learners))


def snapshot_to_pb(s: Snapshot) -> pb.Snapshot:
    md = s.metadata
    return pb.Snapshot(data=s.data, metadata=pb.SnapshotMetadata(
        conf_state=conf_state_to_pb(md.conf_state), index=md.index, term=md.term))


def snapshot_from_pb(p: pb.Snapshot) -> Snapshot:
    md = p.metadata
    return Snapshot(p.data, SnapshotMetadata(conf_state_from_pb(md.conf_state), md.index, md.term))


def message_to_pb(m: Message) -> pb.Message:
    p = pb.Message(type=m.type, to=m.to, term=m.term, log_term=m.log_term, index=m.index,  # type: ignore[arg-type]
                   entries=[entry_to_pb(e) for e in m.entries], commit=m.commit, reject=m.reject,
                   reject_hint=m.reject_hint, context=m.context)
    setattr(p, "from", m.frm)
    if m.snapshot is not None:
        p.snapshot.CopyFrom(snapshot_to_pb(m.snapshot))
    return p


def message_from_pb(p: pb.Message) -> Message:
    return Message(p.type, to=p.to, frm=getattr(p, "from"), term=p.term, log_term=p.log_term, index=p.index,
                   entries=[entry_from_pb(e) for e in p.entries], commit=p.commit,
                   snapshot=snapshot_from_pb(p.snapshot) if p.HasField("snapshot") else None,
                   reject=p.reject, reject_hint=p.reject_hint, context=p.context)


def encode_message(m: Message) -> bytes:
    return message_to_pb(m).SerializeToString()


def decode_message(data: bytes) -> Message:
    return message_from_pb(pb.Message.FromString(data))


def encode_conf_change(cc: ConfChange) -> bytes:
    return pb.ConfChange(type=cc.type, node_id=cc.node_id, context=cc.context).SerializeToString()  # type: ignore[arg-type]


def decode_conf_change(data: bytes) -> ConfChange:
    p = pb.ConfChange.FromString(data)
    return ConfChange(p.type, p.node_id, p.context)
