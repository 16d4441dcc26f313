"""The crash points' switch (authstore/failpoints.py): off by default, gofail's terms, no typos."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from authstore import failpoints


@pytest.fixture(autouse=True)
def disarm() -> Iterator[None]:
    yield
    failpoints.load({})


def test_nothing_armed_without_the_variable() -> None:
    assert failpoints.load({}) == []
    failpoints.hit("applyBeforeCommit")  # a no-op


def test_counts_then_action() -> None:
    assert failpoints.load({failpoints.ENV: "applyBeforeCommit=2*off->panic"}) == ["applyBeforeCommit"]
    failpoints.hit("applyBeforeCommit")
    failpoints.hit("applyBeforeCommit")
    failpoints.hit("raftBeforeFsync")  # not armed
    with pytest.raises(failpoints.FailpointPanic):
        failpoints.hit("applyBeforeCommit")


def test_a_counted_action_runs_that_many_times_then_the_point_is_off() -> None:
    failpoints.load({failpoints.ENV: "walMidCheckpoint=1*panic"})
    with pytest.raises(failpoints.FailpointPanic):
        failpoints.hit("walMidCheckpoint")
    failpoints.hit("walMidCheckpoint")


@pytest.mark.parametrize("spec", ["applyBeforeCommmit=kill", "applyBeforeCommit=explode", "applyBeforeCommit",
                                  "raftAfterFsync=x*off->kill"])
def test_a_misspelt_point_or_action_is_refused(spec: str) -> None:
    with pytest.raises(failpoints.FailpointError):
        failpoints.load({failpoints.ENV: spec})
