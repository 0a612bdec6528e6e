"""Names and bytes of archive objects (FORMAT.md §"Archive" is the spec; this is its one codec).

Names (all numbers zero-padded to 20 digits, so name order is LSN order):

- ``log/<first>.wal``          a group object: the records the shipper found durable since the
                               previous one, LSNs first..last (last is in its header). Keyed by the
                               first LSN alone, written create-only: two writers can never both
                               ship a given LSN, which is how a promoted follower fences an old
                               primary (`wal.archive.follow`).
- ``merged/<first>-<last>.wal`` the same encoding, the records of consecutive group objects merged
                               in the background (then the group objects are deleted).
- ``snap/<lsn>.snap``          a logical snapshot of the state at applied LSN ``lsn``.

Every object is verifiable alone: a header naming what it holds, a CRC-32C per record or entry
(the log's own checksum), and a SHA-256 of everything before it as a trailer. Whether a group
object belongs to the archive at all is the chain's rule (`wal.archive.plan`): its header's
writer_id and `behind` say.
"""

from __future__ import annotations

import array
import hashlib
import io
import itertools
import mmap
import struct
from collections.abc import Iterable, Iterator
from typing import BinaryIO, NamedTuple, Protocol

from wal._bindings import ffi, lib, object_records
from wal.errors import CorruptionError
from wal.log.record import MAX_KEY_BYTES

LOG_PREFIX = "log/"
MERGED_PREFIX = "merged/"
SNAP_PREFIX = "snap/"

# A writer has at most this many group objects in flight (PUT, not yet answered) at once. They
# may be stored in any order, so an archive whose writer stopped mid-flight can hold up to
# MAX_IN_FLIGHT - 1 group objects past a missing one: its *unfinished tail* (plan.unfinished_tail).
MAX_IN_FLIGHT = 8
# Bits 0-2 of a log object's flags: `behind`, how many of its writer's objects before it were not
# yet stored (with everything before them) when it was sent. 0 in objects of earlier versions.
BEHIND_MASK = 0x7

LOG_MAGIC = b"AGWALLOG"
SNAP_MAGIC = b"AGWALSNP"
# A log object with behind >= 1 is written as version 2: it belongs to the archive only if the
# object before it in the chain has its writer_id (FORMAT.md §18, "Chain"), a rule a reader of
# version 1 does not know, so such a reader refuses the object instead of taking it blindly.
# Objects with behind 0 (every object of a writer with one PUT in flight, merged objects, fence
# objects) stay version 1, readable by every agentwal.
LOG_VERSIONS = (1, 2)
# A snapshot of version 2 holds the state's idempotency entries after its entries (FORMAT.md
# §18): a reader of version 1 refuses it rather than restore a store that takes a retried
# commit for a new one. Version 1 snapshots are read (they hold no idempotency entries).
SNAP_VERSION = 2
SNAP_VERSIONS = (1, 2)
# magic, version, flags, count, first_lsn, last_lsn, min_time_ms, max_time_ms, writer_id
_LOG_HEADER = struct.Struct("<8sHHIQQQQ16s")
# magic, version, flags, reserved, lsn, taken_ms, entries, writer_id, idempotency entries (v1: 0)
_SNAP_HEADER = struct.Struct("<8sHHIQQQ16sQ")
_REC = struct.Struct("<QII")  # lsn, length, crc32c(lsn, length, payload)
_ENTRY = struct.Struct("<IIQI")  # key length, value length, version, crc32c(lengths, version, key, value)
_IDEM = struct.Struct("<IQQI")  # key length, lsn, time_ms, crc32c(key length, lsn, time_ms, key)
DIGEST = 32  # SHA-256 trailer
assert _LOG_HEADER.size == 64 and _SNAP_HEADER.size == 64
SNAPSHOT_HEADER_BYTES = _SNAP_HEADER.size


def _crc(*parts: bytes) -> int:
    crc = 0
    for part in parts:
        crc = lib.wal_crc32c(crc, ffi.from_buffer(part), len(part))
    return int(crc)


