"""Metric registration and naming (both programs), and the counters moving where they are hooked."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import grpc
import grpc.aio
import lmdb
import pytest
from prometheus_client import REGISTRY
from prometheus_client.metrics_core import Metric

import authstore.metrics as store_metrics
import proxy.metrics as proxy_metrics
from authstore.state.auth.authorize import authorize
from authstore.state.auth.store import AuthStore
from protos.authpb import auth_pb2
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from protos.storepb import store_pb2
from proxy import instrument, passwords
from proxy.authenticate import Authenticator
from proxy.passwords import PasswordHasher
from proxy.tokens.jwt import JwtProvider
from raftgate.errors import REVISION_MOVED, Err, EtcdError
from raftgate.methods import METHODS

SNAKE = re.compile(r"[a-z][a-z0-9_]*")
#: Label names that would put a secret or an unbounded, client-chosen value into a series.
FORBIDDEN_LABELS = {"user", "username", "name", "key", "range_end", "token", "password", "peer", "client"}


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def raftgate_families() -> list[Metric]:
    return [m for m in REGISTRY.collect() if m.name.startswith("raftgate_")]


# --- naming ---------------------------------------------------------------------------------------


def test_both_programs_define_their_metrics_under_their_own_prefix() -> None:
    names = {m.name for m in raftgate_families()}
    for family in names:
        assert family.startswith(("raftgate_proxy_", "raftgate_store_")), family
    expected = {
        "raftgate_proxy_authentications", "raftgate_proxy_bcrypt_duration_seconds", "raftgate_proxy_bcrypt_queue_depth",
        "raftgate_proxy_authenticate_revision_retries", "raftgate_proxy_token_validations", "raftgate_proxy_requests",
        "raftgate_proxy_permission_denials", "raftgate_proxy_old_revision_refusals", "raftgate_proxy_open_streams",
        "raftgate_store_permission_denials", "raftgate_store_old_revision_refusals", "raftgate_store_auth_revision",
        "raftgate_store_proposals", "raftgate_store_proposal_batch_size", "raftgate_store_apply_duration_seconds",
        "raftgate_store_apply_lag_entries", "raftgate_store_leader_changes", "raftgate_store_is_leader",
        "raftgate_store_raft_term", "raftgate_store_open_watches", "raftgate_store_wal_fsync_duration_seconds",
    }
    assert expected <= names, expected - names


def test_names_types_and_labels_follow_prometheus_conventions() -> None:
    for family in raftgate_families():
        assert SNAKE.fullmatch(family.name), family.name
        assert family.documentation, f"{family.name} has no help text"
        if family.type == "counter":
            assert all(s.name.endswith("_total") for s in family.samples), family.name
        else:
            assert not family.name.endswith("_total"), f"{family.name}: only counters end in _total"
        if "duration" in family.name or "time" in family.name:
            assert family.type == "histogram" and family.name.endswith("_seconds"), family.name
        for sample in family.samples:
            assert not sample.name.endswith("_created"), "created series are disabled"
            for label in sample.labels:
                if label == "le":
                    continue
                assert SNAKE.fullmatch(label), (family.name, label)
                assert label not in FORBIDDEN_LABELS, (family.name, label)


def test_closed_label_sets_are_exported_before_the_first_event() -> None:
    for result in proxy_metrics.AUTH_RESULTS:
        assert REGISTRY.get_sample_value("raftgate_proxy_authentications_total", {"result": result}) is not None
    for kind in proxy_metrics.TOKEN_KINDS:
        for result in proxy_metrics.TOKEN_RESULTS:
            labels = {"kind": kind, "result": result}
            assert REGISTRY.get_sample_value("raftgate_proxy_token_validations_total", labels) is not None


def test_request_kind_labels_are_the_store_kind_names() -> None:
    fields = {f.name for f in ipb.InternalRaftRequest.DESCRIPTOR.fields}
    for method in METHODS:
        kind = proxy_metrics.request_kind(method.field)
        assert kind in fields or kind == "other", (method, kind)
    assert proxy_metrics.request_kind(4) == "put"
    assert proxy_metrics.request_kind(3) == "range"


# --- store hooks ----------------------------------------------------------------------------------


@pytest.fixture
def auth_env(tmp_path: Path) -> Iterator[tuple[lmdb.Environment, AuthStore]]:
    """Auth enabled; root; alice with READWRITE on key "a" only."""
    env = lmdb.open(str(tmp_path), max_dbs=32, map_size=1 << 26)
    auth = AuthStore(env)
    hashed = base64.b64encode(bcrypt.hashpw(b"pw", bcrypt.gensalt(4))).decode()
    perm = auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE, key=b"a")
    with env.begin(write=True) as txn:
        auth.user_add(txn, pb.AuthUserAddRequest(name="root", hashedPassword=hashed))
        auth.user_grant_role(txn, pb.AuthUserGrantRoleRequest(user="root", role="root"))
        auth.user_add(txn, pb.AuthUserAddRequest(name="alice", hashedPassword=hashed))
        auth.role_add(txn, pb.AuthRoleAddRequest(name="r"))
        auth.role_grant_permission(txn, pb.AuthRoleGrantPermissionRequest(name="r", perm=perm))
        auth.user_grant_role(txn, pb.AuthUserGrantRoleRequest(user="alice", role="r"))
        auth.enable(txn, pb.AuthEnableRequest())
    yield env, auth
    env.close()


def _authorize(env: lmdb.Environment, auth: AuthStore, key: bytes, revision: int, *, read: bool) -> Err | None:
    req = ipb.InternalRaftRequest(header=ipb.RequestHeader(username="alice", auth_revision=revision),
                                  put=pb.PutRequest(key=key, value=b"v"))
    with env.begin() as txn:
        try:
            authorize(auth, txn, req.header, req, lambda _lease: [], read=read)
        except EtcdError as e:
            return e.err
    return None


def test_store_counts_denials_and_old_revisions_by_kind_and_stage(
    auth_env: tuple[lmdb.Environment, AuthStore],
) -> None:
    env, auth = auth_env
    with env.begin() as txn:
        current = auth.revision(txn)
    denied = {"kind": "put", "stage": "apply"}
    old = {"kind": "put", "stage": "read"}
    before = value("raftgate_store_permission_denials_total", **denied), value(
        "raftgate_store_old_revision_refusals_total", **old)
    assert _authorize(env, auth, b"a", current, read=False) is None
    assert _authorize(env, auth, b"b", current, read=False) is Err.PERMISSION_DENIED
    assert _authorize(env, auth, b"a", current - 1, read=True) is Err.AUTH_OLD_REVISION
    after = value("raftgate_store_permission_denials_total", **denied), value(
        "raftgate_store_old_revision_refusals_total", **old)
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)


def test_store_leadership_and_lag_helpers() -> None:
    changes = value("raftgate_store_leader_changes_total")
    store_metrics.observe_leadership(leader=7, term=3, me=7)
    assert value("raftgate_store_is_leader") == 1 and value("raftgate_store_raft_term") == 3
    store_metrics.observe_leadership(leader=7, term=3, me=7)  # no change
    store_metrics.observe_leadership(leader=9, term=4, me=7)
    assert value("raftgate_store_is_leader") == 0 and value("raftgate_store_raft_term") == 4
    store_metrics.observe_leadership(leader=0, term=5, me=7)  # election under way
    store_metrics.observe_leadership(leader=9, term=5, me=7)  # same node re-elected: still an election
    assert value("raftgate_store_leader_changes_total") - changes >= 2
    store_metrics.observe_indexes(committed=10, applied=7)
    assert value("raftgate_store_apply_lag_entries") == 3
    store_metrics.observe_indexes(committed=10, applied=12)  # a snapshot can put applied ahead
    assert value("raftgate_store_apply_lag_entries") == 0
    proposals = value("raftgate_store_proposals_total")
    store_metrics.observe_proposal()
    store_metrics.observe_batch(5)
    assert value("raftgate_store_proposals_total") == proposals + 1
    assert value("raftgate_store_proposal_batch_size_bucket", le="8.0") >= 1


# --- proxy hooks ----------------------------------------------------------------------------------


class FakeStore:
    """Just enough of StoreClient for the Authenticator."""

    def __init__(self, *, enabled: bool = True, password: bytes = b"pw", moves: int = 0) -> None:
        self.enabled = enabled
        self.hash = bcrypt.hashpw(password, bcrypt.gensalt(4))
        self.moves = moves

    async def credentials(self, name: str, timeout: float | None = None) -> store_pb2.CredentialsResponse:
        return store_pb2.CredentialsResponse(auth_enabled=self.enabled, auth_revision=3, found=name == "alice",
                                             password_hash=self.hash)

    async def do(self, data: bytes, timeout: float | None = None) -> bytes:
        if self.moves:
            self.moves -= 1
            raise grpc.aio.AioRpcError(grpc.StatusCode.ABORTED, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       REVISION_MOVED)
        return store_pb2.InternalResponse(authenticate=pb.AuthenticateResponse(token="t.1")).SerializeToString()


def _authenticate(store: FakeStore, name: str, password: str, timeout: float | None = None) -> Err | None:
    async def go() -> Err | None:
        hasher = PasswordHasher(4, 2)
        try:
            auth = Authenticator(store, hasher, jwt=None, simple_ttl_seconds=300)  # type: ignore[arg-type]
            await auth.authenticate(pb.AuthenticateRequest(name=name, password=password), timeout)
        except EtcdError as e:
            return e.err
        finally:
            hasher.close()
        return None

    return asyncio.run(go())


@pytest.mark.parametrize(
    ("store", "name", "password", "result", "err"),
    [
        (FakeStore(), "alice", "pw", "ok", None),
        (FakeStore(), "alice", "wrong", "auth_failed", Err.AUTH_FAILED),
        (FakeStore(), "nobody", "pw", "auth_failed", Err.AUTH_FAILED),
        (FakeStore(enabled=False), "alice", "pw", "not_enabled", Err.AUTH_NOT_ENABLED),
        # The revision never stops moving: retried until the deadline, then etcd's timeout.
        (FakeStore(moves=10**9), "alice", "pw", "revision_retry_exhausted", Err.TIMEOUT),
    ],
)
def test_authentications_are_counted_by_result(
    store: FakeStore, name: str, password: str, result: str, err: Err | None
) -> None:
    before = value("raftgate_proxy_authentications_total", result=result)
    checks = value("raftgate_proxy_bcrypt_duration_seconds_count", operation="check")
    assert _authenticate(store, name, password, timeout=0.3) is err
    assert value("raftgate_proxy_authentications_total", result=result) == before + 1
    if result != "not_enabled":
        assert value("raftgate_proxy_bcrypt_duration_seconds_count", operation="check") > checks
    assert value("raftgate_proxy_bcrypt_queue_depth", operation="check") == 0


def test_revision_retries_are_counted() -> None:
    before = value("raftgate_proxy_authenticate_revision_retries_total")
    assert _authenticate(FakeStore(moves=2), "alice", "pw") is None
    assert value("raftgate_proxy_authenticate_revision_retries_total") == before + 2


def test_bcrypt_queue_depth_counts_waiting_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four hashes on one worker: while the first runs, three wait, and the gauge says so. The
    worker is held while the gauge is read: a worker that drains the queue before the read (its
    thread runs whenever the test's thread drops the GIL) made this test fail once with 0."""
    held = threading.Event()
    real = passwords._hashpw

    def hashpw_held(raw: bytes, cost: int) -> bytes:
        held.wait(30)
        return real(raw, cost)

    monkeypatch.setattr(passwords, "_hashpw", hashpw_held)

    async def go() -> list[float]:
        hasher = PasswordHasher(4, 1)
        seen: list[float] = []
        try:
            before = value("raftgate_proxy_bcrypt_queue_depth", operation="hash")
            checks_before = value("raftgate_proxy_bcrypt_queue_depth", operation="check")
            jobs = [asyncio.ensure_future(hasher.hash("pw")) for _ in range(4)]
            for _ in range(500):  # until the worker holds the first job (bounded: 5 s)
                await asyncio.sleep(0.01)
                if value("raftgate_proxy_bcrypt_queue_depth", operation="hash") - before == 3:
                    break
            seen.append(value("raftgate_proxy_bcrypt_queue_depth", operation="hash") - before)
            seen.append(value("raftgate_proxy_bcrypt_queue_depth", operation="check") - checks_before)
            held.set()
            await asyncio.gather(*jobs)
            seen.append(value("raftgate_proxy_bcrypt_queue_depth", operation="hash") - before)
        finally:
            held.set()
            hasher.close()
        return seen

    waiting, checks_waiting, done = asyncio.run(go())
    # Hashing waits in its own lane: the check lane's depth does not move.
    assert (waiting, checks_waiting, done) == (3, 0, 0)


METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"  # "Metrics and health"


def _documented_metric_rows() -> list[tuple[list[str], str]]:
    """(metric names, labels cell) of each row of the metrics table (docs/kubernetes.md)."""
    rows: list[tuple[list[str], str]] = []
    lines = iter(METRICS_DOC.read_text().splitlines())
    for line in lines:
        if line.startswith("| metric | type | labels |"):
            break
    next(lines)  # the | --- | row
    for line in lines:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append((re.findall(r"`(raftgate_[a-z0-9_]+)`", cells[0]), cells[2]))
    return rows


def _label_names(metric: str) -> tuple[str, ...]:
    collector = REGISTRY._names_to_collectors[metric]  # type: ignore[attr-defined]
    return tuple(collector._labelnames)


def test_metric_labels_are_the_documented_tables() -> None:
    """Every metric in the documented table has exactly the labels the table names (a label in
    ``(+ `x`)`` is on some of the row's metrics only)."""
    rows = _documented_metric_rows()
    assert rows
    for names, cell in rows:
        optional = set(re.findall(r"`([a-z_]+)`", "".join(re.findall(r"\(\+[^)]*\)", cell))))
        named = set(re.findall(r"`([a-z_]+)`", cell))
        required = named - optional
        seen: set[str] = set()
        for name in names:
            labels = set(_label_names(name))
            assert required <= labels <= named, (name, sorted(labels), cell)
            seen |= labels
        assert seen == named, (names, sorted(seen), cell)


