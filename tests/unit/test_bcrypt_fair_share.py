"""Issue 22 item 5: the bcrypt check lanes are fair without refusing a lone client.

Both lanes (the proxy's password checks, proxy/passwords.py; the store's sidecar logins,
authstore/api/login.py) are driven through their public check calls, with bcrypt replaced by a
check that waits until the test lets go and records the order in which checks ran: so what is
asserted is who runs, who waits and who is refused, and in which order (never how long).

* one address alone may use every worker and every waiting place (a sidecar's only client is its
  own pod, on 127.0.0.1);
* while two addresses both wait, the one that is not flooding gets at least half of the checks
  served (waiting checks are served round-robin between addresses);
* a queue that is really full still refuses with etcd's ``too many requests``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from authstore.api import login as store_login
from proxy import passwords
from raftgate.errors import Err, EtcdError

A = "ipv4:10.0.0.7"
B = "ipv4:10.0.0.8"


@dataclass
class Gate:
    """Stands in for bcrypt: every check records its password and waits for ``release``."""

    release: threading.Event = field(default_factory=threading.Event)
    started: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self, raw: bytes, hashed: bytes) -> bool:
        with self.lock:
            self.started.append(raw.decode())
        self.release.wait(timeout=50)  # bounded: the test lets go long before
        return False


@dataclass
class Lane:
    """One lane under test: ``submit(peer, password)`` starts a check; ``workers``, ``waiting``:
    its threads and waiting places."""

    submit: Callable[[str, str], Awaitable[bool]]
    workers: int
    waiting: int
    close: Callable[[], None]


def _proxy_lane(workers: int, waiting: int) -> Lane:
    hasher = passwords.PasswordHasher(4, workers=workers, queue_limit=waiting)
    return Lane(lambda peer, pw: hasher.check(pw, b"", peer=peer), workers, waiting, hasher.close)


def _store_lane(workers: int, waiting: int) -> Lane:
    assert waiting == workers * store_login.QUEUE_PER_WORKER  # the store's pool has no queue flag
    lane = store_login.BcryptLane(workers)
    return Lane(lambda peer, pw: lane.check(pw.encode(), b"$2a$", peer), workers, waiting,
                lane.close)


LANES = {"proxy": (_proxy_lane, lambda w: 4 * w), "store": (_store_lane, lambda w: store_login.QUEUE_PER_WORKER * w)}


@pytest.fixture(params=sorted(LANES))
def make(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> tuple[Gate, Callable[[int], Lane]]:
    gate = Gate()
    monkeypatch.setattr(passwords, "_checkpw", gate.check)
    monkeypatch.setattr(store_login, "_checkpw", gate.check)
    factory, waiting = LANES[request.param]
    lanes: list[Lane] = []

    def build(workers: int) -> Lane:
        lanes.append(factory(workers, waiting(workers)))
        return lanes[-1]

    yield gate, build
    gate.release.set()
    for lane in lanes:
        lane.close()


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)  # polling interval of a condition wait


def _refused(futures: list[asyncio.Future[bool]]) -> list[asyncio.Future[bool]]:
    """The futures that ended with ``too many requests`` (any other error fails the test)."""
    out = []
    for f in futures:
        if f.done() and (exc := f.exception()) is not None:
            assert isinstance(exc, EtcdError) and exc.err is Err.TOO_MANY_REQUESTS, exc
            out.append(f)
    return out


async def _settle() -> None:
    """A few loop turns: refusals at admission are answered at once."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_lone_address_gets_the_whole_lane(make: tuple[Gate, Callable[[int], Lane]]) -> None:
    gate, build = make

    async def go() -> None:
        lane = build(3)
        places = lane.workers + lane.waiting
        checks = [asyncio.ensure_future(lane.submit(A, f"A{i}")) for i in range(places)]
        await _settle()
        await _until(lambda: len(gate.started) == lane.workers or bool(_refused(checks)),
                     "every worker to run a check")
        assert not _refused(checks), f"{len(_refused(checks))} of {places} refused: the lane had room"
        assert len(gate.started) == lane.workers  # every worker busy with this one address at once
        gate.release.set()
        assert await asyncio.gather(*checks) == [False] * places
        assert len(gate.started) == places

    asyncio.run(go())


