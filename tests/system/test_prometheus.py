"""A real Prometheus scrapes raftgate: a 3-node store cluster and a proxy, each with --metrics-addr,
and Prometheus 2.x (Debian's ``prometheus`` package, which ``.ci/run`` installs as root) with its
own data directory and a free 127.0.0.1 port, scraping every second. Its HTTP query API must show
the auth counters by result and kind, histograms with their buckets, exactly one leader, and the
leader change after the leader is killed; ``promtool check metrics`` must find nothing to say
about either program's /metrics. Every wait polls a condition; every process is stopped.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from protos.authpb import auth_pb2
from protos.etcdserverpb import rpc_pb2
from tests.support.cluster import Client, Cluster, Node, retry_ok, setup_auth, store_argv
from tests.support.probes import sample, scrape
from tests.support.processes import Process, Program, free_port, wait_for

pytestmark = pytest.mark.slow

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
MISSING = "prometheus/promtool not installed (Debian package `prometheus`; .ci/run installs it when run as root)"
needs_prometheus = pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None, reason=MISSING)

#: prometheus_client's bucket counts (proxy/metrics.py, authstore/metrics.py), +Inf included.
BCRYPT_BUCKETS = 12 + 1
APPLY_BUCKETS = 14 + 1


class Prometheus(Process):
    """One Prometheus on 127.0.0.1, its TSDB in its own directory, scraping ``jobs`` every second."""

    name = "prometheus"

    def __init__(self, workdir: Path, jobs: dict[str, list[str]]) -> None:
        super().__init__(workdir)
        self.port = free_port()
        self.config = self.workdir / "prometheus.yml"
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}
                               for job, targets in jobs.items()],
        }
        self.config.write_text(json.dumps(config, indent=2))  # YAML is a superset of JSON

    def command(self) -> list[str]:
        assert PROMETHEUS is not None
        return [PROMETHEUS, f"--config.file={self.config}", f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"]

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def query(self, promql: str) -> list[tuple[dict[str, str], float]]:
        """An instant query through the HTTP API: [(labels, value)]."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as resp:
            answer = json.load(resp)
        assert answer["status"] == "success", answer
        return [(r["metric"], float(r["value"][1])) for r in answer["data"]["result"]]

    def wait(self, promql: str, ok: Callable[[list[tuple[dict[str, str], float]]], bool], what: str,
             timeout: float = 60.0) -> list[tuple[dict[str, str], float]]:
        """Polls the query until ``ok`` holds for its result; fails with the last result."""
        last: list[list[tuple[dict[str, str], float]]] = [[]]

        def check() -> bool:
            last[0] = self.query(promql)
            return ok(last[0])

        try:
            wait_for(check, timeout, what, interval=0.2)
        except TimeoutError as exc:
            raise AssertionError(f"{what}: `{promql}` gave {last[0]}") from exc
        return last[0]

    def value(self, promql: str, want: float, what: str) -> None:
        """Waits until the query yields exactly one sample, equal to ``want``."""
        self.wait(promql, lambda r: len(r) == 1 and r[0][1] == want, what)


