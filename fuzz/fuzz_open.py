"""Fuzz target: opening a log or a store over arbitrary directory contents.

Each input builds a directory in a scratch place (tmpfs when there is one), opens it, checks
what came back, and removes it. Two kinds, chosen by the low bit of the first byte:

* **log** (bit 0 = 0): a log directory of 1-3 segment files -- mostly valid segments built with
  wal.log.format's encoders (sealed but the last, LSNs continuing) with damage from
  ``_common.mutate``, sometimes raw input bytes -- under their proper names or, now and then,
  names that are *not* segment names by FORMAT.md (upper-case hex, a sign, an underscore,
  ``.tmp``, ``.broken``, ...), plus stray files. Then, in order: ``wal.Log.open(readonly=True)``,
  ``wal.Log.open()`` (strict) and, if strict refused, ``wal.Log.open(recovery="truncate")``.
* **store** (bit 0 = 1): a copy of a store made by a real ``wal.open`` (STORE, log/ with several
  4 KiB segments, state/), whose log segments are then damaged, or extended with a record of
  valid framing carrying a fuzzed store transaction, or whose STORE file or state/ is replaced
  or removed. Then ``wal.open()`` (strict) and, if refused, ``wal.open(recovery="truncate")``.

The oracle is the reference decoder run over the files *before* anything is opened: the
valid records of every file with a segment name (``wal.log.format.parse_segment_name``), in
segment-number order, concatenated -- call it C. The only acceptable outcomes are:

* a ``wal.WalError`` (any subclass), or
* success, and then
  - the records read back are in LSN order, gap-free, and a prefix of C (never a record
    that is not in the input, never one out of place);
  - strict success read back *all* of C (damage is never skipped silently); truncate success
    that read back less than C reported the loss (``recovery_report.lost_lsns``);
  - appending a record, closing and reopening strictly succeeds and reads the same records
    plus the appended one (recovery left a log a writer can continue);
  - for a store: its contents equal the original commits up to the state's applied LSN
    followed by the transactions of the log records read back after it, and reopening gives
    the same contents.

Anything else -- another exception type, a wrong or missing record, a crash -- is a finding.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import shutil
import struct
import sys
from collections.abc import Callable, Iterator
from typing import Any

import lmdb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (
    U64_MAX,
    Finding,
    Input,
    Segment,
    describe,
    mutate,
    plan_segment,
    scratch_dir,
    scratch_root,
    tolerated,
    unraisable_is_finding,
)

import wal
from wal.log import format as wf
from wal.log import record, recovery

SEGMENT_BYTES = 4096
APPENDED = b"agentwal-fuzz-appended"
Records = list[tuple[int, bytes]]


# ---- the oracle --------------------------------------------------------------------------------------


def reference_records(logdir: str) -> tuple[Records, list[str], set[str]]:
    """C: the valid records of every properly named segment file, in segment order; the scan
    verdicts; and the open findings (fuzz/findings/README.md) this directory can run into."""
    found = []
    known = set()
    for name in os.listdir(logdir):
        number = wf.parse_segment_name(name)
        path = os.path.join(logdir, name)
        if number is not None and os.path.isfile(path) and not os.path.islink(path):
            found.append((number, path))
        elif number is None and recovery.parse_segment_name(name) is not None:
            known.add("segment-names")
    records: Records = []
    verdicts = []
    for _, path in sorted(found):
        with open(path, "rb") as f:
            ref = wf.scan_segment(f.read())
        records += ref.payloads
        verdicts.append(f"{ref.status}:{ref.reason}" if ref.reason else ref.status)
        if ref.header is not None and max(ref.header.first_lsn, ref.last_lsn + 1) >= 1 << 63:
            known.add("lsn-int64")
        if ref.last_lsn == U64_MAX:
            known.add("lsn-wrap")
        if ref.header is not None and ref.header.log_id == 0:
            known.add("log-id-zero")
        if (ref.header is not None and ref.header.segment_no == U64_MAX) or path.endswith(wf.segment_name(U64_MAX)):
            known.add("segment-no-max")
    return records, verdicts, known


@contextlib.contextmanager
def stepping_over(known: set[str], outcomes: list[str]) -> Iterator[None]:
    """Let a finding pass when the input runs into an open finding this run was told to step over."""
    try:
        yield
    except Finding:
        names = sorted(name for name in known if tolerated(name))
        if not names:
            raise
        outcomes.append(f"known:{','.join(names)}")


def check_sequence(what: str, got: Records, concat: Records) -> None:
    """got is in LSN order, gap-free, and a prefix of the reference records."""
    for (a, _), (b, _) in itertools.pairwise(got):
        if b != a + 1:
            raise Finding(f"{what}: LSN {b} follows LSN {a} (gap or disorder) in {_lsns(got)}")
    if got != concat[: len(got)]:
        for i, (item, ref) in enumerate(zip(got, concat, strict=False)):
            if item != ref:
                raise Finding(f"{what}: record #{i} is LSN {item[0]} ({len(item[1])} bytes) where the input "
                              f"holds LSN {ref[0]} ({len(ref[1])} bytes); read {_lsns(got)}, input {_lsns(concat)}")
        raise Finding(f"{what}: read {len(got)} records {_lsns(got)}, the input holds only {_lsns(concat)}")


def _lsns(records: Records) -> str:
    if len(records) > 8:
        return f"[{records[0][0]}..{records[-1][0]}] ({len(records)} records)"
    return str([lsn for lsn, _ in records])


def read_all(log: wal.Log) -> Records:
    return list(log.read(max(1, log.first_lsn)))


@contextlib.contextmanager
def acceptable(what: str, outcomes: list[str], *, state_intact: bool = False) -> Iterator[None]:
    """A WalError is an acceptable outcome (recorded); any other exception is a finding.

    state_intact: the input never touches the LMDB files, so an error blaming them misleads
    the user (its advice, rebuilding the state from the log, cannot help): a finding too.
    """
    try:
        yield
    except Finding:
        raise
    except wal.WalError as exc:
        reason = getattr(exc, "reason", "")
        if state_intact and reason == "state damaged" and not tolerated("store-key-size"):
            raise Finding(f"{what}: the error blames the LMDB state, which the input left intact:\n"
                          f"{describe(exc)}") from exc
        outcomes.append(f"{what}:{type(exc).__name__}:{reason}")
    except Exception as exc:
        for name, kind in (("store-key-size", lmdb.BadValsizeError), ("store-file-json", RecursionError)):
            if isinstance(exc, kind) and tolerated(name):
                outcomes.append(f"{what}:known:{name}")
                return
        raise Finding(f"{what}: {type(exc).__name__} is not a wal.WalError:\n{describe(exc)}") from exc


def _close_quietly(obj: Any) -> Callable[[], None]:
    def close() -> None:
        with contextlib.suppress(Exception):
            obj.close()

    return close


# ---- log directories -----------------------------------------------------------------------------------


def _odd_name(number: int, inp: Input) -> str:
    """A name near a segment name that FORMAT.md says is not one (or is one, spelled oddly)."""
    hex16 = f"{number:016x}"
    return (
        f"{number:016X}.wal",  # upper-case hex
        f"+{number:015x}.wal",  # a sign
        f"0_{number:014x}.wal",  # an underscore
        f" {number:015x}.wal",  # a space
        f"{hex16}.wal.tmp",  # a segment being created
        f"{hex16}.wal.broken",  # a set-aside segment
        f"{hex16}.WAL",
        f"{number:017x}.wal",  # 17 digits
        f"{hex16}.wal.0000000000000040.broken",
    )[inp.below(9)]


def build_log(inp: Input, logdir: str) -> None:
    os.makedirs(logdir)
    nseg = 1 + inp.below(3)
    log_id = inp.nonzero_u64() if inp.chance(3, 4) else inp.u64()
    number = 1 if inp.chance(3, 4) else inp.u64()
    lsn = inp.small_lsn()
    for i in range(nseg):
        last = i == nseg - 1
        if inp.chance(1, 10):  # raw bytes
            data = bytearray(inp.take(inp.below(512)))
        else:
            seg = plan_segment(inp, log_id=log_id, segment_no=number or 1, first_lsn=lsn,
                               sealed=not last or inp.chance(1, 4))
            lsn = seg.next_lsn & U64_MAX or 1
            if inp.chance(1, 2):
                for _ in range(1 + inp.below(3)):
                    mutate(seg, inp)
            data = seg.data
        name = wf.segment_name(number) if inp.chance(15, 16) else _odd_name(number, inp)
        with open(os.path.join(logdir, name), "wb") as f:
            f.write(data)
        number = (number + (1 if inp.chance(15, 16) else inp.below(3))) & U64_MAX
    for _ in range(inp.below(3)):
        extra = inp.below(6)
        if extra == 0:  # a segment still being created
            _write(os.path.join(logdir, wf.segment_name(number) + wf.TEMP_SUFFIX), inp.payload(200))
        elif extra == 1:  # a lock file with stale contents
            _write(os.path.join(logdir, wf.LOCK_FILE_NAME), inp.payload(16))
        elif extra == 2:  # a file that is not part of the log
            _write(os.path.join(logdir, "NOTES"), inp.payload(16))
        elif extra == 3:  # cut bytes kept from an earlier repair
            _write(os.path.join(logdir, wf.broken_name(max(number - 1, 0), 64)), inp.payload(64))


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def run_log(inp: Input, root: str) -> list[str]:
    logdir = os.path.join(root, "log")
    build_log(inp, logdir)
    concat, verdicts, known = reference_records(logdir)
    outcomes = ["log", *verdicts]
    with stepping_over(known, outcomes):
        with stepping_over(_readonly_known(logdir), outcomes), acceptable("readonly", outcomes), \
                contextlib.ExitStack() as stack:
            log = wal.Log.open(logdir, readonly=True)
            stack.callback(_close_quietly(log))
            records = read_all(log)
            check_sequence("Log.open(readonly=True)", records, concat)
            outcomes.append(f"readonly:ok:{len(records)}")
        for mode in ("strict", "truncate"):
            opened = False
            with acceptable(mode, outcomes):
                opened = check_log_open(logdir, mode, concat, outcomes)
            if opened:
                break
    return outcomes


def _readonly_known(logdir: str) -> set[str]:
    """F9 applies when the log has damage (other than a torn tail) that a writable open refuses."""
    try:
        damaged = recovery.scan_directory(logdir).damage is not None
    except Exception:
        damaged = True
    return {"readonly-damage"} if damaged else set()


def check_log_open(logdir: str, mode: str, concat: Records, outcomes: list[str]) -> bool:
    with contextlib.ExitStack() as stack:
        log = wal.Log.open(logdir, recovery=mode, segment_bytes=SEGMENT_BYTES)
        stack.callback(_close_quietly(log))
        records = read_all(log)
        what = f"Log.open(recovery={mode!r})"
        check_sequence(what, records, concat)
        report = log.recovery_report
        if mode == "strict" and len(records) != len(concat):
            raise Finding(f"{what} succeeded but read {_lsns(records)} of the input's {_lsns(concat)}: "
                          "records were skipped without an error")
        if len(records) < len(concat) and report.lost_lsns is None:
            raise Finding(f"{what} read {_lsns(records)} of the input's {_lsns(concat)} and reported no loss")
        if records and report.last_lsn != records[-1][0]:
            raise Finding(f"{what}: recovery_report.last_lsn is {report.last_lsn}, the last record read is "
                          f"LSN {records[-1][0]}")
        outcomes.append(f"{mode}:ok:{len(records)}:{'lost' if report.lost_lsns else ''}")
        lsn = log.append(APPENDED)
        if lsn != report.last_lsn + 1:
            raise Finding(f"{what}: the first append got LSN {lsn}, expected {report.last_lsn + 1}")
        log.close()
    # Recovery must have left a log that opens cleanly and holds what it held plus the append.
    try:
        with wal.Log.open(logdir, segment_bytes=SEGMENT_BYTES) as again:
            reread = read_all(again)
    except Exception as exc:
        raise Finding(f"reopening after {what} and one append failed:\n{describe(exc)}") from exc
    if reread != [*records, (lsn, APPENDED)]:
        raise Finding(f"reopening after {what} and one append read {_lsns(reread)}, expected "
                      f"{_lsns(records)} + LSN {lsn}")
    return True


# ---- store directories ----------------------------------------------------------------------------------

_TEMPLATE: dict[str, Any] = {}


def store_template() -> tuple[str, Records, int]:
    """A store made once per process: (path, its log records, its applied LSN).

    Its log is written through wal.Log with a fixed seed (log id and salts) and fixed commit
    times, then wal.open builds STORE and the LMDB state by replaying it -- so the bytes a
    fuzz input damages are the same in every process, and a saved input reproduces.
    """
    if not _TEMPLATE:
        base = os.path.join(scratch_root(), f"agentwal-fuzz-template-{os.getpid()}")
        shutil.rmtree(base, ignore_errors=True)
        atexit.register(shutil.rmtree, base, True)
        path = os.path.join(base, "store")
        payloads = []
        for i in range(36):
            key = f"key-{i % 6}".encode()
            ops: list[record.Op]
            idem = None
            if i % 7 == 3:
                ops = [(record.OP_DELETE, key, None)]
            elif i % 9 == 5:
                ops = [(record.OP_PUT, key, bytes([i]) * 40), (record.OP_PUT, f"other-{i}".encode(), b"x" * (i * 3)),
                       (record.OP_DELETE, f"key-{(i + 1) % 6}".encode(), None)]
                idem = f"idem-{i}".encode()
            else:
                ops = [(record.OP_PUT, key, bytes([65 + i % 26]) * (120 + (37 * i) % 300))]
            payloads.append(record.encode(ops, 1_700_000_000_000 + i, idem))
        with wal.Log.open(os.path.join(path, "log"), segment_bytes=SEGMENT_BYTES, _seed=20261122,
                          _store_log=True) as log:
            log.append_many(payloads)
        with wal.open(path, segment_bytes=SEGMENT_BYTES) as store:
            applied = store.watermarks.applied
        with wal.Log.open(os.path.join(path, "log"), readonly=True) as log:
            originals = read_all(log)
        assert applied == originals[-1][0] == len(payloads), (applied, len(originals))
        _TEMPLATE.update(path=path, originals=originals, applied=applied)
    return _TEMPLATE["path"], _TEMPLATE["originals"], _TEMPLATE["applied"]


def _segment_of(data: bytearray) -> Segment:
    """A Segment over an existing image: header fields and record offsets as the reference decoder sees them."""
    ref = wf.scan_segment(bytes(data))
    h = ref.header
    seg = Segment(data, h.salt if h else 1, h.first_lsn if h else 1, h.log_id if h else 0, h.segment_no if h else 0)
    off = wf.SEGMENT_HEADER_SIZE
    while off + wf.RECORD_HEADER_SIZE <= ref.end_offset:
        seg.offsets.append(off)
        off += wf.record_size(struct.unpack_from("<I", data, off + wf.RH_LENGTH)[0])
    return seg


def store_payload(inp: Input) -> bytes:
    """A log payload for a store: raw bytes, or a transaction (FORMAT.md section 15) with fuzzed fields."""
    if inp.chance(1, 5):
        return inp.payload(64)
    kind = record.KIND_TXN if inp.chance(7, 8) else inp.byte()
    flags = (0, 0, record.FLAG_IDEMPOTENCY, inp.byte())[inp.below(4)]
    n_ops = inp.below(4)
    n_field = n_ops if inp.chance(7, 8) else (n_ops + (1, -1, 1000)[inp.below(3)]) & 0xFFFFFFFF
    parts = [struct.pack("<BBQI", kind, flags, inp.u64(), n_field)]
    if flags & record.FLAG_IDEMPOTENCY:
        n = (1, 5, 0, 511, 512, 600)[inp.below(6)]
        parts += [struct.pack("<H", n), bytes([inp.byte() | 1]) * n]
    for _ in range(n_ops):
        op = (record.OP_PUT, record.OP_PUT, record.OP_DELETE, inp.byte())[inp.below(4)]
        klen = (1, 3, 8, 0, 511, 512, 0xFFFF)[inp.below(7)]
        key = (b"key-" + bytes([48 + inp.below(8)]))[:klen] if klen < 6 else bytes([inp.byte() | 1]) * klen
        if inp.chance(1, 8):
            key = key[: inp.below(len(key) + 1)]  # the length field says more than follows
        parts += [bytes([op]), struct.pack("<H", klen), key]
        if op == record.OP_PUT:
            value = inp.payload(40)
            vlen = len(value) if inp.chance(7, 8) else inp.u64() & 0xFFFFFFFF
            parts += [struct.pack("<I", vlen), value]
    if inp.chance(1, 8):
        parts.append(inp.payload(8))  # trailing bytes
    return b"".join(parts)


def damage_store(inp: Input, path: str) -> bool:
    """Damage a copy of the template store; returns whether state/ is still the template's."""
    logdir = os.path.join(path, "log")
    names = sorted(n for n in os.listdir(logdir) if wf.parse_segment_name(n) is not None)
    state_kept = True
    for _ in range(1 + inp.below(3)):
        what = inp.below(10)
        if what <= 3 and names:  # byte damage to one segment
            name = names[inp.below(len(names))]
            file = os.path.join(logdir, name)
            with open(file, "rb") as f:
                seg = _segment_of(bytearray(f.read()))
            for _ in range(1 + inp.below(3)):
                mutate(seg, inp, reencode=False)
            _write(file, bytes(seg.data))
        elif what <= 6 and names:  # a valid next record carrying a fuzzed transaction, at the log's end
            file = os.path.join(logdir, names[-1])
            with open(file, "rb") as f:
                data = bytearray(f.read())
            ref = wf.scan_segment(bytes(data))
            if ref.header is None:
                continue
            rec = wf.encode_record(lsn=(ref.last_lsn + 1) & U64_MAX, payload=store_payload(inp), salt=ref.header.salt)
            data[ref.end_offset :] = rec + bytes(max(0, len(data) - ref.end_offset - len(rec)))
            _write(file, bytes(data))
        elif what == 7:  # the state is lost: rebuilt from the log
            shutil.rmtree(os.path.join(path, "state"), ignore_errors=True)
            state_kept = False
        elif what == 8:  # the STORE file replaced
            content = (inp.payload(48), b"[" * 5000, b'{"format": "agentwal-store", "version": 2}\n',
                       b'{"format": "agentwal-store"}\n', b"\xff\xfe", b"")[inp.below(6)]
            _write(os.path.join(path, "STORE"), content)
        elif names:  # a segment removed
            os.unlink(os.path.join(logdir, names.pop(inp.below(len(names)))))
    return state_kept


