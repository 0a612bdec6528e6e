"""The object archive of a sealed store: every object sealed whole (FORMAT.md §18-§19).

An archive of a sealed store holds ``sealed.json`` (plain JSON, ``{"format":
"agentwal-archive-sealing", "version": 1, "encrypted": bool}``), written create-only before its
first other object, and every other object (log and merged objects, snapshots) is the
envelope of the object FORMAT.md §18 describes, sealed with the context ``b"agentwal
archive\\0" + name``: compressed when the store compresses (except snapshots, spooled as
they are written and never compressed: their values are envelopes already), AES-256-GCM-
encrypted when it encrypts. So the object store sees no key, no value and no record header of
an encrypted store: only object names (LSNs), sizes and times. A snapshot's values are
envelopes already; sealing the object again costs one AEAD pass over bytes already ciphertext
and hides the keys too.

Restores and followers read ``sealed.json`` first: an encrypted archive needs the key
(`MissingKeyError` otherwise), and the store they make is sealed like the one that shipped.

A store compressing with trained zstd dictionaries compresses its objects with them too, so
each writer session ships them first, as ``dict/<id:08x>.zdict`` (create-only, sealed but
never compressed: a dictionary cannot need itself); restores and followers load them before
anything else, and the store they make keeps them (wal/store/sealed.py, ``dicts/``).
"""

from __future__ import annotations

import contextlib
import json
import mmap
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from wal.archive import layout
from wal.archive.objects import ObjectExistsError, ObjectMissingError, ObjectStore, RangedRead
from wal.crypto.sealing import (
    CODEC_ENCRYPTED,
    CODEC_PLAIN,
    CONTEXT_ARCHIVE,
    HEADER_BYTES,
    KEY_ID_BYTES,
    OVERHEAD,
    TAG_BYTES,
    Opening,
    Sealer,
    parse,
)
from wal.errors import ArgumentError, CorruptionError, MissingKeyError, SealDamagedError, WrongKeyError

MANIFEST = "sealed.json"
MANIFEST_FORMAT = "agentwal-archive-sealing"
DICT_PREFIX = "dict/"
KEY_PREFIX = "keys/"
KEY_FORMAT = "agentwal-archive-key"


class DecryptingRead(RangedRead):
    """A windowed read of an encrypted (not compressed) object: its ciphertext arrives through
    `inner` (`RangedRead`, a window at a time) and is decrypted into `buffer`, a private
    anonymous mapping of the plaintext's size, _DECRYPT_STEP bytes at a time as the reader waits
    for them; the ciphertext decrypted is released at once, and the plaintext as the reader
    releases it (its pages given back). So a restore of an encrypted archive holds about two
    windows of its snapshot, not the snapshot two or three times over.

    The plaintext handed out before the end is not authenticated: `wait(size)` checks the tag
    (SealDamagedError if it fails), and until then the reader must treat what it loaded as
    disposable. The snapshot loader does (layout.snapshot_pieces, whose last wait is for the
    whole object: the restore builds its store aside and moves it into place only once whole).
    A flipped ciphertext byte flips the same plaintext byte (GCM is a stream cipher), so a
    damaged entry or header may fail its own check first: refused either way, and the reader
    then calls `authenticate`, so that a changed ciphertext is reported as that. The header's fields are
    read before the tag is checked, to choose which snapshot a restore starts from: a forged
    one can make it pass over a snapshot (it then starts from an older one, its own checked) or
    choose one that is then refused when its tag fails, never load bytes that were changed."""

    def __init__(self, inner: RangedRead, opening: Opening, where: Callable[[], str]) -> None:
        self._inner = inner
        self._opening = opening
        self._where = where
        if inner.size < OVERHEAD:
            raise SealDamagedError(f"{where()}: an encrypted envelope of {inner.size} bytes (at least {OVERHEAD})",
                                   reason="sealed value damaged")
        size = inner.size - OVERHEAD
        super().__init__(mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS))
        self.size = size
        self._done = 0  # buffer[:_done] is decrypted
        self._authenticated = False

    def wait(self, upto: int) -> None:
        upto = min(upto, self.size)
        inner = self._inner
        while self._done < upto:
            step = min(self.size, self._done + _DECRYPT_STEP)  # a step at a time: no larger buffers
            inner.wait(HEADER_BYTES + step)
            cipher = memoryview(inner.buffer)[HEADER_BYTES + self._done:HEADER_BYTES + step]
            assert isinstance(self.buffer, mmap.mmap)
            self.buffer[self._done:step] = self._opening.update(cipher)
            cipher.release()
            self._done = step
            inner.release(HEADER_BYTES + step)
            self.held_max = inner.held_max
        if upto == self.size and not self._authenticated:
            inner.wait(inner.size)
            self._opening.finish(bytes(memoryview(inner.buffer)[inner.size - TAG_BYTES:inner.size]))
            self._authenticated = True

    def authenticate(self) -> None:
        """Decrypt on to the end, releasing as it goes, and check the tag (SealDamagedError if it
        fails). What a reader that found damage in plaintext handed out before the tag was
        checked calls to tell a changed ciphertext (the tag fails) from damage in what was sealed."""
        while not self._authenticated:
            self.wait(min(self.size, self._done + _DECRYPT_STEP))
            self.release(self._done)

    def release(self, upto: int) -> None:
        drop = min(upto, self._done) // mmap.PAGESIZE * mmap.PAGESIZE
        if drop > self._dropped:
            assert isinstance(self.buffer, mmap.mmap)
            self.buffer.madvise(mmap.MADV_DONTNEED, self._dropped, drop - self._dropped)
            self._dropped = drop

    def close(self) -> None:
        """Stop fetching (the buffer stays: the reader may hold views of it)."""
        self._inner.close()


