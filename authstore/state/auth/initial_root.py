"""A new cluster's root, from ``--initial-root-password-file``: part of the cluster's first log
entries, so there is never a moment when the store serves with authentication disabled.

Without it, a new cluster runs with auth off until someone creates root and enables auth, and
anyone who reaches the store first can create root (or grant role root to themselves). With it,
the first entries of a NEW cluster are, after the initial members' conf changes:
``UserAdd root`` (a bcrypt hash, never the password), ``RoleAdd root``, ``UserGrantRole root
root``, ``AuthEnable`` - committed at start-up, like the conf changes, and applied before the node
opens its internal port. A restart, or a member joining an existing cluster, adds nothing.

Every initial member writes these entries itself, and Raft assumes that entries with the same
index and term are the same on every node: so they are derived identically everywhere. bcrypt
needs a salt; here it comes from the cluster's identity (initial cluster token and member IDs),
never from the password, so every member computes the same hash from the same file. A salt only
has to be unique, not secret; what this gives up is that someone who knows the cluster's
configuration could start guessing before the hash exists. Every initial member must be given
the same password file (the Helm chart mounts one Secret into every store pod).
"""

from __future__ import annotations

import base64
import hashlib

import bcrypt

from authstore.raft.types import Entry, EntryType
from authstore.state.auth.store import ROOT_ROLE, ROOT_USER
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb

MIN_COST, MAX_COST, DEFAULT_COST = 4, 31, 10
_STD = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_BCRYPT = b"./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"




def cluster_salt(cost: int, cluster_id: int, cluster_token: str) -> bytes:
    """A bcrypt salt (``$2a$NN$`` + 22 characters) unique to this cluster's identity."""
    raw = hashlib.sha256(b"raftgate initial root\n" + cluster_id.to_bytes(8, "big") + cluster_token.encode()).digest()
    encoded = base64.b64encode(raw[:16]).rstrip(b"=").translate(bytes.maketrans(_STD, _BCRYPT))
    return b"$2a$%02d$" % cost + encoded[:22]


def hash_password(password: str, cost: int, cluster_id: int, cluster_token: str) -> bytes:
    return bcrypt.hashpw(password.encode("utf-8"), cluster_salt(cost, cluster_id, cluster_token))


def initial_root_entries(hashed: bytes, first_index: int, term: int = 1) -> list[Entry]:
    """The four entries that create root and enable auth, from ``first_index`` on."""
    requests = [
        ipb.InternalRaftRequest(auth_user_add=pb.AuthUserAddRequest(
            name=ROOT_USER, hashedPassword=base64.b64encode(hashed).decode("ascii"))),
        ipb.InternalRaftRequest(auth_role_add=pb.AuthRoleAddRequest(name=ROOT_ROLE)),
        ipb.InternalRaftRequest(auth_user_grant_role=pb.AuthUserGrantRoleRequest(user=ROOT_USER, role=ROOT_ROLE)),
        ipb.InternalRaftRequest(auth_enable=pb.AuthEnableRequest()),
    ]
    return [Entry(term, first_index + i, EntryType.NORMAL, r.SerializeToString()) for i, r in enumerate(requests)]
