"""Revoking a client certificate (etcd's ``--client-crl-file``): a leaked CN ``root`` certificate
must stop being root when the CRL lists it, not when it expires.

etcd reads the CRL at each TLS handshake and closes the connection of a listed certificate: its
client sees UNAVAILABLE. gRPC-Python offers no CRL at the handshake, so the proxy checks the
verified peer certificate on every call and on every message of a stream, and refuses with the
same code. The CRL is re-read when it changes (a mounted Secret swapped); a broken or untrusted
CRL keeps the last good one; one that never loads stops the proxy at start with exit code 2.

The store's internal port takes the same flag for the proxies' and sidecars' certificates: a
leaked central proxy certificate is root.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from protos.storepb import store_pb2
from tests.support.processes import (
    BACKENDS,
    REPO_ROOT,
    Program,
    etcdctl,
    free_port,
    proxy_program,
    skip_unless_available,
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
    before = len(cluster.proxy.lines)
    write_test_crl(cluster.crl, cluster.pki, ["root"])
    assert cluster.range("root")[0] == "UNAVAILABLE"
    # the proxy logs the new list, and then the refusal of root under it, beside the call that sees
    # it: both lines may reach us after the answer, and must not be counted below as lines about
    # the broken file
    wait_for(lambda: any("a new list (1 revoked" in line for line in cluster.proxy.lines[before:]) and
             any("lists the client certificate serial" in line for line in cluster.proxy.lines[before:]), 10,
             "the proxy to log the good list and the refusal under it")
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
    assert len(warnings) == 1 and "cannot be used" in warnings[0], warnings
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


# --- the store's internal port: the proxies' and sidecars' client certificates ---------------


def _do_stream_call(channel: grpc.Channel) -> grpc.StreamStreamMultiCallable:
    return channel.stream_stream("/raftgate.storepb.Store/DoStream",
                                 request_serializer=store_pb2.DoBatch.SerializeToString,
                                 response_deserializer=store_pb2.DoResultBatch.FromString)


def _status_batch(call_id: int) -> store_pb2.DoBatch:
    status = ipb.InternalRaftRequest(header=ipb.RequestHeader(username="root", auth_revision=1),
                                     auth_status=rpc_pb2.AuthStatusRequest()).SerializeToString()
    return store_pb2.DoBatch(calls=[store_pb2.DoCall(id=call_id, request=status)])


def test_the_store_refuses_a_revoked_proxy_or_sidecar_certificate(tmp_path: Path) -> None:
    central = write_test_pki(tmp_path / "central", ["proxy"])
    sidecars = write_test_pki(tmp_path / "sidecars", ["sidecar"], ca_name="raftgate-test-sidecar-ca")
    crl = tmp_path / "crl.pem"

    def write_crls(revoked_proxy: bool, revoked_sidecar: bool) -> None:
        one = write_test_crl(tmp_path / "central.crl", central, ["proxy"] if revoked_proxy else [])
        two = write_test_crl(tmp_path / "sidecar.crl", sidecars, ["sidecar"] if revoked_sidecar else [])
        (tmp_path / "crl.new").write_bytes(one.read_bytes() + two.read_bytes())
        os.replace(tmp_path / "crl.new", crl)

    write_crls(False, False)
    secret = tmp_path / "peer-secret"
    secret.write_text("peer-secret-for-the-test")
    store_port, peer = free_port(), f"http://127.0.0.1:{free_port()}"
    store = Program(tmp_path / "s", [
        "store", "--data-dir", str(tmp_path / "data"), "--listen-internal-urls", f"https://127.0.0.1:{store_port}",
        "--cert-file", str(central["server.crt"]), "--key-file", str(central["server.key"]),
        "--trusted-ca-file", str(central["ca"]), "--sidecar-trusted-ca-file", str(sidecars["ca"]),
        "--client-crl-file", str(crl),
        "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--peer-secret-file", str(secret)],
        "raftgate store:")
    client_port = free_port()
    proxy = Program(tmp_path / "p", [
        "proxy", "--listen-client-urls", f"http://127.0.0.1:{client_port}",
        "--store-endpoints", f"127.0.0.1:{store_port}", "--internal-cert", str(central["proxy.crt"]),
        "--internal-key", str(central["proxy.key"]), "--internal-ca", str(central["ca"])], "raftgate proxy:")

    def channel(pki: dict[str, Path], cn: str) -> grpc.Channel:
        creds = grpc.ssl_channel_credentials(central["ca"].read_bytes(), pki[f"{cn}.key"].read_bytes(),
                                             pki[f"{cn}.crt"].read_bytes())
        return grpc.secure_channel(f"127.0.0.1:{store_port}", creds)

    def health(pki: dict[str, Path], cn: str) -> str:
        with channel(pki, cn) as ch:
            try:
                health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
            except grpc.RpcError as e:
                return f"{e.code().name} {e.details()}"
            return "OK"

    endpoint = f"127.0.0.1:{client_port}"
    with store, proxy:
        wait_for(lambda: etcdctl(endpoint, "put", "k", "v")[0] == 0, 60, "the proxy to write through the store")
        assert health(central, "proxy") == "OK" and health(sidecars, "sidecar") == "OK"
        with channel(central, "proxy") as ch:
            batches: queue.Queue[store_pb2.DoBatch | None] = queue.Queue()

            def drain() -> Iterator[store_pb2.DoBatch]:
                while (batch := batches.get()) is not None:
                    yield batch

            stream = _do_stream_call(ch)(drain(), timeout=60)
            try:
                batches.put(_status_batch(1))
                assert next(stream).results[0].code == 0
                write_crls(True, True)
                # the proxy's stream, opened before: its next batch is refused and the stream ends
                batches.put(_status_batch(2))
                with pytest.raises(grpc.RpcError) as refused:
                    next(stream)
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
                assert (refused.value.details() or "").startswith(REVOKED)
            finally:
                batches.put(None)
                stream.cancel()
        assert health(central, "proxy").startswith(f"UNAVAILABLE {REVOKED}")
        assert health(sidecars, "sidecar").startswith(f"UNAVAILABLE {REVOKED}")
        # the leaked proxy certificate no longer reaches the store through the proxy either
        assert etcdctl(endpoint, "get", "k", timeout=30, dial_timeout="2s")[0] != 0
        write_crls(False, True)
        assert health(central, "proxy") == "OK"
        wait_for(lambda: etcdctl(endpoint, "get", "k", "--print-value-only")[:2] == (0, "v\n"), 60,
                 "the proxy to read through the store again")


@pytest.mark.parametrize("case", ["garbage", "http"])
def test_a_store_crl_that_never_loads_stops_the_store(tmp_path: Path, case: str) -> None:
    central = write_test_pki(tmp_path / "central", [])
    crl = tmp_path / "crl.pem"
    crl.write_bytes(b"garbage") if case == "garbage" else write_test_crl(crl, central)
    secret = tmp_path / "secret"
    secret.write_text("a-secret-for-the-test")
    peer = f"http://127.0.0.1:{free_port()}"
    scheme = "https" if case == "garbage" else "http"
    rc, out = _run(["store", "--data-dir", str(tmp_path / "data"), "--listen-internal-urls",
                    f"{scheme}://127.0.0.1:{free_port()}", "--cert-file", str(central["server.crt"]),
                    "--key-file", str(central["server.key"]), "--trusted-ca-file", str(central["ca"]),
                    "--internal-secret-file", str(secret), "--client-crl-file", str(crl),
                    "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--peer-secret-file",
                    str(secret)], tmp_path)
    assert rc == 2, out[-2000:]
    assert "--client-crl-file" in out and "Traceback" not in out, out[-2000:]


@pytest.mark.parametrize("backend", BACKENDS)
def test_etcdctl_sees_a_revoked_certificate_refused_as_etcd_refuses_it(tmp_path: Path, backend: str) -> None:
    """Side by side with etcd 3.5.1 and the same files: the certificate works, the CRL listing it
    is written, etcdctl's next command with it fails (etcd: at the handshake; raftgate: the call,
    UNAVAILABLE), and another certificate of the CA goes on working."""
    from tests.support.tls_servers import TLSEtcd, TLSRaftgate

    skip_unless_available(backend)
    pki = write_test_pki(tmp_path / "pki", ["root", "alice"])
    crl = write_test_crl(tmp_path / "crl.pem", pki)
    server = TLSEtcd(tmp_path, pki) if backend == "etcd" else TLSRaftgate(tmp_path, pki)
    server.extra_args.append(f"--client-crl-file={crl}")
    server.start()
    try:
        def ctl(cn: str, *args: str) -> tuple[int, str, str]:
            env = {"ETCDCTL_CACERT": str(pki["ca"]), "ETCDCTL_CERT": str(pki[f"{cn}.crt"]),
                   "ETCDCTL_KEY": str(pki[f"{cn}.key"])}
            return etcdctl(server.endpoint, *args, env=env, dial_timeout="2s", timeout=60)

        assert ctl("root", "put", "k", "v")[:2] == (0, "OK\n")
        write_test_crl(crl, pki, ["root"])
        # on etcd each refused command waits out etcdctl's command timeout (the handshake fails and
        # is retried): both at once, so the test waits it out once
        refused = (("put", "k", "stolen"), ("get", "k"))
        with ThreadPoolExecutor(len(refused)) as pool:
            answers = list(pool.map(lambda args: ctl("root", *args), refused))
        for args, (rc, out, _) in zip(refused, answers, strict=True):
            assert rc != 0 and out == "", (args, rc, out)
        assert ctl("alice", "get", "k", "--print-value-only")[:2] == (0, "v\n")
    finally:
        server.stop()
