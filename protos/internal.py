"""Constants of raftgate's internal contract (proxy <-> store, store <-> store), defined once.

Error texts live in :mod:`raftgate.errors` (the one error table, e.g. ``REVISION_MOVED``); the
field numbers are read from the generated descriptor, so the .proto stays their one source.
"""

from __future__ import annotations

from protos.etcdserverpb import raft_internal_pb2

#: gRPC metadata carrying a client's token from a sidecar-class proxy to the store, on the calls
#: that are not DoStream / WatchBatches messages (those carry it in a field): the store verifies it.
INTERNAL_TOKEN_METADATA = "x-raftgate-client-token"
#: Development shared secrets travel as proofs, never themselves: raftgate/secret_proof.py.
#: The largest message each of the store's ports takes (a DoStream or WatchShared message, a Raft
#: message to a peer).
STORE_MESSAGE_BYTES = 64 << 20
#: The largest --max-request-bytes a proxy takes: a request of that size (a stream's message may be
#: 512 KiB more, as etcd's), with its stamped header, its caller's token (metadata: under 1 MiB)
#: and its call's framing, still fits a store message (a larger one would be refused with the whole
#: stream carrying it, every other caller's calls on it too).
MAX_REQUEST_BYTES_LIMIT = STORE_MESSAGE_BYTES - (2 << 20)
#: The most bytes one batch message of an internal stream carries (DoStream both ways, watch
#: responses, Raft messages); a single larger item still travels, alone. Well under the 64 MiB
#: gRPC message limit of the store's ports.
STREAM_BATCH_BYTES = 4 << 20
#: The most sub-streams one Store.WatchShared stream carries at once: the store refuses one more
#: (`too many requests`), the proxy opens another stream to the node before it gets there.
WATCH_SHARED_MAX_SUBS = 10_000
#: The most bytes of one answer a DoStream message carries; a larger answer travels in parts of
#: this size, interleaved with other answers (each DoStream message then stays within
#: STREAM_BATCH_BYTES).
ANSWER_PART_BYTES = 1 << 20
#: The largest answer a client is given: etcd's server sends up to math.MaxInt32 bytes (grpc-go
#: refuses a larger one with RESOURCE_EXHAUSTED, "trying to send message larger than max").
MAX_ANSWER_BYTES = 2**31 - 1
#: What the InternalResponse around a client's answer adds: a field tag and a length.
ANSWER_ENVELOPE_BYTES = 8

_FIELDS = raft_internal_pb2.InternalRaftRequest.DESCRIPTOR.fields_by_name
#: InternalRaftRequest field numbers the proxy builds requests with itself.
AUTHENTICATE_FIELD: int = _FIELDS["authenticate"].number
AUTH_STATUS_FIELD: int = _FIELDS["auth_status"].number
