"""Attacks on gRPC's socket I/O on its poller thread (raftgate/grpc_io.py: the store and the proxy
run gRPC core's iomgr endpoints, ``GRPC_EXPERIMENTS=-event_engine_client,-event_engine_listener``),
where iomgr and the EventEngine endpoints could differ: clients that stop reading their sockets,
hundreds of idle, half-open and garbage connections, kill -9 of a store named ``localhost`` and of
the proxy under open streams, listeners on 127.0.0.1, [::1] and a Unix socket at once, TLS client
certificates a CA did not sign or that are out of their dates, an operator's own
``GRPC_EXPERIMENTS``, and ``raftgate local``'s children.

Each held when written, with the change and with gRPC's default I/O
(``GRPC_EXPERIMENTS=event_engine_client,event_engine_listener`` in the environment): cases the
suite lacked (raw HTTP/2 clients that never read their socket, an operator's experiments, the
children's environment), kept so that a grpcio upgrade or a return to the EventEngine shows a
difference here first.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import queue
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from raftgate import grpc_io
from tests.support.memory import memory_kib
from tests.support.processes import (
    SECRET,
    Program,
    RaftgateLocal,
    free_port,
    proxy_program,
    stop_together,
    store_program,
    wait_for,
    wait_serving,
    write_test_pki,
)
from tests.support.raw_h2 import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PREFACE,
    SETTINGS,
    RawH2,
    frame,
    grpc_headers,
    grpc_message,
    header_block,
)

pytestmark = pytest.mark.slow

MIB = 1 << 20
WAIT = 60.0  # an upper bound on a loaded machine, never a timing assertion
BIG_KEYS = 12  # 12 values of 1 MiB: a 12 MiB Range


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _open_connections(port: int) -> list[str]:
    """The TCP connections whose local end is ``port`` that are still open on this machine
    (ESTABLISHED, or CLOSE_WAIT: the peer is gone and the socket not closed yet), from /proc."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] in ("01", "08"):
                found.append(f"{fields[1]} -> {fields[2]} state {fields[3]}")
    return found


def _bad_lines(program: Program) -> list[str]:
    """ERROR lines, tracebacks and gRPC core's own E-lines (``E1207 10:50:45.37 ... file.cc:83] ...``)."""
    return [line for line in program.output().splitlines()
            if " ERROR " in line or "Traceback" in line or re.match(r"E\d{4} ", line)]


def _store_and_proxy(work: Path) -> tuple[Program, str, Program, int]:
    """A one-node store and a proxy in front of it, both serving: (store, its internal host:port,
    proxy, client port); stopped by the caller (both, also when the proxy fails to start)."""
    store, internal = store_program(work)
    port = free_port()
    proxy = proxy_program(work, internal, f"http://127.0.0.1:{port}")
    try:
        store.start()
        proxy.start()
        wait_serving(f"127.0.0.1:{port}")
    except BaseException:
        stop_together([proxy, store])
        raise
    return store, internal, proxy, port


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Program, str, Program, int]]:
    """A one-node store and a proxy in front of it: (store, its internal host:port, proxy, client port)."""
    store, internal, proxy, port = _store_and_proxy(tmp_path_factory.mktemp("served"))
    try:
        kv = rpc_pb2_grpc.KVStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        for i in range(BIG_KEYS):
            kv.Put(rpc_pb2.PutRequest(key=b"big/%03d" % i, value=bytes([65 + i]) * MIB), timeout=WAIT)
        yield store, internal, proxy, port
    finally:
        stop_together([proxy, store])
    for program in (store, proxy):
        assert not _bad_lines(program), _bad_lines(program)[:5]


