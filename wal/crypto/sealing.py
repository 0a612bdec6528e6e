"""Sealed values: per-value zstd compression, then AES-256-GCM, in one self-describing envelope
(FORMAT.md §19, "Sealed values").

A *sealed store* keeps every value as an envelope; so do the blobs, archive objects and exports
of an encrypted store (each with its own context, below). The envelope says which codec made it,
so one store holds plain, compressed, encrypted and compressed-then-encrypted values side by
side, and a change of options (compression on, a new key) needs no rewrite::

    envelope  := codec:u8 body
    codec     := 0x00 plain | 0x01 zstd | 0x80 encrypted | 0x81 zstd, then encrypted
    body      := bytes                                   (codec & 0x80 == 0: the value, or its zstd frame)
               | key_id:8 session:16 counter:u64 sealed  (codec & 0x80: AES-256-GCM, sealed = ciphertext || tag:16)

Compression comes first (ciphertext does not compress), and only where it pays: values of at
least `threshold` bytes whose zstd frame is shorter than they are. A frame made with a trained
dictionary names it in its own header (zstd's dictionary id); the dictionaries a handle may
need are given to it (``compression_dict=``).

What encryption covers and what it does not. Values are encrypted; keys are not: LMDB keeps
keys in order for scans and prefix reads, so they stay plain in the log records and the state
(as do LSNs, record headers, versions and idempotency keys). Put nothing secret in a key. Blob
files and archive objects are sealed whole (their names are digests and LSNs). Compression
before encryption lets a value's length depend on its content; a caller that mixes secrets with
attacker-chosen text in one value and lets the attacker watch its size should turn compression
off for that store.

Keys. The caller's 32-byte *master keys* never encrypt anything themselves. A key's id is the
first 8 bytes of HMAC-SHA256(key, "agentwal key id v1"): stored beside every ciphertext, it says
which key to use and proves nothing about the key to someone without it. `Keyring` holds the
current key (new writes) and older ones (reads), or asks a provider callable.

Nonces: why no (key, nonce) pair is ever used twice
----------------------------------------------------
AES-GCM loses both confidentiality and integrity when one key encrypts two messages under one
nonce. The hazards here are a log tail cut after a crash and written again at the same LSNs, a
store restored from an archive and written on, a follower promoted, a process forked, and two
processes (or two stores) sharing a master key. The design gives a nonce nothing to do with any
of them -- no nonce is derived from an LSN, a position or anything read from disk:

1. Every *sealing session* draws a fresh 16-byte id S from ``os.urandom`` and encrypts under its
   own key K_S = HKDF-SHA256(master key, salt=S, info="agentwal seal v1"). A session lives in
   one process's memory and dies with it: each `Sealer` starts one (every open of a store, every
   export, every archive upload, every rekey), each streamed seal is one of its own (`sealing`:
   an archive snapshot encrypted as it is written, its one envelope at counter 0, traced as
   every session's counters are), and a forked child starts new ones for all of its
   Sealers before it can seal anything (``os.register_at_fork``). A C session (below) also
   refuses to seal in any process but the one that made it (native/sealcore.c keeps the
   process's epoch in a page the kernel zeroes in every child, ``MADV_WIPEONFORK``), so not
   even a child forked past Python's fork hooks and libc's (``_Fork()``, a raw ``clone``)
   continues one.
2. Within a session the nonce is a 64-bit counter taken atomically before each encryption: one
   counter per session, whichever path seals (below). It only goes up, is never reset, saved or
   read back, and a session moves to a new S long before it could wrap (`SESSION_LIMIT`).
3. So two encryptions share (K_S, nonce) only if they are in one session -- impossible, the
   counter differs -- or two sessions drew the same 128-bit S under the same master key: for n
   sessions at most n^2 / 2^129 (2^-65 after four billion sessions), the standard bound for
   random 128-bit salts, and far below AES-GCM's own random-nonce limit.

Torn tails, restores and promotions re-encrypt nothing with an old session: whatever writes
after them is a new process or a new open, hence a new session. The tests record every
(key id, session, counter) that any process uses across kill loops, power cuts, restores and
promotions (``AGENTWAL_TRACE_NONCES``) and scan every file for sealed values, and find no
pair used for two different ciphertexts.

Where the encryption runs. A session is one object, the Sealer's ``_session``, holding K_S, the
key id, S and the counter; its ``seal(codec, body, context)`` takes the next counter, records it
for the trace, and returns the envelope. Where libcrypto can be loaded it is a C session
(``wal._storecore.SealSession``, native/sealcore.c): OpenSSL's EVP AES-256-GCM, the code
`cryptography` wraps, through cipher contexts keyed once per session (a seal sets only the
nonce), the counter a C atomic fetch-and-add. A sealed store's put then seals in the C commit
call itself, through that same session object, with no Python frame (native/storecore.c, "The
sealed put"); every other seal -- compressed values, transactions, aput, blobs, archive
objects, exports -- calls the same ``seal`` from `Sealer.seal`. So both paths draw from one
counter: none of them could hand out a counter another one did, and there is no second session
to keep apart. (A separate C session would have been as safe -- its own S -- but two sessions per
open, one counter each, is more to reason about for nothing.) Where libcrypto cannot be loaded,
or with ``AGENTWAL_SEAL_NATIVE=0``, a session is a `_Session` over `cryptography`'s AESGCM with an
``itertools.count`` counter (atomic under the GIL), and every seal is `Sealer.seal`'s. The key
derivation is `cryptography`'s HKDF in both, once per session; the opening of envelopes is
always `cryptography`'s. The envelope is the same byte for byte (the tests compare the two).

The AEAD's associated data binds each ciphertext to its header (codec, key id, session,
counter) and to its context: ``b"agentwal value\\0" + store key`` for a store value (so a value
moved to another key fails to open), ``b"agentwal blob\\0" + digest`` for a blob,
``b"agentwal archive\\0" + object name`` for an archive object. An exported value is the store's
envelope as stored (value context), so an import opens it as the store would.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import math
import os
import struct
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, BinaryIO

from wal.crypto import zstd
from wal.errors import ArgumentError, ArgumentTypeError, EncryptionKeyError, MissingKeyError, SealDamagedError

CODEC_PLAIN = 0x00
CODEC_ZSTD = 0x01
CODEC_ENCRYPTED = 0x80
_CODECS = frozenset((0x00, 0x01, 0x80, 0x81))
KEY_BYTES = 32
KEY_ID_BYTES = 8
SESSION_BYTES = 16
COUNTER_BYTES = 8
HEADER_BYTES = 1 + KEY_ID_BYTES + SESSION_BYTES + COUNTER_BYTES  # of an encrypted envelope: 33
TAG_BYTES = 16
OVERHEAD = HEADER_BYTES + TAG_BYTES  # an encrypted value's envelope adds 49 bytes
# A session is replaced after this many encryptions (never near the counter's 2^64).
SESSION_LIMIT = 1 << 48
# A value naming a dictionary not known has the stored ones read again, at most once a second.
_LOOK_AGAIN_S = 1.0
DEFAULT_THRESHOLD = 128  # values shorter than this are not worth a zstd frame (its ~10-byte header)
ZSTD_LEVEL = 1  # as small as level 3 on agent JSON here (2.20x vs 2.22x), a quarter faster
MAX_PLAIN_BYTES = 1 << 30  # a zstd frame claiming more than this is damage, not data (no bomb)

CONTEXT_VALUE = b"agentwal value\x00"
CONTEXT_BLOB = b"agentwal blob\x00"
CONTEXT_ARCHIVE = b"agentwal archive\x00"
CONTEXT_DICT = b"agentwal dictionary\x00"  # + the dictionary's id, u32 big-endian: a stored dictionary file

_KEY_ID_LABEL = b"agentwal key id v1"
_HKDF_INFO = b"agentwal seal v1"

KeySource = bytes | Sequence[bytes] | Callable[[bytes | None], bytes | None]


def key_id(key: bytes) -> bytes:
    """The 8-byte id of a 32-byte master key (stored beside what it encrypted)."""
    return hmac.new(key, _KEY_ID_LABEL, hashlib.sha256).digest()[:KEY_ID_BYTES]


def _derive(master: bytes, session: bytes) -> bytes:
    """K_S: the key of the session `session` under `master` (module docstring, "Nonces", 1)."""
    from cryptography.hazmat.primitives import hashes  # noqa: PLC0415 -- an optional dependency
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF  # noqa: PLC0415

    derived: bytes = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=session, info=_HKDF_INFO).derive(master)
    return derived


def _aead(master: bytes, session: bytes) -> Any:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: PLC0415 -- an optional dependency

    return AESGCM(_derive(master, session))


def _need_cryptography() -> None:
    try:
        import cryptography.hazmat.primitives.ciphers.aead  # noqa: F401, PLC0415
    except ImportError:
        raise ArgumentError("encryption needs the 'cryptography' package: pip install 'agentwal[crypto]'") from None


def _check_key(key: object, what: str) -> bytes:
    if not isinstance(key, bytes | bytearray | memoryview):
        raise ArgumentTypeError(f"{what} must be 32 bytes, not {type(key).__name__}")
    data = bytes(key)
    if len(data) != KEY_BYTES:
        raise ArgumentError(f"{what} must be {KEY_BYTES} bytes (AES-256), got {len(data)}")
    return data


class Keyring:
    """The master keys a handle may use: the *current* one encrypts new values; any of them opens
    values sealed under its id.

    `source` is a 32-byte key; a sequence of keys, the current one first (rotation: put the new
    key first and keep the old ones after it until `agentwal rekey` has rewritten their values);
    or a provider callable, ``provider(None) -> current key`` and ``provider(key_id: bytes) ->
    key or None``, for keys that live in a KMS or a secret store. A provider is asked once per id
    per handle; a key it returns for an id must have that id."""

    def __init__(self, source: KeySource) -> None:
        _need_cryptography()
        self._provider: Callable[[bytes | None], bytes | None] | None = None
        self._keys: dict[bytes, bytes] = {}
        self._lock = threading.Lock()
        if isinstance(source, bytes | bytearray | memoryview):
            keys = [_check_key(source, "encryption key")]
        elif callable(source):
            self._provider = source
            got = _ask(source, None)
            if got is None:
                raise MissingKeyError("the key provider returned no current key (provider(None) gave None)")
            keys = [_provided_key(got, None)]
        elif isinstance(source, Sequence) and not isinstance(source, str) and len(source) > 0:
            keys = [_check_key(k, f"encryption key {i}") for i, k in enumerate(source)]
        else:
            raise ArgumentTypeError("encryption must be a 32-byte key, a non-empty sequence of keys (current "
                                    f"first) or a provider callable, not {type(source).__name__}")
        self.current_id = key_id(keys[0])
        self.current = keys[0]
        for k in keys:
            self._keys.setdefault(key_id(k), k)

    @property
    def has_provider(self) -> bool:
        return self._provider is not None

    @property
    def ids(self) -> list[bytes]:
        """The ids known so far, the current one first."""
        return [self.current_id, *(i for i in self._keys if i != self.current_id)]

    def lookup(self, kid: bytes) -> bytes | None:
        key = self._keys.get(kid)
        if key is not None or self._provider is None:
            return key
        got = _ask(self._provider, kid)
        if got is None:
            return None
        key = _provided_key(got, kid)
        if key_id(key) != kid:
            raise MissingKeyError(f"the key provider returned, for key id {kid.hex()}, a key whose id is "
                                  f"{key_id(key).hex()}", key_id=kid.hex())
        with self._lock:
            self._keys[kid] = key
        return key


def _provided_key(got: object, kid: bytes | None) -> bytes:
    """A key the provider returned, checked: one that is not 32 bytes is an EncryptionKeyError
    naming the key asked for, as a provider's own failure is (`_ask`), so that the store's open
    or the read that asked names where; the provider is the caller's code, not an argument."""
    which = "the current key" if kid is None else f"the key of id {kid.hex()}"
    if not isinstance(got, bytes | bytearray | memoryview):
        raise EncryptionKeyError(f"the key provider gave, for {which}, a {type(got).__name__}, not 32 bytes",
                                 key_id=None if kid is None else kid.hex())
    if len(got) != KEY_BYTES:
        raise EncryptionKeyError(f"the key provider gave, for {which}, {len(got)} bytes: a key is {KEY_BYTES} "
                                 "bytes (AES-256)", key_id=None if kid is None else kid.hex())
    return bytes(got)


