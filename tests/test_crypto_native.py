"""Sealing in C (native/sealcore.c, wal._storecore.SealSession) and the sealed put that seals
inside the C commit call (native/storecore.c, "The sealed put").

The C path must be invisible except for speed: its envelopes are byte for byte those of the
Python path (`cryptography`), open with the Python Sealer.open and after a reopen, are refused
under a wrong key or another store key, and take their nonces from the one counter of the
Sealer's session -- across threads, both paths, the session limit and forks. Where libcrypto is
not used (AGENTWAL_SEAL_NATIVE=0, or it cannot be loaded) the Python path seals as before, and
the two read each other's values.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import struct
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

import wal
from wal._bindings import storecore
from wal.crypto import sealing
from wal.crypto.sealing import (
    CODEC_ENCRYPTED,
    CODEC_ZSTD,
    CONTEXT_VALUE,
    HEADER_BYTES,
    Keyring,
    Sealer,
    key_id,
    parse,
)
from wal.drill import failpoints
from wal.errors import SealDamagedError, WrongKeyError
from wal.store.store import Store

KEY = bytes(range(32))
KEY2 = bytes(range(1, 33))
VALUE = json.dumps({"role": "user", "content": "the quarterly numbers are confidential " * 90}).encode()  # ~3.5 KiB


def _raw(store: wal.Store, key: bytes) -> bytes:
    """The envelope the store holds for key (the plain store's read underneath the sealed one)."""
    v = Store.get(store, key)
    assert v is not None
    return v


def _libcrypto_present() -> bool:
    """Whether a libcrypto native/sealcore.c would try can be loaded at all (the same names)."""
    import ctypes  # noqa: PLC0415

    for name in ("libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.so"):
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return True
    return False


# Where a libcrypto loads (every CI machine here) these must pass: a binding that fails to use
# it fails them. Only where none exists, or AGENTWAL_SEAL_NATIVE=0 asks for the Python path,
# is there no C path to test (the Python path's tests here and in test_crypto_store.py run).
needs_c_path = pytest.mark.skipif(
    os.environ.get("AGENTWAL_SEAL_NATIVE") == "0" or not _libcrypto_present(),
    reason="no C sealing path here: no libcrypto loads, or AGENTWAL_SEAL_NATIVE=0")


@pytest.fixture
def python_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """New sessions seal through `cryptography`, as where libcrypto cannot be loaded."""
    monkeypatch.setattr(sealing._native, "session_type", None)


class _SealCalls:
    """Counts Sealer.seal calls: the sealed put's C path makes none."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        real = Sealer.seal

        def counting(sealer: Sealer, data: bytes, context: bytes) -> bytes:
            self.n += 1
            return real(sealer, data, context)

        monkeypatch.setattr(Sealer, "seal", counting)


@needs_c_path
def test_libcrypto_is_loaded_here_and_stores_seal_through_it() -> None:
    """This machine has Python's ssl, hence libcrypto: the C sessions are in use (the tests
    below would otherwise test the Python path twice)."""
    assert sealing.native_library() == storecore.load_aead()
    assert isinstance(Sealer(Keyring(KEY))._session, storecore.SealSession)


def test_a_c_session_and_a_python_session_make_the_same_envelope_byte_for_byte() -> None:
    derived, kid, sid = os.urandom(32), key_id(KEY), os.urandom(16)
    c = storecore.SealSession(derived, kid, sid, sealing.SESSION_LIMIT, -1, 0)
    py = sealing._Session(derived, kid, sid)
    for codec, body, context in [(CODEC_ENCRYPTED, b"", b""), (CODEC_ENCRYPTED, VALUE, CONTEXT_VALUE + b"k"),
                                 (CODEC_ENCRYPTED | CODEC_ZSTD, b"x" * 17, b"agentwal blob\0" + bytes(32)),
                                 (CODEC_ENCRYPTED, os.urandom(200_000), CONTEXT_VALUE + b"big")]:  # GIL released
        assert c.seal(codec, body, context) == py.seal(codec, body, context)
    assert c.used == 4
    # and it is AES-256-GCM as FORMAT.md §19 writes it: nonce = counter u64 LE + 4 zero bytes
    env = c.seal(CODEC_ENCRYPTED, b"hello", b"ctx")
    assert env is not None and env[:25] == bytes([CODEC_ENCRYPTED]) + kid + sid and env[25:33] == struct.pack("<Q", 4)
    assert AESGCM(derived).decrypt(env[25:33] + bytes(4), env[33:], env[:33] + b"ctx") == b"hello"


def test_c_session_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="key must be 32 bytes"):
        storecore.SealSession(bytes(31), bytes(8), bytes(16), 10, -1, 0)
    with pytest.raises(ValueError, match="session_id must be 16 bytes"):
        storecore.SealSession(bytes(32), bytes(8), bytes(15), 10, -1, 0)
    s = storecore.SealSession(bytes(32), bytes(8), bytes(16), 10, -1, 0)
    with pytest.raises(ValueError, match="not an encrypted one"):
        s.seal(0x01, b"v", b"")
    with pytest.raises(TypeError):
        s.seal(0x80, "text", b"")


@needs_c_path
def test_values_sealed_by_the_c_put_open_in_python_and_after_reopen(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _SealCalls(monkeypatch)
    values = {f"conv/{i}".encode(): VALUE + b"%d" % i for i in range(200)}
    values[b"empty"] = b""
    values[b"big"] = os.urandom(100_000)  # sealed with the GIL released
    with wal.open(tmp_path, encryption=KEY) as store:
        session = store._sealer._session
        assert isinstance(session, storecore.SealSession)
        for k, v in values.items():
            store.put(k, v)
        store.put("str-key-\u00e9", b"via str")
        assert calls.n == 0  # every put sealed in C
        assert session.used == len(values) + 1
        envelopes = {k: _raw(store, k) for k in values}
        assert all(store.get(k) == v for k, v in values.items())
        # opened by a Sealer that seals and opens through `cryptography` only
        with monkeypatch.context() as m:
            m.setattr(sealing._native, "session_type", None)
            py = Sealer(Keyring(KEY))
            assert isinstance(py._session, sealing._Session)
            assert all(py.open(envelopes[k], CONTEXT_VALUE + k, lambda: "v") == v for k, v in values.items())
    counters = sorted(parse(e)[3] for e in envelopes.values())  # type: ignore[index]
    assert len(set(counters)) == len(counters)
    with wal.open(tmp_path, encryption=KEY) as store:
        assert dict(store.scan(b"conv/")) == {k: v for k, v in values.items() if k.startswith(b"conv/")}
        assert store.get(b"big") == values[b"big"] and store.get("str-key-\u00e9") == b"via str"
        assert _raw(store, b"conv/7") == envelopes[b"conv/7"]  # as written: no rewrite on open


def test_a_wrong_key_or_another_store_key_or_a_flipped_byte_still_refuses_a_c_sealed_value(tmp_path: Path) -> None:
    with wal.open(tmp_path / "s", encryption=KEY) as store:
        store.put(b"a", VALUE)
        store.put(b"b", VALUE)
        env = _raw(store, b"a")
        sealer = store._sealer
    with pytest.raises(WrongKeyError):
        wal.open(tmp_path / "s", encryption=KEY2)
    with pytest.raises(SealDamagedError):
        sealer.open(env, CONTEXT_VALUE + b"b", lambda: "moved")  # bound to its key by the AAD
    for at in (0 + 5, 30, HEADER_BYTES + 3, len(env) - 1):
        bad = bytearray(env)
        bad[at] ^= 1
        with pytest.raises((SealDamagedError, wal.MissingKeyError)):
            sealer.open(bytes(bad), CONTEXT_VALUE + b"a", lambda: "flipped")


@needs_c_path
def test_the_c_put_leaves_compressible_values_and_other_call_forms_to_the_python_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _SealCalls(monkeypatch)
    with wal.open(tmp_path, encryption=KEY, compression="zstd") as store:
        store.put(b"small", b"x" * 100)  # under the threshold (128): sealed in C, not compressed
        assert calls.n == 0 and _raw(store, b"small")[0] == CODEC_ENCRYPTED
        store.put(b"json", VALUE)  # compressible: the Python put compresses, then seals
        assert calls.n == 1 and _raw(store, b"json")[0] == CODEC_ENCRYPTED | CODEC_ZSTD
        store.put(b"kw", VALUE, durability="sync")
        store.put(key=b"kw2", value=b"v")
        store.put(b"ba", bytearray(b"v"))
        assert calls.n == 4
        with store.transaction() as tx:
            tx.put(b"tx", b"in a transaction")
        assert calls.n == 5
        assert {k: store.get(k) for k in (b"small", b"json", b"kw", b"kw2", b"ba", b"tx")} == {
            b"small": b"x" * 100, b"json": VALUE, b"kw": VALUE, b"kw2": b"v", b"ba": b"v", b"tx": b"in a transaction"}


@needs_c_path
def test_one_counter_across_threads_and_both_paths_no_nonce_twice(tmp_path: Path) -> None:
    """8 threads put through the C path while two others commit through the Python path (the
    sealed transaction, a durability= put, aput) on the same session: every envelope in the
    store has its own counter, and the session counted each of them."""
    n_threads, per = 8, 300
    with wal.open(tmp_path, encryption=KEY) as store:
        session = store._sealer._session
        errors: list[BaseException] = []

        def c_path(t: int) -> None:
            try:
                for i in range(per):
                    store.put(f"c{t}/{i}", VALUE[: 64 + i])
            except BaseException as exc:
                errors.append(exc)

        def py_path(t: int) -> None:
            try:
                for i in range(per // 3):
                    with store.transaction() as tx:
                        tx.put(f"p{t}/tx{i}", b"txn %d" % i)
                    store.put(f"p{t}/sync{i}", b"sync %d" % i, durability="sync")
                    if t == 0:  # one event loop: the waiters of loops in two threads share the log's eventfd
                        asyncio.run(store.aput(f"p{t}/a{i}", b"async %d" % i))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=c_path, args=(t,)) for t in range(n_threads)]
        threads += [threading.Thread(target=py_path, args=(t,)) for t in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors
        keys = [k for k, _ in Store.scan(store)]
        envelopes = [_raw(store, k) for k in keys]
        assert len(envelopes) == n_threads * per + 2 * (2 * per // 3) + per // 3
        nonces = [parse(e)[1:] for e in envelopes]  # type: ignore[index]
        assert len(set(nonces)) == len(nonces)
        assert {n[1] for n in nonces} == {session.id} and session.used == len(envelopes)


@needs_c_path
def test_the_session_limit_starts_new_sessions_on_the_c_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sealing, "SESSION_LIMIT", 7)
    calls = _SealCalls(monkeypatch)
    with wal.open(tmp_path, encryption=KEY) as store:
        for i in range(50):
            store.put(b"k%d" % i, b"v%d" % i)
        envelopes = [_raw(store, b"k%d" % i) for i in range(50)]
        assert all(store.get(b"k%d" % i) == b"v%d" % i for i in range(50))
    nonces = [parse(e)[2:] for e in envelopes]  # type: ignore[index]
    assert len(set(nonces)) == 50 and all(counter < 7 for _, counter in nonces)
    assert len({sid for sid, _ in nonces}) >= 50 // 7
    assert calls.n == len({sid for sid, _ in nonces}) - 1  # a used-up session: the Python put renews it


FORK_RUN = textwrap.dedent("""
    import json, os, sys, threading
    import wal
    from wal._bindings import storecore
    from wal.crypto.sealing import parse
    key = bytes(range(32))
    root = sys.argv[1]
    nonces = []
    def record(store, keys):
        for k in keys:
            env = wal.Store.get(store, k)
            nonces.append([env[9:25].hex(), parse(env)[3]])
    s = wal.open(root + "/parent", encryption=key)
    for i in range(20):
        s.put(b"before%d" % i, b"v")
    inherited = s._sealer._session
    kids = []
    for n in range(3):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            out = []
            # the parent's session, as the child inherited it, seals nothing here
            assert inherited.seal(0x80, b"x", b"") is None and not inherited.live
            assert s._sealer._session is not inherited  # renewed at the fork
            with wal.open(root + "/child%d" % n, encryption=key) as c:
                ts = [threading.Thread(target=lambda t=t: [c.put(b"t%d/%d" % (t, i), b"v") for i in range(50)])
                      for t in range(4)]
                [t.start() for t in ts]; [t.join() for t in ts]
                nonces.clear()
                record(c, [k for k, _ in wal.Store.scan(c)])
            for _ in range(20):  # the parent's Sealer in the child: a new session too
                env = s._sealer.seal(b"child seal", b"ctx")
                nonces.append([env[9:25].hex(), parse(env)[3]])
            os.write(w, json.dumps(nonces).encode())
            os._exit(0)
        os.close(w)
        kids.append((pid, r))
    for i in range(20):
        s.put(b"after%d" % i, b"v")
    record(s, [k for k, _ in wal.Store.scan(s)])
    every = list(nonces)
    for pid, r in kids:
        data = b""
        while chunk := os.read(r, 1 << 16):
            data += chunk
        assert os.waitpid(pid, 0)[1] == 0
        every += json.loads(data)
    s.close()
    print(json.dumps(every))
