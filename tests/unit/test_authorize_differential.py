"""The method table must not change a single authorization decision (raftgate/methods.py).

authorize (authstore/state/auth/authorize.py) now picks each request's check from the table; before
commit 90318f2 it was one if/elif chain. Hypothesis builds random auth states (users, roles, grants,
deletions, auth on or off, reached through the AuthStore's own calls) and random
InternalRaftRequests of every kind the table knows (nested Txns with compares and prev_kv, leases
with and without keys, user/role reads of self and others, alarms, members, maintenance, the
store-only entries, malformed requests with no or two kinds), under random headers (no user,
unknown user, old/new/zero revisions, simple and invalid tokens), and asks both the function of
9e1fa96 (loaded from git under another module name) and today's. Both must answer alike: the same
etcd error (code and message) or both allow.
"""

from __future__ import annotations

import base64
import importlib.util
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import lmdb
import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from authstore.state.auth import authorize as new_authorize
from authstore.state.auth.store import AuthStore
from protos.authpb import auth_pb2
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from raftgate.errors import Err, EtcdError
from raftgate.methods import REQUESTS

BEFORE_TABLE = "9e1fa96"
ROOT = Path(__file__).resolve().parents[2]
HASH = base64.b64encode(b"$2b$04$abcdefghijklmnopqrstuu5Jm0bq2b3DNHYXjJSOJ5WbWbYHJ8bTa").decode()

USERS = ["root", "alice", "bob"]
ROLES = ["root", "r1", "r2"]
KEYS = [b"a", b"a1", b"b", b"k", b"w", b"w1", b"z", b"\xff"]
ENDS = [b"", b"", b"\x00", b"b", b"c", b"x", b"w2", b"\xff"]
LEASES: dict[int, list[bytes]] = {1: [b"w1", b"a"], 2: [b"k"], 3: [], 4: [b"a1", b"z"]}


def _old_module() -> ModuleType:
    """authorize.py as it was before the table, imported as a module of its own."""
    try:
        source = subprocess.run(["git", "show", f"{BEFORE_TABLE}:authstore/state/auth/authorize.py"], cwd=ROOT,
                                capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"commit {BEFORE_TABLE} is not in this checkout")
    path = Path(tempfile.mkdtemp()) / "authorize_before_table.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("authorize_before_table", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def old() -> ModuleType:
    return _old_module()


def lease_keys(lease_id: int) -> list[bytes]:
    if lease_id not in LEASES:
        raise EtcdError(Err.LEASE_NOT_FOUND)
    return list(LEASES[lease_id])


# ---- auth states: a random sequence of the AuthStore's own calls, refusals ignored ----------------

perm = st.builds(lambda t, k, e: auth_pb2.Permission(permType=t, key=k, range_end=e),
                 st.sampled_from([0, 1, 2]), st.sampled_from(KEYS), st.sampled_from(ENDS))
users, roles = st.sampled_from(USERS), st.sampled_from(ROLES)
auth_call = st.one_of(
    st.tuples(st.just("user_add"), users.map(lambda u: pb.AuthUserAddRequest(name=u, hashedPassword=HASH))),
    st.tuples(st.just("role_add"), roles.map(lambda r: pb.AuthRoleAddRequest(name=r))),
    st.tuples(st.just("user_grant_role"), st.builds(lambda u, r: pb.AuthUserGrantRoleRequest(user=u, role=r),
                                                    users, roles)),
    st.tuples(st.just("user_revoke_role"), st.builds(lambda u, r: pb.AuthUserRevokeRoleRequest(name=u, role=r),
                                                     users, roles)),
    st.tuples(st.just("role_grant_permission"),
              st.builds(lambda r, p: pb.AuthRoleGrantPermissionRequest(name=r, perm=p), roles, perm)),
    st.tuples(st.just("user_delete"), users.map(lambda u: pb.AuthUserDeleteRequest(name=u))),
    st.tuples(st.just("role_delete"), roles.map(lambda r: pb.AuthRoleDeleteRequest(role=r))),
    st.tuples(st.just("enable"), st.just(pb.AuthEnableRequest())),
    st.tuples(st.just("disable"), st.just(pb.AuthDisableRequest())),
)
#: root with role root first, and alice with role r1, so that auth can be enabled and keys checked
setup = st.lists(auth_call, max_size=16).flatmap(lambda calls: st.sampled_from([
    calls,
    [("user_add", pb.AuthUserAddRequest(name="root", hashedPassword=HASH)),
     ("role_add", pb.AuthRoleAddRequest(name="root")),
     ("user_grant_role", pb.AuthUserGrantRoleRequest(user="root", role="root")),
     ("user_add", pb.AuthUserAddRequest(name="alice", hashedPassword=HASH)),
     ("role_add", pb.AuthRoleAddRequest(name="r1")),
     ("user_grant_role", pb.AuthUserGrantRoleRequest(user="alice", role="r1")), *calls,
     ("enable", pb.AuthEnableRequest())],
]))