def _served_calls(endpoint: str, rounds: int, label: bytes) -> list[str]:
    """``rounds`` Put and Range pairs on a channel of their own; the errors they met."""
    errors: list[str] = []
    channel = grpc.insecure_channel(endpoint)
    kv = rpc_pb2_grpc.KVStub(channel)
    try:
        for i in range(rounds):
            try:
                kv.Put(rpc_pb2.PutRequest(key=b"small/" + label, value=b"%d" % i), timeout=WAIT)
                got = kv.Range(rpc_pb2.RangeRequest(key=b"small/" + label), timeout=WAIT).kvs[0].value
                assert got == b"%d" % i, got
            except grpc.RpcError as exc:
                errors.append(f"{exc.code().name}: {exc.details()}")
    finally:
        channel.close()
    return errors


def test_clients_that_stop_reading_their_sockets_hold_up_no_one(served: tuple[Program, str, Program, int]) -> None:
    """Raw HTTP/2 clients that open every window, ask for a lot and then never read their socket
    again (the server's writes stay pending on a full socket): a Watch with prev_kv on keys being
    written and two 12 MiB Ranges on the proxy's client port, two proven 12 MiB Do Ranges on the
    store's internal port. Meanwhile 100 Puts of 100 KiB on the watched keys and three other
    clients' Puts and Ranges are all answered; the two programs grow by a bounded amount, and once
    the stuck clients go their connections are gone too."""
    store, internal, proxy, port = served
    assert store.proc is not None and proxy.proc is not None
    pids = {"proxy": proxy.proc.pid, "store": store.proc.pid}
    before = {name: memory_kib(pid, "VmRSS") for name, pid in pids.items()}
    fds_before = {name: _fds(pid) for name, pid in pids.items()}
    stuck: list[RawH2] = []
    try:
        watcher = RawH2("127.0.0.1", port, rcvbuf=4096)
        stuck.append(watcher)
        watcher.handshake()
        watcher.call("/etcdserverpb.Watch/Watch", rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(
            key=b"watched/", range_end=b"watched0", prev_kv=True)).SerializeToString(), end_stream=False)
        big_range = rpc_pb2.RangeRequest(key=b"big/", range_end=b"big0")
        for _ in range(2):
            reader = RawH2("127.0.0.1", port, rcvbuf=4096)
            stuck.append(reader)
            reader.handshake()
            reader.call("/etcdserverpb.KV/Range", big_range.SerializeToString())
        host, internal_port = internal.rsplit(":", 1)
        do_range = ipb.InternalRaftRequest(header=ipb.RequestHeader(username="root"), range=big_range)
        for _ in range(2):
            reader = RawH2(host, int(internal_port), rcvbuf=4096)
            stuck.append(reader)
            reader.handshake()
            reader.call("/raftgate.storepb.Store/Do", do_range.SerializeToString(), extra=reader.prove(SECRET.encode()))
        # the Ranges' answers have filled the readers' sockets: the servers' writes are pending now
        wait_for(lambda: all(r.pending_at_server() > 0 for r in stuck[1:]), WAIT,
                 "the servers' writes of the Ranges' answers to wait on the stuck readers")

        results: list[list[str]] = []
        others = [threading.Thread(target=lambda n=n: results.append(_served_calls(f"127.0.0.1:{port}", 40, b"%d" % n)))
                  for n in range(3)]
        for t in others:
            t.start()
        writer = grpc.insecure_channel(f"127.0.0.1:{port}")
        try:
            kv = rpc_pb2_grpc.KVStub(writer)
            peak = dict(before)
            for i in range(100):
                kv.Put(rpc_pb2.PutRequest(key=b"watched/k", value=b"%08d" % i + b"x" * (100 * 1024)), timeout=WAIT)
                if i % 10 == 9:
                    peak = {name: max(peak[name], memory_kib(pid, "VmRSS")) for name, pid in pids.items()}
        finally:
            writer.close()
        for t in others:
            t.join(timeout=WAIT * 2)
        assert not any(t.is_alive() for t in others), "a client's calls did not end"
        assert results == [[], [], []], results
        growth = {name: (peak[name] - before[name]) >> 10 for name in pids}
        # measured: proxy +85 MiB, store +170-200 MiB with either I/O (each stuck Range's whole
        # answer is held until written); an unbounded buffer of the watch's 20 MiB of events, or a
        # write retried without end, would show far above
        assert growth["proxy"] < 250 and growth["store"] < 400, growth
    finally:
        for reader in stuck:
            reader.close()
    # nothing of the stuck clients is left behind, and the proxy answers at once
    wait_for(lambda: all(_fds(pid) <= fds_before[name] for name, pid in pids.items()), WAIT,
             "the stuck clients' connections to be closed")
    assert _served_calls(f"127.0.0.1:{port}", 3, b"after") == []