""")


@needs_c_path
def test_no_nonce_twice_across_a_fork_the_child_never_continues_the_parents_session(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", FORK_RUN, str(tmp_path)], check=True, capture_output=True,
                         timeout=120, text=True)
    nonces = [tuple(n) for n in json.loads(out.stdout)]
    assert len(nonces) == 40 + 3 * (200 + 20)
    repeated = [n for n, c in collections.Counter(nonces).items() if c > 1]
    assert not repeated
    assert len({sid for sid, _ in nonces}) >= 1 + 3 * 2  # the parent's, and two new ones per child


TRACE_RUN = textwrap.dedent("""
    import os, sys, threading
    import wal
    key = bytes(range(32))
    with wal.open(sys.argv[1], encryption=key) as s:
        ts = [threading.Thread(target=lambda t=t: [s.put(b"t%d/%d" % (t, i), b"v" * i) for i in range(100)])
              for t in range(4)]
        [t.start() for t in ts]; [t.join() for t in ts]
        with s.transaction() as tx:
            tx.put(b"tx", b"python path")
        if os.fork() == 0:
            with wal.open(sys.argv[1] + "-child", encryption=key) as c:
                for i in range(30):
                    c.put(b"c%d" % i, b"child")
            os._exit(0)
        os.wait()
""")


def test_nonce_tracing_records_every_c_sealed_nonce(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """AGENTWAL_TRACE_NONCES (the nonce-reuse tests) sees the C path's seals as the Python
    path's: one line per seal, every envelope on disk among them, none twice."""
    trace = tmp_path / "nonces.txt"
    monkeypatch.setenv("AGENTWAL_TRACE_NONCES", str(trace))
    subprocess.run([sys.executable, "-c", TRACE_RUN, str(tmp_path / "s")], check=True, timeout=120)
    lines = trace.read_bytes().splitlines()
    assert len(lines) == len(set(lines)) == 400 + 1 + 30
    traced = {(bytes.fromhex(k.decode()), bytes.fromhex(s.decode()), int(c)) for k, s, c in map(bytes.split, lines)}
    on_disk = set()
    for root in (tmp_path / "s", tmp_path / "s-child"):
        with wal.open(root, encryption=KEY) as store:
            on_disk |= {parse(_raw(store, k))[1:] for k, _ in Store.scan(store)}  # type: ignore[index]
    assert len(on_disk) == 431 and on_disk <= traced


