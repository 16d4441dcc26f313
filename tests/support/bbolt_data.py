"""Database contents for the bbolt format tests (tests/storage/test_bbolt_*.py): hypothesis
strategies for what write_db takes, covering every page kind the writer makes."""

from __future__ import annotations

import random
import struct

from hypothesis import strategies as st

from authstore.etcd_format.bbolt import PAGE_SIZE

Buckets = list[tuple[bytes, list[tuple[bytes, bytes]]]]


def many(count: int, seed: int) -> dict[bytes, bytes]:
    """`count` random binary keys (1-24 bytes) with small values: enough of them make branch pages."""
    rng = random.Random(seed)
    return {rng.randbytes(rng.randint(1, 24)): rng.randbytes(rng.randint(0, 40)) for _ in range(count)}


def big(sizes: list[int]) -> dict[bytes, bytes]:
    """Values of the given sizes (some bigger than a page: overflow pages)."""
    return {struct.pack(">I", i): bytes([i % 251]) * size for i, size in enumerate(sizes)}


#: one bucket's pairs: a few of any bytes (inline buckets), thousands (branch levels), or big values
bucket_items = st.one_of(
    st.dictionaries(st.binary(min_size=1, max_size=40), st.binary(max_size=120), max_size=30),
    st.builds(many, st.integers(0, 3000), st.integers(0, 2**32)),
    st.builds(big, st.lists(st.integers(0, 3 * PAGE_SIZE), max_size=6)),
)
#: write_db's input: up to 6 buckets with binary names, sorted as it wants them
bucket_sets = st.dictionaries(st.binary(min_size=1, max_size=20), bucket_items, max_size=6).map(
    lambda d: [(name, sorted(items.items())) for name, items in sorted(d.items())]
)