def _garbage_answer(port: int, payload: bytes) -> bytes:
    """What the server sends a connection that sent ``payload`` before the server closed it."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as conn:
        conn.sendall(payload)
        got = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := conn.recv(65536):
                got += chunk
        return got


def _huge_header_answer(port: int, size: int) -> bytes:
    """The HEADERS payload answering a Range whose header block carries ``size`` bytes of metadata
    (in HEADERS and CONTINUATION frames of 16 KiB)."""
    conn = RawH2("127.0.0.1", port)
    try:
        conn.handshake()
        block = header_block(grpc_headers("/etcdserverpb.KV/Range", conn.authority, [("x-big", "a" * size)]))
        chunks = [block[i:i + 16384] for i in range(0, len(block), 16384)]
        frames = [frame(HEADERS if i == 0 else CONTINUATION, END_HEADERS if i == len(chunks) - 1 else 0, 1, chunk)
                  for i, chunk in enumerate(chunks)]
        with contextlib.suppress(OSError):  # the server may answer and close before the last frame
            conn.sock.sendall(b"".join(frames) + frame(DATA, END_STREAM, 1, grpc_message(
                rpc_pb2.RangeRequest(key=b"k").SerializeToString())))
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            kind, flags, stream, payload = conn.read_frame()
            if kind == HEADERS and stream == 1 and flags & END_STREAM:
                return payload
        raise AssertionError("no trailers")
    finally:
        conn.close()


def test_idle_half_open_and_garbage_connections_leave_clients_served(served: tuple[Program, str, Program, int]) -> None:
    """300 TCP connections that send nothing, 300 that send the HTTP/2 preface and stop, 100 that
    stop inside the preface and 200 idle gRPC channels: a client is still answered. HTTP/1.1,
    random bytes and a TLS ClientHello get the server's SETTINGS and a closed connection; a 2 MiB
    and a 16 MiB header block get RESOURCE_EXHAUSTED; once every connection is closed the proxy's
    descriptors are back where they were."""
    _, _, proxy, port = served
    assert proxy.proc is not None
    pid = proxy.proc.pid
    endpoint = f"127.0.0.1:{port}"
    assert _served_calls(endpoint, 1, b"base") == []
    base = _fds(pid)
    held: list[socket.socket] = []
    channels: list[grpc.Channel] = []
    try:
        for i in range(700):
            conn = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
            held.append(conn)
            if 300 <= i < 600:
                conn.sendall(PREFACE + frame(SETTINGS, 0, 0, b""))
            elif i >= 600:
                conn.sendall(PREFACE[:10])
        for _ in range(200):
            channel = grpc.insecure_channel(endpoint, options=[("grpc.use_local_subchannel_pool", 1)])
            channels.append(channel)
            grpc.channel_ready_future(channel).result(timeout=WAIT)
        wait_for(lambda: _fds(pid) >= base + 900, WAIT, "the proxy to accept every connection")
        assert _served_calls(endpoint, 3, b"crowd") == []

        tls_hello = bytes.fromhex("160301") + os.urandom(200)
        for payload in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", os.urandom(4096), tls_hello, PREFACE + os.urandom(500)):
            answer = _garbage_answer(port, payload)
            assert answer[3:4] == bytes([SETTINGS]) and len(answer) < 100, answer
        for size in (2 * MIB, 16 * MIB):
            trailers = _huge_header_answer(port, size)
            assert b"grpc-status\x018" in trailers, trailers  # RESOURCE_EXHAUSTED
        assert _served_calls(endpoint, 3, b"after-garbage") == []
    finally:
        for conn in held:
            conn.close()
        for channel in channels:
            channel.close()
    wait_for(lambda: _fds(pid) <= base, WAIT, "the proxy to close every connection")
    assert _served_calls(endpoint, 1, b"end") == []


Events = queue.Queue[tuple[str, bytes | str]]


def _watch(endpoint: str, key: bytes, events: Events) -> tuple[grpc.Channel, threading.Event]:
    """A Watch of ``key``'s prefix, its events and its end put on ``events``; created once it returns."""
    channel = grpc.insecure_channel(endpoint)
    done = threading.Event()

    def requests() -> Iterator[rpc_pb2.WatchRequest]:
        yield rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=key, range_end=key[:-1] + b"0"))
        done.wait(WAIT * 4)

    def run() -> None:
        try:
            for resp in rpc_pb2_grpc.WatchStub(channel).Watch(requests(), timeout=WAIT * 4):
                if resp.created:
                    events.put(("created", b""))
                for event in resp.events:
                    events.put(("event", event.kv.value))
        except grpc.RpcError as exc:
            events.put(("end", f"{exc.code().name}: {exc.details()}"))

    threading.Thread(target=run, daemon=True).start()
    assert events.get(timeout=WAIT) == ("created", b"")
    return channel, done