def test_bcrypt_metrics_name_the_two_lanes_as_the_docs_do() -> None:
    """The docs name the operation values; both lanes' queue depths exist from the start."""
    (cell,) = [cell for names, cell in _documented_metric_rows() if "raftgate_proxy_bcrypt_queue_depth" in names]
    assert re.fullmatch(r"`operation` \(check, hash\)", cell), cell
    assert set(proxy_metrics.BcryptOperation.__args__) == {"check", "hash"}  # type: ignore[attr-defined]
    for operation in ("check", "hash"):
        assert REGISTRY.get_sample_value("raftgate_proxy_bcrypt_queue_depth", {"operation": operation}) is not None


def test_jwt_validations_are_counted_by_result() -> None:
    now = [1000.0]
    jwt = JwtProvider("HS256", private_key=b"k" * 32, ttl_ns=10 * 10**9, clock=lambda: now[0])
    token = jwt.sign("alice", 3)

    def delta(result: str, action: Any) -> float:
        before = value("raftgate_proxy_token_validations_total", kind="jwt", result=result)
        action()
        return value("raftgate_proxy_token_validations_total", kind="jwt", result=result) - before

    assert delta("valid", lambda: jwt.verify(token)) == 1
    assert delta("cache_hit", lambda: jwt.verify(token)) == 1
    assert delta("invalid", lambda: jwt.verify(token[:-2] + "xx")) == 1
    now[0] += 60
    assert delta("expired", lambda: jwt.verify(token)) == 1  # from the cache
    assert delta("expired", lambda: jwt.verify(token)) == 1  # verified again, now expired


