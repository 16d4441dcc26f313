"""Revoking a client certificate (etcd's ``--client-crl-file``): a leaked CN ``root`` certificate
must stop being root when the CRL lists it, not when it expires.

etcd reads the CRL at each TLS handshake and closes the connection of a listed certificate: its
client sees UNAVAILABLE. gRPC-Python offers no CRL at the handshake, so the proxy checks the
verified peer certificate on every call and on every message of a stream, and refuses with the
same code. The CRL is re-read when it changes (a mounted Secret swapped); a broken or untrusted
CRL keeps the last good one; one that never loads stops the proxy at start with exit code 2.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.support.processes import (
    REPO_ROOT,
    Program,
    etcdctl,
    free_port,
    proxy_program,
    store_program,
    wait_for,
    write_test_crl,
    write_test_pki,
)

pytestmark = pytest.mark.slow

ROOT_PW = "rootpw"
REVOKED = "raftgate: client certificate revoked"


@dataclass
class Cluster:
    pki: dict[str, Path]
    crl: Path
    target: str
    proxy: Program

    def channel(self, cn: str) -> grpc.Channel:
        creds = grpc.ssl_channel_credentials(self.pki["ca"].read_bytes(), self.pki[f"{cn}.key"].read_bytes(),
                                             self.pki[f"{cn}.crt"].read_bytes())
        return grpc.secure_channel(self.target, creds)

    def range(self, cn: str, key: bytes = b"k", token: str | None = None) -> tuple[str, str]:
        with self.channel(cn) as channel:
            try:
                rpc_pb2_grpc.KVStub(channel).Range(rpc_pb2.RangeRequest(key=key), timeout=10,
                                                   metadata=[("token", token)] if token else None)
            except grpc.RpcError as e:
                return e.code().name, e.details() or ""
            return "OK", ""

    def ctl(self, cn: str, *args: str, user: str | None = None) -> tuple[int, str, str]:
        env = {"ETCDCTL_CACERT": str(self.pki["ca"]), "ETCDCTL_CERT": str(self.pki[f"{cn}.crt"]),
               "ETCDCTL_KEY": str(self.pki[f"{cn}.key"])}
        return etcdctl(f"https://{self.target}", *args, user=user, env=env, dial_timeout="5s")

    def root_token(self) -> str:
        """root's token by password, over alice's connection (a token wins over the certificate)."""
        with self.channel("alice") as channel:
            answer = rpc_pb2_grpc.AuthStub(channel).Authenticate(
                rpc_pb2.AuthenticateRequest(name="root", password=ROOT_PW), timeout=10)
        return answer.token

    def unrevoke(self) -> None:
        write_test_crl(self.crl, self.pki)
        wait_for(lambda: self.range("root") == ("OK", ""), 30, "root's certificate to be accepted again")


def _tls_flags(pki: dict[str, Path], crl: Path) -> list[str]:
    return [f"--cert-file={pki['server.crt']}", f"--key-file={pki['server.key']}",
            f"--trusted-ca-file={pki['ca']}", "--client-cert-auth", f"--client-crl-file={crl}"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("crl")
    pki = write_test_pki(work / "pki", ["root", "alice", "bob"])
    crl = write_test_crl(work / "crl.pem", pki)
    store, internal = store_program(work)
    store.start()
    port = free_port()
    proxy = proxy_program(work, internal, f"https://127.0.0.1:{port}", *_tls_flags(pki, crl))
    try:
        proxy.start()
        c = Cluster(pki, crl, f"127.0.0.1:{port}", proxy)
        wait_for(lambda: c.ctl("root", "auth", "status")[0] == 0, 60, "the proxy to serve through the store")
        for step in (("user", "add", f"root:{ROOT_PW}"), ("auth", "enable")):
            assert c.ctl("root", *step)[0] == 0, step
        for step in (("role", "add", "reader"), ("role", "grant-permission", "reader", "read", "k"),
                     ("user", "add", "alice", "--no-password"), ("user", "grant-role", "alice", "reader"),
                     ("put", "k", "v")):
            assert c.ctl("root", *step)[0] == 0, step
        yield c
    finally:
        proxy.stop()
        store.stop()


def test_a_revoked_root_certificate_is_refused_on_its_next_call(cluster: Cluster) -> None:
    cluster.unrevoke()
    assert cluster.ctl("root", "user", "list")[:2] == (0, "alice\nroot\n")
    write_test_crl(cluster.crl, cluster.pki, ["root"])
    code, message = cluster.range("root")
    assert code == "UNAVAILABLE" and message.startswith(REVOKED), (code, message)
    with cluster.channel("root") as channel:  # every service: Auth, Maintenance, health
        for call in (lambda: rpc_pb2_grpc.AuthStub(channel).UserList(rpc_pb2.AuthUserListRequest(), timeout=10),
                     lambda: rpc_pb2_grpc.MaintenanceStub(channel).Status(rpc_pb2.StatusRequest(), timeout=10),
                     lambda: health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)):
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
        # a token does not lend a revoked certificate's connection anything either
        with pytest.raises(grpc.RpcError) as refused:
            rpc_pb2_grpc.KVStub(channel).Range(rpc_pb2.RangeRequest(key=b"k"), timeout=10,
                                               metadata=[("token", cluster.root_token())])
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    rc, out, _ = cluster.ctl("root", "put", "k", "stolen")
    assert rc != 0
    # other certificates of the same CA are not touched
    assert cluster.range("alice") == ("OK", "")
    assert cluster.ctl("alice", "get", "k")[:2] == (0, "k\nv\n")


def test_open_streams_end_on_their_next_action(cluster: Cluster) -> None:
    cluster.unrevoke()
    with cluster.channel("root") as channel:
        lease = rpc_pb2_grpc.LeaseStub(channel).LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=60), timeout=10)
        watch_requests: queue.Queue[rpc_pb2.WatchRequest | None] = queue.Queue()
        keepalive_requests: queue.Queue[rpc_pb2.LeaseKeepAliveRequest | None] = queue.Queue()

        def drain(q: queue.Queue) -> Iterator:  # type: ignore[type-arg]
            while (item := q.get()) is not None:
                yield item

        watch = rpc_pb2_grpc.WatchStub(channel).Watch(drain(watch_requests), timeout=60)
        watch_requests.put(rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=b"k")))
        assert next(watch).created
        keepalive = rpc_pb2_grpc.LeaseStub(channel).LeaseKeepAlive(drain(keepalive_requests), timeout=60)
        keepalive_requests.put(rpc_pb2.LeaseKeepAliveRequest(ID=lease.ID))
        assert next(keepalive).TTL > 0
        watch2 = rpc_pb2_grpc.WatchStub(channel).Watch(
            iter([rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=b"other"))]), timeout=60)
        assert next(watch2).created
        try:
            write_test_crl(cluster.crl, cluster.pki, ["root"])
            # the keep-alive stream's next keep-alive is refused and the stream ends
            keepalive_requests.put(rpc_pb2.LeaseKeepAliveRequest(ID=lease.ID))
            with pytest.raises(grpc.RpcError) as refused:
                next(keepalive)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
            assert (refused.value.details() or "").startswith(REVOKED)
            # the watch stream's next create is refused and the stream ends
            watch_requests.put(rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=b"k2")))
            with pytest.raises(grpc.RpcError) as refused:
                next(watch)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
            # a watch that only receives gets no event of a later change: the stream ends instead
            with cluster.channel("alice") as other:
                rpc_pb2_grpc.KVStub(other).Put(rpc_pb2.PutRequest(key=b"other", value=b"new"), timeout=10,
                                               metadata=[("token", cluster.root_token())])
            with pytest.raises(grpc.RpcError) as refused:
                next(watch2)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
        finally:
            watch_requests.put(None)
            keepalive_requests.put(None)
            watch.cancel()
            watch2.cancel()
            keepalive.cancel()


def test_a_broken_or_untrusted_crl_keeps_the_last_good_one(cluster: Cluster, tmp_path: Path) -> None:
    cluster.unrevoke()
    write_test_crl(cluster.crl, cluster.pki, ["root"])
    assert cluster.range("root")[0] == "UNAVAILABLE"
    logged = len(cluster.proxy.lines)

    def replace(data: bytes) -> None:
        tmp = cluster.crl.with_name("crl.new")
        tmp.write_bytes(data)
        os.replace(tmp, cluster.crl)

    replace(b"-----BEGIN X509 CRL-----\nbm90IGEgQ1JM\n-----END X509 CRL-----\n")
    for _ in range(20):  # many calls: the broken file is read and logged once
        assert cluster.range("root")[0] == "UNAVAILABLE"
    assert cluster.range("alice") == ("OK", "")
    warnings = [line for line in cluster.proxy.lines[logged:] if "--client-crl-file" in line]
    assert len(warnings) == 1, warnings
    # a CRL that lists nothing, signed by a CA the proxy does not trust: refused, root stays revoked
    stranger = write_test_pki(tmp_path / "stranger", [], ca_name="raftgate-test-ca")  # same name, other key
    write_test_crl(cluster.crl, stranger)
    for _ in range(5):
        assert cluster.range("root")[0] == "UNAVAILABLE"
    assert any("not signed" in line for line in cluster.proxy.lines[logged:]), cluster.proxy.lines[logged:]
    # the file removed (a Secret unmounted): still the last good list
    cluster.crl.unlink()
    assert cluster.range("root")[0] == "UNAVAILABLE"
    # a good CRL again, in DER this time, that no longer lists root
    write_test_crl(cluster.crl, cluster.pki, der=True)
    assert cluster.range("root") == ("OK", "")
    write_test_crl(cluster.crl, cluster.pki, ["alice"], der=True)
    assert cluster.range("alice")[0] == "UNAVAILABLE" and cluster.range("root") == ("OK", "")


def _run(args: list[str], tmp_path: Path) -> tuple[int, str]:
    proc = subprocess.Popen([sys.executable, "-m", "raftgate.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    return proc.returncode, out


@pytest.mark.parametrize("case", ["garbage", "missing", "untrusted", "no-ca", "empty"])
@pytest.mark.parametrize("program", ["proxy", "local"])
def test_a_crl_that_never_loads_stops_the_program(tmp_path: Path, case: str, program: str) -> None:
    pki = write_test_pki(tmp_path / "pki", ["root"])
    crl = tmp_path / "crl.pem"
    if case == "garbage":
        crl.write_bytes(b"not a CRL\n")
    elif case == "empty":
        crl.write_bytes(b"")
    elif case == "untrusted":
        write_test_crl(crl, write_test_pki(tmp_path / "other", []))
    else:
        write_test_crl(crl, pki)
    flags = _tls_flags(pki, tmp_path / "absent.pem" if case == "missing" else crl)
    if case == "no-ca":
        flags = [f for f in flags if not f.startswith(("--trusted-ca-file", "--client-cert-auth"))]
    if program == "proxy":
        args = ["proxy", "--listen-client-urls", f"https://127.0.0.1:{free_port()}", "--store-endpoints",
                f"127.0.0.1:{free_port()}", "--internal-secret-file", str(pki["ca"]), *flags]
    else:
        args = ["local", "--data-dir", str(tmp_path / "data"), "--nodes", "1", "--client-port", str(free_port()),
                *flags]
    rc, out = _run(args, tmp_path)
    assert rc == 2, out[-2000:]
    assert "--client-crl-file" in out and "Traceback" not in out, out[-2000:]


def test_local_passes_the_crl_to_its_proxies(tmp_path: Path) -> None:
    from tests.support.processes import RaftgateLocal

    pki = write_test_pki(tmp_path / "pki", ["root", "alice"])
    crl = write_test_crl(tmp_path / "crl.pem", pki, ["root"])
    local = RaftgateLocal(tmp_path, extra_args=["--nodes", "1", *_tls_flags(pki, crl)])

    def serving() -> bool:
        return c.range("alice") == ("OK", "")

    local.is_ready = serving  # type: ignore[method-assign]
    c = Cluster(pki, crl, f"127.0.0.1:{local.port}", local)  # type: ignore[arg-type]
    local.start()
    try:
        code, message = c.range("root")
        assert code == "UNAVAILABLE" and message.startswith(REVOKED), (code, message)
    finally:
        local.stop()