# ---- requests -------------------------------------------------------------------------------------

key, end, lease = st.sampled_from(KEYS), st.sampled_from(ENDS), st.sampled_from([0, 1, 2, 3, 4, 9])
range_req = st.builds(pb.RangeRequest, key=key, range_end=end, serializable=st.booleans(),
                      keys_only=st.booleans(), count_only=st.booleans())
put_req = st.builds(pb.PutRequest, key=key, value=st.just(b"v"), lease=lease, prev_kv=st.booleans(),
                    ignore_value=st.booleans(), ignore_lease=st.booleans())
delete_req = st.builds(pb.DeleteRangeRequest, key=key, range_end=end, prev_kv=st.booleans())
compare = st.builds(pb.Compare, key=key, range_end=end, target=st.sampled_from([0, 1, 2, 3, 4]),
                    result=st.sampled_from([0, 1, 2, 3]))


def _txn(children: st.SearchStrategy[pb.RequestOp]) -> st.SearchStrategy[pb.TxnRequest]:
    return st.builds(pb.TxnRequest, compare=st.lists(compare, max_size=3), success=st.lists(children, max_size=3),
                     failure=st.lists(children, max_size=3))


request_op = st.recursive(
    st.one_of(range_req.map(lambda r: pb.RequestOp(request_range=r)),
              put_req.map(lambda r: pb.RequestOp(request_put=r)),
              delete_req.map(lambda r: pb.RequestOp(request_delete_range=r))),
    lambda children: _txn(children).map(lambda t: pb.RequestOp(request_txn=t)),
    max_leaves=8,
)
names = st.sampled_from([*USERS, "", "nobody"])
role_names = st.sampled_from([*ROLES, "", "nothing"])

BODIES: dict[str, st.SearchStrategy[Message]] = {
    "range": range_req,
    "put": put_req,
    "delete_range": delete_req,
    "txn": _txn(request_op),
    "lease_grant": st.builds(pb.LeaseGrantRequest, ID=lease, TTL=st.integers(0, 100)),
    "lease_revoke": st.builds(pb.LeaseRevokeRequest, ID=lease),
    "lease_keep_alive": st.builds(pb.LeaseKeepAliveRequest, ID=lease),
    "lease_time_to_live": st.builds(pb.LeaseTimeToLiveRequest, ID=lease, keys=st.booleans()),
    "alarm": st.builds(pb.AlarmRequest, action=st.sampled_from([0, 1, 2]), memberID=st.integers(0, 3),
                       alarm=st.sampled_from([0, 1, 2])),
    "auth_user_get": st.builds(pb.AuthUserGetRequest, name=names),
    "auth_role_get": st.builds(pb.AuthRoleGetRequest, role=role_names),
    "auth_user_add": st.builds(pb.AuthUserAddRequest, name=names),
    "auth_user_delete": st.builds(pb.AuthUserDeleteRequest, name=names),
    "auth_user_grant_role": st.builds(pb.AuthUserGrantRoleRequest, user=names, role=role_names),
    "auth_role_add": st.builds(pb.AuthRoleAddRequest, name=role_names),
    "auth_role_grant_permission": st.builds(pb.AuthRoleGrantPermissionRequest, name=role_names, perm=perm),
    "authenticate": st.builds(ipb.InternalAuthenticateRequest, name=names, password=st.just("x")),
    "compaction": st.builds(pb.CompactionRequest, revision=st.integers(0, 5), physical=st.booleans()),
    "member_add": st.builds(pb.MemberAddRequest, peerURLs=st.just(["http://127.0.0.1:1"]), isLearner=st.booleans()),
    "member_remove": st.builds(pb.MemberRemoveRequest, ID=st.integers(0, 3)),
}
#: kinds added after the table (the function before it never knew them): not compared here
AFTER_TABLE = frozenset({"auth_failures"})
#: every message field of InternalRaftRequest but the header, so kinds outside the table are asked too
FIELDS = [f for f in ipb.InternalRaftRequest.DESCRIPTOR.fields
          if f.message_type is not None and f.name != "header" and f.name not in AFTER_TABLE]