_DECRYPT_STEP = 4 << 20  # a DecryptingRead decrypts this much at a time


class EnvelopedRead(RangedRead):
    """A windowed read of a plain envelope (codec 0x00, then the object): `inner`'s bytes past
    the codec byte, in place."""

    def __init__(self, inner: RangedRead) -> None:
        if inner.size < 1:
            raise SealDamagedError("an empty envelope (no codec byte)", reason="sealed value damaged")
        super().__init__(memoryview(inner.buffer)[1:])
        self._inner = inner
        self.size = inner.size - 1

    def wait(self, upto: int) -> None:
        self._inner.wait(upto + 1)
        self.held_max = self._inner.held_max

    def release(self, upto: int) -> None:
        self._inner.release(upto + 1)

    def close(self) -> None:
        self._inner.close()


def key_object(key_id: bytes) -> str:
    """The name of the marker of a key an encrypted archive holds objects under (FORMAT.md §18)."""
    return f"{KEY_PREFIX}{key_id.hex()}"


def archive_key_ids(objects: ObjectStore) -> list[str]:
    """The ids (hex) of every key the archive's writers have sealed objects under, from their
    markers: empty for an archive written before markers were (its keys are then learnt only
    from its objects' envelopes, one at a time)."""
    ids = []
    for name, _ in objects.list(KEY_PREFIX):
        kid = name[len(KEY_PREFIX):]
        if len(kid) == 2 * KEY_ID_BYTES and all(c in "0123456789abcdef" for c in kid):
            ids.append(kid)
    return ids


def check_keys(objects: ObjectStore, sealer: Sealer) -> None:
    """WrongKeyError if the archive names every key its objects are sealed under (its manifest
    says "key_markers") and none of the keys given (nor any a key provider knows) is one of
    them: a mistyped or wrong key, told from a missing older one (MissingKeyError, raised by
    the object that needs it). A provider that fails for an id (a KMS refusing a retired key)
    is asked for the next; if it knows none and failed for some, its first failure is raised."""
    keys = sealer.keys
    if keys is None:
        return
    listed = archive_key_ids(objects)
    if not listed:
        return
    known = {i.hex() for i in keys.ids}
    if known & set(listed):
        return
    failure: Exception | None = None
    answers: list[str] = []  # what the provider answered instead of a key asked for
    if keys.has_provider:
        for kid in listed:
            try:
                if keys.lookup(bytes.fromhex(kid)) is not None:
                    return
            except MissingKeyError as exc:  # another key than the one asked for: a wrong key
                answers.append(f" ({exc})")
            except Exception as exc:  # the provider's own error, wrapped (sealing._ask)
                failure = failure or exc
    if failure is not None:
        raise failure
    raise WrongKeyError(f"none of the keys given (key ids {', '.join(sorted(known))}) is one the archive "
                        f"{objects.url} is encrypted under ({', '.join(listed)}): a wrong key?{''.join(answers)}",
                        key_id=listed[-1], where=objects.url)


