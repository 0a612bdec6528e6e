"""`agentwal rekey`: rewrite what an encrypted store holds under older keys with its current key.

Rotation (wal/crypto/sealing.py, "Keys") puts new writes under the new key at once and reads old
values while their key is given; this finishes it, so that the old keys can be retired:

1. every value whose envelope names another key id is rewritten: read and opened with the keys
   given, committed again (transactions of at most `batch` keys and `batch_bytes` of values,
   through the log like any commit) and so sealed under the current key, in a new session; a
   store that holds compressed values is opened with compression, so they are compressed again
   rather than rewritten whole;
2. every blob file and stored dictionary (``dicts/``) sealed under another key is sealed again
   under the current one (written to a temporary file, fsynced, renamed over the old, the
   directory fsynced), its name kept;
3. a checkpoint, after which recovery never replays a record written before it (so never needs
   the old keys), and the log segments it releases are removed;
4. the state is compacted (`agentwal compact`): LMDB's free pages, which still hold the old
   ciphertexts, are returned to the filesystem (refused while a read-only handle in another
   process has the store open: close it and run rekey again, which finds the values rewritten);
5. a store that ships to an object archive (its archive.json names one) is opened with it: the
   rewrite is shipped, then a snapshot of the rewritten state under the current key (at an LSN
   of its own: a store with nothing to rewrite commits one empty transaction first), so a
   restore to any point from then on, and the store's next archived open (which reads the
   archive's newest objects), need the current key alone;
6. STORE, and the state's record of its sealing (what an open with STORE lost is held to),
   list only the current key's id: an open with only an old key is then refused as
   `WrongKeyError`.

What stays under the old keys: the records of the newest log segment written before the
checkpoint (never read again; the segment goes once it is full and checkpointed), the segments
kept in the store's local ``archive/`` folder (a store opened with ``archive=True``), and objects
an object archive already held (immutable: a restore to a point among them needs the old key,
until retention removes them). The store stays open for the whole run; it is the store's writer
(needs the lock).
"""

from __future__ import annotations

import os
from typing import Any

from wal._fs import replace_durably
from wal.archive.objects import ArchiveError, ArchiveUnavailableError
from wal.crypto.sealing import CODEC_ENCRYPTED, CODEC_ZSTD, CONTEXT_BLOB, KEY_ID_BYTES
from wal.errors import ArgumentError
from wal.ops.inspect import scan
from wal.ops.target import _writer_target, open_writer
from wal.store.sealed import STORE_FIELD, dict_file, read_meta, write_dictionary
from wal.store.store import STORE_FILE, Store, _write_store_file, shipping_archive


