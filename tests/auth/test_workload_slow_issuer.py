"""A slow or hung OIDC issuer must not stall workload tokens whose key is already known.

Anyone can make the proxy fetch the issuer's keys again: a token whose ``iss`` is the issuer and
whose ``kid`` nobody knows does it (at most once per refetch interval). While that fetch waits on
the issuer (up to the fetch timeout, twice with discovery), a pod's token signed with a key the
proxy already holds must still be verified at once, not queue behind the fetch (every request of
every workload stalls, and so do the proxy's worker threads).

Finding: tokens of known keys queued behind a refetch waiting on a hung issuer (failed before the
fix).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time

import jwt as pyjwt

from raftgate.workload_identity import KeySet, UserMap, WorkloadRefused, WorkloadVerifier
from tests.support.oidc_issuer import AUDIENCE, public_jwk, rsa_key

ISSUER = "https://issuer.example"
SUBJECT = "system:serviceaccount:shop:cart"
#: generous bound for a verification that needs no I/O (the fetch it must not wait for never ends
#: before the test releases it)
BOUND_SECONDS = 10.0


class HungIssuer:
    """Serves the JWKS once; every later fetch hangs until ``release``."""

    max_age = 300.0
    refetch_interval = 0.0

    def __init__(self) -> None:
        self.document = json.dumps({"keys": [public_jwk(rsa_key(0), "k1")]}).encode()
        self.calls = 0
        self.hanging = threading.Event()
        self.release = threading.Event()

    def fetch(self) -> bytes:
        self.calls += 1
        if self.calls > 1:
            self.hanging.set()
            self.release.wait(BOUND_SECONDS * 2)
        return self.document


def token(kid: str) -> str:
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": [AUDIENCE], "sub": SUBJECT, "iat": now, "nbf": now, "exp": now + 600}
    return pyjwt.encode(claims, rsa_key(0), algorithm="RS256", headers={"kid": kid})


def test_a_known_key_verifies_while_an_unknown_kid_waits_on_a_hung_issuer() -> None:
    source = HungIssuer()
    keys = KeySet(source)  # type: ignore[arg-type]
    keys.load()
    verifier = WorkloadVerifier(ISSUER, AUDIENCE, keys,
                                UserMap.from_json(json.dumps([{"match": SUBJECT, "user": "cart"}])))

    def attacker() -> None:
        with contextlib.suppress(WorkloadRefused):
            verifier.verify(token("made-up"))

    attack = threading.Thread(target=attacker, daemon=True)
    attack.start()
    try:
        assert source.hanging.wait(BOUND_SECONDS), "the made-up kid did not make the keys fetched again"
        result: list[str] = []
        legit = threading.Thread(target=lambda: result.append(verifier.verify(token("k1")).user), daemon=True)
        legit.start()
        legit.join(BOUND_SECONDS)
        assert result == ["cart"], "a token of a known key waited for the issuer's hung fetch"
    finally:
        source.release.set()
        attack.join(BOUND_SECONDS)