def dict_object(dict_id: int, key_id: bytes | None) -> str:
    """The name of a dictionary's object: with the id of the key it is sealed under, if any, so
    that a writer session under a new key (after rotation) ships it again under that key, and a
    restore given only the new key finds a copy it can open."""
    return f"{DICT_PREFIX}{dict_id:08x}{'.' + key_id.hex() if key_id is not None else ''}.zdict"


class SealedObjects(ObjectStore):
    """`inner` with every object but the manifest sealed on put and opened on get."""

    def __init__(self, inner: ObjectStore, sealer: Sealer) -> None:
        self.inner = inner
        self.sealer = sealer
        self.url = inner.url
        self.create_only_honored = inner.create_only_honored
        self._manifest_checked = False

    def check_create_only(self) -> bool:
        """Asked of the object store underneath (the probe needs no manifest, nor sealing)."""
        return self.inner.check_create_only()

    def _ensure_manifest(self) -> None:
        if self._manifest_checked:
            return
        # "key_markers": every writer of this archive, from its first, marks its keys (below);
        # readers of an archive begun before markers were cannot tell a wrong key by them.
        body = json.dumps({"format": MANIFEST_FORMAT, "version": 1, "encrypted": self.sealer.encrypting,
                           "key_markers": True}).encode()
        try:
            self.inner.put(MANIFEST, body, create_only=True)
        except ObjectExistsError:
            check_manifest(read_manifest(self.inner), self.sealer, self.inner.url)
        if self.sealer.encrypting and self.sealer.keys is not None:
            # Before any object under the current key: readers tell a wrong key from a
            # missing one by these markers (`check_keys`).
            marker = {"format": KEY_FORMAT, "version": 1, "key_id": self.sealer.keys.current_id.hex()}
            with contextlib.suppress(ObjectExistsError):
                self.inner.put(key_object(self.sealer.keys.current_id), json.dumps(marker).encode(),
                               create_only=True)
        for did in sorted(self.sealer.dictionaries):
            name = dict_object(did, self.sealer.keys.current_id if self.sealer.keys is not None else None)
            try:
                self.inner.put(name, self.sealer.seal_dictionary(did, CONTEXT_ARCHIVE + name.encode()),
                               create_only=True)
            except ObjectExistsError:
                # Shipped already, by an earlier session: the same dictionary, or (another store's
                # with the same zstd id) DictionaryConflictError, before anything compressed with
                # ours is shipped where readers would decode it with that one.
                self._load_dictionary(name)
        self._manifest_checked = True

    def load_dictionaries(self) -> None:
        """Give the sealer every dictionary the archive holds (before any object is read)."""
        for name, _ in self.inner.list(DICT_PREFIX):
            with contextlib.suppress(MissingKeyError):  # a copy under a key not given: another may open
                self._load_dictionary(name)

    def _load_dictionary(self, name: str) -> None:
        where = f"the archive object {name} of {self.inner.url}"
        envelope = self.inner.get(name)
        did = self.sealer.open_dictionary(envelope, CONTEXT_ARCHIVE + name.encode(), lambda: where)
        parsed = parse(envelope)
        key = parsed[1] if parsed is not None else None
        if name != dict_object(did, key):
            raise SealDamagedError(f"{where} holds another zstd dictionary ({did:08x}); it is not used",
                                   reason="sealed value damaged")

    def put(self, name: str, data: bytes | memoryview, *, create_only: bool = True) -> None:
        self._ensure_manifest()
        self.inner.put(name, self.sealer.seal(data, CONTEXT_ARCHIVE + name.encode()), create_only=create_only)

    def stream_sealer(self) -> Sealer | None:
        return self.sealer

    def put_envelope(self, name: str, data: bytes | memoryview, *, create_only: bool = True) -> None:
        self._ensure_manifest()
        self.inner.put(name, data, create_only=create_only)

    def remove_stale_temporaries(self, older_than_s: float) -> int:
        return self.inner.remove_stale_temporaries(older_than_s)

    def get(self, name: str) -> bytes:
        return self.sealer.open(self.inner.get(name), CONTEXT_ARCHIVE + name.encode(),
                                lambda: f"the archive object {name} of {self.inner.url}")

    def read_ranged(self, name: str, *, window: int | None = None) -> RangedRead:
        # An object is sealed whole (one AEAD tag over it). A windowed read (a restore's
        # snapshot) of one encrypted and not compressed is decrypted as its ranges arrive,
        # authenticated once the last is in (`DecryptingRead`); any other is opened whole.
        context = CONTEXT_ARCHIVE + name.encode()
        where: Callable[[], str] = lambda: f"the archive object {name} of {self.inner.url}"  # noqa: E731
        if window is not None:
            head = self.inner.get_head(name, HEADER_BYTES)
            if len(head) == HEADER_BYTES and head[0] == CODEC_ENCRYPTED:
                opening = self.sealer.opening(head, context, where)
                return DecryptingRead(self.inner.read_ranged(name, window=window), opening, where)
            if head[:1] == bytes((CODEC_PLAIN,)):
                if self.sealer.require_encrypted:  # refused before it is downloaded, not after
                    raise SealDamagedError(f"{where()} is not encrypted, in an encrypted archive (a value put in "
                                           "place of a ciphertext)", reason="sealed value damaged")
                return EnvelopedRead(self.inner.read_ranged(name, window=window))
        return RangedRead(self.sealer.open(self.inner.get_large(name), context, where))

    def stale_key_id(self, name: str) -> bytes | None:
        """The id of the key `name` is encrypted under if that is not the current key (one ranged
        GET of its envelope's header), else None: a writer's open asks it of the archive's
        newest snapshot, and ships a new one under the current key after a rotation, so a
        restore of the archive from then on needs only that key (wal/archive/store.py)."""
        keys = self.sealer.keys
        if keys is None:
            return None
        head = self.inner.get_head(name, 1 + KEY_ID_BYTES)
        if len(head) < 1 + KEY_ID_BYTES or not head[0] & CODEC_ENCRYPTED:
            return None
        kid = head[1:1 + KEY_ID_BYTES]
        return None if kid == keys.current_id else kid

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[tuple[str, int]]:
        return (item for item in self.inner.list(prefix, start_after) if item[0] != MANIFEST)

    def delete(self, name: str) -> None:
        self.inner.delete(name)

    def delete_many(self, names: Sequence[str]) -> None:
        self.inner.delete_many(names)

    def list_times(self, prefix: str) -> Iterator[tuple[str, float]]:
        return (item for item in self.inner.list_times(prefix) if item[0] != MANIFEST)


