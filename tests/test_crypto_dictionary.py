"""A trained zstd dictionary given once is stored with the store (``dicts/``, sealed like a
value, so encrypted in an encrypted store) and named in STORE: later opens -- writers,
read-only openers, operator tools -- read and compress with it without being given it again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import zstandard
from archive_helpers import wait_until

import wal
from wal.archive.objects import open_objects
from wal.archive.sealed import SealedObjects, for_reading
from wal.crypto import sealing
from wal.crypto.sealing import CODEC_ZSTD
from wal.errors import CorruptionError, SealDamagedError
from wal.ops import rekey, use_sealing
from wal.store.sealed import DICT_DIR, read_meta

KEY = bytes(range(32))
KEY2 = bytes(range(1, 33))
MARK = b"quasar-lantern"  # in every sample, so in the dictionary trained on them


def samples(n: int = 2000) -> list[bytes]:
    return [json.dumps({"role": "tool", "call_id": f"call_{i}", "name": "search", "note": MARK.decode(),
                        "result": {"status": "ok", "hits": i % 7, "query": f"q{i}"}}).encode() for i in range(n)]


@pytest.fixture(scope="module")
def zdict() -> bytes:
    return sealing.train_dictionary(samples(), 4096)


def frame_dict_id(raw: bytes) -> int:
    assert raw[0] == CODEC_ZSTD, raw[:4]
    return int(zstandard.get_frame_parameters(raw[1:]).dict_id)


def raw_value(store: wal.Store, key: bytes) -> bytes:
    raw = wal.Store.get(store, key)
    assert raw is not None
    return raw


def test_a_dictionary_given_once_is_stored_and_used_by_every_later_open(tmp_path: Path, zdict: bytes) -> None:
    did = zstandard.ZstdCompressionDict(zdict).dict_id()
    values = samples(200)
    with wal.open(tmp_path, compression="zstd", compression_dict=zdict, compression_threshold=32) as store:
        for i, v in enumerate(values[:100]):
            store.put(f"r/{i}", v)
    assert os.listdir(tmp_path / DICT_DIR) == [f"{did:08x}.zdict"]
    assert (read_meta(str(tmp_path)) or {})["sealed"]["dict"] == f"{did:08x}"
    # A writer given only compression="zstd": reads the old values, compresses new ones with it.
    with wal.open(tmp_path, compression="zstd", compression_threshold=32) as store:
        assert [store.get(f"r/{i}") for i in range(100)] == values[:100]
        store.put("r/new", values[150])
        assert frame_dict_id(raw_value(store, b"r/new")) == did
        # Compressed with the dictionary: far smaller than without it.
        assert len(raw_value(store, b"r/new")) * 2 < len(values[150])
    # No options at all, and read-only: every value reads.
    with wal.open(tmp_path) as store:
        assert store.get("r/new") == values[150]
    with wal.open(tmp_path, readonly=True) as reader:
        assert [reader.get(f"r/{i}") for i in range(100)] == values[:100]


def test_a_dictionary_in_an_encrypted_store_is_encrypted_and_rekeyed(tmp_path: Path, zdict: bytes) -> None:
    assert MARK in zdict  # the dictionary holds fragments of the values it was trained on
    with wal.open(tmp_path, encryption=KEY, compression="zstd", compression_dict=zdict,
                  compression_threshold=32) as store:
        store.put("a", samples(1)[0])
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert MARK not in path.read_bytes(), path
    with pytest.raises(wal.WrongKeyError):
        wal.open(tmp_path, encryption=KEY2)
    with wal.open(tmp_path, encryption=[KEY2, KEY], compression="zstd") as store:  # rotation: new writes under KEY2
        store.put("b", samples(2)[1])
    use_sealing(encryption=[KEY2, KEY])
    try:
        rekey(str(tmp_path))
    finally:
        use_sealing()
    with wal.open(tmp_path, encryption=KEY2) as store:  # the old key retired, the dictionary rewritten under KEY2
        assert store.get("a") == samples(1)[0] and store.get("b") == samples(2)[1]
    (dict_file,) = (tmp_path / DICT_DIR).iterdir()
    assert dict_file.read_bytes()[1:9] == sealing.key_id(KEY2)


def test_a_damaged_or_missing_stored_dictionary_is_a_clean_error(tmp_path: Path, zdict: bytes) -> None:
    with wal.open(tmp_path, encryption=KEY, compression="zstd", compression_dict=zdict,
                  compression_threshold=32) as store:
        store.put("a", samples(1)[0])
    (dict_file,) = (tmp_path / DICT_DIR).iterdir()
    good = dict_file.read_bytes()
    damaged = bytearray(good)
    damaged[len(damaged) // 2] ^= 0x01
    dict_file.write_bytes(bytes(damaged))
    with pytest.raises(SealDamagedError, match="dictionary file"):
        wal.open(tmp_path, encryption=KEY)
    dict_file.unlink()
    with pytest.raises(CorruptionError, match="is missing") as exc:
        wal.open(tmp_path, encryption=KEY, compression="zstd")
    assert exc.value.path == str(dict_file)
    dict_file.write_bytes(good)  # put back: all is well again
    with wal.open(tmp_path, encryption=KEY) as store:
        assert store.get("a") == samples(1)[0]


def test_a_store_written_before_dictionaries_were_stored_opens_and_stores_it(tmp_path: Path, zdict: bytes) -> None:
    """A store from before: values compressed with a dictionary, no dicts/ and no "dict" in STORE.
    It reads as before when given the dictionary, and from then on keeps it."""
    with wal.open(tmp_path, compression="zstd", compression_dict=zdict, compression_threshold=32) as store:
        store.put("a", samples(1)[0])
    meta_path = tmp_path / "STORE"
    meta = json.loads(meta_path.read_bytes())
    del meta["sealed"]["dict"]
    meta_path.write_text(json.dumps(meta))
    for f in (tmp_path / DICT_DIR).iterdir():
        f.unlink()
    (tmp_path / DICT_DIR).rmdir()
    with wal.open(tmp_path, compression="zstd") as store, pytest.raises(wal.MissingKeyError, match="dictionary"):
        store.get("a")
    with wal.open(tmp_path, compression_dict=zdict) as store:
        assert store.get("a") == samples(1)[0]
    with wal.open(tmp_path) as store:
        assert store.get("a") == samples(1)[0]


def test_an_archive_holds_the_dictionary_and_a_restore_keeps_it_in_the_restored_store(
        tmp_path: Path, zdict: bytes) -> None:
    url = (tmp_path / "archive").as_uri()
    values = samples(50)
    with wal.open(tmp_path / "src", archive=url, compression="zstd", compression_dict=zdict,
                  compression_threshold=32) as store:
        for i, v in enumerate(values):
            store.put(f"r/{i}", v)
    # The archive holds the dictionary (dict/<id>.zdict, never compressed), so a restore needs
    # nothing but the URL, and the restored store keeps it.
    assert [p.name for p in (tmp_path / "archive" / "dict").iterdir()] == os.listdir(tmp_path / "src" / DICT_DIR)
    wal.restore(url, tmp_path / "restored")
    assert os.listdir(tmp_path / "restored" / DICT_DIR) == os.listdir(tmp_path / "src" / DICT_DIR)
    with wal.open(tmp_path / "restored") as store:
        assert [store.get(f"r/{i}") for i in range(50)] == values
    with wal.follow(url, tmp_path / "follower", poll_ms=50) as replica:  # a follower too
        assert replica.get("r/49") == values[49]
    assert os.listdir(tmp_path / "follower" / DICT_DIR) == os.listdir(tmp_path / "src" / DICT_DIR)
    # A damaged dictionary object is refused by name, and nothing is left at the target.
    (obj,) = (tmp_path / "archive" / "dict").iterdir()
    raw = bytearray(obj.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    obj.write_bytes(bytes(raw))
    with pytest.raises(wal.WalError, match="dict/"):
        wal.restore(url, tmp_path / "again")
    assert not (tmp_path / "again").exists()


@pytest.mark.parametrize("encryption", [None, KEY], ids=["compressed", "encrypted"])
def test_every_flipped_byte_of_a_stored_dictionary_gives_the_values_or_a_wal_error(
        tmp_path: Path, zdict: bytes, encryption: bytes | None) -> None:
    values = samples(30)
    with wal.open(tmp_path, encryption=encryption, compression="zstd", compression_dict=zdict,
                  compression_threshold=32) as store:
        for i, v in enumerate(values):
            store.put(f"r/{i}", v)
    (dict_file,) = (tmp_path / DICT_DIR).iterdir()
    good = dict_file.read_bytes()
    outcomes = {"values": 0, "error": 0}
    # The envelope's header and the dictionary's, then every 23rd byte of the rest.
    for at in [*range(min(64, len(good))), *range(64, len(good), 23)]:
        damaged = bytearray(good)
        damaged[at] ^= 0x5A
        dict_file.write_bytes(bytes(damaged))
        try:
            with wal.open(tmp_path, encryption=encryption) as store:
                got = [store.get(f"r/{i}") for i in range(len(values))]
        except wal.WalError:
            outcomes["error"] += 1
            continue
        assert got == values, at  # never a wrong value
        outcomes["values"] += 1
    dict_file.write_bytes(good)
    # Every byte is covered: by the AEAD tag, and in any case by the dictionary's SHA-256.
    assert outcomes == {"values": 0, "error": outcomes["error"]} and outcomes["error"] > 64


def test_after_a_key_rotation_the_archive_holds_the_dictionary_under_the_new_key_too(
        tmp_path: Path, zdict: bytes) -> None:
    did = zstandard.ZstdCompressionDict(zdict).dict_id()
    url = (tmp_path / "archive").as_uri()
    with wal.open(tmp_path / "src", archive=url, encryption=KEY, compression="zstd", compression_dict=zdict,
                  compression_threshold=32) as store:
        store.put("a", samples(1)[0])
    with wal.open(tmp_path / "src", archive=url, encryption=[KEY2, KEY], compression="zstd",
                  compression_threshold=32) as store:
        store.put("b", samples(2)[1])
    names = sorted(p.name for p in (tmp_path / "archive" / "dict").iterdir())
    assert names == sorted(f"{did:08x}.{sealing.key_id(k).hex()}.zdict" for k in (KEY, KEY2))
    for key in (KEY, KEY2):  # either key alone finds a copy it can open
        objects, _ = for_reading(open_objects(url), {"encryption": key})
        assert isinstance(objects, SealedObjects) and did in objects.sealer.dictionaries
    wal.restore(url, tmp_path / "restored", encryption=[KEY2, KEY])
    with wal.open(tmp_path / "restored", encryption=[KEY2, KEY]) as store:
        assert store.get("a") == samples(1)[0] and store.get("b") == samples(2)[1]


def test_an_export_carries_the_dictionaries_so_an_import_needs_only_the_key(tmp_path: Path, zdict: bytes) -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from wal.ops import export_lines, import_pairs, parse_import  # noqa: PLC0415

    values = samples(120)
    with wal.open(tmp_path / "src", encryption=KEY, compression="zstd", compression_dict=zdict,
                  compression_threshold=32) as store:
        for i, v in enumerate(values):
            store.put(f"r/{i}", v)
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY)
    backup = tmp_path / "backup.jsonl"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "wal", *args], capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL, check=False)

    r = run("export", str(tmp_path / "src"), "-o", str(backup))
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in backup.read_text().splitlines()[1:-1]]  # inside the export's frame
    did = zstandard.ZstdCompressionDict(zdict).dict_id()
    assert lines[0]["zstd_dictionary"] == f"{did:08x}" and len(lines) == 121  # the dictionary first
    assert MARK.decode() not in backup.read_text()  # the dictionary is sealed: encrypted with the store
    r = run("import", str(tmp_path / "copy"), str(backup), "--create", "--key-file", str(key_file))
    assert r.returncode == 0, r.stderr
    with wal.open(tmp_path / "copy", encryption=KEY) as copy:
        assert [copy.get(f"r/{i}") for i in range(120)] == values
    # Without the dictionary's line the compressed values cannot be opened: refused before any write
    # (the key lines alone, unframed: in the export, the frame's end line refuses a line dropped).
    without = tmp_path / "without.jsonl"
    without.write_text("".join(line + "\n" for line in backup.read_text().splitlines()[2:-1]))
    r = run("import", str(tmp_path / "copy2"), str(without), "--create", "--key-file", str(key_file), "--unframed")
    assert r.returncode == 1 and f"{did:08x}" in r.stderr and not (tmp_path / "copy2").exists()
    # A changed byte in the dictionary's envelope: a clean error naming it, nothing written.
    text = list(export_lines(str(tmp_path / "src")))[1:-1]  # unframed, as above
    first = json.loads(text[0])
    envelope = bytearray(__import__("base64").b64decode(first["sealed"]["base64"]))
    envelope[len(envelope) // 2] ^= 1
    first["sealed"] = {"base64": __import__("base64").b64encode(bytes(envelope)).decode()}
    read = parse_import(iter([json.dumps(first), *text[1:]]), "changed", unframed=True)
    use_sealing(encryption=KEY)
    try:
        with pytest.raises(SealDamagedError, match=f"exported zstd dictionary {did:08x}"):
            import_pairs(str(tmp_path / "copy3"), read.pairs, create=True, dictionaries=read.dictionaries)
    finally:
        use_sealing()
    assert not (tmp_path / "copy3").exists()


@pytest.mark.parametrize("encrypted", [True, False])
def test_a_dictionary_given_with_the_id_of_another_stored_one_is_refused(tmp_path: Path, encrypted: bool) -> None:
    """Two trained dictionaries with one zstd id (one retrained with a fixed dict_id): a frame
    names its dictionary by id only. The open given the second is refused, naming the stored
    file, and changes nothing. (It was accepted and compressed with it, but never stored it:
    every later open decoded those values with the first, into errors, and in an encrypted
    store, whose frames carry no checksum, into other bytes.)"""
    weather = [json.dumps({"role": "user", "content": f"the weather in city {i % 13} is {i % 5}"}).encode()
               for i in range(3000)]
    flights = [json.dumps({"tool": "flights", "from": f"A{i % 11}", "price": i % 900}).encode() for i in range(3000)]
    first = zstandard.train_dictionary(4096, weather, dict_id=777).as_bytes()
    second = zstandard.train_dictionary(4096, flights, dict_id=777).as_bytes()
    assert first != second
    keys = {"encryption": KEY} if encrypted else {}
    with wal.open(tmp_path, compression="zstd", compression_dict=first, compression_threshold=32, **keys) as store:
        store.put("w", weather[0])
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with pytest.raises(wal.ArgumentError, match=r"dicts/00000309\.zdict: the zstd dictionary 00000309 has other"):
        wal.open(tmp_path, compression="zstd", compression_dict=second, compression_threshold=32, **keys)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    with wal.open(tmp_path, compression="zstd", **keys) as store:
        assert store.get("w") == weather[0]
    with pytest.raises(wal.ArgumentError, match="other contents"):
        sealing.Sealer(None, "zstd", dictionaries=[first, second])


def test_a_dictionary_too_few_samples_train_is_refused_as_an_argument() -> None:
    with pytest.raises(wal.ArgumentError, match="no zstd dictionary could be trained from 5 sample"):
        sealing.train_dictionary([b"x" * 10] * 5)


def test_a_dictionary_or_threshold_without_compression_is_refused(tmp_path: Path, zdict: bytes) -> None:
    """Without compression="zstd" they mean nothing: a dictionary alone made a "sealed" store that
    compressed nothing, and a threshold alone was dropped without a word."""
    for name, options in (("d", {"compression_dict": zdict}), ("t", {"compression_threshold": 32}),
                          ("e", {"encryption": bytes(range(32)), "compression_dict": zdict})):
        with pytest.raises(wal.ArgumentError, match=f"{next(k for k in options if k.startswith('compression'))} "
                                                    'given without compression="zstd"'):
            wal.open(tmp_path / name, **options)
        assert not (tmp_path / name).exists()
    wal.open(tmp_path / "plain").close()
    with pytest.raises(wal.ArgumentError, match="does not"):
        wal.open(tmp_path / "plain", compression_threshold=32)
    assert "sealed" not in read_meta(str(tmp_path / "plain"))
    # A store created compressing takes them alone: it compresses as its STORE records.
    wal.open(tmp_path / "z", compression="zstd").close()
    with wal.open(tmp_path / "z", compression_threshold=32, compression_dict=zdict) as store:
        store.put("a", b"x")


def test_a_rotated_writer_seals_the_stored_dictionary_under_the_new_key(tmp_path: Path, zdict: bytes) -> None:
    """Every open reads every stored dictionary: one left sealed under the old key kept the store
    from opening with the new key alone, though the values written under it needed only that
    one. A writer given both keys seals it again under the new one."""
    with wal.open(tmp_path, encryption=KEY, compression="zstd", compression_dict=zdict,
                  compression_threshold=32) as store:
        store.put("old", samples(1)[0])
    with wal.open(tmp_path, encryption=[KEY2, KEY], compression="zstd", compression_threshold=32) as store:
        store.put("new", samples(2)[1])
    for path in (tmp_path / DICT_DIR).iterdir():
        assert sealing.parse(path.read_bytes())[1] == sealing.key_id(KEY2)
    with wal.open(tmp_path, encryption=KEY2, compression="zstd", compression_threshold=32) as store:
        assert store.get("new") == samples(2)[1]
        with pytest.raises(wal.MissingKeyError, match=sealing.key_id(KEY).hex()):
            store.get("old")


@pytest.mark.parametrize("writer, follower", [
    ({"compression": "zstd"}, {}),
    ({"encryption": KEY, "compression": "zstd", "compression_dict": "zdict"}, {"encryption": KEY}),
], ids=["plain-follower-of-a-compressing-writer", "keyed-follower-of-a-writer-with-a-dictionary"])
def test_a_standby_started_before_a_compressing_writer_reads_its_values(
        tmp_path: Path, zdict: bytes, writer: dict, follower: dict) -> None:
    """A follower started on an archive that held nothing never loaded the writer's dictionaries
    once it shipped (stuck: "compressed with zstd dictionary ..., which was not given"), and one
    given no options read a compressing writer's objects as plain ("damaged"). Once objects come,
    it is opened as a follower started then would be, its empty store made again from them."""
    writer = {k: (zdict if v == "zdict" else v) for k, v in writer.items()}
    (tmp_path / "a").mkdir()
    url = f"file://{tmp_path}/a"
    values = samples(200)
    standby = wal.follow(url, tmp_path / "f", poll_ms=20, **follower)
    try:
        with wal.open(tmp_path / "s", archive=url, **writer) as store:
            for i, value in enumerate(values):
                store.put(f"k/{i}", value, durability="replicated" if i == len(values) - 1 else None)
        wait_until(lambda: standby.lsn == len(values))
        assert standby.stats()["follower_error"] is None
        assert all(standby.get(f"k/{i}") == value for i, value in enumerate(values))
    finally:
        standby.close()


@pytest.mark.parametrize("keyed", [False, True], ids=["compressed", "encrypted-and-compressed"])
def test_readers_opened_before_their_writer_first_compresses_with_a_dictionary_read_its_values(
        tmp_path: Path, zdict: bytes, keyed: bool) -> None:
    """A read-only handle and a follower, both opened while the writer compressed without a
    dictionary, then the writer reopened with one: each loaded the dictionaries once, at its
    open, and every value compressed with the new one was "compressed with zstd dictionary ...,
    which was not given" (the follower stopped applying, for good, and its promotion failed).
    They now read the stored one (dicts/, the archive's dict/) when a value first names it, and
    the follower keeps it in its own store, for its reads and once promoted."""
    key = {"encryption": KEY} if keyed else {}
    url = f"file://{tmp_path}/a"
    values = samples(40)
    with wal.open(tmp_path / "s", archive=url, compression="zstd", compression_threshold=32, **key) as store:
        store.put("plain/0", values[0], durability="replicated")
    reader = wal.open(tmp_path / "s", readonly=True, **key)
    standby = wal.follow(url, tmp_path / "f", poll_ms=20, **key)
    try:
        wait_until(lambda: standby.lsn == 1)
        # The writer, in another process (LMDB takes one handle per process), given a dictionary.
        (tmp_path / "zdict").write_bytes(zdict)
        script = textwrap.dedent(f"""
            import sys
            import wal
            values = [bytes.fromhex(h) for h in sys.stdin.read().split()]
            with wal.open({str(tmp_path / "s")!r}, archive={url!r}, compression="zstd", compression_threshold=32,
                          compression_dict=open({str(tmp_path / "zdict")!r}, "rb").read(), **{key!r}) as store:
                for i, value in enumerate(values):
                    store.put(f"d/{{i}}", value, durability="replicated")
            """)
        subprocess.run([sys.executable, "-c", script], input=" ".join(v.hex() for v in values), text=True, check=True)
        assert (tmp_path / "s" / DICT_DIR).is_dir()
        assert all(reader.get(f"d/{i}") == value for i, value in enumerate(values))
        wait_until(lambda: standby.lsn == 1 + len(values))
        assert standby.stats()["follower_error"] is None
        assert all(standby.get(f"d/{i}") == value for i, value in enumerate(values))
        assert sorted(os.listdir(tmp_path / "f" / DICT_DIR)) == sorted(os.listdir(tmp_path / "s" / DICT_DIR))
        promoted = standby.promote()
        try:
            assert promoted.get("d/0") == values[0]
            promoted.put("after", values[1])
        finally:
            promoted.close()
    finally:
        reader.close()
        standby.close()


def test_a_value_naming_a_dictionary_nowhere_stored_looks_for_it_at_most_once_a_second(
        tmp_path: Path, zdict: bytes) -> None:
    """Each read of a value compressed with a dictionary the store does not hold (damage, or one
    never given) read every stored dictionary again: a scan of dicts/ (an archive: a LIST and a
    GET of each) per read. One look a second at most; the reads still say which is missing."""
    with wal.open(tmp_path, compression="zstd", compression_threshold=32) as store:
        store.put("k", b"v" * 64)
    other = bytes([CODEC_ZSTD]) + zstandard.ZstdCompressor(
        dict_data=zstandard.ZstdCompressionDict(zdict)).compress(samples(1)[0] * 2)
    with wal.open(tmp_path, compression="zstd", compression_threshold=32) as store:
        sealer = store._sealer  # type: ignore[attr-defined]
        looks = []
        learn = sealer.learn_dictionaries
        sealer.learn_dictionaries = lambda: looks.append(1) or learn()
        for _ in range(200):
            with pytest.raises(wal.MissingKeyError, match="compressed with zstd dictionary"):
                sealer.open(other, b"ctx", lambda: "a value")
        assert len(looks) == 1


def test_a_stored_dictionary_that_says_it_is_compressed_is_damage_not_a_dictionary_to_look_for(
        tmp_path: Path, zdict: bytes) -> None:
    """A stored dictionary is never compressed. One whose codec byte says zstd, with a frame
    naming an unknown dictionary, was opened as any value: its dictionary looked for, which read
    this one again, under the lock the look holds (the reader hung). It is damage, named."""
    url = f"file://{tmp_path}/a"
    with wal.open(tmp_path / "s", archive=url, compression="zstd", compression_threshold=32) as store:
        store.put("k", b"v" * 100, durability="replicated")
    frame = zstandard.ZstdCompressor(dict_data=zstandard.ZstdCompressionDict(zdict)).compress(b"x" * 5000)
    (tmp_path / "a" / "dict").mkdir(exist_ok=True)
    (tmp_path / "a" / "dict" / "0badd1c7.zdict").write_bytes(bytes([CODEC_ZSTD]) + frame)
    with pytest.raises(SealDamagedError, match=r"dict/0badd1c7.zdict .* never compressed"):
        for_reading(open_objects(url), {"compression": "zstd"})