class FakeContext:
    def __init__(self) -> None:
        self._code: grpc.StatusCode | None = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self._code = code
        raise RuntimeError(details)  # stands in for grpc's AbortError

    def code(self) -> grpc.StatusCode | None:
        return self._code


def test_requests_and_open_streams_are_counted_by_method_and_code() -> None:
    put = next(m for m in METHODS if m.name == "Put")
    snapshot = next(m for m in METHODS if m.name == "Snapshot")

    async def ok(_method: Any, _request: Any, _context: Any) -> bytes:
        return b""

    async def denied(_method: Any, _request: Any, context: FakeContext) -> bytes:
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied")
        return b""

    async def chunks(_method: Any, _request: Any, _context: Any) -> Any:
        yield b"1"
        yield b"2"

    labels = {"service": "etcdserverpb.KV", "method": "Put"}
    streams = {"service": "etcdserverpb.Maintenance", "method": "Snapshot"}

    async def go() -> list[float]:
        await instrument.unary(put, lambda r, c: ok(put, r, c))(b"", FakeContext())
        with pytest.raises(RuntimeError):
            await instrument.unary(put, lambda r, c: denied(put, r, c))(b"", FakeContext())
        gen = instrument.stream(snapshot, lambda r, c: chunks(snapshot, r, c))(b"", FakeContext())
        first = await gen.__anext__()
        assert first == b"1"
        open_now = value("raftgate_proxy_open_streams", **streams)
        assert [x async for x in gen] == [b"2"]
        return [open_now, value("raftgate_proxy_open_streams", **streams)]

    ok_before = value("raftgate_proxy_requests_total", code="OK", **labels)
    denied_before = value("raftgate_proxy_requests_total", code="PERMISSION_DENIED", **labels)
    snap_before = value("raftgate_proxy_requests_total", code="OK", **streams)
    during, after = asyncio.run(go())
    assert value("raftgate_proxy_requests_total", code="OK", **labels) == ok_before + 1
    assert value("raftgate_proxy_requests_total", code="PERMISSION_DENIED", **labels) == denied_before + 1
    assert value("raftgate_proxy_requests_total", code="OK", **streams) == snap_before + 1
    assert (during, after) == (1, 0)


