"""Sealed stores: `wal.open(path, encryption=..., compression="zstd")` (FORMAT.md §19).

Where the sealing happens, and why there. A value is sealed once, at the API, before it enters
the commit path: the log record carries the envelope, the overlay and LMDB hold the same bytes,
and a read opens them. The write path pays one zstd call and one AEAD call per value and nothing
else: the C commit path, group commit, the materializer, replay, checkpoints, snapshots shipped
to an archive and restores all move envelopes as opaque bytes, so each of them keeps its proofs
unchanged and none of them sees plaintext. Sealing in the log writer instead would encrypt each
value twice (the log record, then the state entry) and put plaintext in the overlay and the
apply queue.

A store is *sealed* from its creation (STORE says so, FORMAT.md §14) or never: then every value
of it is an envelope and no value needs a version test to tell which it is. An *encrypted*
store is encrypted from its creation too, and holds only encrypted envelopes (an unencrypted one
is refused as damage: no downgrade). Compression may be switched on and off at any open;
the envelope says which codec made each value. A store created plain is moved to a sealed one
by export and import (`agentwal export` / `agentwal import --encryption-key-file`).

The classes here are mixed in front of `wal.Store` (or the archive's `ArchivedStore`): they
override the public reads and writes only, sealing on the way in and opening on the way out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, overload

from wal._bindings import storecore
from wal._fs import makedirs_durable, replace_durably
from wal.crypto.sealing import (
    CONTEXT_DICT,
    CONTEXT_VALUE,
    DEFAULT_THRESHOLD,
    OVERHEAD,
    Keyring,
    KeySource,
    Sealer,
    key_id,
    parse,
)
from wal.errors import (
    ArgumentError,
    ArgumentTypeError,
    CorruptionError,
    EncryptionKeyError,
    MissingKeyError,
    RecordTooLargeError,
    SealDamagedError,
    WalError,
    WrongKeyError,
)
from wal.log.record import OP_PUT
from wal.store.snapshot import refuse_lone_key
from wal.store.state import DATA_FILE, SEALED_KEY, State

if TYPE_CHECKING:
    from wal.store.snapshot import Snapshot
    from wal.store.store import Store, Transaction

STORE_FIELD = "sealed"  # the STORE file's object for a sealed store: {"encrypted", "key_ids", "dict"?}
DICT_DIR = "dicts"  # the trained zstd dictionaries a sealed store's values were compressed with


def dict_file(root: str, dict_id: int) -> str:
    return os.path.join(root, DICT_DIR, f"{dict_id:08x}.zdict")


def dict_context(dict_id: int) -> bytes:
    return CONTEXT_DICT + dict_id.to_bytes(4, "big")


def dictionary_files(root: str) -> Iterator[tuple[int, str]]:
    """(zstd id, path) of every dictionary file in `root`/dicts, by id."""
    folder = os.path.join(root, DICT_DIR)
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return
    for name in names:
        if not name.endswith(".zdict") or len(name) != 14:
            continue  # a temporary file of a write a crash interrupted
        try:
            did = int(name[:8], 16)
        except ValueError:
            continue
        yield did, os.path.join(folder, name)


def load_dictionaries(root: str, sealer: Sealer, compressing: int | None) -> list[int]:
    """Give `sealer` every dictionary stored in `root`/dicts (each file a sealed envelope of one,
    named by its zstd id), and compress with `compressing` (STORE's "dict") unless the caller
    gave one. Stored dictionaries are why a compressed store opens without compression_dict=.
    Returns the ids of those sealed under another key than the current one (a key rotation)."""
    found: set[int] = set()
    stale: list[int] = []
    for did, path in dictionary_files(root):
        with open(path, "rb") as f:
            envelope = f.read()
        if sealer.open_dictionary(envelope, dict_context(did), _naming(f"the dictionary file {path}")) != did:
            raise SealDamagedError(f"the dictionary file {path} holds another zstd dictionary than {did:08x}; it is "
                                   "not used", reason="sealed value damaged")
        if did == compressing and sealer.compression is not None:
            sealer.add_dictionary(sealer.dictionaries[did], compress_with=True)
        found.add(did)
        header = parse(envelope)
        if sealer.keys is not None and header is not None and header[1] != sealer.keys.current_id:
            stale.append(did)
    if compressing is not None and compressing not in found:
        path = dict_file(root, compressing)
        raise CorruptionError(f"{path} is missing: the store's STORE file names it as the dictionary its values are "
                              "compressed with (it is written before STORE names it)", path=path,
                              reason="missing dictionary")
    return stale


def store_dictionaries(root: str, sealer: Sealer, dict_ids: Sequence[int]) -> None:
    """Write each dictionary `dict_ids` names that `root`/dicts does not hold yet, sealed (and so
    encrypted in an encrypted store: a dictionary is made of fragments of values), each durable
    -- written to a temporary file, fsynced, renamed, the folder fsynced -- before anything
    compressed with it can be written."""
    for did in dict_ids:
        if not os.path.exists(dict_file(root, did)):
            write_dictionary(root, sealer, did)


def write_dictionary(root: str, sealer: Sealer, dict_id: int) -> None:
    """Write (or replace, atomically: a rename over it) the stored dictionary `dict_id`, sealed
    by `sealer` now, durably."""
    makedirs_durable(os.path.join(root, DICT_DIR))
    replace_durably(dict_file(root, dict_id), sealer.seal_dictionary(dict_id, dict_context(dict_id)))


class SealingPlan:
    """What one open of a sealed store needs: its Sealer, and the STORE fields to write under
    the log's lock (`before_open`). Made by `plan` before anything is opened."""

    def __init__(self, root: str, sealer: Sealer, new: bool, readonly: bool, *, given: Sequence[int] = (),
                 recovered: dict[str, Any] | None = None, stale: Sequence[int] = (),
                 compression_off: bool = False) -> None:
        self.root = root
        self.compression_off = compression_off  # compression="none": STORE records that it is off
        self.sealer = sealer
        self.new = new
        self.readonly = readonly
        self.given = list(given)  # ids of the dictionaries the caller gave (compression_dict=)
        self.stale = list(stale)  # stored dictionaries sealed under an older key (`load_dictionaries`)
        # A store whose STORE file was lost: its sealing as its state's mark records it
        # (`recovered_sealing`), which the STORE written again starts from.
        self.recovered = recovered

    def before_open(self, meta: dict[str, Any]) -> dict[str, Any]:
        """Called with the STORE file's JSON ({} for a store being created) under the log's lock,
        before anything is written; returns the JSON it must hold. A store created by this open becomes
        sealed; an encrypted one lists the current key's id before anything is written under it."""
        sealed = meta.get(STORE_FIELD)
        keys = self.sealer.keys
        if not isinstance(sealed, dict) and self.recovered is not None and not meta:
            sealed = self.recovered
        if not isinstance(sealed, dict):
            if not self.new:
                raise ArgumentError(_NOT_SEALED.format(root=self.root))
            sealed = {"encrypted": keys is not None, "key_ids": []}
        ids = list(sealed.get("key_ids") or [])
        if keys is not None and keys.current_id.hex() not in ids:
            ids.append(keys.current_id.hex())
        fields: dict[str, Any] = {"encrypted": bool(sealed.get("encrypted")), "key_ids": ids}
        # The dictionaries given are stored before STORE names one and before any value is
        # compressed with them; STORE names the one new values are compressed with.
        store_dictionaries(self.root, self.sealer, self.given)
        compressing = self.sealer.compressing_dictionary if self.given else sealed.get("dict")
        if compressing is not None:
            fields["dict"] = f"{compressing:08x}" if isinstance(compressing, int) else compressing
        if self.sealer.compression is not None:  # what a later open compresses with unless told otherwise
            fields["compression"] = {"codec": self.sealer.compression, "threshold": self.sealer.threshold}
        elif self.compression_off:  # said, and kept: `agentwal rekey` must not turn it on again
            fields["compression"] = {"codec": "none"}
        elif isinstance(sealed.get("compression"), dict):  # {"codec": "none"} (or a codec unknown here): kept
            fields["compression"] = sealed["compression"]
        return {**meta, STORE_FIELD: fields}

    def after_store_written(self) -> None:
        """Once STORE lists the current key (`before_open`'s fields written): the stored
        dictionaries sealed under an older key, sealed again under the current one while the
        older one is given. Every open reads every stored dictionary, so one left under a retired
        key kept the store from opening once that key was dropped, though every value written
        under the new one read without it. (Before STORE lists the key, a crash would leave a
        dictionary under a key the store does not name.)"""
        for did in self.stale:
            write_dictionary(self.root, self.sealer, did)
        self.stale = []

    def store_class(self, base: type[Store]) -> type[Store]:
        return _sealed_class(base)

    def attach(self, store: Store) -> None:
        store._sealer = self.sealer  # type: ignore[attr-defined]


_NOT_SEALED = ("the store at {root} was created without encryption or compression, so its values are "
               "stored as they are: it cannot be opened with encryption= or compression=. Copy it into a new "
               "store that has them: `agentwal export {root} -o all.jsonl`, then `agentwal import NEW all.jsonl "
               "--create` with --key-file KEY (encryption) and/or --compression zstd")


def store_lost(root: str) -> CorruptionError:
    """The error for a store whose state records sealed values but whose STORE names no sealing."""
    return CorruptionError(
        f"the store at {root} holds sealed (encrypted or compressed) values, as its state records, but its "
        f"STORE file names no sealing: STORE was lost or replaced. Put back the STORE file from a copy of the "
        "store, or delete it and open the store with its options (encryption=..., compression=...), which "
        "writes it again", path=os.path.join(root, "STORE"), reason="STORE damaged")


def read_meta(root: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(root, "STORE"), "rb") as f:
            meta = json.loads(f.read(1 << 16))
    except (OSError, ValueError, RecursionError):
        return None  # missing: a new store; unreadable: the store's own check says so
    return meta if isinstance(meta, dict) else None


def check_compression_options(root: str, compression: str | None, compression_threshold: int | None,
                              compression_dict: object) -> None:
    """`wal.open`'s compression_threshold= and compression_dict= mean nothing without
    compression="zstd" for a store that never compressed (new or plain): a dictionary alone made
    a "sealed" store that compresses nothing, and a threshold alone was dropped without a word.
    (A store that compressed, turned off since, may be given the dictionary its older values
    need; a restore gives the store it makes the archive's, opening it with open_local.)"""
    if compression is not None or (compression_dict is None and compression_threshold is None):
        return
    meta = read_meta(root)
    sealed = meta.get(STORE_FIELD) if meta is not None else None
    if isinstance(sealed, dict) and isinstance(sealed.get("compression"), dict):
        return
    named = " and ".join(name for name, value in (("compression_dict", compression_dict),
                                                  ("compression_threshold", compression_threshold))
                         if value is not None)
    raise ArgumentError(f"{named} given without compression=\"zstd\": they set how a store compresses, and the "
                        f"store at {root} does not; pass compression=\"zstd\" with them, or leave them out")


def plan(root: str, *, readonly: bool, encryption: KeySource | None, compression: str | None,
         compression_threshold: int | None, compression_dict: bytes | Sequence[bytes] | None) -> SealingPlan | None:
    """The sealing of an open of the store at `root`, or None for a plain store opened plainly.

    Refuses, before anything is opened: a sealed option on a store created plain
    (ArgumentError), an encrypted store without a key (MissingKeyError), and keys none of which
    the store's data is encrypted under (WrongKeyError)."""
    # "none": new values stored uncompressed in a store an earlier open compressed (STORE then
    # no longer says to compress); otherwise an open that says nothing compresses as recorded.
    turned_off = compression == "none"
    if turned_off:
        compression = None
    meta = read_meta(root)
    sealed = meta.get(STORE_FIELD) if meta is not None else None
    wanted = encryption is not None or compression is not None or compression_dict is not None
    recovered = None
    if isinstance(sealed, dict):
        check_sealed_fields(sealed, os.path.join(root, "STORE"))
    else:
        if not wanted:
            return None
        if meta is not None:
            if read_state_mark(root) not in (None, UNREADABLE):
                raise store_lost(root)  # its state says sealed: STORE lost the field (damage)
            raise ArgumentError(_NOT_SEALED.format(root=root))
        if readonly:
            raise ArgumentError(f"no agentwal store at {root} to open read-only")
        # No STORE file: a new store, or one whose STORE was lost. Then the state's mark says how
        # it is sealed, and this open is held to it as to a STORE that says so: no key for an
        # encrypted store, or keys none of its data is under, are refused before anything is
        # written (a compressed-only or wrong-key open made it a new store: plaintext, or values
        # under a key it was never encrypted with, beside its envelopes).
        recovered = recovered_sealing(root, keyed=encryption is not None)
        sealed = recovered or {}
    recorded = sealed.get("compression")
    if compression is None and not turned_off and isinstance(recorded, dict) and recorded.get("codec") == "zstd":
        # Compressed by an earlier open: an open that does not say so compresses as it did
        # (a reopen without compression= wrote every new value uncompressed).
        compression = "zstd"
        if compression_threshold is None and isinstance(recorded.get("threshold"), int):
            compression_threshold = recorded["threshold"]
    options = {"encryption": encryption, "compression": compression, "compression_threshold": compression_threshold,
               "compression_dict": compression_dict}
    sealer = sealer_for(sealed, options, f"the store at {root}", where=root)
    keys = sealer.keys
    encrypted = bool(sealed.get("encrypted"))
    sealer.never_encrypted = meta is not None and not encrypted  # STORE says so (encrypted from creation or never)
    stored = [i for i in sealed.get("key_ids") or [] if isinstance(i, str)]
    if (meta is not None or recovered is not None) and keys is not None and not encrypted:
        raise ArgumentError(f"the store at {root} was created without encryption: its values are not encrypted, and "
                            "encryption cannot be turned on for it. " + _NOT_SEALED.format(root=root).split(". ", 1)[1])
    if keys is not None and stored:
        known = {i.hex() for i in keys.ids}
        answers: list[str] = []  # what a provider answered instead of a key asked for
        if not known & set(stored) and keys.has_provider:  # it may know older ids than the current one
            for i in stored:
                try:
                    if keys.lookup(bytes.fromhex(i)) is not None:
                        known.add(i)
                except MissingKeyError as exc:  # another key than the one asked for: a wrong key
                    answers.append(f" ({exc})")
                except EncryptionKeyError as exc:  # the provider failed, or gave no key: name the store
                    raise type(exc)(f"the store at {root}: {exc}", key_id=exc.key_id, where=root) from exc
        if not known & set(stored) and _sealed_under_any(root, keys.ids):
            # Values under a key STORE does not list: a store restored, or followed, with a newer
            # key than most of its values are under (a restore lists the keys it was given). The
            # key is then listed, by a writable open, as any new key is.
            known |= set(stored)
        if not known & set(stored):
            raise WrongKeyError(f"none of the keys given (key ids {', '.join(i.hex() for i in keys.ids)}) is one the "
                                f"store at {root} is encrypted under ({', '.join(stored)}): a wrong key?"
                                f"{''.join(answers)}", key_id=stored[-1], where=root)
    given = list(sealer.dictionaries)
    stale = load_dictionaries(root, sealer, None if given else _named_dict(root, sealed))
    # One stored later by the store's writer (a read-only open beside it, a follower's store
    # given one from its archive) is read from dicts/ when a value first names it.
    sealer.learn_dictionaries = lambda: load_dictionaries(root, sealer, None)
    return SealingPlan(root, sealer, new=meta is None, readonly=readonly, given=given, recovered=recovered,
                       stale=stale, compression_off=turned_off)


def check_sealed_fields(sealed: dict[str, Any], path: str) -> None:
    """STORE's "sealed" object holds together: "encrypted" a bool, "key_ids" the ids of the keys
    an encrypted store's values are under (at least the one it was created with) and none for a
    store that is not encrypted. STORE is plain JSON: a changed byte in a name ("encrypted"
    read as missing) made an encrypted store open without a key and take values in the clear."""
    encrypted, ids = sealed.get("encrypted"), sealed.get("key_ids")
    if not isinstance(encrypted, bool) or not isinstance(ids, list) or bool(ids) != encrypted:
        raise CorruptionError(f"{path} is damaged: its sealing ({json.dumps(sealed)[:200]}) does not hold together "
                              "(an encrypted store lists its key ids, one that is not lists none). Put back the "
                              "STORE file from a copy of the store, or delete it and open the store with its key: "
                              "its state records how it is sealed", path=path, reason="bad store file")


def mark_for(sealed: dict[str, Any]) -> bytes:
    """The state's sealed mark (FORMAT.md §16): how STORE says the store is sealed."""
    return json.dumps({"encrypted": bool(sealed.get("encrypted")), "key_ids": list(sealed.get("key_ids") or [])},
                      sort_keys=True).encode()


UNREADABLE = b"?"  # `read_state_mark`: the state is there, its mark could not be read now


def record_sealing(state: State, sealed: dict[str, Any]) -> None:
    """Set `state`'s record of its sealing (`SEALED_KEY`) to STORE's "sealed" object `sealed`,
    durably (a checkpoint): what an open with STORE lost is held to. The caller keeps every
    other write of the state out."""
    state.meta_put(SEALED_KEY, mark_for(sealed))
    state.checkpoint()


def read_state_mark(root: str) -> bytes | None:
    """The sealed mark of the state of the store at `root` (not open in this process), read
    before anything is opened for writing: the mark, None (no state yet, or a state not marked
    sealed) or UNREADABLE (a state a read-only open refuses now: one a crash left for a writable
    open to repair, or one open in this process already). The caller decides what UNREADABLE
    allows; it may be a sealed store's."""
    path = os.path.join(root, "state")
    if not os.path.exists(os.path.join(path, DATA_FILE)):
        return None
    try:
        state = State(path, readonly=True)
    except (WalError, OSError):
        return UNREADABLE
    try:
        return state.meta_get(SEALED_KEY)
    except (WalError, OSError):
        return UNREADABLE
    finally:
        state.close()


# Entries `_sealed_under_any` looks at, at most: an open refused as under a wrong key reads no
# more than this many of the state's entries first.
_KEY_SAMPLE_ENTRIES = 10_000


def _sealed_under_any(root: str, ids: Sequence[bytes]) -> bool:
    """Whether one of the first _KEY_SAMPLE_ENTRIES values of the store's state is sealed under
    one of the key `ids` (its envelope's key id, in the clear: FORMAT.md §19). Asked only before
    an open is refused as WrongKeyError; False where the state cannot be read now."""
    path = os.path.join(root, "state")
    if not os.path.exists(os.path.join(path, DATA_FILE)):
        return False
    wanted = set(ids)
    try:
        # A reader like any (its slot in lock.mdb, LMDB's reader table): never the writer lock,
        # which a writer starting meanwhile would find taken.
        state = State(path, readonly=True)
    except (WalError, OSError):
        return False
    try:
        after: bytes | None = None
        for _ in range(0, _KEY_SAMPLE_ENTRIES, 1000):
            chunk = state.scan_chunk(b"", after, 1000)
            if any((header := parse(env)) is not None and header[1] in wanted for _, _, env in chunk):
                return True
            if len(chunk) < 1000:
                return False
            after = chunk[-1][0]
        return False
    except (WalError, OSError):
        return False
    finally:
        state.close()


def parse_mark(raw: bytes | None) -> dict[str, Any] | None:
    """A mark's {"encrypted", "key_ids"}, or None where it says no more than "sealed" (`1`,
    written by an earlier version) or is not one."""
    if raw is None or raw == b"1":
        return None
    try:
        mark = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(mark, dict) or not isinstance(mark.get("encrypted"), bool) \
            or not isinstance(mark.get("key_ids"), list):
        return None
    return {"encrypted": mark["encrypted"], "key_ids": [i for i in mark["key_ids"] if isinstance(i, str)]}


def recovered_sealing(root: str, *, keyed: bool) -> dict[str, Any] | None:
    """For an open given sealing options where no STORE file is: None for a new store (no state)
    or a plain one (a state not marked sealed); else the sealing its state's mark records, which
    the open is held to as to a STORE saying it. Where the mark cannot tell (a state that cannot
    be read now, a mark that says only "sealed"), an open given a key (`keyed`) is taken as one of
    an encrypted store, and one given none is refused, nothing written: the store may be
    encrypted."""
    raw = read_state_mark(root)
    if raw is None:
        return None
    mark = parse_mark(raw) if raw != UNREADABLE else None
    if mark is not None:
        return mark
    # A state that cannot be read now (a read-only open waits for a writable open's repair), or
    # a mark that says only "sealed" (an earlier version's): encrypted or not, it does not say.
    # With a key, taken as encrypted (a wrong key then writes nothing in the clear, each value's
    # own key id tells at its read, and the writable open checks STORE against the state's mark
    # once it can read it); without one, refused: it may be encrypted.
    if not keyed:
        path = os.path.join(root, "STORE")
        why = ("the store's state cannot be read now (a read-only open of it is refused: it waits for a writable "
               "open's repair, or it is open in this process), so whether it is sealed is not known"
               if raw == UNREADABLE else
               "the store's state records only that it is sealed (a record made by an earlier version), not "
               "whether it is encrypted")
        raise CorruptionError(f"{path} is missing, and {why}: open it with its key (encryption=...), or, if it "
                              "was not encrypted, put back the STORE file from a copy of the store", path=path,
                              reason="STORE damaged")
    return {"encrypted": True, "key_ids": []}


def _named_dict(root: str, sealed: dict[str, Any]) -> int | None:
    """The id of the dictionary STORE says new values are compressed with, or None."""
    named = sealed.get("dict")
    if named is None:
        return None
    if not isinstance(named, str) or len(named) != 8 or not all(c in "0123456789abcdef" for c in named):
        path = os.path.join(root, "STORE")
        raise CorruptionError(f"{path} names the dictionary {named!r}, which is not 8 hex digits",
                              path=path, reason="bad store file")
    return int(named, 16)


def _naming(text: str) -> Callable[[], str]:
    return lambda: text


def sealer_for(sealed: dict[str, Any], options: dict[str, Any], what: str, where: str | None = None) -> Sealer:
    """The Sealer of a handle on something sealed as `sealed` says (STORE's "sealed" object, or an
    archive's manifest), with the caller's `options` (encryption, compression,
    compression_threshold, compression_dict); MissingKeyError if it is encrypted and no key is given."""
    unknown = set(options) - {"encryption", "compression", "compression_threshold", "compression_dict"}
    if unknown:
        raise ArgumentError(f"unknown option(s): {', '.join(sorted(unknown))}")
    encryption = options.get("encryption")
    try:
        keys = Keyring(encryption) if encryption is not None else None
    except EncryptionKeyError as exc:
        if exc.where is not None:
            raise
        raise type(exc)(f"{what}: {exc}", key_id=exc.key_id, where=where or what) from exc.__cause__
    encrypted = bool(sealed.get("encrypted"))
    if encrypted and keys is None:
        stored = [i for i in sealed.get("key_ids") or [] if isinstance(i, str)]
        raise MissingKeyError(f"{what} is encrypted{' (key ids ' + ', '.join(stored) + ')' if stored else ''}: open "
                              "it with encryption=KEY (or a key provider; the agentwal command: --key-file)",
                              key_id=stored[0] if stored else None,
                              where=where or what)
    threshold = options.get("compression_threshold")
    compression = options.get("compression")
    if compression == "none":  # wal.open's "off" (`plan`), given to a restore or a follower to pass on
        compression = None
    return Sealer(keys, compression, threshold=DEFAULT_THRESHOLD if threshold is None else threshold,
                  dictionaries=_given_dictionaries(options.get("compression_dict")), require_encrypted=encrypted)


def _given_dictionaries(zdict: object) -> list[bytes]:
    """compression_dict=: None, a trained dictionary's bytes, or a sequence of them."""
    if zdict is None:
        return []
    if isinstance(zdict, bytes | bytearray | memoryview):
        return [bytes(zdict)]
    items = list(zdict) if isinstance(zdict, list | tuple) else None
    if items is None or not all(isinstance(d, bytes | bytearray | memoryview) for d in items):
        raise ArgumentTypeError("compression_dict must be a trained zstd dictionary's bytes (or a list of them), "
                                f"got {type(zdict).__name__}")
    return [bytes(d) for d in items]


# ---- the store's public reads and writes, sealed --------------------------------------------------


def _ctx(key: bytes) -> bytes:
    return CONTEXT_VALUE + key


class _Where:
    """Names a value for errors, lazily (built only when one is raised)."""

    __slots__ = ("key", "path")

    def __init__(self, path: str, key: bytes) -> None:
        self.path = path
        self.key = key

    def __call__(self) -> str:
        return f"the value of key {self.key!r} in the store at {self.path}"


def _sealed_class(base: type[Store]) -> type[Store]:
    cached = _classes.get(base)
    if cached is not None:
        return cached
    from wal.store import store as plain  # noqa: PLC0415 -- wal.store.store imports this module

    _key, _value = plain._key, plain._value  # the store's own argument checks
    op_put = OP_PUT
    # A value this long seals into an envelope within the store's value limit, whatever the
    # sealing: the longest envelope is an encrypted one's (`_sealable` checks the longer ones).
    fits = plain.MAX_VALUE_BYTES - OVERHEAD

    def _sealable(sealer: Sealer, value: Any) -> bytes:
        """`value` checked as the plain store checks it (`_value`), and against the value limit of
        this store: the plain limit less what its envelopes add, so that the error names the
        caller's value and the limit it must keep, not the envelope the store would have made."""
        data = _value(value)
        limit = plain.MAX_VALUE_BYTES - sealer.envelope_overhead
        if len(data) > limit:
            kind = "an encrypted" if sealer.encrypting else "a compressed"
            raise RecordTooLargeError(f"value of {len(data)} bytes is over the {limit}-byte value limit of {kind} "
                                      f"store (the {plain.MAX_VALUE_BYTES}-byte limit less the "
                                      f"{sealer.envelope_overhead} bytes its envelope may add)")
        return data
    base_put = base.put
    # The C commit is called straight only over the plain Store, whose put is that call and
    # nothing else; a subclass's put (the archive's admits each commit against its RPO first)
    # is always called.
    direct = base_put is plain.Store.put

    class SealedTransaction(plain.Transaction):
        _store: Any

        def put(self, key: bytes | str, value: bytes, *, if_version: int | None = None) -> None:
            k = _key(key)
            super().put(k, self._store._sealer.seal(_sealable(self._store._sealer, value), _ctx(k)),
                        if_version=if_version)

        @overload
        def get(self, key: bytes | str, default: None = None) -> bytes | None: ...
        @overload
        def get(self, key: bytes | str, default: bytes) -> bytes: ...

        def get(self, key: bytes | str, default: bytes | None = None) -> bytes | None:
            k = _key(key)
            v = super().get(k, None)
            return default if v is None else self._store._unseal(k, v)

    class Sealed(base):  # type: ignore[valid-type, misc]
        _sealer: Sealer

        def _unseal(self, key: bytes, envelope: bytes) -> bytes:
            return self._sealer.open(envelope, _ctx(key), _Where(self._path, key))

        def put(self, key: bytes | str, value: bytes, *, durability: str | None = None) -> int:
            # Over the plain Store, store.put(key, value) is one C call that seals and commits
            # (the FastCommit installed below); this frame runs for the rest: a durability=,
            # keyword arguments, argument types the C call does not take as they are, values the
            # Sealer compresses, a Python sealing session (no libcrypto), and over the archive's
            # store every put. It seals in Python and hands the envelope to that same C commit
            # (Core.commit, as Store.put makes it): a bytes key is taken as it is, any other
            # through _key, which encodes a str and refuses one it cannot (the C commit and the
            # Python path below still refuse an empty or oversized key), and no super() or bound
            # method is made.
            k = key if type(key) is bytes else _key(key)
            v = self._sealer.seal(value if type(value) is bytes and len(value) <= fits else
                                  _sealable(self._sealer, value), CONTEXT_VALUE + k)
            if durability is None:
                if direct:
                    lsn: int = self._commit_fast(op_put, k, v, False)
                    if lsn > 0:
                        return lsn
                    if lsn < 0:
                        self._fast_wait_failed()
                return int(base_put(self, k, v))  # the base's put: its C path, or the Python path
            return int(base_put(self, k, v, durability=durability))

        async def aput(self, key: bytes | str, value: bytes, *, durability: str | None = None) -> int:
            k = _key(key)
            return int(await super().aput(k, self._sealer.seal(_sealable(self._sealer, value), _ctx(k)),
                                          durability=durability))

        @overload
        def get(self, key: bytes | str, default: None = None) -> bytes | None: ...
        @overload
        def get(self, key: bytes | str, default: bytes) -> bytes: ...

        def get(self, key: bytes | str, default: bytes | None = None) -> bytes | None:
            k = _key(key)
            v = super().get(k)
            return default if v is None else self._unseal(k, v)

        def get_many(self, keys: Sequence[bytes | str], default: bytes | None = None) -> list[bytes | None]:
            refuse_lone_key(keys)
            ks = [_key(k) for k in keys]
            return [default if v is None else self._unseal(k, v) for k, v in zip(ks, super().get_many(ks), strict=True)]

        def scan(self, prefix: bytes | str = b"") -> Iterator[tuple[bytes, bytes]]:
            return _opened_scan(super().scan(prefix), self._unseal)

        def snapshot(self) -> Snapshot:
            return _SealedSnapshot(super().snapshot(), self._unseal)  # type: ignore[return-value]

        def transaction(self, durability: str | None = None, idempotency_key: bytes | str | None = None, *,
                        serializable: bool = False) -> Transaction:
            tx: Transaction = super().transaction(durability, idempotency_key, serializable=serializable)
            tx.__class__ = SealedTransaction  # the same object, its put and get sealed
            return tx

        def _update_step(self, key: bytes, fn: Callable[[bytes | None], bytes | None]) -> Any:
            written: list[bytes | None] = [None]

            def opened(envelope: bytes | None) -> bytes | None:
                new = written[0] = fn(None if envelope is None else self._unseal(key, envelope))
                return None if new is None else self._sealer.seal(_sealable(self._sealer, new), _ctx(key))

            txn, checks, _ = super()._update_step(key, opened)
            return txn, checks, written[0]  # `update` returns the caller's value, not its envelope

        def stats(self) -> dict[str, Any]:
            out: dict[str, Any] = super().stats()
            out["encryption"] = self._sealer.encrypting
            out["compression"] = self._sealer.compression
            return out

    if direct:
        # Called as store.put(key, value), the sealed put is one C call: the value sealed in C
        # through the Sealer's session (when it is a C one) and committed as Store.put commits;
        # every other case runs the put above (native/storecore.c, "The sealed put").
        Sealed.put = storecore.FastCommit(Sealed.put, op_put, plain.Store.put, CONTEXT_VALUE)  # type: ignore[method-assign]
    Sealed.__name__ = Sealed.__qualname__ = "Sealed" + base.__name__
    _classes[base] = Sealed
    return Sealed


_classes: dict[type, type] = {}


def _opened_scan(inner: Iterator[tuple[bytes, bytes]],
                 open_: Callable[[bytes, bytes], bytes]) -> Iterator[tuple[bytes, bytes]]:
    try:
        for k, v in inner:
            yield k, open_(k, v)
    finally:
        close = getattr(inner, "close", None)
        if close is not None:
            close()  # ends the scan's LMDB read transaction with ours


class _SealedSnapshot:
    """`Store.snapshot()` of a sealed store: the same snapshot, its values opened."""

    def __init__(self, snap: Snapshot, open_: Callable[[bytes, bytes], bytes]) -> None:
        self._snap = snap
        self._open_value = open_
        self.lsn = snap.lsn

    @overload
    def get(self, key: bytes | str, default: None = None) -> bytes | None: ...
    @overload
    def get(self, key: bytes | str, default: bytes) -> bytes: ...

    def get(self, key: bytes | str, default: bytes | None = None) -> bytes | None:
        k = self._snap._key(key)
        v = self._snap.get(k)
        return default if v is None else self._open_value(k, v)

    def version(self, key: bytes | str) -> int | None:
        return self._snap.version(key)

    def get_many(self, keys: Sequence[bytes | str], default: bytes | None = None) -> list[bytes | None]:
        refuse_lone_key(keys)
        return [self.get(k, default) for k in keys]

    def scan(self, prefix: bytes | str = b"") -> Iterator[tuple[bytes, bytes]]:
        return _opened_scan(self._snap.scan(prefix), self._open_value)

    def close(self) -> None:
        self._snap.close()

    def __enter__(self) -> _SealedSnapshot:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._snap).replace("<wal.Snapshot", "<wal.Snapshot (sealed)")


__all__ = ["SealingPlan", "key_id", "plan", "read_meta"]
