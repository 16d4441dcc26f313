"""The proof of a development secret (raftgate/secret_proof.py): what a captured proof is good for.

A proof opens the server only for the connection its challenge was issued to, the member and the
port (role) it names, while the challenge is fresh, and only from this server process; anything
malformed is no proof at all.
"""

from __future__ import annotations

import pytest

from protos.storepb.store_pb2 import ChallengeResponse
from raftgate.secret_proof import (
    CHALLENGE_TTL,
    INTERNAL,
    NONE,
    PEER,
    PROOF_METADATA,
    STALE,
    Challenges,
    proof_metadata,
)

CENTRAL = b"central-secret-0123456789"
SIDECAR = b"sidecar-secret-0123456789"
PEER_ADDR = "ipv4:10.0.0.7:40000"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _server(clock: Clock | None = None, role: str = INTERNAL) -> Challenges:
    return Challenges(role, (CENTRAL, SIDECAR), member_id=7, clock=clock or Clock())


def _nonce(server: Challenges, peer: str = PEER_ADDR) -> bytes:
    answer = ChallengeResponse.FromString(server.issue(peer))
    assert answer.member_id == 7
    return answer.nonce


def test_each_secret_is_proven_for_its_connection_member_and_port() -> None:
    server = _server()
    nonce = _nonce(server)
    assert server.verify(proof_metadata(CENTRAL, INTERNAL, 7, nonce), PEER_ADDR) == 0
    assert server.verify(proof_metadata(SIDECAR, INTERNAL, 7, nonce), PEER_ADDR) == 1
    # the same proof from another connection: the nonce was not issued there (ask again)
    assert server.verify(proof_metadata(CENTRAL, INTERNAL, 7, nonce), "ipv4:10.0.0.7:40001") == STALE
    # made for another member (a relay passing this member's challenge on), another port, another secret
    assert server.verify(proof_metadata(CENTRAL, INTERNAL, 8, nonce), PEER_ADDR) == NONE
    assert server.verify(proof_metadata(CENTRAL, PEER, 7, nonce), PEER_ADDR) == NONE
    assert server.verify(proof_metadata(b"another-secret-0123456789", INTERNAL, 7, nonce), PEER_ADDR) == NONE


def test_a_challenge_is_good_for_a_short_while_and_from_this_process_only() -> None:
    clock = Clock()
    server = _server(clock)
    md = proof_metadata(CENTRAL, INTERNAL, 7, _nonce(server))
    clock.now += CHALLENGE_TTL
    assert server.verify(md, PEER_ADDR) == 0
    clock.now += 1
    assert server.verify(md, PEER_ADDR) == STALE
    # a restarted server (another key) vouches for none of its predecessor's challenges
    assert _server(clock).verify(proof_metadata(CENTRAL, INTERNAL, 7, _nonce(server)), PEER_ADDR) == STALE
    # a peer port's challenge is not an internal port's
    peer_port = _server(clock, PEER)
    nonce = _nonce(peer_port)
    assert server.verify(proof_metadata(CENTRAL, INTERNAL, 7, nonce), PEER_ADDR) == STALE


@pytest.mark.parametrize("value", ["", "v1", "v1..", "v2.AAAA.AAAA", "v1.!!!!.AAAA", "v1.AAAA.AAAA",
                                   "v1." + "A" * 500 + ".AAAA", "v1.AAAA.AAAA.AAAA", "\u00e9\u00e9\u00e9"])
def test_anything_malformed_is_no_proof(value: str) -> None:
    assert _server().verify(((PROOF_METADATA, value),), PEER_ADDR) in (NONE, STALE)
    assert _server().verify(((PROOF_METADATA, value.encode()),), PEER_ADDR) in (NONE, STALE)


def test_no_metadata_is_no_proof() -> None:
    assert _server().verify(None, PEER_ADDR) == NONE
    assert _server().verify((("x-raftgate-internal-secret", CENTRAL.decode()),), PEER_ADDR) == NONE
