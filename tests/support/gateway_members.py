"""A cluster built member by member, each store node with its member proxy serving gRPC and the
JSON gateway (``--advertise-gateway-urls``): the gateway discovery tests' world."""

from __future__ import annotations

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
    internal, grpc_port, gateway_port = free_port(), free_port(), free_port()
    grpc_url, gateway_url = f"http://127.0.0.1:{grpc_port}", f"http://127.0.0.1:{gateway_port}"
    node = Node(name=name, data_dir=world.tmp / name, internal=f"127.0.0.1:{internal}",
                argv=store_argv(name, world.tmp / name, internal, peer, world.secret, initial, grpc_url,
                                ["--advertise-gateway-urls", gateway_url, *extra]))
    world.cluster.nodes.append(node)
    world.cluster.restart(node)
    proxy = Program(world.tmp / f"{name}-proxy",
                    ["proxy", "--listen-client-urls", grpc_url, "--listen-gateway-urls", gateway_url,
                     "--store-endpoints", node.internal, "--member-store-endpoint", node.internal,
                     "--internal-secret-file", str(world.secret), "--bcrypt-cost", "4"],
                    "raftgate proxy:", name=f"{name}-proxy")
    world.cluster.extra_programs.append(proxy)
    proxy.start()
    member = Member(name, node, proxy, f"127.0.0.1:{grpc_port}", gateway_url)
    world.members.append(member)
    return member
