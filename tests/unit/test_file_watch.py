"""raftgate/file_watch.py: the one way every following reader (JWT keys, CRLs, client TLS files,
identity files, workload user maps) tells that its files changed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raftgate.file_watch import FileWatch, missing, stamps


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_rewrite_a_symlink_swap_and_a_deletion_are_changes(tmp_path: Path) -> None:
    a, b, link = tmp_path / "a", tmp_path / "b", tmp_path / "key"
    a.write_bytes(b"one")
    b.write_bytes(b"two")
    link.symlink_to(a)
    watch = FileWatch([link])
    assert watch.look() is None  # nothing new since the watch began
    link.unlink()
    link.symlink_to(b)  # Kubernetes swaps a volume by symlink
    swapped = watch.look()
    assert swapped is not None
    watch.took(swapped)
    assert watch.look() is None
    b.write_bytes(b"three, longer")  # rewritten in place
    rewritten = watch.look()
    assert rewritten is not None and rewritten != swapped
    watch.took(rewritten)
    b.unlink()
    gone = watch.look()
    assert gone is not None and missing(gone)


def test_files_that_failed_are_not_looked_at_again_until_they_change(tmp_path: Path) -> None:
    f = tmp_path / "crl.pem"
    f.write_bytes(b"good")
    watch = FileWatch([f])
    f.write_bytes(b"broken!")
    broken = watch.look()
    assert broken is not None
    assert watch.failed(broken) is True  # reported the first time
    assert watch.look() is None  # not tried again
    assert watch.failed(broken) is False  # nor reported again
    f.write_bytes(b"fixed, at last")
    fixed = watch.look()
    assert fixed is not None and fixed != broken


def test_looks_no_more_than_once_per_interval_unless_forced(tmp_path: Path) -> None:
    f, clock = tmp_path / "map.json", Clock()
    f.write_bytes(b"[]")
    watch = FileWatch([f], poll_interval=1.0, clock=clock)
    f.write_bytes(b"[1]")
    assert watch.look() is None  # not due yet
    assert watch.look(force=True) is not None
    clock.now = 0.5
    assert watch.look() is None
    clock.now = 1.5
    assert watch.look() is not None


def test_a_directory_sees_entries_come_and_go_but_not_dot_entries(tmp_path: Path) -> None:
    d = tmp_path / "keys"
    d.mkdir()
    (d / "k1.pem").write_bytes(b"k1")
    watch = FileWatch([d], dir_entries=8)
    (d / "..data").write_bytes(b"machinery")
    before = watch.stamps()
    (d / "k2.pem").write_bytes(b"k2")
    after = watch.look()
    assert after is not None and len(after) == len(before) + 1
    watch.took(after)
    os.remove(d / "k1.pem")
    assert watch.look() is not None


def test_strict_stamps_name_the_missing_file(tmp_path: Path) -> None:
    with pytest.raises(OSError) as e:
        stamps([tmp_path / "absent"], strict=True)
    assert e.value.filename == str(tmp_path / "absent")
    assert missing(stamps([tmp_path / "absent"]))
