"""The C writer produces, byte for byte, the worked example of FORMAT.md (tests/data/golden_two_records.wal)."""

from __future__ import annotations

import pathlib

import wal

GOLDEN = pathlib.Path(__file__).parent / "data" / "golden_two_records.wal"
LOG_ID = 0x0123456789ABCDEF
SALT = 0x5A17C0FFEE15900D


def test_c_writer_output_equals_the_golden_file_and_a_zero_tail(tmp_path: pathlib.Path) -> None:
    golden = GOLDEN.read_bytes()
    with wal.Log.open(tmp_path, segment_bytes=4096, _new_log_id=LOG_ID, _new_salt=SALT) as log:
        # One batch: nothing was durable before it, so the writer puts no MARK record in it.
        assert log.append_many([b"hello", b"agent state v1"]) == 2
    data = (tmp_path / "0000000000000001.wal").read_bytes()
    assert len(data) == 4096
    assert data[: len(golden)] == golden
    assert not any(data[len(golden) :])


def test_golden_file_reads_back_through_the_log(tmp_path: pathlib.Path) -> None:
    seg = tmp_path / "0000000000000001.wal"
    seg.write_bytes(GOLDEN.read_bytes() + bytes(4096 - len(GOLDEN.read_bytes())))
    with wal.Log.open(tmp_path, readonly=True) as log:
        assert list(log.read()) == [(1, b"hello"), (2, b"agent state v1")]
    with wal.Log.open(tmp_path) as log:
        assert log.append(b"third") == 3
        assert [p for _, p in log.read(3)] == [b"third"]