def log_name(first: int) -> str:
    return f"{LOG_PREFIX}{first:020d}.wal"


def merged_name(first: int, last: int) -> str:
    return f"{MERGED_PREFIX}{first:020d}-{last:020d}.wal"


def snap_name(lsn: int) -> str:
    return f"{SNAP_PREFIX}{lsn:020d}.snap"


class Name(NamedTuple):
    kind: str  # "log", "merged" or "snap"
    first: int  # the snapshot's LSN for "snap"
    last: int | None  # known from the name for "merged" (and "snap": == first); None for "log"


def parse_name(name: str) -> Name | None:
    """What an object name says, or None for a name the archive does not use."""
    try:
        if name.startswith(LOG_PREFIX) and name.endswith(".wal"):
            first = int(name[len(LOG_PREFIX):-4])
            return Name("log", first, None) if len(name) == len(LOG_PREFIX) + 24 else None
        if name.startswith(MERGED_PREFIX) and name.endswith(".wal"):
            a, _, b = name[len(MERGED_PREFIX):-4].partition("-")
            return Name("merged", int(a), int(b)) if len(a) == len(b) == 20 else None
        if name.startswith(SNAP_PREFIX) and name.endswith(".snap"):
            lsn = int(name[len(SNAP_PREFIX):-5])
            return Name("snap", lsn, lsn)
    except ValueError:
        return None
    return None


def time_of(payload: bytes | memoryview) -> int:
    """The commit time (unix ms) of a store transaction payload (wal/log/record.py: kind, flags, time_ms)."""
    return int.from_bytes(payload[2:10], "little") if len(payload) >= 10 else 0


class LogObject(NamedTuple):
    """A verified log object. Its records are not copied out: record i's payload is
    ``body[offsets[i] : offsets[i] + lengths[i]]``, the layout `record.Collapser` takes
    (`lsns`, `offsets`: u64 arrays; `lengths`: u32), so a restore applies them straight from
    the downloaded bytes. `records` and `payload` copy, for callers that keep records."""

    first: int
    last: int
    min_time_ms: int
    max_time_ms: int
    writer_id: bytes
    body: memoryview
    lsns: array.array[int]
    offsets: array.array[int]
    lengths: array.array[int]
    behind: int = 0  # see BEHIND_MASK

    def payload(self, i: int) -> bytes:
        start = self.offsets[i]
        return bytes(self.body[start:start + self.lengths[i]])

    @property
    def records(self) -> list[tuple[int, bytes]]:
        """[(lsn, payload)], copied out of the object."""
        return [(lsn, self.payload(i)) for i, lsn in enumerate(self.lsns)]


def encode_log(records: list[tuple[int, bytes]], writer_id: bytes, behind: int = 0) -> bytes:
    """A log object holding consecutive records [(lsn, payload)] (at least one); `behind`: see
    BEHIND_MASK (0 for merged objects, made of stored objects only)."""
    assert records, "a log object holds at least one record"
    assert 0 <= behind <= BEHIND_MASK
    first, last = records[0][0], records[-1][0]
    assert last - first + 1 == len(records), "records must be consecutive"
    times = [time_of(p) for _, p in records]
    if type(records) is not list or not all(type(r) is tuple and type(r[1]) is bytes for r in records):
        records = [(lsn, bytes(payload)) for lsn, payload in records]  # object_records takes exactly these
    body = _LOG_HEADER.pack(LOG_MAGIC, 2 if behind else 1, behind, len(records), first, last, min(times),
                            max(times), writer_id) + object_records(records)
    return body + _sha256(body)


# Up to this size a digest is computed holding the GIL, fed to hashlib in pieces below its
# GIL-release threshold (2,048 bytes): a group object is hashed on the shipper's path from one
# PUT to the next, and a thread that lets the GIL go there, with 64 committing threads waiting
# for it, gets it back only after them. Larger bodies (merges, catching up) release it.
_SHA_WITH_GIL_BYTES = 64 << 10
_SHA_PIECE = 2047