def _next_value(events: Events, value: bytes) -> None:
    while True:
        kind, got = events.get(timeout=WAIT)
        assert kind == "event", (kind, got)
        if got == value:
            return


def test_a_store_named_localhost_killed_and_the_proxy_killed_under_streams(tmp_path: Path) -> None:
    """The proxy reaches its store by the name ``localhost``. kill -9 of the store under four
    writers and an open Watch: the writers see only etcd's UNAVAILABLE, the proxy writes again
    once the store is back, and the Watch, still open, gets the next event. Then kill -9 of the
    proxy: the client's Watch ends with UNAVAILABLE, the store closes the dead proxy's connections
    (none is left open on its side), and a new proxy serves."""
    store, internal = store_program(tmp_path)
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    proxy = proxy_program(tmp_path, internal.replace("127.0.0.1", "localhost"), f"http://{endpoint}")
    try:
        store.start()
        proxy.start()
        wait_serving(endpoint)
        events: Events = queue.Queue()
        channel, done = _watch(endpoint, b"/w/", events)
        kv = rpc_pb2_grpc.KVStub(grpc.insecure_channel(endpoint))
        kv.Put(rpc_pb2.PutRequest(key=b"/w/k", value=b"before"), timeout=WAIT)
        _next_value(events, b"before")

        stop = threading.Event()
        acked: list[float] = []
        errors: set[str] = set()

        def write(w: int) -> None:
            own = grpc.insecure_channel(endpoint)
            try:
                stub = rpc_pb2_grpc.KVStub(own)
                for i in range(100_000):
                    if stop.is_set():
                        return
                    try:
                        stub.Put(rpc_pb2.PutRequest(key=b"/load/%d" % w, value=b"%d" % i), timeout=5)
                        acked.append(time.monotonic())
                    except grpc.RpcError as exc:
                        errors.add(exc.code().name)
            finally:
                own.close()

        writers = [threading.Thread(target=write, args=(w,)) for w in range(4)]
        for t in writers:
            t.start()
        try:
            wait_for(lambda: len(acked) > 40, WAIT, "Puts acknowledged under load")
            store.kill9()
            wait_for(lambda: errors, WAIT, "the writers to meet the killed store")
            store.start()
            back = time.monotonic()
            wait_for(lambda: any(t > back for t in acked), WAIT, "a Put acknowledged after the restart")
        finally:
            stop.set()
            for t in writers:
                t.join(timeout=WAIT)
        assert errors == {"UNAVAILABLE"}, errors
        kv.Put(rpc_pb2.PutRequest(key=b"/w/k", value=b"after"), timeout=WAIT)
        _next_value(events, b"after")

        store_port = int(internal.rsplit(":", 1)[1])
        assert _open_connections(store_port), "the proxy holds no connection to its store"
        proxy.kill9()
        kind, detail = events.get(timeout=WAIT)
        assert kind == "end" and str(detail).startswith("UNAVAILABLE"), (kind, detail)
        done.set()
        channel.close()
        # the store closes the dead proxy's connections (no test client connects to it)
        wait_for(lambda: not _open_connections(store_port), WAIT,
                 "the store to close the dead proxy's connections")
        proxy.start()
        wait_serving(endpoint)
    finally:
        stop_together([proxy, store])
    assert not _bad_lines(proxy) and not _bad_lines(store), (_bad_lines(proxy), _bad_lines(store))


