"""The public API's static types, checked by mypy (pyproject.toml lists this file beside `wal`,
and CI runs mypy); the test runs the same calls, so what the types claim is what they return."""

from __future__ import annotations

from pathlib import Path
from typing import assert_type

import wal


def test_get_with_a_default_is_typed_bytes_and_without_one_bytes_or_none(tmp_path: Path) -> None:
    with wal.open(tmp_path) as store:
        store.put("k", b"v")
        assert assert_type(store.get("k", b"d"), bytes) == b"v"
        assert assert_type(store.get("missing", b"d"), bytes) == b"d"
        assert assert_type(store.get("missing"), bytes | None) is None
        with store.snapshot() as snap:
            assert assert_type(snap.get("missing", b"d"), bytes) == b"d"
        with store.transaction() as tx:
            assert assert_type(tx.get("missing", b"d"), bytes) == b"d"
            assert assert_type(tx.get("k"), bytes | None) == b"v"