def _sha256(body: bytes) -> bytes:
    if len(body) > _SHA_WITH_GIL_BYTES:
        return hashlib.sha256(body).digest()
    h = hashlib.sha256()
    view = memoryview(body)
    for at in range(0, len(body), _SHA_PIECE):
        h.update(view[at:at + _SHA_PIECE])
    return h.digest()


def _damaged(name: str, why: str, lsns: str) -> CorruptionError:
    return CorruptionError(f"archive object {name} (LSNs {lsns}) is damaged: {why}; it was not used",
                           path=name, reason="damaged archive object")


_ZSTD_FRAME = b"\x28\xb5\x2f\xfd"


def looks_sealed(head: bytes | bytearray | memoryview) -> bool:
    """Whether an object read as a plain one begins as a sealed envelope (FORMAT.md §19) does:
    encrypted (codec 0x80/0x81, then a key id, session and counter), a zstd frame after codec
    0x01, or a plain object after codec 0x00. A plain object begins with its magic, so no byte
    flipped in it alone makes it look so (its first byte alone changed: the rest of its magic
    follows)."""
    head = bytes(head[:9])
    if len(head) < 9 or head[1:8] in (LOG_MAGIC[1:], SNAP_MAGIC[1:]):
        return False
    return (head[0] in (0x80, 0x81) or (head[0] == 0x01 and head[1:5] == _ZSTD_FRAME)
            or (head[0] == 0x00 and head[1:9] in (LOG_MAGIC, SNAP_MAGIC)))


def missing_manifest(name: str) -> CorruptionError:
    """The error for an object of a sealed store (an envelope, a key marker, a dictionary) in an
    archive without its sealing manifest."""
    return CorruptionError(f"archive object {name} belongs to a store that encrypts or compresses, but the archive "
                           "has no sealed.json, which says so: it was deleted or never copied with the objects; "
                           "nothing was used", path=name, reason="missing archive manifest")


def _check_digest(data: bytes | bytearray | memoryview, name: str, lsns: str) -> memoryview:
    if looks_sealed(data):
        raise missing_manifest(name)
    if len(data) < 64 + DIGEST:
        raise _damaged(name, f"{len(data)} bytes is shorter than a header and trailer", lsns)
    body = memoryview(data)[:-DIGEST]
    if hashlib.sha256(body).digest() != data[-DIGEST:]:
        raise _damaged(name, "its SHA-256 trailer does not match its bytes", lsns)
    return body


def merge_logs(objects: list[LogObject], writer_id: bytes) -> bytes:
    """One log object holding the records of consecutive verified objects: byte for byte what
    `encode_log` makes of their records, but joined as they are (a record's framing and CRC are
    the same in any object, and the times come from the parts' headers), with no Python object
    per record. The merge of a writer's small group objects runs beside its commits, and each
    record it handled in Python was GIL time they waited for."""
    assert objects, "a merge holds at least one object"
    assert all(a.last + 1 == b.first for a, b in itertools.pairwise(objects)), "consecutive objects"
    first, last = objects[0].first, objects[-1].last
    body = _LOG_HEADER.pack(LOG_MAGIC, 1, 0, last - first + 1, first, last, min(o.min_time_ms for o in objects),
                            max(o.max_time_ms for o in objects), writer_id) + \
        b"".join(o.body[_LOG_HEADER.size:] for o in objects)
    return body + _sha256(body)