def test_proxy_listens_on_loopback_v4_v6_and_a_unix_socket_at_once(tmp_path: Path) -> None:
    """One proxy on 127.0.0.1, [::1] and a Unix socket serves on each; a second one asking for the
    [::1] or the 127.0.0.1 port in use fails to start, naming it; the socket file is gone after
    the stop."""
    store, internal = store_program(tmp_path)
    v4, v6 = free_port(), free_port()
    sock = tmp_path / "client.sock"
    proxy = proxy_program(tmp_path, internal, f"http://127.0.0.1:{v4},unix://{sock},http://[::1]:{v6}")
    try:
        store.start()
        proxy.start()
        wait_serving(f"127.0.0.1:{v4}")
        for target in (f"127.0.0.1:{v4}", f"[::1]:{v6}", f"unix://{sock}", f"localhost:{v4}"):
            assert _served_calls(target, 1, target.encode()) == [], target
        for listen in (f"http://[::1]:{v6}", f"http://127.0.0.1:{v4}"):
            second = proxy_program(tmp_path, internal, listen, name=f"second{len(listen)}")
            with pytest.raises(RuntimeError, match="exited with 1 before ready"):
                second.start(timeout=WAIT)
            assert "in use" in second.output() and listen.removeprefix("http://") in second.output(), second.output()
            assert "Traceback" not in second.output()
        assert _served_calls(f"[::1]:{v6}", 1, b"still") == []
    finally:
        stop_together([proxy, store])
    assert proxy.last_exit_code == 0, proxy.output()
    assert not sock.exists()


