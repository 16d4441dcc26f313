"""`raftgate snapshot status` prints what etcdutl 3.5.1 prints for the same numbers (its output
for an etcd snapshot, copied from a run: hash 65e8aa98, revision 2, 7 keys, 20480 bytes)."""

from __future__ import annotations

from authstore.snapshot_tool import Status, _human_bytes, format_status

ETCDUTL = Status(hash=1709746840, revision=2, total_key=7, total_size=20480)


def test_status_formats_as_etcdutl() -> None:
    assert format_status(ETCDUTL, "simple") == "65e8aa98, 2, 7, 20 kB"
    assert format_status(ETCDUTL, "json") == '{"hash":1709746840,"revision":2,"totalKey":7,"totalSize":20480}'
    assert format_status(ETCDUTL, "table") == "\n".join([
        "+----------+----------+------------+------------+",
        "|   HASH   | REVISION | TOTAL KEYS | TOTAL SIZE |",
        "+----------+----------+------------+------------+",
        "| 65e8aa98 |        2 |          7 |      20 kB |",
        "+----------+----------+------------+------------+",
    ])


def test_sizes_in_si_units_as_go_humanize() -> None:
    assert [_human_bytes(n) for n in (0, 9, 999, 1000, 2138112, 119_000, 5 << 30)] == \
        ["0 B", "9 B", "999 B", "1.0 kB", "2.1 MB", "119 kB", "5.4 GB"]