def decode_log(data: bytes | memoryview, name: str) -> LogObject:
    """Verify and decode a log object; CorruptionError (naming the object and LSNs) if anything is off."""
    parsed = parse_name(name)
    hint = (f"{parsed.first}..{parsed.last if parsed.last is not None else '?'}" if parsed else "?")
    body = _check_digest(data, name, hint)
    magic, version, flags, count, first, last, tmin, tmax, writer = _LOG_HEADER.unpack_from(body, 0)
    lsns = f"{first}..{last}"
    if magic != LOG_MAGIC:
        raise _damaged(name, f"bad magic {magic!r}", hint)
    if version not in LOG_VERSIONS:
        raise CorruptionError(f"archive object {name} has format version {version}; this agentwal reads "
                              f"{' and '.join(map(str, LOG_VERSIONS))}", path=name, reason="archive version")
    if parsed is None or parsed.first != first or (parsed.last is not None and parsed.last != last) \
            or last - first + 1 != count:
        raise _damaged(name, f"its header (LSNs {lsns}, {count} records) disagrees with its name", hint)
    # Every record checked and indexed in one C call (native/objindex.c), the GIL released.
    lsn_array, offsets, lengths = array.array("Q", bytes(8 * count)), array.array("Q", bytes(8 * count)), \
        array.array("I", bytes(4 * count))
    end = lib.wal_archive_index(ffi.from_buffer(body), len(body), _LOG_HEADER.size, first, count,
                                ffi.from_buffer("uint64_t[]", lsn_array), ffi.from_buffer("uint64_t[]", offsets),
                                ffi.from_buffer("uint32_t[]", lengths))
    if end < 0:
        bad = first - end - 1
        cut = _LOG_HEADER.size if bad == first else offsets[bad - first - 1] + lengths[bad - first - 1]
        if cut + _REC.size > len(body):
            raise _damaged(name, f"it ends inside record LSN {bad}", lsns)
        raise _damaged(name, f"record LSN {bad} fails its CRC-32C", lsns)
    if end != len(body):
        raise _damaged(name, "bytes follow its last record", lsns)
    return LogObject(first, last, tmin, tmax, bytes(writer), body, lsn_array, offsets, lengths, flags & BEHIND_MASK)


IdemEntry = tuple[bytes, int, int]  # an idempotency key, the LSN of its commit, that commit's time_ms


class Snapshot(NamedTuple):
    lsn: int
    taken_ms: int
    writer_id: bytes
    entries: list[tuple[bytes, int, bytes]]  # (key, version, value) in key order
    idem: list[IdemEntry]


def encode_snapshot(lsn: int, taken_ms: int, writer_id: bytes, entries: Iterable[tuple[bytes, int, bytes]],
                    idem: Iterable[IdemEntry] = ()) -> bytes:
    """A snapshot object, whole in memory (`write_snapshot` writes one to a file)."""
    listed, idem_listed = list(entries), list(idem)
    out = io.BytesIO()
    write_snapshot(out, SnapshotHeader(lsn, taken_ms, writer_id, len(listed), len(idem_listed)), listed, idem_listed)
    return out.getvalue()


_WRITE_CHUNK = 1 << 20  # write_snapshot hashes and writes its entries about this many bytes at a time


def write_snapshot(out: BinaryIO, header: SnapshotHeader, entries: Iterable[tuple[bytes, int, bytes]],
                   idem: Iterable[IdemEntry] = ()) -> int:
    """Write a snapshot object of `header.n_entries` entries, then `header.n_idem` idempotency
    entries, to `out` as they come, holding about _WRITE_CHUNK bytes of it at a time (a state of
    any size is never whole in memory); returns its size. The header, which counts both, comes
    first and the SHA-256 of everything before it last, so the counts are given up front (an
    LMDB read transaction knows them: its entries are the ones `entries` and `idem` yield). A
    count that turns out wrong raises ValueError."""
    lsn, taken_ms, writer_id, n_entries, n_idem = header
    digest = hashlib.sha256()
    size = 0
    parts = [_SNAP_HEADER.pack(SNAP_MAGIC, SNAP_VERSION, 0, 0, lsn, taken_ms, n_entries, writer_id, n_idem)]
    held = len(parts[0])
    n = n_idem_seen = 0

    def spill() -> None:
        nonlocal size, parts, held
        chunk = b"".join(parts)
        digest.update(chunk)
        out.write(chunk)
        size += held
        parts, held = [], 0

    for key, version, value in entries:
        lengths = struct.pack("<IIQ", len(key), len(value), version)
        parts += (_ENTRY.pack(len(key), len(value), version, _crc(lengths, key, value)), key, value)
        held += _ENTRY.size + len(key) + len(value)
        n += 1
        if held >= _WRITE_CHUNK:
            spill()
    if n != n_entries:
        raise ValueError(f"the snapshot at LSN {lsn} was to hold {n_entries} entries and was given {n}")
    for key, commit_lsn, time_ms in idem:
        fields = struct.pack("<IQQ", len(key), commit_lsn, time_ms)
        parts += (fields, _crc(fields, key).to_bytes(4, "little"), key)
        held += _IDEM.size + len(key)
        n_idem_seen += 1
        if held >= _WRITE_CHUNK:
            spill()
    if n_idem_seen != n_idem:
        raise ValueError(f"the snapshot at LSN {lsn} was to hold {n_idem} idempotency entries and was given "
                         f"{n_idem_seen}")
    spill()
    out.write(digest.digest())
    return size + DIGEST