def read_manifest(objects: ObjectStore) -> dict[str, Any] | None:
    """The archive's sealing manifest, or None for an archive of a plain store."""
    try:
        raw = objects.get(MANIFEST)
    except ObjectMissingError:
        return None
    try:
        meta = json.loads(raw)
    except ValueError:
        meta = None
    # "encrypted" must be there and a bool: a damaged name or value read as "not encrypted"
    # would have an encrypted archive's key refused as one given to a plain archive.
    if (not isinstance(meta, dict) or meta.get("format") != MANIFEST_FORMAT or meta.get("version") != 1
            or not isinstance(meta.get("encrypted"), bool)):
        raise CorruptionError(f"the archive {objects.url} has an unreadable {MANIFEST}: {raw[:200]!r}",
                              path=MANIFEST, reason="bad archive manifest")
    return meta


def holds_nothing(objects: ObjectStore) -> bool:
    """No log object, merged object nor snapshot: a writer has shipped nothing yet. (A sealed
    writer's manifest is stored before its first object: listed first, an object found means
    its manifest, if it has one, is there to be read.)"""
    return not any(next(iter(objects.list(prefix)), None) is not None
                   for prefix in (layout.LOG_PREFIX, layout.MERGED_PREFIX, layout.SNAP_PREFIX))


def _check_not_sealed(objects: ObjectStore) -> None:
    """For an archive that holds objects and no manifest, read with sealing options: if its
    objects are sealed, the manifest was lost (CorruptionError saying so), rather than the
    archive being a plain store's (an ArgumentError sending the caller to open it without them).
    Its key markers or dictionaries say so, else its first object's first bytes."""
    for prefix in (KEY_PREFIX, DICT_PREFIX):
        marker = next(iter(objects.list(prefix)), None)
        if marker is not None:
            raise layout.missing_manifest(marker[0])
    for prefix in (layout.SNAP_PREFIX, layout.LOG_PREFIX, layout.MERGED_PREFIX):
        first = next(iter(objects.list(prefix)), None)
        if first is not None and layout.looks_sealed(objects.get_head(first[0], 9)):
            raise layout.missing_manifest(first[0])


