"""Off-machine durability: the store's log and state shipped to an object store (FORMAT.md §"Archive").

    store = wal.open(path, archive="s3://bucket/prefix", archive_rpo_ms=1000)
    store = wal.open(path, durability="replicated", archive="file:///mnt/backup/agent")
    wal.restore(url, new_dir, lsn=None, time=None)
    replica = wal.follow(url, dir); store = replica.promote()

Modules: `objects` (the object-store backends: file:// and s3://), `layout` (object names and
their byte encoding), `shipper` (the background thread that ships log objects and snapshots,
merges small objects, and answers `replicated` waiters), `store` (the Store subclass that ties a
shipper to a store), `restore` (point-in-time restore and `verify`), `follow` (followers and
promotion with fencing).
"""

from __future__ import annotations

__all__ = ["is_archive_url"]


def is_archive_url(archive: object) -> bool:
    """True for an object-store location (``s3://...``, ``file://...``), an `ObjectStore` or an
    obstore store object; False for the store's older local-folder archive (``True`` or a plain
    directory path)."""
    from wal.archive.objects import ObjectStore, is_obstore_store  # noqa: PLC0415 -- loads only when used

    if isinstance(archive, ObjectStore) or is_obstore_store(archive):
        return True
    return isinstance(archive, str) and "://" in archive