IDEM_CHUNK = 65_536  # idempotency entries per piece a restore loads (a few MB of Python objects)


def _idem_chunks(body: bytes | bytearray | memoryview, off: int, count: int, name: str,
                 hint: str) -> Iterator[tuple[list[IdemEntry], int]]:
    """The `count` idempotency entries of a snapshot from ``body[off:]``, each past its CRC-32C,
    IDEM_CHUNK at a time, each chunk with the offset after it (the last: after them all; an
    empty chunk when `count` is 0); CorruptionError naming the object if not."""
    out: list[IdemEntry] = []
    end = len(body)
    for i in range(count):
        if off + _IDEM.size > end:
            raise _damaged(name, f"it ends inside idempotency entry {i}", hint)
        klen, commit_lsn, time_ms, crc = _IDEM.unpack_from(body, off)
        key_at = off + _IDEM.size
        if not 0 < klen <= MAX_KEY_BYTES or key_at + klen > end:
            raise _damaged(name, f"idempotency entry {i} has a bad key length ({klen} bytes)", hint)
        key = bytes(body[key_at:key_at + klen])
        if _crc(bytes(body[off:off + _IDEM.size - 4]), key) != crc:
            raise _damaged(name, f"idempotency entry {i} fails its CRC-32C", hint)
        out.append((key, commit_lsn, time_ms))
        off = key_at + klen
        if len(out) == IDEM_CHUNK:
            yield out, off
            out = []
    if out or not count:
        yield out, off


def _read_idem(body: bytes | bytearray | memoryview, off: int, count: int, name: str,
               hint: str) -> tuple[list[IdemEntry], int]:
    """`_idem_chunks`, whole: every entry, and the offset after them."""
    chunks = list(_idem_chunks(body, off, count, name, hint))  # at least one
    return [entry for chunk, _ in chunks for entry in chunk], chunks[-1][1]


class SnapshotImage(NamedTuple):
    """A verified snapshot whose entries stay where they are: `n_entries` entries from
    ``body[start:]`` on, in the layout `State.load_snapshot` takes, so a restore puts them into
    LMDB straight from the downloaded bytes, with no Python object per entry."""

    lsn: int
    taken_ms: int
    writer_id: bytes
    body: memoryview
    start: int
    n_entries: int
    in_key_order: bool  # keys strictly increasing (as written): they may be appended
    idem: list[IdemEntry]

    def entries(self) -> list[tuple[bytes, int, bytes]]:
        """[(key, version, value)], copied out."""
        out: list[tuple[bytes, int, bytes]] = []
        body, off = self.body, self.start
        for _ in range(self.n_entries):
            klen, vlen, version, _ = _ENTRY.unpack_from(body, off)
            off += _ENTRY.size
            out.append((bytes(body[off:off + klen]), version, bytes(body[off + klen:off + klen + vlen])))
            off += klen + vlen
        return out


EMPTY_SNAPSHOT = SnapshotImage(0, 0, b"", memoryview(b""), 0, 0, True, [])  # the implicit one at LSN 0