def check_manifest(meta: dict[str, Any] | None, sealer: Sealer | None, url: str) -> None:
    if meta is None:
        if sealer is not None:
            raise ArgumentError(f"the archive {url} was written by a store without encryption or compression")
        return
    if meta.get("encrypted") and (sealer is None or not sealer.encrypting):
        raise MissingKeyError(f"the archive {url} is encrypted: pass encryption=KEY (or a key provider)", where=url)
    if sealer is not None and sealer.encrypting and not meta.get("encrypted"):
        raise ArgumentError(f"the archive {url} is not encrypted: it belongs to a store created without encryption")


def wrap(objects: ObjectStore, sealer: Sealer | None) -> ObjectStore:
    """The archive as a store sealed by `sealer` ships to it (None: a plain store's, as it is;
    an archive already opened sealed, by a follower being promoted: as it is)."""
    return objects if sealer is None or isinstance(objects, SealedObjects) else SealedObjects(objects, sealer)


def for_reading(objects: ObjectStore, options: dict[str, Any]) -> tuple[ObjectStore, dict[str, Any] | None]:
    """For restore, follow and verify: the archive opened with the caller's sealing `options`
    (encryption, compression, compression_dict, ...), and the STORE "sealed" object the store
    made from it must carry (None: a plain store)."""
    from wal.store.sealed import sealer_for  # noqa: PLC0415

    if isinstance(objects, SealedObjects):  # opened so already (a follower's restore)
        sealed = {"encrypted": objects.sealer.encrypting, "key_ids": []}
        if objects.sealer.keys is not None:
            sealed["key_ids"] = [i.hex() for i in objects.sealer.keys.ids]
        return objects, sealed
    meta = read_manifest(objects)
    manifest = meta is not None
    # compression="none" (wal.open's "off", passed on to the store made) asks for no sealing: a
    # plain archive takes it, as wal.open's plain store does (it was refused as "written by a
    # store without encryption or compression").
    if meta is None and any(v is not None for k, v in options.items() if (k, v) != ("compression", "none")):
        empty = holds_nothing(objects)
        # Read again after the listing: a writer stores its manifest before its first object, so
        # one shipped between the first read and the listing is found now.
        meta = None if empty else read_manifest(objects)
        manifest = meta is not None
        if meta is None and not empty:
            _check_not_sealed(objects)
            check_manifest(None, sealer_for({}, options, "the archive " + objects.url), objects.url)
        if meta is None:
            # Nothing shipped yet (a standby started before its writer): sealed as the caller
            # says. A follower is held to the writer's manifest once objects come
            # (`Follower._confirm_sealing`).
            meta = {"encrypted": options.get("encryption") is not None}
    if meta is None:
        return objects, None
    sealed = {"encrypted": bool(meta.get("encrypted")), "key_ids": []}
    sealer = sealer_for(sealed, options, "the archive " + objects.url)
    check_manifest(meta, sealer, objects.url)
    if manifest and sealed["encrypted"] and meta.get("key_markers") is True:
        check_keys(objects, sealer)
    sealer.never_encrypted = manifest and not sealed["encrypted"]  # not a standby's guess (see above)
    if sealer.keys is not None:
        # Every key given, the current one first: the archive's objects may be under any of
        # them, and so the restored store's values (listing the current one alone refused an
        # open of the restored store with the older key everything was under).
        sealed["key_ids"] = [i.hex() for i in sealer.keys.ids]
    sealed_objects = SealedObjects(objects, sealer)
    sealed_objects.load_dictionaries()
    # A follower reads on while its writer ships dictionaries it starts compressing with.
    sealer.learn_dictionaries = sealed_objects.load_dictionaries
    return sealed_objects, sealed


def with_dictionaries(objects: ObjectStore, sealing: dict[str, Any]) -> dict[str, Any]:
    """The `wal.open` options of a store made from the archive: the caller's `sealing`, plus the
    archive's dictionaries when the caller gave none, so that the store's first open stores them
    with it (``dicts/``) and it reads without them being given again."""
    if not isinstance(objects, SealedObjects) or sealing.get("compression_dict") is not None:
        return sealing
    dicts = list(objects.sealer.dictionaries.values())
    return {**sealing, "compression_dict": dicts} if dicts else sealing