def _ask(provider: Callable[[bytes | None], bytes | None], kid: bytes | None) -> bytes | None:
    """provider(kid); whatever it raises (a KMS out of reach, a secret store refusing) as an
    EncryptionKeyError naming the key asked for, the provider's error chained: a caller then
    sees one kind of error whatever the provider, and not, say, an OSError it would take for
    the disk's."""
    try:
        return provider(kid)
    except Exception as exc:
        which = "the current key" if kid is None else f"the key of id {kid.hex()}"
        raise EncryptionKeyError(f"the key provider failed to give {which}: {type(exc).__name__}: {exc}",
                                 key_id=None if kid is None else kid.hex()) from exc


_pack_counter = struct.Struct("<Q").pack  # the envelope's counter field, and the nonce's first 8 bytes
_NONCE_TAIL = bytes(12 - COUNTER_BYTES)  # the nonce = counter (u64 LE) + four zero bytes
_CODEC_BYTE = (bytes((CODEC_PLAIN,)), bytes((CODEC_ZSTD,)))  # an unencrypted envelope's first byte, by codec


class _Session:
    """One sealing session through `cryptography` (the Python path): a random id, its derived
    AEAD and its nonce counter (module docstring). The same interface as the C sessions,
    ``wal._storecore.SealSession``: `id`, `key_id` and `seal`."""

    __slots__ = ("counter", "encrypt", "id", "key_id", "pid", "prefixes")

    def __init__(self, derived: bytes, kid: bytes, sid: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: PLC0415 -- optional

        # The process the session was made in. A child forked by libc fork() straight (ctypes,
        # a C extension) skips os.register_at_fork's hook, and would seal under the parent's
        # session with the parent's next counters: the same nonces. A seal in another process
        # answers "used up", as the C session does after any fork, and the Sealer starts anew.
        self.pid = os.getpid()
        self.id = sid
        self.key_id = kid
        self.encrypt = AESGCM(derived).encrypt  # bound once: the seal path's one AEAD call
        self.counter = itertools.count()
        # the first 25 header bytes, by the codec's compression bit (made once, not per seal)
        self.prefixes = (bytes((CODEC_ENCRYPTED,)) + kid + self.id,
                         bytes((CODEC_ENCRYPTED | CODEC_ZSTD,)) + kid + self.id)

    def seal(self, codec: int, body: bytes, context: bytes) -> bytes | None:
        """The envelope of `body` (codec 0x80 or 0x81), or None once the session is used up."""
        if os.getpid() != self.pid:
            return None
        n = next(self.counter)
        if n >= SESSION_LIMIT:
            return None
        if _trace_fd >= 0:
            os.write(_trace_fd, b"%s %s %d\n" % (self.key_id.hex().encode(), self.id.hex().encode(), n))
        counter = _pack_counter(n)
        header = self.prefixes[codec & CODEC_ZSTD] + counter
        sealed: bytes = self.encrypt(counter + _NONCE_TAIL, body, header + context)
        return header + sealed


class _NativeSessions:
    """The C sessions (wal._storecore.SealSession, native/sealcore.c): OpenSSL's AES-256-GCM
    through cipher contexts keyed once per session, the same envelope byte for byte.
    wal/_bindings.py hands the type over when the C core loads (this floor is below it and
    cannot import it). AGENTWAL_SEAL_NATIVE=0 keeps every session on the Python path."""

    __slots__ = ("load", "session_type", "state")

    def __init__(self) -> None:
        self.session_type: Any = None  # None: not bound (or AGENTWAL_SEAL_NATIVE=0): Python sessions
        self.load: Callable[[], str] | None = None
        self.state: str | None = None  # None: not checked yet; "": not usable; else the library's name


_native = _NativeSessions()


def bind_native(session_type: Any, load: Callable[[], str]) -> None:
    """Called once by wal/_bindings.py: the C session type and its libcrypto loader."""
    if os.environ.get("AGENTWAL_SEAL_NATIVE", "") != "0":
        _native.session_type, _native.load = session_type, load


def native_library() -> str | None:
    """The libcrypto that new sealing sessions encrypt through (C sessions), or None when they
    use `cryptography` (no libcrypto could be loaded, or AGENTWAL_SEAL_NATIVE=0). Checked once
    per process: the library loads, and an envelope it seals opens with `cryptography`."""
    session_type, load = _native.session_type, _native.load
    if session_type is None or load is None:
        return None
    if _native.state is None:
        try:
            name = load()
            key, sid, kid, context = bytes(range(KEY_BYTES)), bytes(SESSION_BYTES), bytes(KEY_ID_BYTES), b"check"
            envelope = session_type(key, kid, sid, SESSION_LIMIT, -1, 0).seal(CODEC_ENCRYPTED, b"agentwal", context)
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: PLC0415 -- optional

            opened = AESGCM(key).decrypt(envelope[HEADER_BYTES - COUNTER_BYTES:HEADER_BYTES] + _NONCE_TAIL,
                                         envelope[HEADER_BYTES:], envelope[:HEADER_BYTES] + context)
            _native.state = name if opened == b"agentwal" else ""
        except Exception:  # any failure of the check: the Python path, as without libcrypto
            _native.state = ""
    return _native.state or None


def _start_session(master: bytes, kid: bytes, compress_from: int) -> Any:
    """A new sealing session: a C one where libcrypto is usable, else a `_Session`."""
    sid = os.urandom(SESSION_BYTES)
    derived = _derive(master, sid)
    if native_library() is not None:
        return _native.session_type(derived, kid, sid, SESSION_LIMIT, _trace_fd, compress_from)
    return _Session(derived, kid, sid)


_sealers: weakref.WeakSet[Sealer] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # The child holds copies of its parent's sessions, counters included: sealing with them would
    # repeat the parent's next nonces. Every Sealer starts a new session before the child seals.
    for sealer in list(_sealers):
        sealer._new_session()


os.register_at_fork(after_in_child=_after_fork_in_child)


# AGENTWAL_TRACE_NONCES=FILE: every (key id, session, counter) is appended to FILE before it is
# used (the nonce-reuse tests; O_APPEND, one write per seal, so processes may share the file).
_trace_path = os.environ.get("AGENTWAL_TRACE_NONCES")
_trace_fd = os.open(_trace_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if _trace_path else -1


class Sealer:
    """Seals and opens envelopes for one handle (thread-safe). `keys` None: no encryption;
    `compression` None or "zstd"; `dictionaries`: trained zstd dictionaries (bytes) that frames
    may name, the first also used to compress when `compression` is on."""

    def __init__(self, keys: Keyring | None, compression: str | None = None, *,
                 threshold: int = DEFAULT_THRESHOLD, dictionaries: Iterable[bytes] = (),
                 require_encrypted: bool = False) -> None:
        if compression not in (None, "zstd"):
            raise ArgumentError(f"compression must be None or 'zstd' (wal.open also takes 'none'), got {compression!r}")
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
            raise ArgumentError(f"compression_threshold must be an int >= 1, got {threshold!r}")
        self.keys = keys
        # An encrypted store holds only encrypted envelopes: an unencrypted one put in its place
        # (a downgrade) is refused as damage, never returned.
        self.require_encrypted = require_encrypted or keys is not None
        # Set for a store (or archive) whose STORE file (manifest) says it was never encrypted: an
        # encrypted envelope in it can only be damage (a changed codec byte), not a missing key.
        self.never_encrypted = False
        self.compression = compression
        self.threshold = threshold
        self._dicts: dict[int, bytes] = {}
        self._dict: bytes | None = None
        dicts = list(dictionaries)
        self._zstd = zstd.binding() if compression or dicts else None
        for raw in dicts:
            data = bytes(raw)
            assert self._zstd is not None
            did = _checked_dictionary(self._zstd, data)
            if self._dicts.get(did, data) != data:
                raise DictionaryConflictError(_CONFLICT.format(did=did, other="another dictionary given"))
            self._dicts[did] = data
            if self._dict is None:
                self._dict = data
        self._local = threading.local()
        self._compressors: list[Any] = []
        self._opened: OrderedDict[bytes, Any] = OrderedDict()  # (key id + session) -> AEAD, bounded
        self._opened_lock = threading.Lock()
        self._session_lock = threading.Lock()
        # Called (once at a time) when a value names a dictionary this sealer does not know: it
        # gives the sealer the dictionaries stored since it was made (a store's dicts/, an
        # archive's dict/), so a reader opened before its writer first compressed with a new
        # one reads it. None: what was given at the start is all there is.
        self.learn_dictionaries: Callable[[], object] | None = None
        self._learning = threading.Lock()
        self._looked_for: dict[int, float] = {}  # dictionary id -> when last looked for (monotonic)
        # A C session (wal._storecore.SealSession) or a _Session; the sealed Store.put reads it
        # from here (native/storecore.c, FastCommit) to seal in C with the same counter.
        self._session: Any = None
        self._blob_key: tuple[bytes, bytes] | None = None
        if keys is not None:
            self._new_session()
        _sealers.add(self)

    @property
    def encrypting(self) -> bool:
        return self.keys is not None

    @property
    def envelope_overhead(self) -> int:
        """The most bytes an envelope adds to what it seals: the codec byte, and an encrypted
        one's header and tag (a value is compressed only where that makes it smaller)."""
        return OVERHEAD if self.encrypting else 1

    @property
    def dictionaries(self) -> dict[int, bytes]:
        """The trained zstd dictionaries this handle reads with, by zstd dictionary id."""
        return dict(self._dicts)

    @property
    def compressing_dictionary(self) -> int | None:
        """The id of the dictionary new values are compressed with (None: none)."""
        return self._zstd.dict_id(self._dict) if self._dict is not None and self._zstd is not None else None

    def seal_dictionary(self, dict_id: int, context: bytes) -> bytes:
        """The envelope of stored dictionary `dict_id` (a file of a store's ``dicts/``, an
        archive's ``dict/`` object): the dictionary and its SHA-256, sealed but never compressed
        (it cannot need itself). The digest vouches for it where no AEAD tag does."""
        data = self._dicts[dict_id]
        return self.seal(data + hashlib.sha256(data).digest(), context, compress=False)

    def open_dictionary(self, envelope: bytes, context: bytes, where: Callable[[], str]) -> int:
        """Know the dictionary sealed in `envelope` (`seal_dictionary`), for reading; its id.
        SealDamagedError if its bytes were changed or it does not load."""
        if envelope[:1] and envelope[0] & CODEC_ZSTD:
            # Never compressed (`seal_dictionary`): opening it would need a dictionary itself,
            # and one naming an unknown one would have `_look_for` read this one again.
            raise _damaged(where(), "a stored dictionary is never compressed, and this one says it is")
        payload = self.open(envelope, context, where)
        data, digest = payload[:-32], payload[-32:]
        if len(payload) < 32 or hashlib.sha256(data).digest() != digest:
            raise _damaged(where(), "the dictionary's SHA-256 does not match it")
        try:
            return self.add_dictionary(data)
        except DictionaryConflictError as exc:
            raise DictionaryConflictError(f"{where()}: {exc}") from None
        except ArgumentError as exc:
            raise _damaged(where(), str(exc)) from None

    def add_dictionary(self, data: bytes, *, compress_with: bool = False) -> int:
        """Know one more trained dictionary (a store's stored one: wal/store/sealed.py), and
        compress new values with it if `compress_with` and none was given. Its id."""
        did = _checked_dictionary(self._binding(), data)
        if self._dicts.setdefault(did, data) != data:
            raise DictionaryConflictError(_CONFLICT.format(did=did, other="another one given or stored"))
        if compress_with and self._dict is None:
            self._dict = self._dicts[did]
            self._compressors.clear()  # contexts made without it (none yet: called before any seal)
        return did

    def _new_session(self) -> None:
        if self.keys is not None:
            # compress_from: values this long are left to this class by the C commit path, which
            # does not compress (0: never compressed).
            compress_from = self.threshold if self.compression is not None else 0
            self._session = _start_session(self.keys.current, self.keys.current_id, compress_from)

    def blob_name(self, data: bytes) -> bytes:
        """The 32-byte name of a blob holding `data`: its SHA-256, or for an encrypted handle an
        HMAC-SHA256 under a key derived from the current master key, so that a file name says
        nothing about the content to whoever lacks the key (no confirming a guessed document)."""
        if self.keys is None:
            return hashlib.sha256(data).digest()
        named = self._blob_key
        if named is None or named[0] != self.keys.current_id:
            from cryptography.hazmat.primitives import hashes  # noqa: PLC0415
            from cryptography.hazmat.primitives.kdf.hkdf import HKDF  # noqa: PLC0415

            secret = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None,
                          info=b"agentwal blob name v1").derive(self.keys.current)
            named = self._blob_key = (self.keys.current_id, secret)
        return hmac.new(named[1], data, hashlib.sha256).digest()

    # ---- sealing ---------------------------------------------------------------------------

    def seal(self, data: bytes | memoryview, context: bytes, *, compress: bool = True) -> bytes:
        """The envelope of `data`: compressed if that pays (and `compress`), encrypted if there
        are keys. (A stored dictionary is sealed with ``compress=False``: it cannot need itself.)

        A sealed store's plain put seals in C without coming here when it can (module docstring,
        "Where the encryption runs"); this is every other seal's path: a handful of Python
        operations around one zstd call (which releases the GIL) and the session's ``seal``
        (a C session keeps the GIL below 32 KiB; `cryptography`'s AESGCM releases it from
        2,048 bytes: docs/performance.md, "Sealed values")."""
        body = data
        codec = CODEC_PLAIN
        if compress and self.compression is not None and len(data) >= self.threshold:
            pool = self._compressors
            c = pool.pop() if pool else self._new_compressor()
            try:
                frame: bytes = c.compress(data)
            finally:
                pool.append(c)
            if len(frame) < len(data):
                codec, body = CODEC_ZSTD, frame
        session = self._session
        if session is None:
            return _CODEC_BYTE[codec] + body
        sealed: bytes | None = session.seal(CODEC_ENCRYPTED | codec, body, context)
        while sealed is None:  # used up (its limit; or, for a C session, made before a fork)
            with self._session_lock:
                if self._session is session:
                    self._new_session()
                session = self._session
            sealed = session.seal(CODEC_ENCRYPTED | codec, body, context)
        return sealed

    def _new_compressor(self) -> zstd.Compressor:
        # A zstd context is not thread-safe and costs ~1 MB to make: a pool (list.pop/append are
        # atomic under the GIL) lends each concurrent seal one and keeps them across threads. A
        # frame carries a checksum only where no AEAD tag authenticates it.
        return self._binding().compressor(ZSTD_LEVEL, self._dict, checksum=self.keys is None)

    def _binding(self) -> zstd.Binding:
        if self._zstd is None:  # a handle without compression meeting a compressed value
            self._zstd = zstd.binding()
        return self._zstd

    # ---- opening ---------------------------------------------------------------------------

    def open(self, envelope: bytes | bytearray | memoryview, context: bytes, where: Callable[[], str]) -> bytes:
        """The value sealed in `envelope`; `where()` names it for errors (MissingKeyError when its
        key was not given, SealDamagedError when its bytes were changed)."""
        if not envelope:
            raise _damaged(where(), "empty (no codec byte)")
        codec = envelope[0]
        if codec == CODEC_PLAIN and not self.require_encrypted:
            return bytes(envelope[1:])  # a bytes slice as it is; a bytearray's copied to bytes
        if codec not in _CODECS:
            raise _damaged(where(), f"unknown codec 0x{codec:02x}")
        if self.require_encrypted and not codec & CODEC_ENCRYPTED:
            raise _damaged(where(), "not encrypted, in an encrypted store (a value put in place of a ciphertext)")
        body = bytes(envelope[1:]) if not codec & CODEC_ENCRYPTED else b""
        if codec & CODEC_ENCRYPTED:
            if self.never_encrypted:
                raise _damaged(where(), f"codec 0x{codec:02x} says encrypted, in a store never encrypted (its codec "
                                        "byte was changed)")
            body = self._decrypt(envelope, context, where)
        if codec & CODEC_ZSTD:
            body = self._decompress(body, where)
        return body

    def _decrypt(self, envelope: bytes | bytearray | memoryview, context: bytes, where: Callable[[], str]) -> bytes:
        if len(envelope) < OVERHEAD:
            raise _damaged(where(), f"an encrypted envelope of {len(envelope)} bytes (at least {OVERHEAD})")
        view = memoryview(envelope)  # the ciphertext is read in place, not copied out first
        sid = bytes(envelope[1:HEADER_BYTES - COUNTER_BYTES])  # key id + session id (a bytearray's too)
        aead = self._opened.get(sid)
        if aead is None:
            aead = self._aead_for(sid[:KEY_ID_BYTES], sid, where)
        try:
            plain: bytes = aead.decrypt(bytes(view[HEADER_BYTES - COUNTER_BYTES:HEADER_BYTES]) + _NONCE_TAIL,
                                        view[HEADER_BYTES:], bytes(view[:HEADER_BYTES]) + context)
        except _invalid_tag():
            raise _damaged(where(), f"authentication failed (key id {sid[:KEY_ID_BYTES].hex()}): its bytes were "
                                    "changed, or it was moved from elsewhere") from None
        return plain

    def sealing(self, out: BinaryIO, context: bytes) -> Sealing:
        """An envelope written to `out` as its contents are fed to it (`Sealing`), for a value
        too large to hold (an archive snapshot). Never compressed: what is streamed is a sealed
        store's snapshot, whose values are envelopes already (compressed where that paid;
        ciphertext does not compress), and a compressed envelope is one zstd frame, made whole.
        Encrypted if this handle encrypts: the bytes `seal` would make of it uncompressed, under
        a session of its own (a fresh random id, counter 0: module docstring, "Nonces"), traced
        as every session's counters are; else codec 0x00 and the contents as they are."""
        if self.keys is None:
            out.write(_CODEC_BYTE[CODEC_PLAIN])
            return Sealing(None, out, 1)
        _need_cryptography()
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes  # noqa: PLC0415 -- optional

        kid, sid = self.keys.current_id, os.urandom(SESSION_BYTES)
        if _trace_fd >= 0:
            os.write(_trace_fd, b"%s %s %d\n" % (kid.hex().encode(), sid.hex().encode(), 0))
        counter = _pack_counter(0)
        header = bytes((CODEC_ENCRYPTED,)) + kid + sid + counter
        aes = algorithms.AES(_derive(self.keys.current, sid))
        encryptor = Cipher(aes, modes.GCM(counter + _NONCE_TAIL)).encryptor()
        encryptor.authenticate_additional_data(header + context)
        out.write(header)
        return Sealing(encryptor, out, OVERHEAD)

    def opening(self, header: bytes, context: bytes, where: Callable[[], str]) -> Opening:
        """The decryption of an encrypted, uncompressed envelope whose first HEADER_BYTES are
        `header`, fed its ciphertext piece by piece (`Opening`): for an envelope too large to
        hold twice (an archive snapshot). MissingKeyError now if its key was not given."""
        if len(header) != HEADER_BYTES or header[0] != CODEC_ENCRYPTED:
            raise _damaged(where(), "not an encrypted, uncompressed envelope")
        _need_cryptography()
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes  # noqa: PLC0415 -- optional

        kid, sid = header[1:1 + KEY_ID_BYTES], header[1 + KEY_ID_BYTES:HEADER_BYTES - COUNTER_BYTES]
        nonce = header[HEADER_BYTES - COUNTER_BYTES:] + _NONCE_TAIL
        decryptor = Cipher(algorithms.AES(_derive(self._master(kid, where), sid)), modes.GCM(nonce)).decryptor()
        decryptor.authenticate_additional_data(header + context)
        return Opening(decryptor, kid, where)

    def _master(self, kid: bytes, where: Callable[[], str]) -> bytes:
        keys = self.keys
        try:
            master = keys.lookup(kid) if keys is not None else None
        except EncryptionKeyError as exc:
            if exc.where is not None:
                raise
            raise type(exc)(f"{where()}: {exc}", key_id=exc.key_id, where=where()) from exc.__cause__
        if master is None:
            given = ", ".join(i.hex() for i in keys.ids) if keys is not None else "none"
            raise MissingKeyError(
                f"{where()} is encrypted under key id {kid.hex()}, which none of the keys given has (key ids: "
                f"{given}): open with that key too (encryption=[current, old...] or a provider that knows it; "
                f"the agentwal command: one more --key-file)",
                key_id=kid.hex(), where=where())
        return master

    def _aead_for(self, kid: bytes, sid: bytes, where: Callable[[], str]) -> Any:
        aead = _aead(self._master(kid, where), sid[KEY_ID_BYTES:])
        with self._opened_lock:
            self._opened[sid] = aead
            if len(self._opened) > 4096:
                self._opened.popitem(last=False)
        return aead

    def _decompress(self, frame: bytes, where: Callable[[], str]) -> bytes:
        try:
            size, dict_id = self._binding().frame(frame)
        except zstd.FrameError as exc:
            raise _damaged(where(), f"not a zstd frame ({exc})") from None
        # This writer always declares the size: a frame without one, or claiming more than any
        # value may hold, is not one of ours and is never decompressed (no zstd bomb).
        if size is None:
            raise _damaged(where(), "a zstd frame that does not declare its size")
        if size > MAX_PLAIN_BYTES:
            raise _damaged(where(), f"a zstd frame claiming {size} bytes")
        d = self._decompressor(dict_id, where)
        try:
            return d.decompress(frame, size)
        except zstd.FrameError as exc:
            raise _damaged(where(), f"its zstd frame does not decode ({exc})") from None

    def _look_for(self, dict_id: int) -> None:
        """Have `learn_dictionaries` read the stored dictionaries, one thread at a time, at most
        once a second for one id (a value naming one that truly is not there, damaged, read in a
        loop, costs a listing a second, not one per read)."""
        with self._learning:
            now = time.monotonic()
            if dict_id in self._dicts or now - self._looked_for.get(dict_id, -math.inf) < _LOOK_AGAIN_S:
                return
            self._looked_for[dict_id] = now
            assert self.learn_dictionaries is not None
            self.learn_dictionaries()

    def _decompressor(self, dict_id: int, where: Callable[[], str]) -> zstd.Decompressor:
        cache = getattr(self._local, "d", None)
        if cache is None:
            cache = self._local.d = {}
        d: zstd.Decompressor | None = cache.get(dict_id)
        if d is None:
            if dict_id and dict_id not in self._dicts and self.learn_dictionaries is not None:
                self._look_for(dict_id)
            if dict_id and dict_id not in self._dicts:
                raise MissingKeyError(f"{where()} is compressed with zstd dictionary {dict_id:08x}, which was not "
                                      "given: open with compression_dict= that dictionary (a store keeps its "
                                      "dictionaries in dicts/, an export in its zstd_dictionary lines)",
                                      where=where())
            d = cache[dict_id] = self._binding().decompressor(self._dicts.get(dict_id))
        return d


class Sealing:
    """An envelope being written (`Sealer.sealing`): `write` writes each piece of its contents
    (encrypted, if it is), `finish` ends it (the tag). An envelope whose `finish` was not called
    is not one: the caller deletes what it wrote. `overhead`: the bytes the envelope adds."""

    def __init__(self, encryptor: Any, out: BinaryIO, overhead: int) -> None:
        self._encryptor = encryptor
        self._out = out
        self.overhead = overhead

    def write(self, contents: bytes | memoryview) -> int:
        self._out.write(contents if self._encryptor is None else self._encryptor.update(contents))
        return len(contents)

    def finish(self) -> None:
        if self._encryptor is not None:
            self._out.write(self._encryptor.finalize() + self._encryptor.tag)


class Opening:
    """An envelope's ciphertext decrypted piece by piece (`Sealer.opening`). What `update`
    returns is NOT authenticated until `finish` accepts the tag: the caller must be able to throw
    it all away (a restore builds its store aside and moves it into place only once whole)."""

    def __init__(self, decryptor: Any, kid: bytes, where: Callable[[], str]) -> None:
        self._decryptor = decryptor
        self._kid = kid
        self._where = where

    def update(self, ciphertext: bytes | memoryview) -> bytes:
        out: bytes = self._decryptor.update(ciphertext)
        return out

    def finish(self, tag: bytes) -> None:
        """SealDamagedError unless the tag authenticates every byte fed to `update`."""
        try:
            self._decryptor.finalize_with_tag(tag)
        except _invalid_tag():
            raise _damaged(self._where(), f"authentication failed (key id {self._kid.hex()}): its bytes were "
                                          "changed, or it was moved from elsewhere") from None


class DictionaryConflictError(ArgumentError):
    """Two trained dictionaries with one zstd id and other contents. A frame names its
    dictionary by that id only, so one of them would decode the other's frames: into an error,
    or, where nothing else checks the result (an encrypted store's frames carry no checksum: the
    AEAD tag vouches for the frame, not for what a dictionary makes of it), into other bytes."""


_CONFLICT = ("the zstd dictionary {did:08x} has other contents than {other} with that id: a frame names its "
             "dictionary by id only, so one would decode the other's values wrongly. Train the new one with "
             "another dict_id (wal.crypto.train_dictionary derives one from the dictionary's contents)")


def _checked_dictionary(binding: zstd.Binding, data: bytes) -> int:
    """The id of trained dictionary `data`; ArgumentError if it is not one or does not load."""
    try:
        did = binding.dict_id(data)
        if did:
            binding.check_dictionary(data)
    except (zstd.FrameError, ValueError) as exc:
        raise ArgumentError(f"compression_dict is not a usable zstd dictionary ({exc})") from None
    if did == 0:
        raise ArgumentError("compression_dict is not a trained zstd dictionary (its id is 0)")
    return did


def _invalid_tag() -> type[Exception]:
    from cryptography.exceptions import InvalidTag  # noqa: PLC0415 -- an optional dependency, loaded once opened

    return InvalidTag


def _damaged(where: str, what: str) -> SealDamagedError:
    return SealDamagedError(f"{where} is damaged: {what}; it is not returned", reason="sealed value damaged")


def parse(envelope: bytes) -> tuple[int, bytes, bytes, int] | None:
    """(codec, key id, session, counter) of an encrypted envelope; None for an unencrypted one."""
    if len(envelope) < OVERHEAD or not envelope[0] & CODEC_ENCRYPTED:
        return None
    return (envelope[0], envelope[1:9], envelope[9:25], int.from_bytes(envelope[25:33], "little"))


def train_dictionary(samples: Sequence[bytes], size: int = 16 << 10) -> bytes:
    """A zstd dictionary trained on sample values (e.g. a few thousand real JSON values), for
    ``wal.open(..., compression="zstd", compression_dict=...)``. Keep it as you keep the store:
    every value compressed with it needs it to be read. ArgumentError if zstd cannot train one
    from these samples (too few, or too alike)."""
    binding = zstd.binding()
    try:
        return binding.train(samples, size)
    except Exception as exc:  # each binding raises its own error type (zstandard.ZstdError, ZstdError)
        raise ArgumentError(f"no zstd dictionary could be trained from {len(samples)} sample(s) "
                            f"({type(exc).__name__}: {exc}); give more samples, of a few thousand real values") from exc
