"""bbolt (go.etcd.io/bbolt) database files: a streaming writer and a bounded, validating reader.

etcd keeps its backend in a bbolt file, and ``etcdctl snapshot save`` writes that file followed by
the sha256 of everything before it. No maintained Python library reads or writes the format, so
this module does, from bbolt's on-disk layout (v1.3, the one etcd 3.5 uses; all integers are
little-endian, as bbolt writes them on every platform etcd ships for):

- The file is a run of pages of ``page_size`` bytes; page ``n`` starts at ``n * page_size``. A page
  starts with a 16-byte header: id u64, flags u16 (branch 0x01, leaf 0x02, meta 0x04, freelist
  0x10), count u16, overflow u32. A page with overflow ``k`` spans ``k + 1`` pages (big values).
- Pages 0 and 1 are meta pages; after the header: magic u32 (0xED0CDAED), version u32 (2),
  page_size u32, flags u32, the root bucket (root page id u64, sequence u64), freelist page id
  u64, high-water mark u64 (the number of pages in use), txid u64, then the FNV-1a 64 of those 56
  bytes. bbolt uses the valid meta (magic, version, checksum) with the higher txid.
- A leaf page holds ``count`` 16-byte elements (flags u32, pos u32, ksize u32, vsize u32) and then
  the keys and values; ``pos`` counts from the element's own first byte. Flag 0x01 marks a bucket:
  the value is the bucket header (root page id u64, sequence u64). A root id of 0 is an inline
  bucket: its leaf page (header and elements, no padding) follows the header inside the value.
- A branch page holds 16-byte elements (pos u32, ksize u32, child page id u64); the key is the
  first key of the child's subtree.
- The freelist page lists free page ids (u64 each, ``count`` of them; 0xFFFF means the first u64
  is the count). bbolt's consistency check wants every page below the high-water mark either
  reachable from the root or free.
- The meta's root bucket is a tree whose leaf elements are the top-level buckets, by name.

etcd has only top-level buckets; the reader reports a nested bucket as a :class:`BoltError` (it
does not read them) and the writer writes none.
"""

from __future__ import annotations

import contextlib
import os
import stat
import struct
import tempfile
import typing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

PAGE_SIZE = 4096
MAGIC = 0xED0CDAED
VERSION = 2
#: bbolt's limits on one key and one value (bucket.go)
MAX_KEY_SIZE = 32768
MAX_VALUE_SIZE = (1 << 31) - 2

BRANCH_PAGE = 0x01
LEAF_PAGE = 0x02
META_PAGE = 0x04
FREELIST_PAGE = 0x10
BUCKET_LEAF_FLAG = 0x01
NO_FREELIST = 0xFFFFFFFFFFFFFFFF

_HEADER = struct.Struct("<QHHI")  # id, flags, count, overflow
_LEAF_ELEM = struct.Struct("<IIII")  # flags, pos, ksize, vsize
_BRANCH_ELEM = struct.Struct("<IIQ")  # pos, ksize, child page id
_META = struct.Struct("<IIIIQQQQQ")  # magic, version, page size, flags, root, sequence, freelist, hwm, txid
_CHECKSUM = struct.Struct("<Q")
_BUCKET = struct.Struct("<QQ")  # root page id, sequence
#: bbolt writes a bucket inline (inside its parent's leaf) while its one leaf page is this small
_MAX_INLINE = PAGE_SIZE // 4
#: page sizes the reader accepts: bbolt uses the OS page size (4 KiB on amd64, up to 64 KiB elsewhere)
PAGE_SIZES = tuple(1 << n for n in range(10, 17))
#: deeper than any real tree (a 2-way tree this deep would hold 2**64 pages): a cycle, not data
_MAX_DEPTH = 64


class BoltError(ValueError):
    """A file that is not a valid bbolt database; the message says what is wrong."""