def _body(field: Any) -> st.SearchStrategy[Message]:
    if field.name in BODIES:
        return BODIES[field.name]
    cls = getattr(ipb.InternalRaftRequest(), field.name).__class__
    return st.just(cls())


def _request(fields: list[tuple[str, Message]]) -> ipb.InternalRaftRequest:
    req = ipb.InternalRaftRequest(ID=7)
    for name, body in fields:
        getattr(req, name).CopyFrom(body)
    return req


one_request = st.sampled_from(FIELDS).flatmap(lambda f: _body(f).map(lambda b: [(f.name, b)]))
malformed = st.lists(st.sampled_from(FIELDS).flatmap(lambda f: _body(f).map(lambda b: (f.name, b))),
                     max_size=2, unique_by=lambda fb: fb[0])
requests = st.one_of(one_request, one_request, one_request, one_request, malformed).map(_request)


def test_every_request_kind_of_the_table_is_generated() -> None:
    assert set(REQUESTS) - AFTER_TABLE <= {f.name for f in FIELDS}


def _world(path: Path, calls: list[tuple[str, Message]]) -> lmdb.Environment:
    env = lmdb.open(str(path), max_dbs=32, map_size=1 << 24)
    store = AuthStore(env)
    for method, req in calls:
        try:
            with env.begin(write=True) as txn:
                getattr(store, method)(txn, req)
        except EtcdError:
            pass  # refused calls leave no trace (their transaction is aborted)
    return env


def _decide(module: ModuleType, env: lmdb.Environment, req: ipb.InternalRaftRequest, read: bool,
            all_leases: Callable[[], list[int]] | None) -> tuple[str, Any, str] | None:
    store = AuthStore(env)  # a store of its own: no permission cache shared between the two
    with env.begin() as txn:
        try:
            module.authorize(store, txn, req.header, req, lease_keys, read=read, all_leases=all_leases)
        except EtcdError as exc:
            return ("EtcdError", exc.err, str(exc))
        except Exception as exc:  # noqa: BLE001 - any other outcome must be the same too
            return (type(exc).__name__, None, str(exc))
    return None


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(calls=setup, req=requests, user=st.sampled_from(["alice", "alice", "alice", "bob", "root", "", "nobody"]),
       rev_shift=st.sampled_from([None, -2, -1, 0, 1]),
       simple=st.booleans(), invalid=st.integers(0, 7), read=st.booleans(), leases=st.booleans())
def test_authorize_decides_as_before_the_table(old: ModuleType, calls: list[tuple[str, Message]],
                                               req: ipb.InternalRaftRequest, user: str, rev_shift: int | None,
                                               simple: bool, invalid: int, read: bool, leases: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = _world(Path(tmp), calls)
        try:
            with env.begin() as txn:
                rev = AuthStore(env).revision(txn)
            req.header.CopyFrom(ipb.RequestHeader(
                username=user, auth_revision=0 if rev_shift is None else max(0, rev + rev_shift),
                simple_token=simple, invalid_token=invalid == 0))
            all_leases = (lambda: sorted(LEASES)) if leases else None
            before = _decide(old, env, req, read, all_leases)
            now = _decide(new_authorize, env, req, read, all_leases)
            assert now == before, (req, calls)
        finally:
            env.close()
