"""The linearizability checker on small hand-made histories, and the simulation's determinism."""

from __future__ import annotations

from tests.support.linearizability import CAS, DELETE, GET, PUT, History, check

from .sim import SimConfig, Simulation


def test_sequential_history_is_linearizable() -> None:
    h = History()
    op = h.invoke(0, PUT, "k", 1)
    h.ok(op)
    op = h.invoke(0, GET, "k")
    h.ok(op, 1)
    op = h.invoke(0, DELETE, "k")
    h.ok(op, True)
    op = h.invoke(0, GET, "k")
    h.ok(op, None)
    assert check(h.ops).ok


def test_stale_read_after_write_completed_is_not_linearizable() -> None:
    h = History()
    w = h.invoke(0, PUT, "k", 1)
    h.ok(w)
    r = h.invoke(1, GET, "k")
    h.ok(r, None)  # the write had completed before the read began
    res = check(h.ops)
    assert not res.ok and res.key == "k"
    assert "not linearizable" in res.describe()


def test_concurrent_read_may_see_either_value() -> None:
    for seen in (None, 1):
        h = History()
        w = h.invoke(0, PUT, "k", 1)
        r = h.invoke(1, GET, "k")
        h.ok(r, seen)
        h.ok(w)
        assert check(h.ops).ok


def test_reads_must_not_go_back_in_time() -> None:
    h = History()
    w = h.invoke(0, PUT, "k", 1)
    r1 = h.invoke(1, GET, "k")
    h.ok(r1, 1)
    r2 = h.invoke(2, GET, "k")  # after r1 saw the new value
    h.ok(r2, None)
    h.ok(w)
    assert not check(h.ops).ok


def test_timed_out_write_may_or_may_not_take_effect() -> None:
    for seen in (None, 1):
        h = History()
        w = h.invoke(0, PUT, "k", 1)
        h.timeout(w)
        r = h.invoke(1, GET, "k")
        h.ok(r, seen)
        assert check(h.ops).ok
    # but it cannot take effect before it was invoked
    h = History()
    r = h.invoke(1, GET, "k")
    h.ok(r, 1)
    w = h.invoke(0, PUT, "k", 1)
    h.timeout(w)
    assert not check(h.ops).ok


def test_failed_write_never_takes_effect() -> None:
    h = History()
    w = h.invoke(0, PUT, "k", 1)
    h.fail(w)
    r = h.invoke(1, GET, "k")
    h.ok(r, 1)
    assert not check(h.ops).ok


def test_cas_and_delete_outputs_constrain() -> None:
    h = History()
    a = h.invoke(0, PUT, "k", 1)
    h.ok(a)
    c1 = h.invoke(0, CAS, "k", (1, 2))
    c2 = h.invoke(1, CAS, "k", (1, 3))
    h.ok(c1, True)
    h.ok(c2, True)  # both cannot swap from 1
    assert not check(h.ops).ok
    h = History()
    d = h.invoke(0, DELETE, "k")
    h.ok(d, True)  # nothing was there
    assert not check(h.ops).ok


def test_keys_are_checked_independently() -> None:
    h = History()
    for i in range(200):  # large but easy: P-compositionality keeps each key small
        key = f"k{i % 10}"
        w = h.invoke(i % 4, PUT, key, i)
        h.ok(w)
        r = h.invoke(i % 4, GET, key)
        h.ok(r, i)
    assert check(h.ops).ok


def test_many_concurrent_timeouts_stay_tractable() -> None:
    h = History()
    pending = [h.invoke(c, PUT, "k", c) for c in range(12)]
    for op in pending:
        h.timeout(op)
    r = h.invoke(99, GET, "k")
    h.ok(r, 5)
    assert check(h.ops).ok


def test_simulation_is_deterministic() -> None:
    def run() -> list:
        sim = Simulation(11, SimConfig(nodes=3, steps=5000))
        sim.run()
        return [(o.kind, o.key, o.arg, o.status, o.output, o.invoke, o.complete) for o in sim.history.ops]
    assert run() == run()