def fnv1a64(data: bytes) -> int:
    """FNV-1a 64 (Go's hash/fnv New64a), bbolt's meta page checksum."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


# ---------------------------------------------------------------------------------------------
# writing


def _as_bytes(data: object, what: str) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"{what} must be bytes, not {type(data).__name__}")


def _checked_key(key: object, previous: bytes | None, what: str) -> bytes:
    key = _as_bytes(key, what)
    if not key:
        raise ValueError(f"empty {what}: bbolt keys are at least one byte")
    if len(key) > MAX_KEY_SIZE:
        raise ValueError(f"{what} of {len(key)} bytes: bbolt's limit is {MAX_KEY_SIZE}")
    if previous is not None and key <= previous:
        raise ValueError(f"{what}s not in strictly ascending order: {key!r} after {previous!r}")
    return key


def _leaf_parts(pgid: int, items: list[tuple[int, bytes, bytes]]) -> tuple[list[bytes], int]:
    """The bytes of a leaf page holding `items` (flags, key, value), unpadded, and their length."""
    n = len(items)
    off = _HEADER.size + _LEAF_ELEM.size * n
    elems = bytearray()
    data: list[bytes] = []
    for i, (flags, key, value) in enumerate(items):
        elems += _LEAF_ELEM.pack(flags, off - (_HEADER.size + _LEAF_ELEM.size * i), len(key), len(value))
        data += (key, value)
        off += len(key) + len(value)
    pages = -(-off // PAGE_SIZE)
    return [_HEADER.pack(pgid, LEAF_PAGE, n, max(pages, 1) - 1), bytes(elems), *data], off


class _Pages:
    """Writes whole pages to `out` in page id order (the file is the pages in order)."""

    def __init__(self, out: typing.BinaryIO, first_pgid: int) -> None:
        self.out = out
        self.next_pgid = first_pgid

    def _write(self, parts: list[bytes], size: int) -> int:
        pgid = self.next_pgid
        pages = max(1, -(-size // PAGE_SIZE))
        for part in parts:
            self.out.write(part)
        self.out.write(bytes(pages * PAGE_SIZE - size))
        self.next_pgid += pages
        return pgid

    def freelist(self) -> int:
        """An empty freelist page: every page the writer numbers is in use."""
        return self._write([_HEADER.pack(self.next_pgid, FREELIST_PAGE, 0, 0)], _HEADER.size)

    def leaf(self, items: list[tuple[int, bytes, bytes]]) -> int:
        parts, size = _leaf_parts(self.next_pgid, items)
        return self._write(parts, size)

    def branch(self, children: list[tuple[bytes, int]]) -> int:
        n = len(children)
        off = _HEADER.size + _BRANCH_ELEM.size * n
        elems = bytearray()
        for i, (key, child) in enumerate(children):
            elems += _BRANCH_ELEM.pack(off - (_HEADER.size + _BRANCH_ELEM.size * i), len(key), child)
            off += len(key)
        pages = -(-off // PAGE_SIZE)
        header = _HEADER.pack(self.next_pgid, BRANCH_PAGE, n, pages - 1)
        return self._write([header, bytes(elems), *(key for key, _ in children)], off)


class _Tree:
    """One B+tree built bottom-up from entries in key order: leaf pages are written as they fill,
    and only (first key, page id) of each leaf is kept until `finish` writes the branch levels."""

    def __init__(self, pages: _Pages) -> None:
        self.pages = pages
        self.pending: list[tuple[int, bytes, bytes]] = []
        self.size = _HEADER.size
        self.children: list[tuple[bytes, int]] = []

    def add(self, flags: int, key: bytes, value: bytes) -> None:
        size = _LEAF_ELEM.size + len(key) + len(value)
        if self.pending and self.size + size > PAGE_SIZE:
            self._flush()
        self.pending.append((flags, key, value))
        self.size += size

    def _flush(self) -> None:
        first = self.pending[0][1] if self.pending else b""
        self.children.append((first, self.pages.leaf(self.pending)))
        self.pending = []
        self.size = _HEADER.size

    def finish(self) -> int:
        """Write what is left and the branch levels; the root page id."""
        if self.pending or not self.children:
            self._flush()
        level = self.children
        while len(level) > 1:
            upper: list[tuple[bytes, int]] = []
            page: list[tuple[bytes, int]] = []
            size = _HEADER.size
            for key, child in level:
                grow = _BRANCH_ELEM.size + len(key)
                # at least two children a page, so every level is smaller than the one below
                if len(page) >= 2 and size + grow > PAGE_SIZE:
                    upper.append((page[0][0], self.pages.branch(page)))
                    page, size = [], _HEADER.size
                page.append((key, child))
                size += grow
            upper.append((page[0][0], self.pages.branch(page)))
            level = upper
        return level[0][1]


def _write_bucket(pages: _Pages, items: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes:
    """Write one bucket's pages; its header (the value under its name in the root bucket)."""
    inline: list[tuple[int, bytes, bytes]] = []
    inline_size = _HEADER.size
    tree: _Tree | None = None
    previous: bytes | None = None
    for pair in items:
        key, value = pair
        key = _checked_key(key, previous, f"key in bucket {name!r}")
        value = _as_bytes(value, f"value in bucket {name!r}")
        if len(value) > MAX_VALUE_SIZE:
            raise ValueError(f"value of {len(value)} bytes in bucket {name!r}: bbolt's limit is {MAX_VALUE_SIZE}")
        previous = key
        if tree is None:
            inline.append((0, key, value))
            inline_size += _LEAF_ELEM.size + len(key) + len(value)
            if inline_size <= _MAX_INLINE:
                continue
            tree = _Tree(pages)
            for entry in inline:
                tree.add(*entry)
            inline = []
        else:
            tree.add(0, key, value)
    if tree is None:
        parts, _ = _leaf_parts(0, inline)
        return _BUCKET.pack(0, 0) + b"".join(parts)
    return _BUCKET.pack(tree.finish(), 0)