@dataclass
class Deployment:
    cluster: Cluster
    node_metrics: dict[str, str]  # node name -> host:port of its /metrics
    proxy_metrics: str
    root: Client


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """3 store nodes and a proxy, each serving /metrics, with auth enabled (root, and alice on /app/)."""
    if PROMETHEUS is None or PROMTOOL is None:
        pytest.skip(MISSING)
    workdir = tmp_path_factory.mktemp("prometheus-cluster")
    # program_cluster gives every node the same extra flags; each needs its own metrics port, so
    # the nodes are built here with its layout (store_argv) and started the same way.
    secret = workdir / "internal-secret"
    secret.write_text("prometheus-test-secret-0123456789abcdef")
    secret.chmod(0o600)
    client_port = free_port()
    client_url = f"http://127.0.0.1:{client_port}"
    layout = [(f"node{i + 1}", free_port(), free_port(), f"127.0.0.1:{free_port()}") for i in range(3)]
    initial = ",".join(f"{name}=http://127.0.0.1:{peer}" for name, _, peer, _ in layout)
    nodes = [Node(name=name, argv=store_argv(name, workdir / name, internal, peer, secret, initial, client_url,
                                              ["--metrics-addr", metrics]),
                  data_dir=workdir / name, internal=f"127.0.0.1:{internal}")
             for name, internal, peer, metrics in layout]
    cluster = Cluster(workdir, sys.executable, secret.read_text(), nodes, f"127.0.0.1:{client_port}")
    proxy_metrics = f"127.0.0.1:{free_port()}"
    root = None
    try:
        _start_all(cluster)
        proxy = Program(workdir / "proxy",
                        ["proxy", "--listen-client-urls", client_url,
                         "--store-endpoints", ",".join(n.internal for n in nodes),
                         "--internal-secret-file", str(secret), "--bcrypt-cost", "4",
                         "--metrics-addr", proxy_metrics],
                        "raftgate proxy:", name="proxy")
        cluster.extra_programs.append(proxy)
        proxy.start()
        root = Client(cluster.endpoint)
        retry_ok(lambda: setup_auth(root), timeout=60, what="auth set-up through the proxy")
        a, md = root.auth, root.md
        a.UserAdd(rpc_pb2.AuthUserAddRequest(name="alice", password="alicepw"), metadata=md, timeout=10)
        a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="app"), metadata=md, timeout=10)
        perm = auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE, key=b"/app/", range_end=b"/app0")
        a.RoleGrantPermission(rpc_pb2.AuthRoleGrantPermissionRequest(name="app", perm=perm), metadata=md, timeout=10)
        a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="alice", role="app"), metadata=md, timeout=10)
        yield Deployment(cluster, {name: metrics for name, _, _, metrics in layout}, proxy_metrics, root)
    finally:
        if root is not None:
            root.close()
        cluster.close()


def _start_all(cluster: Cluster) -> None:
    """Starts every node at once (a lone node waits for its peers before it reports ready)."""
    errors: list[BaseException] = []

    def start(node: Node) -> None:
        try:
            cluster.restart(node)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(n,)) for n in cluster.nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def login(d: Deployment, name: str, password: str) -> grpc.StatusCode:
    client = Client(d.cluster.endpoint)
    try:
        client.login(name, password)
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()
    finally:
        client.close()


def metrics_text(address: str) -> bytes:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        return resp.read()


def test_promtool_check_metrics_is_clean_on_both_programs(deployment: Deployment) -> None:
    d = deployment
    assert login(d, "alice", "alicepw") == grpc.StatusCode.OK
    assert login(d, "alice", "wrong") == grpc.StatusCode.INVALID_ARGUMENT
    assert PROMTOOL is not None
    for who, address in [("proxy", d.proxy_metrics), *d.node_metrics.items()]:
        text = metrics_text(address)
        assert b"raftgate_" in text
        check = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, timeout=60)
        report = (check.stdout + check.stderr).decode()
        assert check.returncode == 0 and not report.strip(), f"{who}: promtool check metrics says:\n{report}"


