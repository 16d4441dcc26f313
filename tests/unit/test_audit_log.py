"""The audit log (proxy/audit/): records never hold a secret, levels, bounds, fail-closed,
reopen. In-process: the wrappers run with the JSON gateway's context (the same handlers)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from protos.etcdserverpb import rpc_pb2 as pb
from proxy import metrics
from proxy.audit import handlers, writer
from proxy.audit.records import AUTH_METHODS, MAX_KEY_BYTES, MAX_RECORD_BYTES, MAX_TEXT_CHARS, MAX_TXN_OPS, is_refusal
from proxy.audit.writer import AuditLog
from proxy.config import ConfigError, load
from proxy.gateway import GatewayContext
from proxy.gateway_errors import Abort
from proxy.watch import _State, track
from raftgate.errors import Err
from raftgate.local import check_children, parse
from raftgate.methods import METHODS
from raftgate.token_verifier import fingerprint
from tests.support.processes import wait_for

BY_NAME = {m.name: m for m in METHODS}
PEER = "ipv4:127.0.0.1:40000"


def lines(log: AuditLog) -> list[dict[str, Any]]:
    """The records queued (the writer is not started in most tests)."""
    return [json.loads(line) for line in log._lines]


def call(log: AuditLog, name: str, request: bytes, *, token: str | None = None, answer: bytes = b"",
         refuse: Err | None = None, user: str = "", revision: int = 0) -> None:
    """One call through the audit wrapper; the behaviour notes an identity, then answers or refuses."""
    method = BY_NAME[name]

    async def behaviour(req: bytes, context: Any) -> bytes:
        handlers.noted_token(token)
        handlers.noted_identity(user, revision)
        if refuse is not None:
            await context.abort(refuse.code, refuse.message)
        return answer

    metadata = () if token is None else (("token", token),)
    context = GatewayContext(metadata, PEER, None)

    async def run() -> None:
        with contextlib.suppress(Abort):
            await handlers.unary(log, method, behaviour)(request, context)

    asyncio.run(run())


# --- no secret ever --------------------------------------------------------------------------------

secret_text = st.text(st.characters(min_codepoint=33, max_codepoint=0x10FFFF, exclude_categories=("Cs",)),
                      min_size=12, max_size=40)


FIXED_TEXT = ("/etcdserverpb.KV/Put /etcdserverpb.KV/Txn /etcdserverpb.Auth/UserAdd"
              " /etcdserverpb.Auth/UserChangePassword"
              " /etcdserverpb.Auth/Authenticate ipv4:127.0.0.1:40000 target_user auth_revision duration_ms token_fp"
              f" {Err.PERMISSION_DENIED.message} {Err.AUTH_FAILED.message}")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.binary(min_size=1, max_size=80), value=st.binary(min_size=12, max_size=200), password=secret_text,
       token=secret_text, name=st.text(min_size=1, max_size=20))
def test_records_never_hold_a_value_a_password_or_a_token(key: bytes, value: bytes, password: str, token: str,
                                                          name: str) -> None:
    assume(value not in key and password not in name and token not in name and password not in token)
    assume(token not in password and fingerprint(token) not in token)
    # a secret that is a piece of the records' own words (e.g. "UserChangePa") is no leak
    assume(all(s not in FIXED_TEXT for s in (password, token)))
    log = AuditLog("-", "all")
    put = pb.PutRequest(key=key, value=value).SerializeToString()
    txn = pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(key=key, value=value))],
                        failure=[pb.RequestOp(request_txn=pb.TxnRequest(
                            success=[pb.RequestOp(request_put=pb.PutRequest(key=key, value=value))]))])
    call(log, "Put", put, token=token, user=name, revision=3)
    call(log, "Txn", txn.SerializeToString(), token=token, refuse=Err.PERMISSION_DENIED, user=name)
    call(log, "UserAdd", pb.AuthUserAddRequest(name=name, password=password).SerializeToString(), token=token)
    call(log, "UserChangePassword", pb.AuthUserChangePasswordRequest(
        name=name, password=password, hashedPassword=password).SerializeToString(), token=token)
    call(log, "Authenticate", pb.AuthenticateRequest(name=name, password=password).SerializeToString(),
         answer=pb.AuthenticateResponse(token=token).SerializeToString())
    call(log, "Authenticate", pb.AuthenticateRequest(name=name, password=password).SerializeToString(),
         refuse=Err.AUTH_FAILED)
    raw = list(log._lines)
    assert len(raw) == 6
    secrets = [value, base64.b64encode(value), password.encode(), json.dumps(password)[1:-1].encode(),
               token.encode(), json.dumps(token)[1:-1].encode()]
    for line in raw:
        assert line.endswith(b"\n") and len(line) <= MAX_RECORD_BYTES
        for secret in secrets:
            assert secret not in line, (secret, line)
    records = lines(log)
    assert records[0]["key"] == base64.b64encode(key[:MAX_KEY_BYTES]).decode()
    assert records[0]["user"] == name[:MAX_TEXT_CHARS] and records[0]["auth_revision"] == 3
    assert records[0]["token_fp"] == fingerprint(token)
    assert [op["op"] for op in records[1]["ops"]] == ["put", "txn", "put"]
    assert records[1]["result"] == "etcdserver: permission denied"
    assert records[2]["target_user"] == name
    assert records[4]["user"] == name and records[4]["token_fp"] == fingerprint(token)  # the token it issued
    assert records[5]["result"] == Err.AUTH_FAILED.message and records[5]["token_fp"] == ""


def test_a_record_has_the_documented_fields() -> None:
    log = AuditLog("-", "all")
    call(log, "Range", pb.RangeRequest(key=b"a", range_end=b"b").SerializeToString(), token="t0k3n", user="alice",
         revision=7)
    (record,) = lines(log)
    assert set(record) == {"time", "method", "user", "peer", "result", "auth_revision", "duration_ms", "token_fp",
                           "key", "range_end"}
    assert record["time"].endswith("Z") and record["time"][10] == "T"
    assert (record["method"], record["user"], record["peer"], record["result"]) == (
        "/etcdserverpb.KV/Range", "alice", PEER, "ok")
    assert (record["key"], record["range_end"], record["auth_revision"]) == ("YQ==", "Yg==", 7)


# --- levels --------------------------------------------------------------------------------------


def test_the_auth_level_is_derived_from_the_method_table() -> None:
    names = {m.name for m in AUTH_METHODS}
    assert {"Authenticate", "UserAdd", "UserDelete", "UserChangePassword", "RoleGrantPermission", "AuthEnable",
            "AuthDisable", "UserGet", "RoleList"} <= names
    assert "AuthStatus" not in names and all(m.service == "Auth" for m in AUTH_METHODS)


@pytest.mark.parametrize(("level", "expected"), [
    ("auth", ["UserAdd", "UserAdd"]),
    ("denials", ["UserAdd", "Put", "UserAdd"]),
    ("all", ["Put", "UserAdd", "Put", "UserAdd"]),
])
def test_levels(level: str, expected: list[str]) -> None:
    log = AuditLog("-", level)
    for refuse in (None, Err.PERMISSION_DENIED):
        call(log, "Put", pb.PutRequest(key=b"k").SerializeToString(), refuse=refuse)
        call(log, "UserAdd", pb.AuthUserAddRequest(name="u").SerializeToString(), refuse=refuse)
    assert [r["method"].rsplit("/", 1)[1] for r in lines(log)] == expected


def test_a_client_that_goes_away_is_not_a_denial() -> None:
    assert not is_refusal(grpc.StatusCode.CANCELLED) and is_refusal(grpc.StatusCode.UNAVAILABLE)


# --- bounds --------------------------------------------------------------------------------------


def test_txn_ops_keys_and_names_are_bounded() -> None:
    deep = pb.TxnRequest(compare=[pb.Compare(key=b"c%d" % i) for i in range(30)],
                         success=[pb.RequestOp(request_range=pb.RangeRequest(key=b"x" * 5000, range_end=b"y"))])
    log = AuditLog("-", "all")
    call(log, "Txn", deep.SerializeToString(), user="u" * 100_000)
    (record,) = lines(log)
    assert len(record["ops"]) == MAX_TXN_OPS and all(op["op"] == "compare" for op in record["ops"])
    assert record["truncated"] is True and len(record["user"]) == MAX_TEXT_CHARS
    assert all(len(line) <= MAX_RECORD_BYTES for line in log._lines)


# --- the queue, fail-closed, reopen --------------------------------------------------------------


def test_without_fail_closed_a_full_queue_drops_and_counts() -> None:
    log = AuditLog("-", "all", queue_bytes=1000)  # not started: nothing drains it
    before = metrics.AUDIT_DROPPED._value.get()
    for _ in range(20):
        call(log, "Put", pb.PutRequest(key=b"k").SerializeToString())
    assert 0 < len(log._lines) < 20
    assert metrics.AUDIT_DROPPED._value.get() - before == 20 - len(log._lines)


def test_fail_closed_refuses_when_the_queue_has_no_room() -> None:
    log = AuditLog("-", "all", fail_closed=True, queue_bytes=2 * MAX_RECORD_BYTES)
    reserved = [log.admit(), log.admit()]
    assert reserved == [True, True] and not log.admit()
    log.release(2)
    assert log.admit()


def test_records_and_reservations_share_the_bound_and_written_records_give_room_back(tmp_path: Path) -> None:
    """The queue's bound counts the records waiting and the rooms admitted requests hold; the
    queue's gauge the records only; what the writer has written is room again."""
    path = tmp_path / "audit.log"
    log = AuditLog(str(path), "all", fail_closed=True, queue_bytes=3 * MAX_RECORD_BYTES)
    line = b"r" * (MAX_RECORD_BYTES // 2 - 1) + b"\n"
    assert log.admit() and log.admit()
    assert log.submit(line)  # unreserved: fits beside the two rooms
    assert metrics.AUDIT_QUEUE_BYTES._value.get() == len(line)
    assert not log.admit()  # 2 rooms and half a room queued: no third room
    assert log.submit(line, reserved=True)  # takes its room's place: half a room back
    assert metrics.AUDIT_QUEUE_BYTES._value.get() == 2 * len(line)
    assert log.admit()  # 1 room + 2 halves + 1 room: full again
    assert not log.submit(line)
    log.release(5)  # more than are held: both rooms back, no more
    assert log.admit() and log.admit() and not log.admit()
    log.release(2)
    log.start()
    try:
        wait_for(lambda: path.exists() and path.read_bytes().count(b"\n") == 2, 10, "the records written")
        wait_for(lambda: metrics.AUDIT_QUEUE_BYTES._value.get() == 0, 10, "the queue to be empty")
        assert log.admit() and log.admit() and log.admit() and not log.admit()  # the whole bound again
    finally:
        log.close()


def test_fail_closed_refuses_once_a_write_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """/dev/full: every write is ENOSPC. The admitted request's record waits; the next is refused."""
    monkeypatch.setattr(writer, "RETRY_SECONDS", 0.05)
    log = AuditLog("/dev/full", "all", fail_closed=True)
    log.start()
    try:
        call(log, "Put", pb.PutRequest(key=b"k").SerializeToString())
        wait_for(lambda: not log.writable, 10, "the write to fail")
        log2: list[dict[str, Any]] = []
        context = GatewayContext((), PEER, None)

        async def refused() -> None:
            with pytest.raises(Abort) as caught:
                await handlers.unary(log, BY_NAME["Range"], lambda r, c: asyncio.sleep(0, b""))(b"", context)
            log2.append({"code": caught.value.code, "details": caught.value.details})

        asyncio.run(refused())
        assert log2 == [{"code": grpc.StatusCode.UNAVAILABLE, "details": "raftgate: audit log unavailable"}]
        assert log._unwritten  # kept for the next try, never dropped
    finally:
        log.close(timeout=0.5)


def test_sighup_reopens_and_a_removed_directory_refuses_until_it_is_back(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer, "RETRY_SECONDS", 0.05)
    directory = tmp_path / "logs"
    directory.mkdir()
    path = directory / "audit.log"
    log = AuditLog(str(path), "all", fail_closed=True)
    log.start()
    try:
        put = pb.PutRequest(key=b"one").SerializeToString()
        call(log, "Put", put)
        wait_for(lambda: path.exists() and path.read_bytes().count(b"\n") == 1, 10, "the first record")
        path.rename(directory / "audit.log.1")
        log.reopen()
        call(log, "Put", put)
        wait_for(lambda: path.exists() and path.read_bytes().count(b"\n") == 1, 10, "the record in the new file")
        assert (directory / "audit.log.1").read_bytes().count(b"\n") == 1
        (directory / "audit.log").unlink()
        (directory / "audit.log.1").unlink()
        directory.rmdir()
        log.reopen()
        wait_for(lambda: not log.writable, 10, "the reopen to fail")
        assert not log.admit()
        directory.mkdir()
        wait_for(lambda: log.writable, 10, "the log to be writable again")
        assert log.admit()
    finally:
        log.close()


def test_fail_closed_through_an_outage_loses_no_record_and_gives_every_room_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests admitted before the log became unwritable finish during the outage: their records
    wait (never dropped), a flood of new requests is refused, and once the log is writable again
    every record is written once and the whole bound is free (no room kept by the flood)."""
    monkeypatch.setattr(writer, "RETRY_SECONDS", 0.05)
    directory = tmp_path / "logs"
    directory.mkdir()
    path = directory / "audit.log"
    log = AuditLog(str(path), "all", fail_closed=True, queue_bytes=8 * MAX_RECORD_BYTES)
    log.start()
    try:
        assert all(log.admit() for _ in range(4))  # under way when the log goes
        path.unlink()
        directory.rmdir()
        log.reopen()
        wait_for(lambda: not log.writable, 10, "the reopen to fail")
        assert not any(log.admit() for _ in range(200))  # the flood: refused, nothing reserved
        records = [b'{"n":%d}\n' % i for i in range(6)]
        assert all(log.submit(line, reserved=True) for line in records[:4])  # the admitted ones end
        assert all(log.submit(line) for line in records[4:])  # records nobody reserved for, within the bound
        assert not log.admit()
        directory.mkdir()
        wait_for(lambda: log.writable, 10, "the log to be writable again")
        wait_for(lambda: path.exists() and path.read_bytes().count(b"\n") == len(records), 10, "every record")
        assert path.read_bytes() == b"".join(records)  # each once, in order
        wait_for(lambda: metrics.AUDIT_QUEUE_BYTES._value.get() == 0, 10, "the queue to be empty")
        assert all(log.admit() for _ in range(8)) and not log.admit()  # the whole bound again
        log.release(8)
    finally:
        log.close()


# --- watch creates and cancels -------------------------------------------------------------------


def test_watch_records_creates_and_cancels_not_events() -> None:
    log = AuditLog("-", "all")
    events = handlers.WatchEvents(log, handlers.Call(BY_NAME["Watch"], PEER, user="bob", auth_revision=2, token_fp="f"))
    state = _State()
    create = pb.WatchCreateRequest(key=b"k", range_end=b"l")
    state.keep(create)
    state.audited.append(handlers.WatchCreate("bob", 2, "f"))
    track(state, pb.WatchResponse(watch_id=5, created=True).SerializeToString(), events)
    track(state, pb.WatchResponse(watch_id=5, events=[]).SerializeToString(), events)
    state.dead.add(5)
    track(state, pb.WatchResponse(watch_id=5, canceled=True).SerializeToString(), events)
    state.keep(create)
    track(state, pb.WatchResponse(watch_id=-1, created=True, canceled=True,
                                  cancel_reason="etcdserver: permission denied").SerializeToString(), events)
    got = [(r["watch"], r["watch_id"], r["result"], r["key"], r["user"]) for r in lines(log)]
    assert got == [("create", 5, "ok", "aw==", "bob"), ("cancel", 5, "etcdserver: invalid auth token", "aw==", "bob"),
                   ("create", -1, "etcdserver: permission denied", "aw==", "bob")]


def test_fail_closed_watch_creates_need_room_and_give_it_back() -> None:
    log = AuditLog("-", "denials", fail_closed=True, queue_bytes=MAX_RECORD_BYTES)
    events = handlers.WatchEvents(log, handlers.Call(BY_NAME["Watch"], PEER))
    pending = events.creating()
    assert pending is not None and events.creating() is None  # the stream then ends with Unavailable
    events.created(pending, pb.WatchCreateRequest(key=b"k"), 1, "ok")  # not a denial: the room comes back
    assert not log._lines and events.creating() is not None


# --- flags ---------------------------------------------------------------------------------------


def test_flags(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s")
    base = ["--store-endpoints=127.0.0.1:7000", f"--internal-secret-file={secret}"]
    cfg = load(base, env={})
    assert (cfg.audit_log, cfg.audit_level, cfg.audit_fail_closed) == (None, "denials", False)
    cfg = load([*base, "--audit-log", "-", "--audit-level", "all", "--audit-fail-closed"], env={})
    assert (cfg.audit_log, cfg.audit_level, cfg.audit_fail_closed) == ("-", "all", True)
    cfg = load(base, env={"RAFTGATE_PROXY_AUDIT_LOG": "/x", "RAFTGATE_PROXY_AUDIT_FAIL_CLOSED": "false"})
    assert (cfg.audit_log, cfg.audit_fail_closed) == ("/x", False)
    with pytest.raises(ConfigError, match="--audit-fail-closed: needs --audit-log"):
        load([*base, "--audit-fail-closed=true"], env={})
    with pytest.raises(ConfigError, match="--audit-fail-closed: must be true or false"):
        load([*base, "--audit-log=-", "--audit-fail-closed=yes"], env={})
    with pytest.raises(ConfigError, match="audit-level"):
        load([*base, "--audit-level=some"], env={})


def test_local_gives_each_proxy_its_own_file(tmp_path: Path) -> None:
    cfg = parse(["--audit-log", str(tmp_path / "audit.log")], {})
    assert cfg.audit_log_of(None) == str(tmp_path / "audit.log")
    assert cfg.audit_log_of("node2") == str(tmp_path / "audit.log.node2")
    assert parse(["--audit-log", "-"], {}).audit_log_of("node1") == "-"


def test_local_refuses_one_audit_file_for_every_proxy(tmp_path: Path) -> None:
    """RAFTGATE_PROXY_AUDIT_LOG would reach the client proxy and every member proxy: several
    writers on one file. local refuses it unless its own --audit-log (one file each) is given."""
    cfg = parse([], {})
    with pytest.raises(ConfigError, match="RAFTGATE_PROXY_AUDIT_LOG: every proxy"):
        check_children(cfg, [], ["proxy"], {"RAFTGATE_PROXY_AUDIT_LOG": str(tmp_path / "a.log")}, None)


@pytest.mark.parametrize("sent", [None, "client-token"])
@pytest.mark.parametrize("ran_with", [None, "client-token", "lent-token"])
def test_the_fingerprint_is_of_the_token_the_call_ran_with(sent: str | None, ran_with: str | None) -> None:
    """The client's token is fingerprinted when the call arrives; a token the pipeline notes
    instead (a lent sidecar token, or none) replaces it; the same token noted again keeps it."""
    log = AuditLog("-", "all")
    method = BY_NAME["Put"]

    async def behaviour(req: bytes, context: Any) -> bytes:
        handlers.noted_token(ran_with)
        handlers.noted_token(ran_with)
        return b""

    metadata = () if sent is None else (("token", sent),)

    async def run() -> None:
        await handlers.unary(log, method, behaviour)(b"", GatewayContext(metadata, PEER, None))

    asyncio.run(run())
    (record,) = lines(log)
    assert record["token_fp"] == ("" if ran_with is None else fingerprint(ran_with))
