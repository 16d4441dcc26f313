"""A cluster built member by member, each store node with its member proxy serving gRPC and the
JSON gateway (``--advertise-gateway-urls``): the gateway discovery tests' world."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.cluster import Cluster, Node, store_argv
from tests.support.processes import Program, free_port


@dataclass
class Member:
    name: str
    node: Node
    proxy: Program
    grpc: str  # host:port
    gateway: str  # http://host:port



@dataclass
class World:
    cluster: Cluster
    tmp: Path
    secret: Path
    members: list[Member] = field(default_factory=list)

    def grpc_endpoints(self) -> str:
        return ",".join(m.grpc for m in self.members)



def start_member(world: World, name: str, initial: str, peer: int, *extra: str) -> Member:
    """One more member, started: its store node, then its member proxy."""
    member = new_member(world, name, initial, peer, *extra)
    world.cluster.restart(member.node)
    member.proxy.start()
    return member


def start_members(world: World, initial: str, peers: dict[str, int]) -> None:
    """The members of a new cluster, every store node at once (one started alone has no quorum to
    publish its attributes and says ready only after the store's 10 s publish wait), then every
    member proxy at once."""
    members = [new_member(world, name, initial, peer) for name, peer in peers.items()]
    with ThreadPoolExecutor(len(members)) as pool:
        list(pool.map(world.cluster.restart, [m.node for m in members]))  # raises what a start raised
        list(pool.map(lambda m: m.proxy.start(), members))


def new_member(world: World, name: str, initial: str, peer: int, *extra: str) -> Member:
    """A member's store node and member proxy, in ``world`` and not started."""
    internal, grpc_port, gateway_port = free_port(), free_port(), free_port()
    grpc_url, gateway_url = f"http://127.0.0.1:{grpc_port}", f"http://127.0.0.1:{gateway_port}"
    node = Node(name=name, data_dir=world.tmp / name, internal=f"127.0.0.1:{internal}",
                argv=store_argv(name, world.tmp / name, internal, peer, world.secret, initial, grpc_url,
                                ["--advertise-gateway-urls", gateway_url, *extra]))
    world.cluster.nodes.append(node)
    proxy = Program(world.tmp / f"{name}-proxy",
                    ["proxy", "--listen-client-urls", grpc_url, "--listen-gateway-urls", gateway_url,
                     "--store-endpoints", node.internal, "--member-store-endpoint", node.internal,
                     "--internal-secret-file", str(world.secret), "--bcrypt-cost", "4"],
                    "raftgate proxy:", name=f"{name}-proxy")
    world.cluster.extra_programs.append(proxy)
    member = Member(name, node, proxy, f"127.0.0.1:{grpc_port}", gateway_url)
    world.members.append(member)
    return member
