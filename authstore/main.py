"""``raftgate store``: one authstore node."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import grpc

from authstore import config as store_config
from authstore.apply import Applier, Identity
from authstore.backend import Backend
from authstore.log.wal import WAL, WALCorrupt
from authstore.maintenance import Maintenance, MemberInfo, cluster_id, member_id
from authstore.node import Node
from authstore.server import StoreService, build_server

log = logging.getLogger("raftgate.store")


def _credentials(cfg: store_config.StoreConfig) -> grpc.ServerCredentials | None:
    if not cfg.tls:
        return None
    assert cfg.cert_file and cfg.key_file and cfg.trusted_ca_file
    return grpc.ssl_server_credentials([(cfg.key_file.read_bytes(), cfg.cert_file.read_bytes())],
                                       root_certificates=cfg.trusted_ca_file.read_bytes(),
                                       require_client_auth=True)


async def serve(cfg: store_config.StoreConfig) -> None:
    backend = Backend(cfg.data_dir / "store", map_size=max(cfg.quota_backend_bytes * 2, 64 << 20))
    mid = member_id(cfg.name, cfg.peer_urls, cfg.initial_cluster_token)
    identity = Identity(cluster_id=cluster_id([mid], cfg.initial_cluster_token), member_id=mid)
    applier = Applier(backend, identity, max_txn_ops=cfg.max_txn_ops)
    with backend.env.begin() as txn:
        applied = backend.applied_index(txn)
    wal = WAL(cfg.data_dir / "wal", applied_index=applied)
    node = Node(wal, applier.apply_batch, applied, backend.sync)
    node.replay()
    me = MemberInfo(cfg.name, cfg.peer_urls, cfg.advertise_client_urls)
    service = StoreService(applier, node, Maintenance(applier, node, me, cfg.quota_backend_bytes))
    address = f"{cfg.listen_host}:{cfg.listen_port}"
    server, _health = build_server(service, secret=cfg.secret, credentials=_credentials(cfg), address=address)
    node.start()
    sweeper = asyncio.get_running_loop().create_task(service.sweep_tokens())
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"raftgate store: {cfg.name} ready on {address} (member {mid:x})", flush=True)
    await stop.wait()
    await server.stop(grace=2)
    sweeper.cancel()
    await node.stop()
    backend.close()


def main(argv: list[str]) -> int:
    try:
        cfg = store_config.parse(argv)
    except store_config.ConfigError as exc:
        print(f"raftgate store: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=cfg.log_level.upper().replace("WARN", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(serve(cfg))
    except WALCorrupt as exc:
        print(f"raftgate store: the log is corrupt and the node will not guess: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"raftgate store: {exc}", file=sys.stderr)
        return 1
    return 0