def _entry_fault(body: bytes | bytearray | memoryview, off: int, index: int) -> str:
    """What is wrong with whole data entry `index` at ``body[off:]``, which failed its check."""
    klen = _ENTRY.unpack_from(body, off)[0]
    if not 0 < klen <= MAX_KEY_BYTES:
        return f"entry {index} has a bad key length ({klen} bytes)"
    return f"entry {index} fails its CRC-32C"


def open_snapshot(data: bytes | bytearray | memoryview, name: str) -> SnapshotImage:
    """Verify a snapshot (its SHA-256, then every entry's CRC-32C, in one C call without the GIL:
    native/objindex.c); CorruptionError (naming the object) if anything is off."""
    hint = _snapshot_hint(name)
    body = _check_digest(data, name, hint)
    lsn, taken, writer, count, n_idem = snapshot_header(body, name)
    in_order = ffi.new("int *")
    end = lib.wal_snapshot_check(ffi.from_buffer(body), len(body), _SNAP_HEADER.size, count, in_order)
    if end < 0:
        bad = -end - 1
        off = _SNAP_HEADER.size  # the entry's offset: the bad one is rare, so walk again to it
        for _ in range(bad):
            klen, vlen, _, _ = _ENTRY.unpack_from(body, off)
            off += _ENTRY.size + klen + vlen
        if off + _ENTRY.size > len(body) or off + _ENTRY.size + sum(_ENTRY.unpack_from(body, off)[:2]) > len(body):
            raise _damaged(name, f"it ends inside entry {bad}", hint)
        raise _damaged(name, _entry_fault(body, off, bad), hint)
    idem, end = _read_idem(body, end, n_idem, name, hint)
    if end != len(body):
        raise _damaged(name, "bytes follow its last entry", hint)
    return SnapshotImage(lsn, taken, writer, body, _SNAP_HEADER.size, count, bool(in_order[0]), idem)


class SnapshotHeader(NamedTuple):
    """A snapshot's header fields (FORMAT.md §18), checked against its name."""

    lsn: int
    taken_ms: int
    writer_id: bytes
    n_entries: int
    n_idem: int = 0  # idempotency entries (version 2; none in version 1)


EMPTY_SNAPSHOT_HEADER = SnapshotHeader(0, 0, b"", 0)  # the implicit one at LSN 0


class SnapshotPiece(NamedTuple):
    """`n_entries` whole entries of a snapshot still arriving, from ``body[offset:]`` on, each
    past its CRC-32C. in_key_order: they and every entry before them are in key order. The
    pieces after the entries have none, and up to IDEM_CHUNK of its idempotency entries each
    in `idem`, each past its CRC-32C (the SHA-256 of the whole is checked after the last)."""

    body: memoryview
    offset: int
    n_entries: int
    in_key_order: bool
    idem: list[IdemEntry] | None = None


class Arriving(Protocol):
    """An object's bytes arriving into `buffer` (`size` of them): `wait(n)` returns once the
    first n are in; `release(n)`: the reader is done with the first n, which may be given back
    (wal.archive.objects.RangedRead)."""

    buffer: bytes | bytearray | mmap.mmap | memoryview
    size: int

    def wait(self, upto: int) -> None: ...

    def release(self, upto: int) -> None: ...


def read_snapshot_header(read: Arriving, name: str) -> SnapshotHeader:
    """The header of a snapshot arriving (`Arriving`), checked (length, magic, version, the LSN
    its name gives); CorruptionError naming the object. Its entries and digest:
    `snapshot_pieces`."""
    if read.size < _SNAP_HEADER.size + DIGEST:
        raise _damaged(name, f"{read.size} bytes is shorter than a header and trailer", _snapshot_hint(name))
    read.wait(_SNAP_HEADER.size)
    return snapshot_header(memoryview(read.buffer), name)


def _snapshot_hint(name: str) -> str:
    parsed = parse_name(name)
    return f"{parsed.first}" if parsed else "?"