def _meta_page(pgid: int, *, root: int, freelist: int, hwm: int, txid: int) -> bytes:
    meta = _META.pack(MAGIC, VERSION, PAGE_SIZE, 0, root, 0, freelist, hwm, txid)
    page = _HEADER.pack(pgid, META_PAGE, 0, 0) + meta + _CHECKSUM.pack(fnv1a64(meta))
    return page + bytes(PAGE_SIZE - len(page))


def write_db(
    out: typing.BinaryIO,
    buckets: Iterable[tuple[bytes, Iterable[tuple[bytes, bytes]]]],
    *,
    tx_id: int = 1,
) -> int:
    """Write a bbolt database holding `buckets` (top-level buckets in ascending name order, each
    with its (key, value) pairs in ascending key order) to `out`; the number of bytes written.

    Pages are streamed as the input is read: memory holds one leaf page and one (first key, page
    id) entry per leaf page written. A bucket's pairs are read to their end before the next bucket
    is asked for, so they may come from one shared cursor. The same input gives the same bytes.

    The two meta pages come first in the file but depend on everything after them: they are
    written last, by seeking back to where `out` was (so a caller hashes the file after this
    returns, not while it streams); a stream that cannot seek, or a file opened for appending, is
    given the bytes through a temporary file. Small buckets are written inline, as bbolt does; the
    freelist is empty (no page is free). The meta at page ``tx_id % 2`` carries `tx_id`, the other
    ``tx_id - 1``; both describe the same data.

    Raises ValueError for unsorted, duplicate or empty names or keys, and for keys or values beyond
    bbolt's limits (`out` then holds a partial file); TypeError for names, keys or values that are
    not bytes-like.
    """
    if not 1 <= tx_id < 1 << 64:
        raise ValueError(f"tx_id {tx_id} is not in [1, 2**64)")
    seekable = False
    with contextlib.suppress(AttributeError, OSError, ValueError):
        seekable = out.seekable()
    if "a" in str(getattr(out, "mode", "")):
        seekable = False  # a file opened for appending writes at its end wherever it was seeked to
    if not seekable:
        with tempfile.TemporaryFile() as spool:
            written = write_db(spool, buckets, tx_id=tx_id)
            spool.seek(0)
            while chunk := spool.read(1 << 20):
                out.write(chunk)
        return written

    start = out.tell()
    out.write(bytes(2 * PAGE_SIZE))  # the meta pages, filled in at the end
    pages = _Pages(out, 2)
    freelist = pages.freelist()
    root = _Tree(pages)
    previous: bytes | None = None
    for entry in buckets:
        name, items = entry
        name = _checked_key(name, previous, "bucket name")
        previous = name
        root.add(BUCKET_LEAF_FLAG, name, _write_bucket(pages, items, name))
    root_pgid = root.finish()
    hwm = pages.next_pgid
    end = out.tell()
    out.seek(start)
    for pgid in (0, 1):
        txid = tx_id if pgid == tx_id % 2 else tx_id - 1
        out.write(_meta_page(pgid, root=root_pgid, freelist=freelist, hwm=hwm, txid=txid))
    out.seek(end)
    return hwm * PAGE_SIZE


# ---------------------------------------------------------------------------------------------
# reading


@dataclass(frozen=True)
class Meta:
    """One meta page's fields."""

    page_size: int
    flags: int
    root: int
    sequence: int
    freelist: int
    hwm: int
    txid: int


