"""An object store that does not honour create-only writes (``If-None-Match: *``), for real: the test
suite's SeaweedFS behind a proxy that drops the header (tests/s3_proxy.py), so a second create-only
PUT of a name silently overwrites it. agentwal fences an old writer with those writes, so it
refuses such a store, clearly, at an archived open and at `promote()`; `archive_fencing=False`
opens anyway for a single-writer deployment, with a WARNING. The same server without the proxy
honours them (every other archive test).
"""

# ruff: noqa: F811 -- fixtures imported by name (tests/archive_server.py)
from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator

import pytest
from archive_server import BUCKET, WeedServer, s3_server  # noqa: F401 -- fixtures
from s3_proxy import StrippingProxy

import wal
from wal.archive import layout
from wal.archive.objects import ObjectExistsError, open_objects


@pytest.fixture
def stripping(s3_server: WeedServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[StrippingProxy]:
    s3_server.use_env(monkeypatch)
    with StrippingProxy(s3_server.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        yield proxy


def _url() -> str:
    return f"s3://{BUCKET}/no-create-only-{os.urandom(6).hex()}"


def test_the_proxy_really_drops_create_only(stripping: StrippingProxy) -> None:
    objects = open_objects(_url())
    objects.put("x/1", b"first")
    objects.put("x/1", b"second")  # create-only, yet accepted: the server never saw If-None-Match
    assert objects.get("x/1") == b"second" and stripping.stripped == 2
    assert objects.check_create_only() is False


def test_the_server_itself_honours_create_only(s3_server: WeedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    s3_server.use_env(monkeypatch)
    objects = open_objects(_url())
    objects.put("x/1", b"first")
    with pytest.raises(ObjectExistsError):
        objects.put("x/1", b"second")
    assert objects.check_create_only() is True
    assert list(objects.list(layout.LOG_PREFIX)) == [] and list(objects.list("probe/")) == []


def test_an_archived_open_refuses_a_store_without_create_only_writes(tmp_path, stripping: StrippingProxy) -> None:
    url = _url()
    with pytest.raises(wal.FailedError, match=r"does not honour create-only writes.*archive_fencing=False"):
        wal.open(tmp_path / "s", archive=url, durability="replicated")
    objects = open_objects(url)
    assert list(objects.list("")) == [], "nothing shipped, the probe object removed"


def test_archive_fencing_false_opens_anyway_with_a_warning(tmp_path, stripping: StrippingProxy, caplog) -> None:
    url = _url()
    caplog.set_level(logging.WARNING, logger="wal.archive")
    with wal.open(tmp_path / "s", archive=url, durability="replicated", archive_fencing=False) as s:
        lsn = s.put("k", b"v")
        assert s.stats()["archived_lsn"] >= lsn
    assert any("no fencing" in r.getMessage() for r in caplog.records)
    report = wal.restore(url, tmp_path / "r")
    assert report.lsn == lsn
    with pytest.raises(wal.ArgumentError, match="archive_fencing must be True or False"):
        wal.open(tmp_path / "t", archive=url, archive_fencing="no")


def test_promote_refuses_to_fence_through_a_store_without_create_only(tmp_path, stripping: StrippingProxy) -> None:
    url = _url()
    with wal.open(tmp_path / "p", archive=url, archive_fencing=False) as s:
        last = s.put("k", b"v")
        deadline = time.monotonic() + 30
        while s.stats()["archived_lsn"] < last:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    follower = wal.follow(url, tmp_path / "f", poll_ms=50)
    try:
        with pytest.raises(wal.FailedError, match="does not honour create-only writes"):
            follower.promote()
        assert follower.get("k") == b"v", "the follower is left as it was"
        assert [n for n, _ in open_objects(url).list(layout.LOG_PREFIX)] == [layout.log_name(1)], "no fence written"
    finally:
        follower.close()
