"""Trust item 2: no window in which anyone can make themselves root.

A new cluster started with ``raftgate store --initial-root-password-file`` has root (role root,
password from the file) and authentication enabled as its first log entries, before any request
is served: an anonymous client can never create root or grant itself role root. The file's
password is bcrypt-hashed before it enters the log; on a restart (existing data) the file changes
nothing. ``raftgate bootstrap-auth`` against an existing cluster fails loudly unless root
authenticates with the file's password and no other user holds role root.
"""

from __future__ import annotations

import base64
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import grpc
import pytest

from authstore import config as store_config
from authstore.main import bootstrap_entries
from authstore.state.auth.authorize import request_kind
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from raftgate.errors import Err
from tests.support.cluster import Cluster, program_cluster
from tests.support.processes import REPO_ROOT

PASSWORD = "initial-Root-pa55word"


def _password_file(directory: Path, password: str = PASSWORD, name: str = "root-password") -> Path:
    path = directory / name
    path.write_text(password + "\n")
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("initial-root")
    pw = _password_file(workdir)
    with program_cluster(workdir / "c", nodes=3,
                         store_flags=["--initial-root-password-file", str(pw), "--bcrypt-cost", "4"]) as c:
        yield c


def _auth(cluster: Cluster) -> tuple[grpc.Channel, rpc_pb2_grpc.AuthStub]:
    channel = grpc.insecure_channel(cluster.endpoint)
    return channel, rpc_pb2_grpc.AuthStub(channel)


def _bootstrap(endpoint: str, password_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raftgate.cli", "bootstrap-auth", "--endpoints", endpoint,
                           "--root-password-file", str(password_file), "--timeout", "60"],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)


@pytest.mark.slow
def test_a_new_cluster_serves_nothing_before_root_and_auth(cluster: Cluster) -> None:
    channel, auth = _auth(cluster)
    with channel:
        # The very first answers: auth is on, and an anonymous client can take nothing.
        status = auth.AuthStatus(rpc_pb2.AuthStatusRequest(), timeout=60)
        assert status.enabled
        for call, request in [("UserAdd", rpc_pb2.AuthUserAddRequest(name="root", password="mine")),
                              ("UserAdd", rpc_pb2.AuthUserAddRequest(name="mallory", password="mine")),
                              ("UserGrantRole", rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root")),
                              ("AuthDisable", rpc_pb2.AuthDisableRequest())]:
            with pytest.raises(grpc.RpcError) as e:
                getattr(auth, call)(request, timeout=30)
            assert (e.value.code(), e.value.details()) == (Err.USER_EMPTY.code, Err.USER_EMPTY.message), call
        with pytest.raises(grpc.RpcError) as e:
            auth.Authenticate(rpc_pb2.AuthenticateRequest(name="root", password="mine"), timeout=30)
        assert e.value.details() == Err.AUTH_FAILED.message
        token = auth.Authenticate(rpc_pb2.AuthenticateRequest(name="root", password=PASSWORD), timeout=30).token
        md = (("token", token),)
        assert list(auth.UserList(rpc_pb2.AuthUserListRequest(), metadata=md, timeout=30).users) == ["root"]
        assert list(auth.UserGet(rpc_pb2.AuthUserGetRequest(name="root"), metadata=md, timeout=30).roles) == ["root"]
        assert list(auth.RoleList(rpc_pb2.AuthRoleListRequest(), metadata=md, timeout=30).roles) == ["root"]
    # Every member holds the same auth state, at the same auth revision.
    revisions = set()
    for node in cluster.nodes:
        answer = cluster.do(node, ipb.InternalRaftRequest(auth_status=rpc_pb2.AuthStatusRequest()), timeout=30)
        assert answer.enabled
        revisions.add(answer.authRevision)
    assert len(revisions) == 1


@pytest.mark.slow
def test_the_plaintext_password_is_never_stored(cluster: Cluster) -> None:
    for node in cluster.nodes:
        for path in node.data_dir.rglob("*"):
            if path.is_file():
                assert PASSWORD.encode() not in path.read_bytes(), path


@pytest.mark.slow
def test_bootstrap_auth_accepts_the_cluster_it_was_given(cluster: Cluster) -> None:
    done = _bootstrap(cluster.endpoint, _password_file(cluster.workdir))
    assert done.returncode == 0, done.stderr
    assert PASSWORD not in done.stdout + done.stderr


@pytest.mark.slow
def test_bootstrap_auth_fails_on_a_wrong_root_password(cluster: Cluster) -> None:
    done = _bootstrap(cluster.endpoint, _password_file(cluster.workdir, "not-the-password", "other"))
    assert done.returncode == 1
    assert "root does not authenticate with the password in the file" in done.stderr
    assert "not-the-password" not in done.stdout + done.stderr


@pytest.mark.slow
def test_bootstrap_auth_fails_when_another_user_holds_role_root(cluster: Cluster) -> None:
    channel, auth = _auth(cluster)
    with channel:
        token = auth.Authenticate(rpc_pb2.AuthenticateRequest(name="root", password=PASSWORD), timeout=30).token
        md = (("token", token),)
        auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="mallory", password="x"), metadata=md, timeout=30)
        auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="mallory", role="root"), metadata=md, timeout=30)
        try:
            done = _bootstrap(cluster.endpoint, _password_file(cluster.workdir))
        finally:
            auth.UserDelete(rpc_pb2.AuthUserDeleteRequest(name="mallory"), metadata=md, timeout=30)
    assert done.returncode == 1
    assert "user mallory holds role root" in done.stderr