def _parse_meta(raw: bytes) -> Meta | str:
    """The meta in a meta page's first bytes, or why it is not valid (bbolt's Meta.Validate)."""
    if len(raw) < _HEADER.size + _META.size + _CHECKSUM.size:
        return "too short for a meta page"
    _, flags, _, _ = _HEADER.unpack_from(raw)
    magic, version, page_size, mflags, root, seq, freelist, hwm, txid = _META.unpack_from(raw, _HEADER.size)
    if magic != MAGIC:
        return f"no bbolt magic (found {magic:#010x})"
    if version != VERSION:
        return f"bbolt format version {version}, expected {VERSION}"
    (checksum,) = _CHECKSUM.unpack_from(raw, _HEADER.size + _META.size)
    if checksum != fnv1a64(raw[_HEADER.size : _HEADER.size + _META.size]):
        return "meta checksum mismatch"
    if flags != META_PAGE:
        return f"meta page has page flags {flags:#x}"
    return Meta(page_size, mflags, root, seq, freelist, hwm, txid)


@dataclass(frozen=True)
class _Bucket:
    root: int  # 0: inline
    inline: bytes  # the inline leaf page (root == 0)


class BoltReader:
    """A bbolt file opened read only, read with pread: every page id, count, offset and overflow is
    checked against the file before it is used, trees are walked with a depth limit and a page
    budget (a cycle or a shared page ends in a BoltError, never a hang), and keys must ascend.

    I/O errors are OSError; everything wrong in the file's content is a :class:`BoltError`. Bytes
    after the last page (etcd's 32-byte sha256 trailer, or preallocated space) are ignored; see
    ``data_size``. Safe to share between threads (pread has no file position).
    """

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int = 8 << 30) -> None:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is rejected right after)
        self._fd: int | None = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            st = os.fstat(self._fd)
            if not stat.S_ISREG(st.st_mode):
                raise BoltError(f"{os.fspath(path)!r} is not a regular file")
            self.file_size = st.st_size
            if self.file_size > max_bytes:
                raise BoltError(f"file of {self.file_size} bytes is larger than the limit of {max_bytes}")
            self.meta = self._load_meta()
        except BaseException:
            self.close()
            raise
        self.page_size = self.meta.page_size
        #: the bytes the pages take; the rest of the file (etcd's sha256 trailer) is not bbolt's
        self.data_size = self.meta.hwm * self.page_size
        self.txid = self.meta.txid

    # -- lifecycle
    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> BoltReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- low level
    def _read(self, offset: int, size: int) -> bytes:
        if self._fd is None:
            raise ValueError("BoltReader is closed")
        if offset + size > self.file_size:
            raise BoltError(f"read of {size} bytes at offset {offset} is past the end of the file")
        data = os.pread(self._fd, size, offset)
        if len(data) != size:
            raise BoltError(f"file shrank while reading: {len(data)} of {size} bytes at offset {offset}")
        return data

    def _load_meta(self) -> Meta:
        found: list[Meta] = []
        errors: list[str] = []
        size = _HEADER.size + _META.size + _CHECKSUM.size
        first = _parse_meta(self._read(0, size)) if self.file_size >= size else "file too short for a meta page"
        if isinstance(first, Meta):
            found.append(first)
            sizes: tuple[int, ...] = (first.page_size,) if first.page_size in PAGE_SIZES else ()
        else:
            errors.append(f"meta page 0: {first}")
            sizes = PAGE_SIZES  # bbolt too looks for meta page 1 when page 0 is damaged
        for page_size in sizes:
            if self.file_size < page_size + size:
                continue
            second = _parse_meta(self._read(page_size, size))
            if isinstance(second, Meta) and second.page_size == page_size:
                found.append(second)
                break
            if len(sizes) == 1:
                errors.append(f"meta page 1: {second if isinstance(second, str) else 'wrong page size'}")
        if not found:
            raise BoltError("not a bbolt database: " + "; ".join(errors or ["no valid meta page"]))
        meta = max(found, key=lambda m: m.txid)
        self._check_meta(meta)
        return meta

    def _check_meta(self, meta: Meta) -> None:
        if meta.page_size not in PAGE_SIZES:
            raise BoltError(f"page size {meta.page_size} is not a power of two from 1 KiB to 64 KiB")
        if meta.hwm < 3 or meta.hwm * meta.page_size > self.file_size:
            raise BoltError(
                f"the meta says {meta.hwm} pages of {meta.page_size} bytes; the file has {self.file_size} bytes"
            )
        if not 2 <= meta.root < meta.hwm:
            raise BoltError(f"root bucket page {meta.root} is outside the pages in use (2 to {meta.hwm - 1})")
        if meta.freelist != NO_FREELIST and not 2 <= meta.freelist < meta.hwm:
            raise BoltError(f"freelist page {meta.freelist} is outside the pages in use (2 to {meta.hwm - 1})")

    def _page(self, pgid: int, where: str, budget: list[int]) -> tuple[int, int, bytes]:
        """(flags, count, the page's bytes with its overflow pages) of page `pgid`, charged to
        `budget` (pages left to read in this walk: a tree's pages do not overlap, so one walk never
        reads more than the pages in use, whatever the overflow counts say)."""
        hwm = self.meta.hwm
        if not 2 <= pgid < hwm:
            raise BoltError(f"{where}: page id {pgid} is outside the pages in use (2 to {hwm - 1})")
        offset = pgid * self.page_size
        page_id, flags, count, overflow = _HEADER.unpack(self._read(offset, _HEADER.size))
        if page_id != pgid:
            raise BoltError(f"{where}: page {pgid} says it is page {page_id}")
        if pgid + overflow >= hwm:
            raise BoltError(f"{where}: page {pgid} has {overflow} overflow pages, past the last page in use")
        budget[0] -= overflow + 1
        if budget[0] < 0:
            raise BoltError(f"{where}: the tree spans more pages than the file has (pages shared or a cycle)")
        return flags, count, self._read(offset, (overflow + 1) * self.page_size)

    @staticmethod
    def _leaf(page: bytes, count: int, where: str) -> list[tuple[int, bytes, bytes]]:
        """The (flags, key, value) elements of a leaf page's bytes, each checked to lie inside."""
        end = _HEADER.size + _LEAF_ELEM.size * count
        if end > len(page):
            raise BoltError(f"{where}: {count} leaf elements do not fit in {len(page)} bytes")
        view = memoryview(page)
        out = []
        room = len(page) - end  # the elements' data do not overlap: they copy out at most this much
        for i in range(count):
            at = _HEADER.size + _LEAF_ELEM.size * i
            flags, pos, ksize, vsize = _LEAF_ELEM.unpack_from(page, at)
            start = at + pos
            if flags & ~BUCKET_LEAF_FLAG:
                raise BoltError(f"{where}: element {i} has unknown flags {flags:#x}")
            if pos < end - at or start + ksize + vsize > len(page):
                raise BoltError(f"{where}: element {i} points outside its page")
            if ksize == 0:
                raise BoltError(f"{where}: element {i} has an empty key")
            room -= ksize + vsize
            if room < 0:
                raise BoltError(f"{where}: the elements' keys and values overlap")
            out.append((flags, bytes(view[start : start + ksize]), bytes(view[start + ksize : start + ksize + vsize])))
        return out

    @staticmethod
    def _branch(page: bytes, count: int, where: str) -> list[tuple[bytes, int]]:
        """The (key, child page id) elements of a branch page's bytes, each checked to lie inside."""
        end = _HEADER.size + _BRANCH_ELEM.size * count
        if count == 0 or end > len(page):
            raise BoltError(f"{where}: a branch page of {count} elements in {len(page)} bytes")
        out = []
        room = len(page) - end
        for i in range(count):
            at = _HEADER.size + _BRANCH_ELEM.size * i
            pos, ksize, child = _BRANCH_ELEM.unpack_from(page, at)
            start = at + pos
            if pos < end - at or start + ksize > len(page):
                raise BoltError(f"{where}: element {i} points outside its page")
            room -= ksize
            if room < 0:
                raise BoltError(f"{where}: the elements' keys overlap")
            out.append((page[start : start + ksize], child))
        return out

    def _node(self, pgid: int, where: str, budget: list[int]) -> tuple[bool, list[typing.Any]]:
        """(is leaf, elements) of a tree page."""
        flags, count, page = self._page(pgid, where, budget)
        if flags == LEAF_PAGE:
            return True, self._leaf(page, count, f"{where}, page {pgid}")
        if flags == BRANCH_PAGE:
            return False, self._branch(page, count, f"{where}, page {pgid}")
        raise BoltError(f"{where}: page {pgid} has flags {flags:#x}, not a leaf or branch page")

    def _walk(self, bucket: _Bucket, where: str) -> Iterator[tuple[int, bytes, bytes]]:
        """Every leaf element of a tree in order; keys must strictly ascend."""
        previous: bytes | None = None
        for flags, key, value in self._walk_unchecked(bucket, where):
            if previous is not None and key <= previous:
                raise BoltError(f"{where}: keys out of order ({key!r} after {previous!r})")
            previous = key
            yield flags, key, value

    def _walk_unchecked(self, bucket: _Bucket, where: str) -> Iterator[tuple[int, bytes, bytes]]:
        if bucket.root == 0:
            yield from self._inline(bucket, where)
            return
        budget = [self.meta.hwm]
        stack: list[Iterator[tuple[bytes, int]]] = [iter([(b"", bucket.root)])]
        while stack:
            step = next(stack[-1], None)
            if step is None:
                stack.pop()
                continue
            is_leaf, elems = self._node(step[1], where, budget)
            if is_leaf:
                yield from elems
            elif len(stack) >= _MAX_DEPTH:
                raise BoltError(f"{where}: tree deeper than {_MAX_DEPTH} levels (a cycle)")
            else:
                stack.append(iter(elems))

    def _inline(self, bucket: _Bucket, where: str) -> list[tuple[int, bytes, bytes]]:
        page = bucket.inline
        if len(page) < _HEADER.size:
            raise BoltError(f"{where}: inline bucket of {len(page)} bytes has no page header")
        _, flags, count, _ = _HEADER.unpack_from(page)
        if flags != LEAF_PAGE:
            raise BoltError(f"{where}: inline bucket page has flags {flags:#x}, not a leaf page")
        return self._leaf(page, count, f"{where} (inline)")

    def _seek(self, bucket: _Bucket, key: bytes, where: str) -> tuple[int, bytes] | None:
        """(flags, value) of `key` in a tree, or None."""
        if bucket.root == 0:
            elems: list[typing.Any] = self._inline(bucket, where)
        else:
            pgid = bucket.root
            budget = [self.meta.hwm]
            for _ in range(_MAX_DEPTH):
                is_leaf, elems = self._node(pgid, where, budget)
                if is_leaf:
                    break
                # the last child whose first key is <= key (the first child if none is)
                lo, hi = 0, len(elems)
                while lo < hi:
                    mid = (lo + hi) // 2
                    if elems[mid][0] <= key:
                        lo = mid + 1
                    else:
                        hi = mid
                pgid = elems[max(lo - 1, 0)][1]
            else:
                raise BoltError(f"{where}: tree deeper than {_MAX_DEPTH} levels (a cycle)")
        for flags, k, value in elems:
            if k == key:
                return flags, value
        return None

    def _root(self) -> _Bucket:
        return _Bucket(self.meta.root, b"")

    @staticmethod
    def _bucket_header(name: bytes, flags: int, value: bytes) -> _Bucket:
        if not flags & BUCKET_LEAF_FLAG:
            raise BoltError(f"root bucket holds a plain key {name!r}; bbolt keeps only buckets there")
        if len(value) < _BUCKET.size:
            raise BoltError(f"bucket {name!r}: header of {len(value)} bytes, expected {_BUCKET.size}")
        root, _ = _BUCKET.unpack_from(value)
        return _Bucket(root, value[_BUCKET.size :] if root == 0 else b"")

    # -- the API
    def buckets(self) -> list[bytes]:
        """The top-level bucket names, ascending."""
        names = []
        for flags, name, value in self._walk(self._root(), "root bucket"):
            self._bucket_header(name, flags, value)
            names.append(name)
        return names

    def _bucket(self, name: bytes) -> _Bucket:
        found = self._seek(self._root(), name, "root bucket")
        if found is None:
            raise KeyError(name)
        return self._bucket_header(name, *found)

    def items(self, bucket: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The (key, value) pairs of a top-level bucket in ascending key order; KeyError if there
        is no such bucket. A nested bucket inside it is a BoltError (etcd has none)."""
        tree = self._bucket(bucket)
        return self._items(tree, bucket)

    def _items(self, tree: _Bucket, name: bytes) -> Iterator[tuple[bytes, bytes]]:
        where = f"bucket {name!r}"
        for flags, key, value in self._walk(tree, where):
            if flags & BUCKET_LEAF_FLAG:
                raise BoltError(f"{where} holds a nested bucket {key!r}; etcd's files have none")
            yield key, value

    def get(self, bucket: bytes, key: bytes) -> bytes | None:
        """The value of `key` in a top-level bucket, or None; KeyError if there is no such bucket."""
        found = self._seek(self._bucket(bucket), key, f"bucket {bucket!r}")
        if found is None:
            return None
        flags, value = found
        if flags & BUCKET_LEAF_FLAG:
            raise BoltError(f"bucket {bucket!r} holds a nested bucket {key!r}; etcd's files have none")
        return value
