"""etcd's initial election tick advance (EtcdServer.adjustTicks): a node does not wait a whole
randomized election timeout after it starts before it may campaign.

- A single-member cluster (fresh or restarted) advances ElectionTicks - 1 ticks at once: it
  leads within 1..ElectionTicks ticks instead of ElectionTicks..2 x ElectionTicks - 1.
- Another member, with --initial-election-tick-advance (the default), waits (50 ms polls, up to
  5 s) until the transport reports more than one active peer (etcd's ``ActivePeers() > 1``), then
  advances ElectionTicks - 2 ticks: two are left, so a member rejoining a cluster with a leader
  still hears its heartbeat before it could campaign.

Each node is driven by a manual clock, one tick at a time, through the driver's own tick path;
what is counted is the ticks until the node leads, or sends its first pre-vote (it campaigns).
The same seed draws the same randomized timeout, so an advance shows as exactly that many
ticks fewer than the same node without it.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from authstore.node.driver import RaftNode
from authstore.raft import HardState, Message, MessageType
from authstore.raft.codec import encode_conf_change
from authstore.raft.storage import MemoryStorage
from authstore.raft.types import ConfChange, ConfChangeType, Entry, EntryType
from tests.raft.fakes import KVStateMachine, ManualClock
from tests.support.node_ports import CountingWorker, RecordingWAL

ELECTION_TICKS = 10
TICK = 0.1
#: more than any start needs: a node that has not campaigned by then never will here
MAX_TICKS = 200


class ActivePeers:
    """ports.Peers: records what is sent; ``active`` remote members have their stream up."""

    def __init__(self, active: int) -> None:
        self.active = active
        self.sent: list[Message] = []

    def bind(self, receiver: object) -> None:
        pass

    def send(self, msg: Message) -> None:
        self.sent.append(msg)

    async def send_snapshot(self, msg: Message, path: Path) -> bool:
        return False

    def active_peers(self) -> int:
        return self.active

    async def close(self) -> None:
        pass


def _new_cluster_storage(members: list[int]) -> MemoryStorage:
    """A new store's log (authstore/main.py bootstrap_entries): one committed ADD_NODE per member."""
    st = MemoryStorage()
    st.append([Entry(1, i + 1, EntryType.CONF_CHANGE, encode_conf_change(ConfChange(ConfChangeType.ADD_NODE, m)))
               for i, m in enumerate(members)])
    st.set_hard_state(HardState(term=1, vote=0, commit=len(members)))
    return st


def _ticks_until(tmp_path: Path, seed: int, members: list[int], *, active: int = 0, campaigned: str = "leads",
                 **node_kw: object) -> int:
    """Ticks after start until member 1 leads (``campaigned="leads"``) or sends a pre-vote."""
    clock = ManualClock()
    peers = ActivePeers(active)
    node = RaftNode(1, _new_cluster_storage(members), RecordingWAL(), KVStateMachine(1, lambda *_: None),  # type: ignore[arg-type]
                    peers, applied=0, snapshot_dir=tmp_path / f"snap-{seed}", tick_seconds=TICK,
                    election_ticks=ELECTION_TICKS, clock=clock, log_worker=CountingWorker(),
                    apply_worker=CountingWorker(), copy_worker=CountingWorker(), rng=random.Random(seed),
                    fail_stop=_fail, **node_kw)  # type: ignore[arg-type]

    def done() -> bool:
        if campaigned == "leads":
            return node.is_leader
        return any(m.type == MessageType.MsgPreVote for m in peers.sent)

    async def main() -> int:
        node.start(members=len(members))  # as the store does: its member list, or --initial-cluster
        await _settle()
        assert not done(), "campaigned before any tick"
        for ticks in range(1, MAX_TICKS + 1):
            clock.advance(TICK)
            await _settle()
            if done():
                node.crash()
                return ticks
        raise AssertionError(f"no campaign within {MAX_TICKS} ticks")

    return asyncio.run(main())


def _fail() -> None:
    raise AssertionError("the driver stopped (fail-stop)")


async def _settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


SEEDS = range(8)


def test_a_new_single_member_cluster_leads_within_one_election_timeout(tmp_path: Path) -> None:
    """Without the advance a single member waits ElectionTicks..2 x ElectionTicks - 1 ticks."""
    counts = [_ticks_until(tmp_path, seed, [1]) for seed in SEEDS]
    assert max(counts) <= ELECTION_TICKS, counts
    assert min(counts) < ELECTION_TICKS, counts


def test_a_member_of_three_whose_peers_are_active_advances_all_but_two_ticks(tmp_path: Path) -> None:
    for seed in SEEDS:
        plain = _ticks_until(tmp_path, seed, [1, 2, 3], active=2, campaigned="pre-votes",
                             initial_election_tick_advance=False)
        advanced = _ticks_until(tmp_path, seed, [1, 2, 3], active=2, campaigned="pre-votes")
        assert plain >= ELECTION_TICKS
        assert advanced == plain - (ELECTION_TICKS - 2), (seed, plain, advanced)
        assert advanced >= 2, "a rejoining member must have two ticks to hear the leader"


def test_a_member_without_active_peers_does_not_advance(tmp_path: Path) -> None:
    """etcd advances only once ActivePeers() > 1: no peer, or one of two, is not enough."""
    for seed in SEEDS:
        plain = _ticks_until(tmp_path, seed, [1, 2, 3], campaigned="pre-votes", initial_election_tick_advance=False)
        assert plain >= ELECTION_TICKS
        assert _ticks_until(tmp_path, seed, [1, 2, 3], active=0, campaigned="pre-votes") == plain
        assert _ticks_until(tmp_path, seed, [1, 2, 3], active=1, campaigned="pre-votes") == plain


def test_the_flag_off_advances_nothing(tmp_path: Path) -> None:
    """--initial-election-tick-advance=false: a member of three waits its whole timeout."""
    for seed in SEEDS:
        off = _ticks_until(tmp_path, seed, [1, 2, 3], active=2, campaigned="pre-votes",
                           initial_election_tick_advance=False)
        assert ELECTION_TICKS <= off < 2 * ELECTION_TICKS