def snapshot_header(buffer: bytes | bytearray | memoryview, name: str) -> SnapshotHeader:
    """A snapshot's header from its first SNAPSHOT_HEADER_BYTES bytes (of a plain snapshot object),
    checked: magic, version, the LSN its name gives."""
    magic, version, _, _, lsn, taken, count, writer, n_idem = _SNAP_HEADER.unpack_from(buffer, 0)
    if looks_sealed(buffer):
        raise missing_manifest(name)
    if magic != SNAP_MAGIC:
        raise _damaged(name, f"bad magic {magic!r}", _snapshot_hint(name))
    if version not in SNAP_VERSIONS:
        raise CorruptionError(f"archive snapshot {name} has format version {version}; this agentwal reads "
                              f"{', '.join(map(str, SNAP_VERSIONS))}", path=name, reason="archive version")
    parsed = parse_name(name)
    if parsed is None or parsed.first != lsn:
        raise _damaged(name, f"its header (LSN {lsn}) disagrees with its name", _snapshot_hint(name))
    return SnapshotHeader(lsn, taken, bytes(writer), count, n_idem if version >= 2 else 0)


def snapshot_pieces(read: Arriving, name: str, header: SnapshotHeader, step: int) -> Iterator[SnapshotPiece]:
    """The entries of a snapshot arriving (`Arriving`), in pieces as its bytes come in, `step`
    bytes at a time: each piece's entries are whole and pass their
    CRC-32C (in C, native/objindex.c), so a restore loads them while the rest downloads. Once
    every byte is in: the entries end where the trailer begins, and the SHA-256 trailer,
    computed along the way, matches. CorruptionError naming the object (and the entry) if not,
    possibly after pieces were yielded: the caller must drop what it made of them (a restore
    builds its store aside, and moves it into place only once whole)."""
    hint = _snapshot_hint(name)
    buffer, size = read.buffer, read.size
    body_len = size - DIGEST
    digest = hashlib.sha256()
    hashed, avail = 0, _SNAP_HEADER.size
    off, left = _SNAP_HEADER.size, header.n_entries
    end, last, in_order = ffi.new("uint64_t *"), ffi.new("uint64_t *", 2**64 - 1), ffi.new("int *", 1)
    while avail < size:
        avail = min(size, avail + step)
        read.wait(avail)
        body = memoryview(buffer)[:min(avail, body_len)]
        digest.update(body[hashed:])
        hashed = len(body)
        if not left:
            continue
        n = lib.wal_snapshot_check_prefix(ffi.from_buffer(body), len(body), off, left, end, last, in_order)
        if n < 0:
            raise _damaged(name, _entry_fault(body, int(end[0]), header.n_entries - left - n - 1), hint)
        if n:
            yield SnapshotPiece(body, off, n, bool(in_order[0]))
            off, left = int(end[0]), left - n
            read.release(min(off, hashed))  # loaded and hashed: a windowed read fetches further
    if left:
        raise _damaged(name, f"it ends inside entry {header.n_entries - left}", hint)
    body = memoryview(buffer)[:body_len]
    end_of_idem = off
    for idem, end_of_idem in _idem_chunks(body, off, header.n_idem, name, hint):
        if idem:
            yield SnapshotPiece(body, end_of_idem, 0, bool(in_order[0]), idem)
    if end_of_idem != body_len:
        raise _damaged(name, "bytes follow its last entry", hint)
    if digest.digest() != bytes(memoryview(buffer)[body_len:size]):
        raise _damaged(name, "its SHA-256 trailer does not match its bytes", hint)


def decode_snapshot(data: bytes, name: str) -> Snapshot:
    """`open_snapshot`, with the entries copied out as a list."""
    image = open_snapshot(data, name)
    return Snapshot(image.lsn, image.taken_ms, image.writer_id, image.entries(), image.idem)


def peek_log_header(data: bytes) -> tuple[int, int] | None:
    """(first, last) from a log object's header, unverified (for planning only)."""
    if len(data) < _LOG_HEADER.size or data[:8] != LOG_MAGIC:
        return None
    _, _, _, _, first, last, _, _, _ = _LOG_HEADER.unpack_from(data, 0)
    return int(first), int(last)
