"""The open fuzz findings (README.md here), each as a minimal check of the *correct* behaviour.

    python fuzz/findings/reproduce.py        # prints OPEN or fixed per finding

Every check raises (AssertionError, or the wrong exception itself) while its bug is there.
tests/test_fuzz_smoke.py runs them as strict xfails, so a fix shows up as a failing XPASS:
then delete the finding here, in the README, in tests/test_fuzz_smoke.py (OPEN_FINDINGS)
and in fuzz/_common.py (KNOWN_FINDINGS), and its saved fuzz input. These use only the public API and the format
encoders, so they keep working when the fuzz targets change how they read their inputs
(the saved ``*.bin`` inputs are tied to that and may need regenerating after such a change).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable

import wal
import wal.log.format as wf
import wal.log.record
from wal.log import record
from wal.log.recovery import scan_buffer

U64_MAX = (1 << 64) - 1


def _segment(d: str, number: int, **kw: object) -> None:
    fields: dict[str, object] = {"log_id": 7, "segment_no": number, "first_lsn": 1, "salt": 11 + number % 1000,
                                 "payloads": []}
    fields.update(kw)
    with open(os.path.join(d, wf.segment_name(number)), "wb") as f:
        f.write(wf.build_segment(**fields))  # type: ignore[arg-type]


def _only_wal_errors(fn: Callable[[], object]) -> None:
    try:
        fn()
    except wal.WalError:
        pass
    except Exception as exc:
        raise AssertionError(f"{type(exc).__module__}.{type(exc).__name__} is not a wal.WalError: {exc}") from exc


def f1_lsn_wrap() -> None:
    """After LSN 2**64-1 the C reader must not accept LSN 0 (the reference decoder does not)."""
    seg = wf.build_segment(log_id=1, segment_no=1, first_lsn=U64_MAX, salt=7, payloads=[])
    seg += wf.encode_record(lsn=U64_MAX, payload=b"a", salt=7) + wf.encode_record(lsn=0, payload=b"b", salt=7)
    ref = wf.scan_segment(seg)
    got = scan_buffer(seg)
    assert (got.records, got.end_offset) == (ref.records, ref.end_offset), (got.records, ref.records)
    d = tempfile.mkdtemp()
    _segment(d, 1, first_lsn=U64_MAX, payloads=[b"last"])
    _only_wal_errors(lambda: wal.Log.open(d).close())


def f2_store_key_size() -> None:
    """A store record with an empty key is CorruptionError "bad store record" (FORMAT.md section 15),
    not an LMDB error, nor a claim that the LMDB file is damaged."""
    d = tempfile.mkdtemp()
    wal.open(d).close()
    with wal.Log.open(os.path.join(d, "log"), _store_log=True) as log:  # a record no store commit makes
        log.append(wal.log.record.encode([(record.OP_PUT, b"", b"v")], 0, None))
    try:
        wal.open(d).close()
    except wal.CorruptionError as exc:
        assert exc.reason == "bad store record", f"reason {exc.reason!r}: {exc}"
    except Exception as exc:
        raise AssertionError(f"{type(exc).__module__}.{type(exc).__name__}: {exc}") from exc
    else:
        raise AssertionError("a record with an empty key was applied")


def f3_read_buffer_error() -> None:
    """Leaving Log.read early closes its mapping cleanly (no swallowed BufferError)."""
    swallowed: list[object] = []
    previous = sys.unraisablehook
    sys.unraisablehook = swallowed.append
    try:
        with wal.Log.open(tempfile.mkdtemp()) as log:
            log.append_many([b"a", b"b", b"c"])
            reader = log.read()
            next(reader)
            reader.close()
    except BufferError as exc:
        raise AssertionError(f"BufferError leaving Log.read: {exc}") from exc
    finally:
        sys.unraisablehook = previous
    assert not swallowed, [getattr(u, "exc_value", u) for u in swallowed]


def f4_lsn_int64() -> None:
    """Appending at LSN 2**63 either works and returns 2**63, or is refused with a WalError."""
    d = tempfile.mkdtemp()
    _segment(d, 1, first_lsn=1 << 63)

    def append() -> None:
        with wal.Log.open(d) as log:
            assert log.append(b"q") == 1 << 63

    _only_wal_errors(append)


def f5_store_file_json() -> None:
    """A deeply nested STORE file is a clear WalError."""
    d = tempfile.mkdtemp()
    wal.open(d).close()
    with open(os.path.join(d, "STORE"), "w") as f:
        f.write("[" * 5000)
    _only_wal_errors(lambda: wal.open(d).close())


def f6_segment_names() -> None:
    """An upper-case-hex name is not a segment name (FORMAT.md section 2): ignored."""
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "000000000000000A.wal"), "wb") as f:
        f.write(wf.build_segment(log_id=7, segment_no=10, first_lsn=1, salt=11, payloads=[b"stray"]))
    with wal.Log.open(d, readonly=True) as log:
        got = list(log.read())
    assert got == [], f"read-only open read {got} from a file that is not a segment"


def f7_log_id_zero() -> None:
    """Log id 0 is not a valid log id (FORMAT.md H7; the writer never draws it): refused clearly."""
    d = tempfile.mkdtemp()
    _segment(d, 1, log_id=0, payloads=[b"a"], sealed=True)
    try:
        wal.Log.open(d).close()
    except wal.CorruptionError as exc:
        assert exc.reason == "bad header fields", exc
        return
    raise AssertionError("a segment with log id 0 was accepted")


def f8_segment_no_max() -> None:
    """A sealed segment numbered 2**64-1 is refused with a WalError (there is no next number)."""
    d = tempfile.mkdtemp()
    _segment(d, U64_MAX, payloads=[b"a"], sealed=True)
    _only_wal_errors(lambda: wal.Log.open(d).close())


def f9_readonly_damage() -> None:
    """A read-only open refuses a first-LSN mismatch in the newest segment, as a writable one does."""
    d = tempfile.mkdtemp()
    _segment(d, 1, payloads=[b"a"], sealed=True)
    _segment(d, 2, first_lsn=5, payloads=[b"x", b"y"])
    try:
        with wal.Log.open(d, readonly=True) as log:
            got = list(log.read())
    except wal.CorruptionError:
        return
    raise AssertionError(f"read-only open read {got}: an LSN gap")


def f10_idem_key_size() -> None:
    """A store record whose idempotency key LMDB cannot hold is 'bad store record', not a blamed state."""
    d = tempfile.mkdtemp()
    wal.open(d).close()
    with wal.Log.open(os.path.join(d, "log"), _store_log=True) as log:  # a record no store commit makes
        log.append(wal.log.record.encode([(record.OP_PUT, b"k", b"v")], 0, b"i" * 600))
    try:
        wal.open(d).close()
    except wal.CorruptionError as exc:
        assert exc.reason == "bad store record", exc
        return
    raise AssertionError("a 600-byte idempotency key was accepted")


FINDINGS: dict[str, Callable[[], None]] = {
    "lsn-wrap": f1_lsn_wrap,
    "store-key-size": f2_store_key_size,
    "read-buffer-error": f3_read_buffer_error,
    "lsn-int64": f4_lsn_int64,
    "store-file-json": f5_store_file_json,
    "segment-names": f6_segment_names,
    "log-id-zero": f7_log_id_zero,
    "segment-no-max": f8_segment_no_max,
    "readonly-damage": f9_readonly_damage,
    "idem-key-size": f10_idem_key_size,
}


def main() -> int:
    still_open = 0
    for name, check in FINDINGS.items():
        try:
            check()
        except Exception as exc:  # AssertionError, or the wrong exception itself
            still_open += 1
            text = f"{type(exc).__name__}: {exc}" if not isinstance(exc, AssertionError) else str(exc) or repr(exc)
            print(f"OPEN   {name}: {text.splitlines()[0][:160]}")
        else:
            print(f"fixed  {name}")
    return 1 if still_open else 0


if __name__ == "__main__":
    sys.exit(main())