def test_a_full_queue_still_refuses(make: tuple[Gate, Callable[[int], Lane]]) -> None:
    gate, build = make

    async def go() -> None:
        lane = build(2)
        places = lane.workers + lane.waiting
        checks = [asyncio.ensure_future(lane.submit(A, f"A{i}")) for i in range(places)]
        await _settle()
        await _until(lambda: len(gate.started) == lane.workers, "every worker to run a check")
        assert not _refused(checks)
        with pytest.raises(EtcdError) as e:
            await lane.submit(A, "one too many")
        assert e.value.err is Err.TOO_MANY_REQUESTS
        gate.release.set()
        await asyncio.gather(*checks)

    asyncio.run(go())


def test_a_flooding_address_leaves_the_other_half(make: tuple[Gate, Callable[[int], Lane]]) -> None:
    gate, build = make

    async def go() -> None:
        lane = build(1)
        flood = [asyncio.ensure_future(lane.submit(A, f"A{i}")) for i in range(lane.workers + lane.waiting + 3)]
        await _settle()
        await _until(lambda: len(gate.started) == lane.workers, "the flood to hold the worker")
        others = max(1, lane.waiting // 4)
        other = [asyncio.ensure_future(lane.submit(B, f"B{i}")) for i in range(others)]
        await _settle()
        assert not _refused(other), "the other address was refused while the flood waited"
        gate.release.set()
        await asyncio.gather(*flood, *other, return_exceptions=True)
        assert not _refused(other)

        # In the order checks ran after the first: those served while both addresses still had
        # checks waiting. The other address gets at least half of them.
        served = [name[0] for name in gate.started[lane.workers:]]
        left = {"A": served.count("A"), "B": served.count("B")}
        assert left["B"] == others
        both_waiting = []
        for who in served:
            if not (left["A"] and left["B"]):
                break
            both_waiting.append(who)
            left[who] -= 1
        assert 2 * both_waiting.count("B") >= len(both_waiting), f"served in order: {''.join(served)}"

    asyncio.run(go())


def test_the_queue_depth_gauge_counts_refused_and_displaced_checks_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy's bcrypt queue-depth gauge is back where it was once a flood has been refused
    at the door, pushed out of the queue by another address, and served."""
    from proxy import metrics

    gate = Gate()
    monkeypatch.setattr(passwords, "_checkpw", gate.check)
    depth = metrics.BCRYPT_QUEUE_DEPTH.labels("check")

    async def go() -> None:
        hasher = passwords.PasswordHasher(4, workers=1, queue_limit=4)
        try:
            before = depth._value.get()
            flood = [asyncio.ensure_future(hasher.check(f"A{i}", b"", peer=A)) for i in range(8)]
            await _settle()
            await _until(lambda: len(gate.started) == 1, "the flood to hold the worker")
            assert depth._value.get() == before + 4
            other = [asyncio.ensure_future(hasher.check(f"B{i}", b"", peer=B)) for i in range(2)]
            await _settle()
            assert depth._value.get() == before + 4  # two of the flood's waiting checks made room
            assert len(_refused(flood)) == 3 + 2 and not _refused(other)
            gate.release.set()
            await asyncio.gather(*flood, *other, return_exceptions=True)
            assert depth._value.get() == before
        finally:
            gate.release.set()
            hasher.close()

    asyncio.run(go())


def test_what_a_waiting_check_keeps_does_not_change_its_answer() -> None:
    """A waiting check keeps only the password's first 72 bytes and the hash's first 64 (so a
    queue place holds a bounded number of bytes): a longer password still matches on what bcrypt
    reads, and a hash with anything after it still never matches."""
    import bcrypt

    password = "p" * 72
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(4))

    async def go() -> None:
        hasher = passwords.PasswordHasher(4, workers=1)
        lane = store_login.BcryptLane(1)
        try:
            for longer in (password, password + "and more"):
                assert await hasher.check(longer, hashed, peer=A)
                assert await lane.check(longer.encode(), hashed, A)
            for padded in (hashed + b"x", hashed + b"x" * 4, hashed + b"$" * 1000):
                assert not await hasher.check(password, padded, peer=A)
                assert not await lane.check(password.encode(), padded, A)
        finally:
            hasher.close()
            lane.close()

    asyncio.run(go())