@needs_prometheus
def test_a_real_prometheus_scrapes_the_auth_and_raft_metrics(deployment: Deployment, tmp_path: Path) -> None:
    d = deployment
    jobs = {"proxy": [d.proxy_metrics], "store": list(d.node_metrics.values())}
    with Prometheus(tmp_path / "prometheus", jobs) as prom:
        assert isinstance(prom, Prometheus)
        prom.value('count(up == 1)', 4, "Prometheus to scrape the proxy and every store node")

        # Logins: two good, one bad; the proxy's own /metrics is the truth Prometheus must show.
        before = scrape(d.proxy_metrics)
        assert login(d, "alice", "alicepw") == grpc.StatusCode.OK
        assert login(d, "alice", "alicepw") == grpc.StatusCode.OK
        assert login(d, "alice", "not-her-password") == grpc.StatusCode.INVALID_ARGUMENT
        after = scrape(d.proxy_metrics)
        ok = sample(after, "raftgate_proxy_authentications_total", result="ok")
        failed = sample(after, "raftgate_proxy_authentications_total", result="auth_failed")
        assert ok - sample(before, "raftgate_proxy_authentications_total", result="ok") == 2
        assert failed - sample(before, "raftgate_proxy_authentications_total", result="auth_failed") == 1
        prom.value('sum(raftgate_proxy_authentications_total{job="proxy",result="ok"})', ok, "good logins")
        prom.value('sum(raftgate_proxy_authentications_total{job="proxy",result="auth_failed"})', failed,
                   "failed logins")
        by_result = {m["result"]: v for m, v in prom.query('raftgate_proxy_authentications_total{job="proxy"}')}
        assert set(by_result) >= {"ok", "auth_failed", "not_enabled"}, by_result  # zero series exported too

        # A permission denial: alice writes outside /app/.
        alice = Client(d.cluster.endpoint)
        try:
            alice.login("alice", "alicepw")
            with pytest.raises(grpc.RpcError) as denied:
                alice.put(b"/other", b"v", timeout=10)
            assert (denied.value.code(), denied.value.details()) == (
                grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied")
            alice.put(b"/app/k", b"v", timeout=10)
        finally:
            alice.close()
        prom.value('sum(raftgate_proxy_permission_denials_total{job="proxy",kind="put"})', 1,
                   "the proxy's denial counter")
        prom.wait('sum(raftgate_store_permission_denials_total{job="store",kind="put"})',
                  lambda r: len(r) == 1 and r[0][1] >= 1, "the store's denial counter")

        # Histograms arrive with their buckets: bcrypt on the proxy, apply on every node.
        prom.value('count(raftgate_proxy_bcrypt_duration_seconds_bucket{job="proxy",operation="check"})',
                   BCRYPT_BUCKETS, "the bcrypt check histogram's buckets")
        prom.wait('raftgate_proxy_bcrypt_duration_seconds_count{job="proxy",operation="check"}',
                  lambda r: len(r) == 1 and r[0][1] >= 3, "bcrypt checks counted")
        median = prom.query('histogram_quantile(0.5, sum by (le) '
                            '(raftgate_proxy_bcrypt_duration_seconds_bucket{job="proxy",operation="check"}))')
        assert len(median) == 1 and 0 < median[0][1] <= 5.0, median
        prom.wait('count by (instance) (raftgate_store_apply_duration_seconds_bucket{job="store"})',
                  lambda r: len(r) == 3 and all(v == APPLY_BUCKETS for _, v in r), "apply histograms on 3 nodes")
        prom.wait('raftgate_store_apply_duration_seconds_count{job="store"} > 0', lambda r: len(r) == 3,
                  "applied batches on every node")

        # Exactly one leader, and it is the node the cluster says leads.
        leader = d.cluster.leader(timeout=30)
        prom.value('sum(raftgate_store_is_leader{job="store"})', 1, "one leader across the nodes")
        prom.wait('raftgate_store_is_leader{job="store"} == 1',
                  lambda r: [m["instance"] for m, _ in r] == [d.node_metrics[leader.name]], "the leader's gauge")

        # Kill the leader: a new one is elected, each survivor counts a leader change.
        survivors = [n for n in d.cluster.nodes if n is not leader]
        changes = {n.name: sample(scrape(d.node_metrics[n.name]), "raftgate_store_leader_changes_total")
                   for n in survivors}
        d.cluster.kill(leader)
        new = d.cluster.leader(timeout=60, among=survivors)
        killed = d.node_metrics[leader.name]
        prom.value(f'up{{instance="{killed}"}}', 0, "Prometheus to see the old leader down")
        prom.value('sum(raftgate_store_is_leader{job="store"})', 1, "one leader after the kill")
        prom.wait('raftgate_store_is_leader{job="store"} == 1',
                  lambda r: [m["instance"] for m, _ in r] == [d.node_metrics[new.name]], "the new leader's gauge")
        for n in survivors:
            prom.wait(f'raftgate_store_leader_changes_total{{instance="{d.node_metrics[n.name]}"}}',
                      lambda r, n=n: len(r) == 1 and r[0][1] >= changes[n.name] + 1,
                      f"{n.name} to count the leader change")
    assert prom.proc is None, "Prometheus stopped"