# ---- the Python path (libcrypto not used) -----------------------------------------------------------


@needs_c_path
@pytest.mark.usefixtures("python_path")
def test_without_libcrypto_the_python_path_seals_and_the_two_paths_read_each_other(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _SealCalls(monkeypatch)
    assert sealing.native_library() is None
    with wal.open(tmp_path, encryption=KEY) as store:
        assert isinstance(store._sealer._session, sealing._Session)
        for i in range(20):
            store.put(b"py%d" % i, VALUE + b"%d" % i)
        assert calls.n == 20  # the C put declines a Python session: Sealer.seal did each
    monkeypatch.undo()  # C sessions again
    with wal.open(tmp_path, encryption=KEY) as store:
        assert isinstance(store._sealer._session, storecore.SealSession)
        assert all(store.get(b"py%d" % i) == VALUE + b"%d" % i for i in range(20))
        for i in range(20):
            store.put(b"c%d" % i, VALUE + b"c%d" % i)
    monkeypatch.setattr(sealing._native, "session_type", None)
    with wal.open(tmp_path, encryption=KEY) as store:
        assert all(store.get(b"c%d" % i) == VALUE + b"c%d" % i for i in range(20))
        assert all(store.get(b"py%d" % i) == VALUE + b"%d" % i for i in range(20))


def test_a_libcrypto_that_cannot_be_loaded_leaves_sealing_on_the_python_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def unloadable() -> str:
        raise OSError("libcrypto could not be loaded (libcrypto.so.3: cannot open shared object file)")

    monkeypatch.setattr(sealing._native, "load", unloadable)
    monkeypatch.setattr(sealing._native, "state", None)
    assert sealing.native_library() is None
    with wal.open(tmp_path, encryption=KEY) as store:
        assert isinstance(store._sealer._session, sealing._Session)
        store.put(b"k", VALUE)
        assert store.get(b"k") == VALUE


def test_agentwal_seal_native_0_keeps_a_process_on_the_python_path(tmp_path: Path) -> None:
    code = ("import wal; from wal.crypto import sealing; assert sealing.native_library() is None\n"
            f"with wal.open({str(tmp_path)!r}, encryption=bytes(range(32))) as s:\n"
            "    assert type(s._sealer._session).__name__ == '_Session'; s.put(b'k', b'from python')\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60,
                   env={**os.environ, "AGENTWAL_SEAL_NATIVE": "0"})
    with wal.open(tmp_path, encryption=KEY) as store:
        assert store.get(b"k") == b"from python"


# ---- sealing after the append (native/commit.c, "Records finished later") -------------------------


@needs_c_path
def test_a_sealed_put_at_sync_is_appended_first_and_encrypted_once_the_gil_is_let_go(tmp_path: Path) -> None:
    """At `sync` the C put appends its record with the ciphertext still to come and finishes it
    after letting the GIL go; at `interval` it seals first, as before. Either way the value reads
    back, and its envelope opens with the Python Sealer."""
    for durability, finished_later in (("sync", 40), ("interval", 0)):
        with wal.open(tmp_path / durability, encryption=KEY, durability=durability) as store:
            for i in range(40):
                store.put(b"k%d" % i, VALUE[: 100 + 50 * i])
            assert store.stats()["finished_later"] == finished_later
            assert all(store.get(b"k%d" % i) == VALUE[: 100 + 50 * i] for i in range(40))
            sealer = store._sealer
            envelope = _raw(store, b"k39")
            assert sealer.open(envelope, sealing.CONTEXT_VALUE + b"k39", lambda: "k39") == VALUE[: 100 + 50 * 39]


@needs_c_path
def test_reads_of_the_newest_version_never_open_an_envelope_still_being_encrypted(tmp_path: Path) -> None:
    """A transaction's read and `update` read a key's newest version, in flight included. A put
    at `sync` enters its envelope before encrypting into it (GIL released): such a read waits
    until that commit is durable (so finished), and never opens the envelope half written --
    which it reported as a damaged value (SealDamagedError) of a sound store."""
    values = [bytes([65 + t]) * (64 << 10) for t in range(4)]  # 64 KiB: ~20 µs of AES a put
    with wal.open(tmp_path, encryption=KEY, durability="sync") as store:
        store.put(b"k", values[0])
        stop = threading.Event()
        seen: list[bytes | None] = []
        errors: list[BaseException] = []

        def reader() -> None:
            while not stop.is_set():
                try:
                    with store.transaction() as tx:
                        seen.append(tx.get(b"k"))
                    store.update(b"k", lambda v: v)  # reads the newest, writes it back
                except BaseException as exc:  # any error fails the test below
                    errors.append(exc)
                    return

        def writer(t: int) -> None:
            for _ in range(300):
                store.put(b"k", values[t])

        threads = [threading.Thread(target=reader)] + [threading.Thread(target=writer, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads[1:]:
            th.join(timeout=120)
        stop.set()
        threads[0].join(timeout=60)
        assert errors == [] and not any(th.is_alive() for th in threads)
        assert store.stats()["finished_later"] >= 600  # the C path, mostly (a busy lock sends some to Python)
        assert len(seen) > 10 and set(seen) <= set(values)
        assert store.get(b"k") in values


@needs_c_path
@pytest.mark.parametrize("size", [4 << 10, 8 << 20])
def test_a_read_of_a_value_being_sealed_gets_it_whole_and_a_version_read_never_waits(tmp_path: Path,
                                                                                    size: int) -> None:
    """A put's fdatasync slowed to 1 s: its version is read at once, and so is its value, whole,
    whether the read found it encrypted already, waited the few microseconds of its AES (4 KiB)
    or, once the AES outlasts the spin (8 MiB: milliseconds), waited for the commit to be
    durable. A conflict check against the in-flight version passes."""
    value = os.urandom(size)
    with wal.open(tmp_path, encryption=KEY, durability="sync") as store:
        old = store.put(b"k", b"old")
        before = store.stats()["finished_later"]
        failpoints.slow("fsync", 1.0)
        try:
            putting = threading.Thread(target=store.put, args=(b"k", value))
            putting.start()
            with store.transaction() as tx:
                while tx.version(b"k") == old:  # until the put is in the overlay
                    pass
                version = tx.version(b"k")
                durable_at_version = store.watermarks.durable
                got = tx.get(b"k")
            with store.transaction() as tx:
                tx.put(b"k", b"checked", if_version=version)
        finally:
            failpoints.clear()
        putting.join(timeout=30)
        assert version is not None and version > old and store.stats()["finished_later"] == before + 1
        assert durable_at_version < version  # read while its fdatasync was still under way
        assert got == value and store.get(b"k") == b"checked"


FINISHED_LATER_RUN = textwrap.dedent("""
    import os, sys, threading
    import wal
    s = wal.open(sys.argv[1], encryption=bytes(range(32)), durability="sync")
    value = lambda t, i: (b"%d/%d:" % (t, i)) * (40 + i)
    ts = [threading.Thread(target=lambda t=t: [s.put(b"t%d/%d" % (t, i), value(t, i)) for i in range(150)])
          for t in range(8)]
    [t.start() for t in ts]; [t.join() for t in ts]
    print(s.stats()["finished_later"], flush=True)
    os._exit(0)  # no close, no checkpoint: the reopen replays the log
""")


@needs_c_path
def test_records_finished_later_from_many_threads_replay_from_the_log_whole(tmp_path: Path) -> None:
    """Eight threads put at `sync`, the process ends without a close, and the reopen replays the
    log: every record the C put finished later passed its CRC and opens with the key."""
    out = subprocess.run([sys.executable, "-c", FINISHED_LATER_RUN, str(tmp_path)], check=True, timeout=120,
                         capture_output=True, text=True)
    assert int(out.stdout) > 0  # most puts took the C path (a busy commit lock sends some to Python)
    with wal.open(tmp_path, encryption=KEY) as store:
        assert store.stats()["records_replayed"] > 0
        for t in range(8):
            for i in range(150):
                assert store.get(b"t%d/%d" % (t, i)) == (b"%d/%d:" % (t, i)) * (40 + i)