def rekey(path: str, *, batch: int = 1000, batch_bytes: int = 8 << 20, compact: bool = True) -> dict[str, Any]:
    """Rewrite every value and blob not sealed under the current key (module docstring). The keys
    come from `wal.ops.use_sealing(encryption=[current, old, ...])` (the command's --key-file)."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ArgumentError(f"batch must be an int >= 1, got {batch!r}")
    target = _writer_target(path, False)
    shipping = shipping_archive(target.path)
    # Opened by URL: an archive given to wal.open as a store object of another cloud (gs://,
    # az://) is not, and its log is then kept for the application's next archived open.
    url = shipping[0] if shipping is not None and shipping[0].startswith(("s3://", "file://")) else None
    # A store that records its compression (on, with its threshold, or turned off) is opened as
    # it records; one from before that record compresses again if any of its values are.
    recorded = ((read_meta(target.path) or {}).get(STORE_FIELD) or {}).get("compression")
    compression = None if recorded is not None or not _holds_compressed_values(target.path) else "zstd"
    with open_writer(target, "rekey", object_archive=url, compression=compression) as store:
        sealer = getattr(store, "_sealer", None)
        if sealer is None or sealer.keys is None:
            raise ArgumentError(f"the store at {path} is not encrypted: there is nothing to rekey")
        current = sealer.keys.current_id
        stale = [k for k, env in Store.scan(store) if env[0] & CODEC_ENCRYPTED and env[1:1 + KEY_ID_BYTES] != current]
        rewritten = 0
        i = 0
        while i < len(stale):
            size = 0
            with store.transaction() as tx:
                # One key at least; then up to `batch` keys while the values stay under
                # `batch_bytes` (a transaction is one log record, of at most 16 MiB).
                for key in stale[i:i + batch]:
                    value = store.get(key)  # opened with the key its envelope names
                    if value is not None and size and size + len(key) + len(value) >= batch_bytes:
                        break
                    i += 1
                    if value is not None:
                        tx.put(key, value)
                        size += len(key) + len(value)
                        rewritten += 1
        blobs = _rekey_blobs(os.path.join(target.path, "blobs"), sealer)
        _rekey_dictionaries(target.path, sealer)
        applied = store.checkpoint()
        result: dict[str, Any] = {"values_rewritten": rewritten, "blobs_rewritten": blobs, "key_id": current.hex(),
                                  "applied_lsn": applied}
        if compact:
            result["compaction"] = store._compact_state()
        if url is not None:
            result["archive_snapshot_lsn"] = _ship_snapshot(store, url)
            # The snapshot is of the state as it then was: one empty transaction later where the
            # archive's newest snapshot had this LSN already (`_ship_snapshot_now`).
            result["applied_lsn"] = max(applied, result["archive_snapshot_lsn"])
        meta = read_meta(target.path) or {}
        before = list((meta.get(STORE_FIELD) or {}).get("key_ids") or [])
        meta[STORE_FIELD] = {**(meta.get(STORE_FIELD) or {}), "key_ids": [current.hex()]}
        # The state's record first: it must share a key id with STORE, and [current] does with
        # STORE before and after. Left listing the old keys, an open with only an old key was
        # accepted once STORE was lost, and sealed new values under a retired key.
        store._record_sealing(meta[STORE_FIELD])
        _write_store_file(target.path, meta)
        result["key_ids_retired"] = [i for i in before if i != current.hex()]
    assert os.path.exists(os.path.join(target.path, STORE_FILE))
    return result


def _holds_compressed_values(path: str) -> bool:
    """Whether any value of the store is stored compressed (its envelope's codec says so). The
    command line has no compression option: the rewrite is compressed when the store was."""
    return any(env[:1] and env[0] & CODEC_ZSTD for _key, _version, env in scan(path, opened=False))


def _ship_snapshot(store: Any, url: str) -> int:
    """A snapshot of the rewritten state, under the current key, into the object archive the
    store ships to: a restore from it (or a writer's open, which reads the archive's newest
    objects) then needs the current key alone. Objects from before stay under the old keys."""
    try:
        return int(store._ship_snapshot_now())
    except ArchiveError as exc:
        raise ArchiveUnavailableError(
            f"the values of {store.path} were rewritten under the current key, but its archive {url} did not receive "
            f"a snapshot of them ({exc}): run `agentwal rekey` again once it answers, and keep the old key until "
            "then (the archive's newest objects are still sealed under it)") from exc


def _rekey_blobs(blob_dir: str, sealer: Any) -> int:
    """Seal again, under the current key, every blob file sealed under another (name kept)."""
    if not os.path.isdir(blob_dir):
        return 0
    current = sealer.keys.current_id
    count = 0
    for sub in sorted(os.listdir(blob_dir)):
        folder = os.path.join(blob_dir, sub)
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if name.endswith(".tmp") or len(name) != 64:
                continue
            with open(path, "rb") as f:
                envelope = f.read()
            if not envelope[:1] or not envelope[0] & CODEC_ENCRYPTED or envelope[1:1 + KEY_ID_BYTES] == current:
                continue
            context = CONTEXT_BLOB + bytes.fromhex(name)
            data = sealer.open(envelope, context, lambda p=path: f"the blob file {p}")
            replace_durably(path, sealer.seal(data, context))
            count += 1
    return count


def _rekey_dictionaries(root: str, sealer: Any) -> None:
    """Seal again, under the current key, every stored dictionary sealed under another (never
    compressed: a dictionary cannot need itself)."""
    current = sealer.keys.current_id
    for did in sorted(sealer.dictionaries):
        path = dict_file(root, did)
        try:
            with open(path, "rb") as f:
                envelope = f.read()
        except FileNotFoundError:
            continue  # given at this open for reading only, never stored: nothing on disk to rekey
        if envelope[1:1 + KEY_ID_BYTES] == current:
            continue
        write_dictionary(root, sealer, did)
