"""One fetch-and-freshness policy for fetched keys (raftgate/key_source.py; issue 23, item 1),
enumerated cell by cell against both of its users, so that the two can never drift apart:

* etcd's ``jwks-url`` follower (raftgate/jwt_keys.py ``JwksFollower`` feeding a ``KeyRing``), and
* workload identity's issuer keys (raftgate/workload_identity.py ``KeySet``).

The cells: fresh keys verify without a fetch; a failing source keeps the keys fetched before while
they are younger than ``max_stale`` and logs the failure once; past ``max_stale`` they stop
verifying (a new generation) and say so once; a good fetch brings them back; an unknown kid
fetches again, but never sooner than ``refetch_interval`` after the last fetch started (the
follower waits that out and is served; a workload token is refused meanwhile: each user's
documented behaviour, a parameter of the policy), and no sooner than it for a second one.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from raftgate import jwt_keys
from raftgate.jwt_keys import JwksFollower, KeyLoadError, KeyMaterial, KeyRing, public_jwk
from raftgate.workload_identity import KeySet

MAX_AGE = 100.0
REFETCH = 10.0
MAX_STALE = 1000.0


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Source:
    """What the keys are fetched from: a JWKS of the kids in ``kids``, or down. Records when
    (on the monotonic clock) each fetch started."""

    def __init__(self, mono: Clock) -> None:
        self.mono = mono
        self.keys = {kid: ec.generate_private_key(ec.SECP256R1()) for kid in ("k1", "k9")}
        self.kids = ["k1"]
        self.down = False
        self.started: list[float] = []

    def document(self) -> bytes:
        self.started.append(self.mono())
        if self.down:
            raise OSError("connection refused")
        return json.dumps({"keys": [{**public_jwk(self.keys[kid]), "kid": kid, "alg": "ES256"}
                                    for kid in self.kids]}).encode()


class Workload:
    """The workload issuer's keys (KeySet) over ``source``."""

    waits_out_refetch = False

    def __init__(self, source: Source, mono: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
        class _Src:
            def fetch(self) -> bytes:
                return source.document()

            def __str__(self) -> str:
                return "the test source"

        self.keys = KeySet(_Src(), clock=mono, max_age=MAX_AGE,  # type: ignore[arg-type]
                           refetch_interval=REFETCH, max_stale=MAX_STALE)

    def refresh(self) -> None:
        self.keys.refresh_if_due()

    def has(self, kid: str) -> bool:
        """Whether ``kid`` verifies now; an unknown one may make the keys fetched again."""
        return self.keys.key_for(kid) is not None

    def generation(self) -> int:
        return self.keys.generation()


class Follower:
    """etcd's jwks-url follower feeding a verify-only KeyRing, its fetch answered by ``source``."""

    waits_out_refetch = True

    def __init__(self, source: Source, mono: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
        def fetch(url: str, context: Any, **_: Any) -> bytes:
            try:
                return source.document()
            except OSError as e:
                raise KeyLoadError(f"cannot fetch: {e}") from None

        async def sleep(seconds: float, *_: Any) -> None:  # the rate limit is waited out on the fake clock
            mono.now += max(seconds, 0.0)

        monkeypatch.setattr(jwt_keys, "fetch", fetch)
        monkeypatch.setattr(asyncio, "sleep", sleep)
        self.ring = KeyRing("ES256", KeyMaterial(None, ()), retain_seconds=300.0, monotonic=mono)
        self.follower = JwksFollower(self.ring, "http://127.0.0.1:1/jwks.json", refresh_seconds=MAX_AGE,
                                     min_interval=REFETCH, max_stale=MAX_STALE, monotonic=mono)

    def refresh(self) -> None:
        asyncio.run(self.follower.refresh())

    def has(self, kid: str) -> bool:
        if not self.ring.knows(kid):
            asyncio.run(self.follower.refresh_for(kid))
        return self.ring.knows(kid)

    def generation(self) -> int:
        return self.ring.generation()


@pytest.fixture(params=[Workload, Follower], ids=["workload-identity", "jwks-url"])
def user(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Source, Clock]]:
    mono = Clock(1000.0)
    source = Source(mono)
    yield request.param(source, mono, monkeypatch), source, mono


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_fetched_keys_fresh_stale_too_stale_and_back(user: tuple[Any, Source, Clock],
                                                    caplog: pytest.LogCaptureFixture) -> None:
    keys, source, mono = user
    caplog.set_level(logging.INFO)
    keys.refresh()
    fetched_at = mono.now
    assert source.started == [fetched_at]
    # fresh: a known kid verifies without a fetch
    assert keys.has("k1")
    mono.now += 1
    assert keys.has("k1")
    assert len(source.started) == 1
    first = keys.generation()
    # stale but within max_stale: every refresh fails, the keys fetched before still verify
    source.down = True
    for _ in range(3):
        mono.now += MAX_AGE + 1
        keys.refresh()
        assert keys.has("k1")
    assert len(source.started) == 4
    assert keys.generation() == first
    warnings = _records(caplog, logging.WARNING)
    assert len(warnings) == 1, warnings  # the failure is logged once
    assert str(int(MAX_STALE)) in warnings[0]  # with the bound it keeps the keys for
    assert _records(caplog, logging.ERROR) == []
    # past max_stale (counted from the last good fetch): no longer verifying, a new generation
    mono.now = fetched_at + MAX_STALE
    assert not keys.has("k1")
    assert keys.generation() != first
    mono.now += MAX_AGE + 1
    keys.refresh()
    assert not keys.has("k1")
    assert len(_records(caplog, logging.WARNING)) == 1  # still logged once
    assert len(_records(caplog, logging.ERROR)) == 1  # said once that they stopped verifying
    # the source is back: the keys are
    source.down = False
    gone = keys.generation()
    mono.now += MAX_AGE + 1
    keys.refresh()
    assert keys.has("k1")
    assert keys.generation() != gone
    caplog.clear()
    # and a failure after that success is logged again
    source.down = True
    mono.now += MAX_AGE + 1
    keys.refresh()
    assert len(_records(caplog, logging.WARNING)) == 1


def test_an_unknown_kid_fetches_again_at_most_once_per_refetch_interval(user: tuple[Any, Source, Clock]) -> None:
    keys, source, mono = user
    keys.refresh()
    assert keys.has("k1")
    source.kids = ["k1", "k9"]  # a rotation the keys fetched have not seen
    mono.now += REFETCH / 2  # within the interval
    served = keys.has("k9")
    assert served == keys.waits_out_refetch
    assert all(b - a >= REFETCH for a, b in zip(source.started, source.started[1:], strict=False)), source.started
    # past the interval: fetched again, and served
    mono.now = source.started[-1] + REFETCH
    assert keys.has("k9")
    # a kid nobody has: however many ask, no two fetches closer than the interval
    for _ in range(5):
        mono.now += 1
        assert not keys.has("nobody")
    assert all(b - a >= REFETCH for a, b in zip(source.started, source.started[1:], strict=False)), source.started
