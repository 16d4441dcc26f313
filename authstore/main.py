"""``raftgate store``: one authstore node of a Raft group (or a group of one)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from authstore import config as store_config
from authstore import failpoints
from authstore.api.callers import Classifier
from authstore.api.lease_keeper import LeaseKeeper
from authstore.api.login import StoreLogin
from authstore.api.maintenance import Maintenance, MemberInfo
from authstore.api.proposer import Proposer
from authstore.api.quota import Quota
from authstore.api.server import StoreService, build_server
from authstore.api.simple_tokens import SimpleTokens, StoreSimpleTokens
from authstore.api.watch.hub import WatchHub, progress_interval_from_env
from authstore.node import identity
from authstore.node.driver import RaftNode
from authstore.node.transport import PeerSecurity, Transport, peer_address
from authstore.node.wal import WAL, WALCorrupt
from authstore.raft.codec import encode_conf_change
from authstore.raft.storage import MemoryStorage
from authstore.raft.types import ConfChange, ConfChangeType, Entry, EntryType, HardState, Snapshot
from authstore.state.apply import Applier
from authstore.state.auth import initial_root
from authstore.state.backend import Backend
from authstore.state.membership import cluster_id, member_id
from protos.etcdserverpb import rpc_pb2 as pb
from protos.internal import STORE_MESSAGE_BYTES
from protos.storepb import store_pb2 as spb
from raftgate import event_loop, grpc_listen, stages
from raftgate.crl import CRLError, RevocationList
from raftgate.errors import EtcdError
from raftgate.flow_windows import FIXED_RECEIVE_WINDOW
from raftgate.observe import start_observability
from raftgate.private_files import private_dir, restrict_umask, wider_than_private
from raftgate.process import DataDirInUse
from raftgate.process import lock_data_dir as lock
from raftgate.stop_signals import STOP_PING_TIMEOUT, stop_on_signals
from raftgate.token_verifier import TokenVerifier
from raftgate.workload_identity import WorkloadConfigError, WorkloadTokens
from raftgate.workload_identity import build as build_workload

log = logging.getLogger("raftgate.store")

#: how long the ready line waits for this member's attributes to be in the member list
PUBLISH_WAIT = 10.0
#: etcd stops a removed member after this delay, so its last messages (a leader's commit of its
#: own removal, the answer to MemberRemove) still go out.
REMOVED_STOP_DELAY = 1.0


class StartupError(Exception):
    pass


def _credentials(cfg: store_config.StoreConfig) -> grpc.ServerCredentials | None:
    if not cfg.tls:
        return None
    assert cfg.cert_file and cfg.key_file and cfg.trusted_ca_file
    cas = cfg.trusted_ca_file.read_bytes()
    if cfg.sidecar_trusted_ca_file is not None:  # both classes connect; Classifier tells them apart
        cas = cas.rstrip(b"\n") + b"\n" + cfg.sidecar_trusted_ca_file.read_bytes()
    return grpc.ssl_server_credentials([(cfg.key_file.read_bytes(), cfg.cert_file.read_bytes())],
                                       root_certificates=cas,
                                       require_client_auth=True)


def _classifier(cfg: store_config.StoreConfig) -> Classifier:
    try:
        return Classifier(secret=cfg.secret, sidecar_secret=cfg.sidecar_secret,
                          central_ca_pem=cfg.trusted_ca_file.read_bytes() if cfg.trusted_ca_file else None,
                          sidecar_ca_pem=(cfg.sidecar_trusted_ca_file.read_bytes()
                                          if cfg.sidecar_trusted_ca_file else None))
    except (OSError, ValueError) as exc:
        raise StartupError(f"--trusted-ca-file / --sidecar-trusted-ca-file: {exc}") from None


def _revocations(cfg: store_config.StoreConfig) -> RevocationList | None:
    """--client-crl-file (checked when the flags were read; a file broken since is a start-up error)."""
    if cfg.client_crl_file is None:
        return None
    try:
        cas = {"trusted_ca_file": cfg.trusted_ca_file, "sidecar_trusted_ca_file": cfg.sidecar_trusted_ca_file}
        return store_config.revocation_list(cfg.client_crl_file, cas)
    except CRLError as exc:
        raise StartupError(str(exc)) from None


def _workload(cfg: store_config.StoreConfig) -> WorkloadTokens | None:
    """--oidc-*: the verifier of workload tokens sidecars forward (a JWKS file is read now)."""
    if cfg.oidc_issuer is None:
        return None
    try:
        return WorkloadTokens(build_workload(cfg.oidc_issuer, cfg.oidc_audience or "", jwks_file=cfg.oidc_jwks_file,
                                             ca_file=cfg.oidc_ca_file, user_map_file=cfg.oidc_user_map or ""))
    except WorkloadConfigError as exc:
        raise StartupError(f"--oidc-issuer: {exc}") from None


def _verifiers(cfg: store_config.StoreConfig, tokens: SimpleTokens) -> list[TokenVerifier]:
    """How the store verifies a sidecar-class caller's token: the first that recognizes it
    decides. Simple tokens; workload tokens (by their ``iss``) before etcd JWTs, which recognize
    any JWT."""
    verifiers: list[TokenVerifier] = [StoreSimpleTokens(tokens)]
    workload = _workload(cfg)
    if workload is not None:
        verifiers.append(workload)
    if cfg.jwt is not None:
        verifiers.append(cfg.jwt)
    return verifiers


def _peer_security(cfg: store_config.StoreConfig) -> PeerSecurity:
    if cfg.peer_tls:
        assert cfg.peer_cert_file and cfg.peer_key_file and cfg.peer_trusted_ca_file
        return PeerSecurity(cert=cfg.peer_cert_file.read_bytes(), key=cfg.peer_key_file.read_bytes(),
                            ca=cfg.peer_trusted_ca_file.read_bytes(), secret=cfg.peer_secret)
    return PeerSecurity(secret=cfg.peer_secret)


def lock_data_dir(data_dir: Path) -> int:
    """Takes an exclusive lock on the data dir for the life of the process (etcd locks its WAL
    files), before anything in it is opened: a second node on the same log and store would say
    ready, take the leadership and stall the cluster. The kernel drops the lock when the process
    ends, however it ends. Returns the lock file's descriptor (kept open).

    A new data dir is made 0700; an existing one that lets other users in is named in one
    warning and left as it is, as etcd does (raftgate/private_files.py)."""
    if private_dir(data_dir):
        wider = wider_than_private(data_dir)
        if wider is not None:
            log.warning("%s", wider)
    try:
        return lock(data_dir)  # the flock and its message: raftgate/process.py, shared with raftgate local
    except DataDirInUse as exc:
        raise StartupError(str(exc)) from None


def bootstrap_entries(cfg: store_config.StoreConfig) -> tuple[list[Entry], HardState]:
    """A new cluster's first log entries: one committed conf change per initial member, then,
    with --initial-root-password-file, root and AuthEnable (identical on every initial member)."""
    ids = [member_id(urls, cfg.initial_cluster_token) for _, urls in cfg.initial_cluster]
    cid = cluster_id(ids, cfg.initial_cluster_token)
    entries = []
    for i, ((name, urls), mid) in enumerate(zip(cfg.initial_cluster, ids, strict=True)):
        ctx = spb.MemberContext(member=pb.Member(ID=mid, name=name, peerURLs=urls), cluster_id=cid)
        cc = ConfChange(ConfChangeType.ADD_NODE, mid, ctx.SerializeToString())
        entries.append(Entry(1, i + 1, EntryType.CONF_CHANGE, encode_conf_change(cc)))
    if cfg.initial_root_password is not None:
        hashed = initial_root.hash_password(cfg.initial_root_password, cfg.bcrypt_cost, cid,
                                            cfg.initial_cluster_token)
        entries += initial_root.initial_root_entries(hashed, len(entries) + 1)
        log.info("new cluster: root and authentication are its first log entries")
    return entries, HardState(term=1, vote=0, commit=len(entries))


async def _find_own_id(cfg: store_config.StoreConfig, security: PeerSecurity) -> tuple[int, dict[int, str]]:
    """A node joining after MemberAdd asks the cluster which member its peer URLs belong to, and
    where every member is: a member added later has an ID of its own, not the one --initial-cluster
    would give it, so the joiner must learn the IDs to answer (the leader may be such a member)."""
    mine = set(cfg.peer_urls)
    for _name, urls in cfg.initial_cluster:
        if set(urls) == mine:
            continue
        for url in urls:
            channel = security.channel(peer_address(url))
            try:
                call = channel.unary_unary("/raftgate.storepb.Peer/Members", request_serializer=None,
                                           response_deserializer=pb.MemberListResponse.FromString)
                prover = security.prover(channel, None)  # whom it reaches is what it asks
                resp = await (prover.call(lambda md, ask=call: ask(b"", metadata=md, timeout=5), timeout=5)
                              if prover else call(b"", timeout=5))
            except grpc.aio.AioRpcError as exc:
                log.warning("could not ask %s for the member list: %s", url, exc.code())
                continue
            finally:
                await channel.close()
            for m in resp.members:
                if mine & set(m.peerURLs):
                    return m.ID, {p.ID: peer_address(p.peerURLs[0]) for p in resp.members if p.peerURLs}
            raise StartupError(f"no member of the cluster has peer URLs {sorted(mine)}: run MemberAdd first")
    raise StartupError("--initial-cluster-state existing: no other member could be reached")


def _own_id(cfg: store_config.StoreConfig, backend: Backend) -> int:
    """This node's member ID as its data dir records it (0: none yet). A data dir of a version
    that kept the ID in the store has it taken over into the ID file once, and the store's record
    dropped (a copy of this store sent to a follower must not carry it)."""
    try:
        mid = identity.read(cfg.data_dir)
    except identity.IdentityError as exc:
        raise StartupError(str(exc)) from None
    if mid is not None:
        return mid
    mid = backend.legacy_member_id()
    if mid:
        identity.write(cfg.data_dir, mid)  # first, so a crash in between loses nothing
        backend.drop_legacy_member_id()
    return mid


def min_lease_ttl(cfg: store_config.StoreConfig) -> int:
    """etcd's minimum lease TTL: (3 x election ticks / 2) heartbeats, rounded up to whole seconds."""
    ticks = max(cfg.election_timeout_ms // cfg.heartbeat_interval_ms, 2)
    return max(1, -(-(3 * ticks // 2) * cfg.heartbeat_interval_ms // 1000))


@dataclass
class Recovered:
    """What a node starts from: its member ID and the log as replayed (or bootstrapped)."""

    member_id: int
    wal: WAL
    storage: MemoryStorage
    applied: int
    #: a joining node's view of where the members are (ID -> peer address), from the cluster itself
    cluster_peers: dict[int, str] = field(default_factory=dict)


async def recover(cfg: store_config.StoreConfig, backend: Backend, security: PeerSecurity) -> Recovered:
    wal = WAL(cfg.data_dir / "wal")
    replayed = wal.replayed
    storage = MemoryStorage()
    mid = _own_id(cfg, backend)
    fresh = not replayed.entries and replayed.snapshot.index == 0 and replayed.hard_state.is_empty()
    cluster_peers: dict[int, str] = {}
    if not fresh and not mid:
        raise StartupError(f"{cfg.data_dir} holds a log but no member ID ({identity.FILE_NAME} is missing): "
                           "restore the file, or remove the member and add it again with an empty data dir (a "
                           "`raftgate snapshot restore` killed before it finished: empty the dir and restore again)")
    if fresh and cfg.initial_cluster_state == "new":
        # (again, if a crash came between the ID and the log: the same ID, from the same URLs)
        mid = member_id(cfg.peer_urls, cfg.initial_cluster_token)
        identity.write(cfg.data_dir, mid)  # before the log: a log is never without its member's ID
        entries, hard_state = bootstrap_entries(cfg)
        wal.save(hard_state, entries)
        storage.append(entries)
        storage.set_hard_state(hard_state)
    elif fresh:
        # A joiner, or one restarted before its first entries came (killed right after it wrote
        # its ID): either way it asks the cluster where its peers are and under which IDs, which
        # --initial-cluster cannot tell for members added later (its leader may be one).
        known = mid
        mid, cluster_peers = await _find_own_id(cfg, security)
        if mid != known:  # nothing in this data dir was said under the ID it held
            identity.write(cfg.data_dir, mid)
    else:  # a restart
        if replayed.snapshot.index:
            storage.apply_snapshot(Snapshot(b"", replayed.snapshot))
        storage.append(replayed.entries)
        storage.set_hard_state(replayed.hard_state)
    return Recovered(mid, wal, storage, replayed.snapshot.index, cluster_peers)


def new_node(cfg: store_config.StoreConfig, rec: Recovered, applier: Applier, peers: Transport) -> RaftNode:
    return RaftNode(rec.member_id, rec.storage, rec.wal, applier, peers, applied=rec.applied,
                    snapshot_dir=cfg.data_dir / "snap", tick_seconds=cfg.heartbeat_interval_ms / 1000,
                    election_ticks=max(cfg.election_timeout_ms // cfg.heartbeat_interval_ms, 2),
                    snapshot_count=cfg.snapshot_count, catchup_entries=cfg.snapshot_catchup_entries,
                    initial_election_tick_advance=cfg.initial_election_tick_advance)


async def serve(cfg: store_config.StoreConfig) -> int | None:
    """Runs the node until SIGTERM/SIGINT or its removal from the cluster; returns its member ID
    if it was removed."""
    stop = asyncio.Event()
    stop_on_signals(stop)  # from the start: a signal during startup stops the node once it is up
    backend = Backend(cfg.data_dir / "store", map_size=max(cfg.quota_backend_bytes * 2, 64 << 20))
    security = _peer_security(cfg)
    rec = await recover(cfg, backend, security)
    cfg = dataclasses.replace(cfg, initial_root_password=None)  # hashed into a new cluster's first entries,
    # or unused: not kept (main() hands its reference over)
    # Everything is built here, each part given what it uses; the parts that follow the node
    # subscribe to it (and to the applier) through their hooks.
    applier = Applier(backend, rec.member_id, max_txn_ops=cfg.max_txn_ops, min_lease_ttl=min_lease_ttl(cfg))
    transport = Transport(rec.member_id, security, cfg.data_dir / "snap")
    node = new_node(cfg, rec, applier, transport)
    proposer = Proposer(node)  # the one source of this node's request IDs; stamps each request's time
    leases = LeaseKeeper(node, applier, propose=proposer.propose)
    me = MemberInfo(cfg.name, cfg.peer_urls, cfg.advertise_client_urls, cfg.advertise_internal_urls,
                    cfg.advertise_gateway_urls)
    maintenance = Maintenance(applier, node, proposer, me, cfg.quota_backend_bytes, cfg.initial_cluster_token,
                              leases=leases)
    watch_hub = WatchHub(applier, node, progress_interval=progress_interval_from_env(os.environ),
                         max_watches_per_stream=cfg.max_watches_per_stream,
                         max_watches_per_user=cfg.max_watches_per_user)
    quota = Quota(applier, maintenance.quota_bytes, node.id, proposer.propose, lambda: node.applied_index)
    tokens = SimpleTokens(lambda: applier.env, lambda: applier.auth, proposer.propose, node.wait_applied,
                          lambda: node.last_index, node.caught_up)
    service = StoreService(applier, node, maintenance, proposer=proposer, watch_hub=watch_hub, quota=quota,
                           tokens=tokens, classifier=_classifier(cfg), verifiers=_verifiers(cfg, tokens),
                           lockout_attempts=cfg.auth_lockout_attempts,
                           lockout_duration_ms=cfg.auth_lockout_duration_ms)
    login = StoreLogin(service.credentials, service.commit_authenticate, lead=service.may_login, jwt=cfg.jwt,
                       simple_ttl_seconds=cfg.auth_token_ttl, workers=cfg.bcrypt_workers, cost=cfg.bcrypt_cost,
                       record_failure=service.record_failure)
    service.serve_logins(login)
    watch_hub.attach()
    # Until the node has applied the membership itself: the members a joiner was told of by the
    # cluster, else --initial-cluster's (a new cluster's IDs come from its URLs and token).
    initial_peers = rec.cluster_peers or {member_id(urls, cfg.initial_cluster_token): peer_address(urls[0])
                                          for _, urls in cfg.initial_cluster}

    def refresh_peers() -> None:
        peers = dict(initial_peers) if not node.conf_state.voters else {}
        with applier.env.begin() as txn:
            for m in applier.membership.members(txn):
                if m.peerURLs:
                    peers[m.ID] = peer_address(m.peerURLs[0])
        transport.set_peers(peers)

    node.on_membership_change(refresh_peers)
    # As etcd: a removed member stops (the graceful stop a SIGTERM starts) and the process exits.
    node.on_removed(lambda: asyncio.get_running_loop().call_later(REMOVED_STOP_DELAY, stop.set))
    node.on_batch_results(leases.on_batch_results)

    def leader_changed(leader: int, term: int) -> None:
        leases.on_leader_change(leader, term)
        watch_hub.leadership_changed(leader == node.id)
        if leader == node.id:
            tokens.became_leader()

    node.on_leader_change(leader_changed)
    address = grpc_listen.host_port(cfg.listen_host, cfg.listen_port)
    server, health = build_server(service, secret=cfg.secret, credentials=_credentials(cfg), address=address,
                                  revocations=_revocations(cfg))
    peer_server = grpc.aio.server(interceptors=security.interceptors(rec.member_id), options=[
        ("grpc.max_receive_message_length", STORE_MESSAGE_BYTES), *FIXED_RECEIVE_WINDOW, STOP_PING_TIMEOUT,
        ("grpc.so_reuseport", 0)])
    peer_server.add_generic_rpc_handlers((transport.handler(maintenance.member_list_bytes),))
    peer_creds = security.server_credentials()
    peer_listen = grpc_listen.host_port(cfg.listen_peer_host, cfg.listen_peer_port)
    if not grpc_listen.bind(peer_server, peer_listen, peer_creds):
        raise OSError(f"--listen-peer-urls: cannot listen on {peer_listen}: the port is in use or the address is "
                      "not available here")
    await peer_server.start()
    startup_commit = node.storage.hard_state.commit
    # etcd counts the members its membership holds as it starts: the store's (a restart), else
    # the cluster's answer to a joiner, or --initial-cluster (a new member)
    with applier.env.begin() as txn:
        members = len(applier.membership.members(txn)) or len(initial_peers)
    node.start(members=members)
    refresh_peers()
    # Nothing is served before the committed entries this node already holds are applied: on a
    # new cluster, that is the initial root and AuthEnable (no request ever sees auth disabled).
    while node.applied_index < startup_commit:
        with contextlib.suppress(EtcdError):
            await node.wait_applied(startup_commit)
    publishing = asyncio.get_running_loop().create_task(maintenance.publish_attributes())
    background = [asyncio.get_running_loop().create_task(tokens.sweep(lambda: node.is_leader)),
                  publishing, asyncio.get_running_loop().create_task(leases.run())]
    await server.start()
    try:
        observability = await start_observability(cfg.observe, health)
    except BaseException:  # e.g. --health-addr in use: stop what runs, so the process ends cleanly
        for task in background:
            task.cancel()
        await server.stop(0)
        await peer_server.stop(0)
        await node.stop()
        backend.close()
        raise
    # Ready as etcd is ready (ReadyNotify): serving, and this member's name and URLs in the member
    # list, so a MemberList right after shows them. A member that cannot publish yet (no leader
    # takes it) says so and reports ready after PUBLISH_WAIT anyway; publishing goes on.
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([publishing, stopping], timeout=PUBLISH_WAIT, return_when=asyncio.FIRST_COMPLETED)
    if not stopping.done():
        stopping.cancel()
    if not publishing.done() and not stop.is_set():
        log.info("member attributes not published yet (no leader has taken them); still trying")
    if not stop.is_set():
        print(f"raftgate store: {cfg.name} ready on {address} (member {node.id:x}, peers on {peer_listen})",
              flush=True)
    await stop.wait()
    await observability.begin_shutdown()
    for task in background:
        task.cancel()
    watch_hub.close()
    service.drain()
    await server.stop(grace=2)
    login.close()
    await observability.close()
    await peer_server.stop(grace=1)
    await node.stop()
    backend.close()
    return node.id if node.removed else None


def main(argv: list[str]) -> int:
    restrict_umask()  # every file and directory the store (or LMDB) creates is owner-only
    try:
        cfg = store_config.parse(argv, os.environ)
        stages.configure(os.environ, program="store")
        loop_name = event_loop.chosen(os.environ)
    except (store_config.ConfigError, ValueError) as exc:
        print(f"raftgate store: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=cfg.log_level.upper().replace("WARN", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        armed = failpoints.load(os.environ)
    except failpoints.FailpointError as exc:
        print(f"raftgate store: {exc}", file=sys.stderr)
        return 2
    if armed:
        log.warning("fail points armed (tests only): %s", ", ".join(armed))
    try:
        lock_data_dir(cfg.data_dir)
        serving = serve(cfg)
        del cfg  # serve() drops the initial root password once it is used: no reference here keeps it
        removed = event_loop.run(serving, loop_name)
    except WALCorrupt as exc:
        print(f"raftgate store: the log is corrupt and the node will not guess: {exc}", file=sys.stderr)
        return 1
    except (OSError, StartupError) as exc:
        print(f"raftgate store: {exc}", file=sys.stderr)
        return 1
    if removed is not None:
        # Exit code 0, as etcd: the operator ended this member on purpose and it stopped cleanly;
        # a supervisor that restarts failed processes has nothing to restart.
        print(f"raftgate store: member {removed:x} was removed from the cluster; exiting", file=sys.stderr,
              flush=True)
    return 0
