"""A sidecar's login is counted by the lockout wherever it lands (issue 21, item 2).

A sidecar's Authenticate is checked by the store (authstore/api/login.py). A follower cannot put
the failure into the log (`not leader`); before the fix it checked the password anyway, dropped the
failure and answered the wrong-password answer, while the right password got `not leader`: guesses
sent to a follower (by a sidecar whose leader guess is stale, or straight with a sidecar credential)
were an oracle no lockout counted. Now a follower refuses a login before it checks anything, with
the answer the sidecar's store client takes as "ask the leader".

Three store nodes (lockout: 3 failures lock a name), a central proxy, and callers holding the
sidecar credential (``--sidecar-secret-file``): raw DoStream calls straight at one node, and real
``raftgate proxy --sidecar`` processes whose first leader guess is a follower (the first seed).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from protos.storepb import store_pb2 as spb
from raftgate.errors import Err
from raftgate.secret_proof import proving_channel
from tests.support.cluster import Cluster, Node, program_cluster
from tests.support.processes import Program, free_port, wait_for, wait_serving

pytestmark = pytest.mark.slow

SIDECAR_SECRET = "sidecar-secret-for-follower-tests-0123"
ATTEMPTS = 3
STORE = "/raftgate.storepb.Store/"
AUTH_FAILED = (Err.AUTH_FAILED.code, Err.AUTH_FAILED.message)
OK = (grpc.StatusCode.OK, "")
USERS = ("alice", "bob", "carol", "dave")


@dataclass
class Setup:
    cluster: Cluster
    leader: Node
    follower: Node
    workdir: Path
    central: grpc.Channel


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp("sidecar-login-follower")
    (workdir / "sidecar-secret").write_text(SIDECAR_SECRET)
    flags = ["--sidecar-secret-file", str(workdir / "sidecar-secret"), "--bcrypt-cost", "4",
             "--auth-lockout-attempts", str(ATTEMPTS), "--auth-lockout-duration", "10m"]
    with program_cluster(workdir / "c", nodes=3, store_flags=flags) as cluster:
        wait_serving(f"http://{cluster.endpoint}")
        central = grpc.insecure_channel(cluster.endpoint)
        try:
            auth = rpc_pb2_grpc.AuthStub(central)
            auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password="rootpw"), timeout=30)
            auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"), timeout=30)
            for name in USERS:
                auth.UserAdd(rpc_pb2.AuthUserAddRequest(name=name, password="pw"), timeout=30)
            auth.AuthEnable(rpc_pb2.AuthEnableRequest(), timeout=30)
            leader = cluster.leader()
            follower = cluster.followers(leader)[0]
            for node in cluster.nodes:
                cluster.sync(node)  # every node has applied the users
            yield Setup(cluster, leader, follower, workdir, central)
        finally:
            central.close()


def stream_login(node: Node, name: str, password: str) -> tuple[grpc.StatusCode, str]:
    """One DoStream AUTHENTICATE straight at ``node`` with the sidecar credential."""
    body = rpc_pb2.AuthenticateRequest(name=name, password=password).SerializeToString()
    with grpc.insecure_channel(node.internal) as base:
        ch = proving_channel(base, SIDECAR_SECRET)
        call = ch.stream_stream(STORE + "DoStream", request_serializer=None, response_deserializer=None)
        batch = spb.DoBatch(calls=[spb.DoCall(id=1, request=body, method=spb.DoCall.AUTHENTICATE)])
        for raw in call(iter([batch.SerializeToString()]), timeout=30):
            for result in spb.DoResultBatch.FromString(raw).results:
                code = next(c for c in grpc.StatusCode if c.value[0] == result.code)
                return code, result.message
    raise AssertionError("no answer on DoStream")


def login(channel: grpc.Channel, name: str, password: str) -> tuple[grpc.StatusCode, str]:
    try:
        token = rpc_pb2_grpc.AuthStub(channel).Authenticate(
            rpc_pb2.AuthenticateRequest(name=name, password=password), timeout=30).token
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    assert token
    return OK


def test_guesses_straight_at_a_follower_are_no_uncounted_oracle(setup: Setup) -> None:
    """A follower answers a guess before it checks it, with the answer the right password gets
    there too; every wrong-password answer a node gives is a failure the lockout counted."""
    wrong = [stream_login(setup.follower, "alice", f"guess{i}") for i in range(4 * ATTEMPTS)]
    right = stream_login(setup.follower, "alice", "pw")
    assert set(wrong) == {right}, "the follower tells a wrong password from the right one"
    assert right == (Err.NOT_LEADER.code, Err.NOT_LEADER.message)  # never taken: the sidecar asks the leader
    counted = sum(answer == AUTH_FAILED for answer in wrong)
    expected = AUTH_FAILED if counted >= ATTEMPTS else OK
    assert stream_login(setup.leader, "alice", "pw") == expected
    assert login(setup.central, "alice", "pw") == expected


def _sidecar(setup: Setup, name: str, *extra: str) -> tuple[Program, grpc.Channel, str]:
    """A real sidecar proxy whose first seed (its first leader guess) is the follower."""
    port = free_port()
    metrics = f"127.0.0.1:{free_port()}"
    seeds = [setup.follower.internal] + [n.internal for n in setup.cluster.nodes if n is not setup.follower]
    program = Program(setup.workdir / name, [
        "proxy", "--sidecar", "--listen-client-urls", f"http://127.0.0.1:{port}", "--store-endpoints", ",".join(seeds),
        "--internal-secret-file", str(setup.workdir / "sidecar-secret"), "--bcrypt-cost", "4",
        "--metrics-addr", metrics, "--audit-log", str(setup.workdir / f"{name}-audit.jsonl"), "--audit-level", "auth",
        *extra], "raftgate proxy:")
    program.start()
    return program, grpc.insecure_channel(f"127.0.0.1:{port}"), metrics


def _proxy_metric(addr: str, name: str) -> float:
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def _audit(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    lines = path.read_text().split("\n")[:-1]  # complete lines
    return [r for r in map(json.loads, lines) if r.get("method") == "/etcdserverpb.Auth/Authenticate"]


def test_guesses_through_a_sidecar_that_starts_at_a_follower_lock_the_name(setup: Setup) -> None:
    """The sidecar's first leader guess is a follower: each guess is still counted (the follower
    sends it to the leader), so after ATTEMPTS wrong passwords the right one is refused through
    the sidecar and the central proxy alike; the sidecar's metrics and audit log say what the
    client saw (one record per call, the wrong-password answer, no internal `not leader`)."""
    program, channel, metrics = _sidecar(setup, "sidecar-guess")
    try:
        for i in range(ATTEMPTS):
            assert login(channel, "bob", f"guess{i}") == AUTH_FAILED
        assert login(channel, "bob", "pw") == AUTH_FAILED  # locked
        assert login(setup.central, "bob", "pw") == AUTH_FAILED
        assert login(channel, "carol", "pw") == OK  # only that name
        assert _proxy_metric(metrics, 'raftgate_proxy_authentications_total{result="auth_failed"}') == ATTEMPTS + 1
        assert _proxy_metric(metrics, 'raftgate_proxy_authentications_total{result="ok"}') == 1
        assert _proxy_metric(metrics, 'raftgate_proxy_authentications_total{result="error"}') == 0
        audit = setup.workdir / "sidecar-guess-audit.jsonl"
        wait_for(lambda: len(_audit(audit)) == ATTEMPTS + 2, 10, "the sidecar's audit records")
        results = [r["result"] for r in _audit(audit)]
        assert results == [Err.AUTH_FAILED.message] * (ATTEMPTS + 1) + ["ok"]
    finally:
        channel.close()
        program.stop()


def test_the_right_password_through_a_sidecar_that_starts_at_a_follower_works(setup: Setup) -> None:
    program, channel, _ = _sidecar(setup, "sidecar-right")
    try:
        assert login(channel, "dave", "pw") == OK
        assert login(channel, "dave", "pw") == OK
    finally:
        channel.close()
        program.stop()


def test_every_wrong_password_answer_through_a_leader_kill_was_counted(tmp_path: Path) -> None:
    """Guesses through a sidecar while the leader is killed (-9): each answer is the wrong-password
    one (counted) or the store's error (not counted, or not known to be); once ATTEMPTS
    wrong-password answers were given, the name is locked on the new leader."""
    (tmp_path / "sidecar-secret").write_text(SIDECAR_SECRET)
    flags = ["--sidecar-secret-file", str(tmp_path / "sidecar-secret"), "--bcrypt-cost", "4",
             "--auth-lockout-attempts", str(ATTEMPTS), "--auth-lockout-duration", "10m"]
    with program_cluster(tmp_path / "c", nodes=3, store_flags=flags) as cluster:
        wait_serving(f"http://{cluster.endpoint}")
        with grpc.insecure_channel(cluster.endpoint) as central:
            auth = rpc_pb2_grpc.AuthStub(central)
            auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password="rootpw"), timeout=30)
            auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"), timeout=30)
            auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="erin", password="pw"), timeout=30)
            auth.AuthEnable(rpc_pb2.AuthEnableRequest(), timeout=30)
            leader = cluster.leader()
            setup = Setup(cluster, leader, cluster.followers(leader)[0], tmp_path, central)
            program, channel, _ = _sidecar(setup, "sidecar-kill")
            try:
                answers = [login(channel, "erin", "guess-before")]
                cluster.kill(leader)
                for i in range(20 * ATTEMPTS):
                    if sum(a == AUTH_FAILED for a in answers) >= ATTEMPTS:
                        break
                    answers.append(login(channel, "erin", f"guess{i}"))
                assert sum(a == AUTH_FAILED for a in answers) >= ATTEMPTS, answers
                store_errors = {(e.code, e.message) for e in (Err.NO_LEADER, Err.TIMEOUT, Err.LEADER_CHANGED,
                                                               Err.TIMEOUT_DUE_TO_LEADER_FAIL,
                                                               Err.TIMEOUT_DUE_TO_CONNECTION_LOST)}
                assert set(answers) <= {AUTH_FAILED} | store_errors, answers
                assert login(channel, "erin", "pw") == AUTH_FAILED  # locked
                assert login(central, "erin", "pw") == AUTH_FAILED
            finally:
                channel.close()
                program.stop()