def _client_cert(directory: Path, pki: dict[str, Path], name: str, not_before: datetime.datetime,
                 not_after: datetime.datetime) -> tuple[Path, Path]:
    """A client certificate for CN root signed by ``pki``'s CA, valid between the two dates."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca = x509.load_pem_x509_certificate(pki["ca"].read_bytes())
    ca_key = serialization.load_pem_private_key(pki["ca.key"].read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "root")]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    (directory / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / f"{name}.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                              serialization.PrivateFormat.PKCS8,
                                                              serialization.NoEncryption()))
    return directory / f"{name}.crt", directory / f"{name}.key"


def test_client_certificates_another_ca_signed_or_out_of_date_get_no_service(tmp_path: Path) -> None:
    """An mTLS client port (--client-cert-auth): no certificate, one another CA signed, an expired
    one and one not yet valid each get UNAVAILABLE (the handshake fails, no call is served), as
    with gRPC's default I/O; a valid one is served before and after."""
    pki = write_test_pki(tmp_path / "pki", ["root"])
    other = write_test_pki(tmp_path / "other", ["root"], ca_name="another-ca")
    now = datetime.datetime.now(datetime.UTC)
    day = datetime.timedelta(days=1)
    expired = _client_cert(tmp_path, pki, "expired", now - 10 * day, now - day)
    future = _client_cert(tmp_path, pki, "future", now + day, now + 10 * day)
    store, internal = store_program(tmp_path)
    port = free_port()
    proxy = proxy_program(tmp_path, internal, f"https://127.0.0.1:{port}", f"--cert-file={pki['server.crt']}",
                          f"--key-file={pki['server.key']}", f"--trusted-ca-file={pki['ca']}", "--client-cert-auth")

    def call(cert: Path | None, key: Path | None) -> str:
        creds = grpc.ssl_channel_credentials(pki["ca"].read_bytes(), key.read_bytes() if key else None,
                                             cert.read_bytes() if cert else None)
        channel = grpc.secure_channel(f"127.0.0.1:{port}", creds)
        try:
            rpc_pb2_grpc.KVStub(channel).Range(rpc_pb2.RangeRequest(key=b"k"), timeout=10)
            return "OK"
        except grpc.RpcError as exc:
            return exc.code().name
        finally:
            channel.close()

    try:
        store.start()
        proxy.start()
        wait_for(lambda: call(pki["root.crt"], pki["root.key"]) == "OK", WAIT, "root to be served over mTLS")
        refused = {name: call(*pair) for name, pair in {
            "none": (None, None), "another CA": (other["root.crt"], other["root.key"]),
            "expired": expired, "not yet valid": future}.items()}
        assert refused == dict.fromkeys(refused, "UNAVAILABLE"), refused
        assert call(pki["root.crt"], pki["root.key"]) == "OK"
    finally:
        stop_together([proxy, store])
    assert not _bad_lines(proxy), _bad_lines(proxy)


@pytest.mark.parametrize("operator", [",,,-", "no_such_experiment", "-event_engine_client", "event_engine_client"])
def test_an_operators_grpc_experiments(tmp_path: Path, operator: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store and the proxy start, serve and stop (exit 0) with an operator's own
    ``GRPC_EXPERIMENTS``, garbage included; what they print holds no ERROR and no traceback, and
    gRPC's own E-lines only name the operator's unknown experiments (gRPC would print those
    without raftgate as well), never one of ours."""
    monkeypatch.setenv(grpc_io.ENV, operator)
    store, _, proxy, port = _store_and_proxy(tmp_path)
    try:
        assert _served_calls(f"127.0.0.1:{port}", 2, b"op") == []
    finally:
        stop_together([proxy, store])
    operators_unknown = {item.strip().removeprefix("-") for item in operator.split(",") if item.strip()}
    operators_unknown -= set(grpc_io.EXPERIMENTS)
    for program in (store, proxy):
        assert program.last_exit_code == 0, program.output()
        for line in _bad_lines(program):
            named = line.split("Unknown experiment:", 1)
            assert len(named) == 2 and named[1].strip() in operators_unknown, line


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_local_children_carry_the_setting_and_stop_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``raftgate local --nodes 3 --proxy-workers 2``: every store, member proxy, the proxy and
    each of its workers started with the setting in their environment; a Put is served; SIGTERM
    stops everything with exit 0, no ERROR line and no traceback."""
    monkeypatch.delenv(grpc_io.ENV, raising=False)
    local = RaftgateLocal(tmp_path, extra_args=["--nodes", "3", "--proxy-workers", "2"])
    local.start()
    try:
        state = local.local_json()
        assert state is not None
        pids = [int(p["pid"]) for p in state["processes"]]  # type: ignore[union-attr,index]
        workers = [int(c) for pid in pids
                   for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        assert len(pids) == 7 and len(workers) == 2, (state, workers)
        for pid in pids + workers:
            assert _environ(pid).get(grpc_io.ENV) == grpc_io.merged(""), pid
        rc, _, err = local.ctl("put", "/k", "v")
        assert rc == 0, err
    finally:
        code = local.stop()
    out = local.output()
    assert code == 0, out[-3000:]
    assert " ERROR " not in out and "Traceback" not in out and not re.search(r"^E\d{4} ", out, re.M), out[-3000:]