@pytest.mark.slow
def test_a_restart_with_another_file_changes_nothing(cluster: Cluster) -> None:
    other = _password_file(cluster.workdir, "a-new-password", "other-root-password")
    for node in cluster.nodes:
        i = node.argv.index("--initial-root-password-file")
        node.argv[i + 1] = str(other)
        cluster.terminate(node)
        cluster.restart(node)
    channel, auth = _auth(cluster)
    with channel:
        auth.Authenticate(rpc_pb2.AuthenticateRequest(name="root", password=PASSWORD), timeout=60)
        with pytest.raises(grpc.RpcError) as e:
            auth.Authenticate(rpc_pb2.AuthenticateRequest(name="root", password="a-new-password"), timeout=30)
        assert e.value.details() == Err.AUTH_FAILED.message


def _store_cfg(tmp_path: Path, name: str, password_file: Path) -> store_config.StoreConfig:
    secret = tmp_path / "secret"
    secret.write_text("s" * 32)
    members = {"a": 1, "b": 2, "c": 3}
    initial = ",".join(f"{n}=http://127.0.0.1:{2380 + i}" for n, i in members.items())
    return store_config.parse([
        "--name", name, "--internal-secret-file", str(secret), "--peer-secret-file", str(secret),
        "--listen-peer-urls", f"http://127.0.0.1:{2380 + members[name]}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{2380 + members[name]}",
        "--initial-cluster", initial, "--initial-root-password-file", str(password_file), "--bcrypt-cost", "4",
    ])  # fmt: skip


@pytest.mark.parametrize("content", ["", "\n", "x" * 73, "x" * 5000])
def test_an_unusable_password_file_stops_the_store(tmp_path: Path, content: str) -> None:
    path = tmp_path / "pw"
    path.write_text(content)
    with pytest.raises(store_config.ConfigError) as e:
        _store_cfg(tmp_path, "a", path)
    assert "--initial-root-password-file" in str(e.value) and "x" * 20 not in str(e.value)


def test_every_initial_member_derives_the_same_first_entries(tmp_path: Path) -> None:
    pw = _password_file(tmp_path)
    firsts = []
    for name in ("a", "b", "c"):
        cfg = _store_cfg(tmp_path, name, pw)
        assert PASSWORD not in repr(cfg)
        entries, hard_state = bootstrap_entries(cfg)
        assert hard_state.commit == len(entries) == 3 + 4
        firsts.append([(e.term, e.index, e.type, e.data) for e in entries])
    assert firsts[0] == firsts[1] == firsts[2]
    assert all(PASSWORD.encode() not in data for *_, data in firsts[0])
    add = ipb.InternalRaftRequest.FromString(firsts[0][3][3]).auth_user_add
    assert add.name == "root" and not add.password
    assert bcrypt.checkpw(PASSWORD.encode(), base64.b64decode(add.hashedPassword))
    kinds = [request_kind(ipb.InternalRaftRequest.FromString(e[3])) for e in firsts[0][3:]]
    assert kinds == ["auth_user_add", "auth_role_add", "auth_user_grant_role", "auth_enable"]