def test_one_handler_counts_every_call_under_its_own_code_and_duration() -> None:
    """A handler serves many calls: each is counted under the code it ended with (the series a
    handler looked up before stay the ones /metrics shows), and each is timed."""
    put = next(m for m in METHODS if m.name == "Put")
    labels = {"service": "etcdserverpb.KV", "method": "Put"}
    outcomes = ["ok", "denied", "ok", "invalid", "denied", "ok"]

    async def behaviour(_request: Any, context: FakeContext) -> bytes:
        outcome = outcomes.pop(0)
        if outcome == "denied":
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied")
        if outcome == "invalid":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: key is not provided")
        return b""

    handler = instrument.unary(put, behaviour)

    async def go() -> None:
        for _ in range(len(outcomes)):
            with contextlib.suppress(RuntimeError):
                await handler(b"", FakeContext())

    codes = ("OK", "PERMISSION_DENIED", "INVALID_ARGUMENT")
    before = {code: value("raftgate_proxy_requests_total", code=code, **labels) for code in codes}
    timed = value("raftgate_proxy_request_duration_seconds_count", **labels)
    asyncio.run(go())
    moved = {code: value("raftgate_proxy_requests_total", code=code, **labels) - before[code] for code in codes}
    assert moved == {"OK": 3, "PERMISSION_DENIED": 2, "INVALID_ARGUMENT": 1}
    assert value("raftgate_proxy_request_duration_seconds_count", **labels) == timed + 6


def test_store_refusals_seen_by_the_proxy_are_counted_by_kind() -> None:
    before = value("raftgate_proxy_permission_denials_total", kind="put")
    old = value("raftgate_proxy_old_revision_refusals_total", kind="range")
    proxy_metrics.store_refusal(4, Err.PERMISSION_DENIED.code, Err.PERMISSION_DENIED.message)
    proxy_metrics.store_refusal(3, Err.AUTH_OLD_REVISION.code, Err.AUTH_OLD_REVISION.message)
    proxy_metrics.store_refusal(4, grpc.StatusCode.UNAVAILABLE, "etcdserver: no leader")
    assert value("raftgate_proxy_permission_denials_total", kind="put") == before + 1
    assert value("raftgate_proxy_old_revision_refusals_total", kind="range") == old + 1
