"""The gateway's Cluster answers name the members' gateway URLs (proxy/gateway_members.py): what a
member published, nothing for a member that published none once others did, the answer as gRPC
gives it when no member publishes any; a member not yet heard of makes the list be asked again,
and a directory that cannot answer does not fail the call."""

from __future__ import annotations

import asyncio

from protos.etcdserverpb import rpc_pb2 as pb
from proxy.gateway_members import GatewayMembers


class Directory:
    def __init__(self, table: dict[int, tuple[str, ...]], later: dict[int, tuple[str, ...]] | None = None,
                 fail: bool = False) -> None:
        self.table = table
        self.later = later
        self.fail = fail
        self.refreshes = 0

    def gateway_urls(self) -> dict[int, tuple[str, ...]]:
        return dict(self.table)

    async def refresh_members(self) -> None:
        self.refreshes += 1
        if self.fail:
            raise ConnectionError("no node answers")
        if self.later is not None:
            self.table = self.later


def _list(*members: tuple[int, list[str]]) -> bytes:
    return pb.MemberListResponse(header=pb.ResponseHeader(revision=3), members=[
        pb.Member(ID=mid, name=f"m{mid}", peerURLs=[f"http://p{mid}:2380"], clientURLs=urls) for mid, urls in members
    ]).SerializeToString()


def _urls(answer: bytes) -> dict[int, list[str]]:
    return {m.ID: list(m.clientURLs) for m in pb.MemberListResponse.FromString(answer).members}


def _rewrite(directory: Directory, answer: bytes) -> bytes:
    return asyncio.run(GatewayMembers(directory).rewrite(answer, pb.MemberListResponse))


def test_members_are_named_by_their_gateway_urls() -> None:
    directory = Directory({1: ("http://a:8080",), 2: ("http://b:8080", "https://b:8443")})
    answer = _rewrite(directory, _list((1, ["http://a:2379"]), (2, ["http://b:2379"])))
    assert _urls(answer) == {1: ["http://a:8080"], 2: ["http://b:8080", "https://b:8443"]}
    assert pb.MemberListResponse.FromString(answer).header.revision == 3  # the rest as the store answered
    assert directory.refreshes == 0


def test_a_member_without_a_gateway_has_no_client_urls_once_others_have_one() -> None:
    directory = Directory({1: ("http://a:8080",), 2: ()})
    assert _urls(_rewrite(directory, _list((1, ["http://a:2379"]), (2, ["http://b:2379"])))) == {
        1: ["http://a:8080"], 2: []}


def test_a_cluster_without_gateways_is_answered_as_grpc_answers() -> None:
    original = _list((1, ["http://a:2379"]), (2, ["http://b:2379"]))
    assert _rewrite(Directory({1: (), 2: ()}), original) == original


def test_a_member_not_heard_of_asks_the_list_again() -> None:
    directory = Directory({1: ("http://a:8080",)}, later={1: ("http://a:8080",), 4: ("http://d:8080",)})
    answer = _rewrite(directory, _list((1, ["http://a:2379"]), (4, ["http://d:2379"])))
    assert _urls(answer) == {1: ["http://a:8080"], 4: ["http://d:8080"]}
    assert directory.refreshes == 1


def test_an_unreachable_directory_answers_from_what_it_knows() -> None:
    directory = Directory({1: ("http://a:8080",)}, fail=True)
    answer = _rewrite(directory, _list((1, ["http://a:2379"]), (4, ["http://d:2379"])))
    assert _urls(answer) == {1: ["http://a:8080"], 4: []}


def test_an_answer_without_members_is_left_alone() -> None:
    original = pb.MemberRemoveResponse(header=pb.ResponseHeader(revision=3)).SerializeToString()
    directory = Directory({1: ("http://a:8080",)})
    assert asyncio.run(GatewayMembers(directory).rewrite(original, pb.MemberRemoveResponse)) == original
