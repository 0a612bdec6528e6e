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

import re

__all__ = ["is_archive_url"]

# A URL's scheme (RFC 3986: a letter, then letters, digits, "+", "-", "."), two characters at
# least so that a Windows drive letter never reads as one, and its colon.
_URL_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:")


def is_archive_url(archive: object) -> bool:
    """True for an object-store location (``s3://...``, ``file://...``), an `ObjectStore` or an
    obstore store object; False for the store's older local-folder archive (``True`` or a plain
    directory path)."""
    from wal.archive.objects import ObjectStore, is_obstore_store  # noqa: PLC0415 -- loads only when used

    if isinstance(archive, ObjectStore) or is_obstore_store(archive):
        return True
    # A scheme before a colon makes it a URL: file:/dir is file:///dir's one-slash spelling, and
    # taken for a relative folder it made a local archive in ./file:/dir. An unknown scheme is
    # then refused by the URL's parser, naming the ones it takes.
    return isinstance(archive, str) and _URL_SCHEME.match(archive) is not None