def run_store(inp: Input, root: str) -> list[str]:
    template, originals, applied = store_template()
    path = os.path.join(root, "store")
    shutil.copytree(template, path)
    state_kept = damage_store(inp, path)
    base_lsn = applied if state_kept else 0
    concat, verdicts, known = reference_records(os.path.join(path, "log"))
    outcomes = ["store", *verdicts, "" if state_kept else "no-state"]
    with stepping_over(known, outcomes):
        for mode in ("strict", "truncate"):
            opened = False
            with acceptable(f"store-{mode}", outcomes, state_intact=True):
                opened = check_store_open(path, mode, concat, originals, base_lsn=base_lsn, outcomes=outcomes)
            if opened:
                break
    return outcomes


def check_store_open(path: str, mode: str, concat: Records, originals: Records, *, base_lsn: int,
                     outcomes: list[str]) -> bool:
    what = f"wal.open(recovery={mode!r})"
    with contextlib.ExitStack() as stack:
        store = wal.open(path, recovery=mode, segment_bytes=SEGMENT_BYTES)
        stack.callback(_close_quietly(store))
        contents = list(store.scan())
        store.close()
    with wal.Log.open(os.path.join(path, "log"), readonly=True) as log:
        records = read_all(log)
    check_sequence(f"{what}, then its log", records, concat)
    if mode == "strict" and len(records) != len(concat):
        raise Finding(f"{what} succeeded but its log holds {_lsns(records)} of the input's {_lsns(concat)}")
    last = records[-1][0] if records else 0
    if last < base_lsn:
        raise Finding(f"{what} succeeded although its state reflects LSN {base_lsn} and its log ends at LSN {last}")
    model: dict[bytes, bytes] = {}
    replay = [r for r in originals if r[0] <= base_lsn] + [r for r in records if r[0] > base_lsn]
    for lsn, payload in replay:
        try:
            txn = record.decode(payload, lsn)
        except wal.CorruptionError as exc:
            raise Finding(f"{what} succeeded although log record LSN {lsn} is not a transaction: {exc}") from exc
        for op, key, value in txn.ops:
            if op == record.OP_PUT:
                assert value is not None
                model[key] = value
            else:
                model.pop(key, None)
    if contents != sorted(model.items()):
        raise Finding(f"{what}: the store holds {len(contents)} keys that differ from the effect of the "
                      f"original commits to LSN {base_lsn} then log records {_lsns(records)}: "
                      f"{_diff(dict(contents), model)}")
    outcomes.append(f"store-{mode}:ok:{len(records)}")
    try:
        with wal.open(path, segment_bytes=SEGMENT_BYTES) as again:
            reread = list(again.scan())
    except Exception as exc:
        raise Finding(f"reopening the store after {what} failed:\n{describe(exc)}") from exc
    if reread != contents:
        raise Finding(f"reopening the store after {what} changed it: {_diff(dict(reread), dict(contents))}")
    return True


def _diff(got: dict[bytes, bytes], want: dict[bytes, bytes]) -> str:
    keys = sorted(set(got) | set(want))
    bad = [k for k in keys if got.get(k) != want.get(k)]
    return ", ".join(f"{k[:20]!r}: {_short(got.get(k))} != {_short(want.get(k))}" for k in bad[:5])


def _short(v: bytes | None) -> str:
    return "absent" if v is None else f"{len(v)} bytes"


# ---- entry points ---------------------------------------------------------------------------------------


def run_one(data: bytes) -> tuple[str, ...]:
    """Check one input; returns a short signature of what it exercised (for corpus selection)."""
    inp = Input(data)
    kind = inp.byte()
    with unraisable_is_finding(_known_unraisable), scratch_dir("agentwal-fuzz-open-") as root:
        outcomes = run_store(inp, root) if kind & 1 else run_log(inp, root)
    return tuple(outcomes)


def _known_unraisable(u: Any) -> str | None:
    """F3: a Log.read generator dropped inside a segment fails to close its mapping."""
    if u.exc_type is BufferError and "_read_records" in repr(u.object):
        return "read-buffer-error"
    return None


def test_one_input(data: bytes) -> None:
    run_one(data)


if __name__ == "__main__":
    from _common import run_atheris

    run_atheris(test_one_input)
