"""The command line on sealed stores: `agentwal rekey`, export and import of sealed values, the
reading commands that need no key and show no plaintext, and `get` / `scan`, which show values
(decompressed without a key, decrypted with --key-file, refused without it). Real subprocesses,
real stores."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import crcmod.predefined
import pytest
from archive_helpers import wait_until

import wal
from wal.crypto.sealing import key_id
from wal.store.store import Store

OLD = bytes(range(32))
NEW = bytes(range(100, 132))
SECRET = b"the-board-minutes-say-merger-with-acme"
_crc32c = crcmod.predefined.mkCrcFun("crc-32c")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wal", *args], capture_output=True, text=True, errors="replace",
                          timeout=120, stdin=subprocess.DEVNULL, check=False)


@pytest.fixture
def keys(tmp_path: Path) -> tuple[str, str]:
    (tmp_path / "old.key").write_bytes(OLD)
    (tmp_path / "new.key").write_text(NEW.hex() + "\n")
    return str(tmp_path / "old.key"), str(tmp_path / "new.key")


def test_rekey_rewrites_every_value_and_blob_so_the_old_key_can_be_retired(tmp_path: Path,
                                                                            keys: tuple[str, str]) -> None:
    from wal.agents import AgentStore  # noqa: PLC0415

    store_dir = tmp_path / "store"
    with wal.open(store_dir, encryption=OLD) as store:
        for i in range(2500):
            store.put(f"k/{i}", SECRET + b" %d" % i)
        AgentStore(store, "a", blob_threshold=64).append("t", SECRET * 10)
    with wal.open(store_dir, encryption=[NEW, OLD]) as store:
        store.put(b"k/new", b"already new")
    old_file, new_file = keys
    r = run("rekey", str(store_dir), "--key-file", old_file)  # the new key missing: k/new cannot be read
    assert r.returncode == 1 and f"b'k/new' in the store at {store_dir} is encrypted under key id " \
        f"{key_id(NEW).hex()}" in r.stderr
    r = run("rekey", str(store_dir), "--key-file", new_file, "--key-file", old_file)
    assert r.returncode == 0, r.stderr
    # 2,500 values, the thread record and its event; the blob file of the event
    assert "2502 value(s) and 1 blob file(s) rewritten" in r.stdout and key_id(OLD).hex() in r.stdout
    with wal.open(store_dir, encryption=NEW) as store:  # the old key retired
        assert store.get("k/7") == SECRET + b" 7" and store.get(b"k/new") == b"already new"
        assert {env[1:9] for _, env in Store.scan(store)} == {key_id(NEW)}
        assert AgentStore(store, "a").read("t").__next__()[1] == SECRET * 10
    with pytest.raises(wal.WrongKeyError):
        wal.open(store_dir, encryption=OLD)
    assert run("rekey", str(store_dir)).returncode == 2  # no key: a usage error


def test_after_rekey_a_store_whose_store_file_is_lost_refuses_an_open_with_only_a_retired_key(
        tmp_path: Path, keys: tuple[str, str]) -> None:
    """Rekey retired the old key from STORE but not from the state's record of its sealing,
    which an open with STORE lost is held to: that open with only the old key was accepted,
    wrote a STORE listing it again, and sealed new values under the retired key."""
    store_dir = tmp_path / "store"
    with wal.open(store_dir, encryption=OLD) as store:
        store.put("a", b"1")
    with wal.open(store_dir, encryption=[NEW, OLD]) as store:
        store.put("b", b"2")
    old_file, new_file = keys
    assert run("rekey", str(store_dir), "--key-file", new_file, "--key-file", old_file).returncode == 0
    (store_dir / "STORE").rename(tmp_path / "STORE.saved")
    with pytest.raises(wal.WrongKeyError):
        wal.open(store_dir, encryption=OLD)
    assert not (store_dir / "STORE").exists()
    with wal.open(store_dir, encryption=NEW) as store:  # the key the store is under: the way back
        assert store.get("a") == b"1" and store.get("b") == b"2"
        store.put("c", b"3")
        assert {env[1:9] for _, env in Store.scan(store)} == {key_id(NEW)}


def test_rekey_of_values_larger_than_one_record_together_commits_them_in_several_transactions(
        tmp_path: Path, keys: tuple[str, str]) -> None:
    """A transaction is one log record (16 MiB at most): 20 values of 1 MiB are rewritten in
    transactions bounded by their bytes, not 1,000 keys at a time (which was over the limit)."""
    store_dir = tmp_path / "store"
    with wal.open(store_dir, encryption=OLD) as store:
        for i in range(20):
            store.put(f"big/{i}", bytes([i]) * (1 << 20))
    old_file, new_file = keys
    r = run("rekey", str(store_dir), "--key-file", new_file, "--key-file", old_file)
    assert r.returncode == 0, r.stderr
    assert "20 value(s)" in r.stdout
    with wal.open(store_dir, encryption=NEW) as store:
        assert all(store.get(f"big/{i}") == bytes([i]) * (1 << 20) for i in range(20))


def test_rekey_of_a_compressed_store_keeps_its_values_compressed(tmp_path: Path, keys: tuple[str, str]) -> None:
    """The command line has no compression option: a store holding compressed values is
    rewritten compressed (codec 0x81), not whole (0x80, many times the bytes)."""
    store_dir = tmp_path / "store"
    turns = [{"role": "user", "content": f"summarise the quarterly report {i}"} for i in range(200)]
    value = json.dumps(turns).encode()
    with wal.open(store_dir, encryption=OLD, compression="zstd") as store:
        for i in range(50):
            store.put(f"conv/{i}", value)

    def codecs_and_bytes() -> tuple[set[int], int]:
        with wal.open(store_dir, encryption=[NEW, OLD]) as store:
            envelopes = [env for _, env in Store.scan(store)]
            return {env[0] for env in envelopes}, sum(map(len, envelopes))

    codecs, before = codecs_and_bytes()
    assert codecs == {0x81}
    old_file, new_file = keys
    r = run("rekey", str(store_dir), "--key-file", new_file, "--key-file", old_file)
    assert r.returncode == 0, r.stderr
    codecs, after = codecs_and_bytes()
    assert codecs == {0x81} and after == before
    info = run("info", str(store_dir))  # says how the values are kept, needing no key
    assert f"values:      encrypted (key id {key_id(NEW).hex()}), compressed (zstd)" in info.stdout, info.stdout
    with wal.open(store_dir, encryption=NEW) as store:
        assert store.get("conv/7") == value


def test_verify_of_an_encrypted_archive_uses_the_key_file(tmp_path: Path, keys: tuple[str, str]) -> None:
    """`agentwal verify URL --key-file K` reads the archive with the key, as `restore` does (it
    was refused as needing a key), and without one it is refused as encrypted."""
    old_file, _ = keys
    url = f"file://{tmp_path}/a"
    with wal.open(tmp_path / "s", archive=url, encryption=OLD) as store:
        store.put("k", SECRET)
    r = run("verify", url, "--key-file", old_file)
    assert r.returncode == 0 and "sound" in r.stdout, r.stderr
    r = run("verify", url)
    assert r.returncode == 1 and "is encrypted" in r.stderr, r.stderr


def test_repair_of_an_encrypted_store_exports_its_state_so_the_printed_import_restores_its_values(
        tmp_path: Path, keys: tuple[str, str]) -> None:
    """repair exports the state it sets aside, and says to import it to put the newer values
    back. A sealed store's state holds envelopes: exported as plain values, that import wrote
    every key's ciphertext back as its value. Now it is exported as `export` does, sealed."""
    from wal import ops  # noqa: PLC0415

    old_file, _ = keys
    store_dir = tmp_path / "store"
    committed = {f"key/{i:03d}".encode(): SECRET + b" %d" % i for i in range(20)}
    with wal.open(store_dir, encryption=OLD) as store:
        for k, v in committed.items():
            store.put(k, v)
    segment = ops.info(str(store_dir))["segments"][0]
    with open(segment["path"], "r+b") as f:  # damage mid-log: the state is ahead of the last good record
        f.seek(segment["end_offset"] // 2)
        byte = f.read(1)
        f.seek(segment["end_offset"] // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    r = run("repair", str(store_dir), "--yes", "--key-file", old_file)
    assert r.returncode == 0, r.stderr
    [export] = store_dir.glob("state.backup-*.jsonl")
    text = export.read_text()
    assert SECRET.decode() not in text and all('"sealed"' in line for line in text.splitlines()[1:-1])
    assert json.loads(text.splitlines()[-1])["end"]["lines"] == len(committed)  # framed, as `export`'s
    r = run("import", str(store_dir), str(export), "--key-file", old_file)
    assert r.returncode == 0, r.stderr
    with wal.open(store_dir, encryption=OLD) as store:
        assert dict(store.scan(b"key/")) == committed


def test_after_rekey_the_archive_ships_a_snapshot_so_a_restore_from_then_on_needs_only_the_new_key(
        tmp_path: Path, keys: tuple[str, str]) -> None:
    old_file, new_file = keys
    url = (tmp_path / "archive").as_uri()
    store_dir = tmp_path / "store"
    with wal.open(store_dir, archive=url, encryption=OLD) as store:
        for i in range(200):
            store.put(f"k/{i}", SECRET + b" %d" % i)
        before_rekey = store.put("k/last-old", b"under the old key")
    # rekey ships the rewrite and a snapshot of it to the archive the store ships to (archive.json)
    r = run("rekey", str(store_dir), "--key-file", new_file, "--key-file", old_file)
    assert r.returncode == 0, r.stderr
    assert "with a snapshot at LSN" in r.stdout
    # the old key retired: a writer's open reads the archive's newest objects, under the new key now
    with wal.open(store_dir, archive=url, encryption=NEW) as store:
        end = store.put("k/after", b"new")
    snaps = sorted((tmp_path / "archive" / "snap").iterdir())
    newest = snaps[-1].read_bytes()
    assert int(snaps[-1].stem) > before_rekey and newest[1:9] == key_id(NEW)
    # The newest point needs the new key alone: every value in its snapshot is under it.
    wal.restore(url, tmp_path / "latest", encryption=NEW)
    with wal.open(tmp_path / "latest", encryption=NEW) as store:
        assert store.get("k/7") == SECRET + b" 7" and store.get("k/after") == b"new"
        assert {env[1:9] for _, env in Store.scan(store)} == {key_id(NEW)}
        assert store.stats()["applied_lsn"] == end
    # A point before the rekey is in objects sealed under the old key: it needs that key, and says so.
    with pytest.raises(wal.MissingKeyError) as exc:
        wal.restore(url, tmp_path / "before", lsn=100, encryption=NEW)
    assert key_id(OLD).hex() in str(exc.value) and not (tmp_path / "before").exists()
    wal.restore(url, tmp_path / "before", lsn=before_rekey, encryption=[NEW, OLD])
    with wal.open(tmp_path / "before", encryption=[NEW, OLD]) as store:
        assert store.get("k/last-old") == b"under the old key" and store.get("k/after") is None


def test_an_archived_open_after_a_rotation_ships_a_snapshot_under_the_new_key(tmp_path: Path) -> None:
    url = (tmp_path / "archive").as_uri()
    with wal.open(tmp_path / "s", archive=url, encryption=OLD) as store:
        store.put("a", SECRET)
    with wal.open(tmp_path / "s", archive=url, encryption=[NEW, OLD]) as store:
        store.put("b", b"new")
        lsn = store.put("c", b"new")
    snaps = sorted((tmp_path / "archive" / "snap").iterdir())
    assert [p.read_bytes()[1:9] for p in snaps] == [key_id(OLD), key_id(NEW)]
    # An open that finds its newest snapshot under the current key ships none: one per rotation.
    with wal.open(tmp_path / "s", archive=url, encryption=[NEW, OLD]) as store:
        store.put("d", b"new")
    assert len(list((tmp_path / "archive" / "snap").iterdir())) == 2
    wal.restore(url, tmp_path / "r", lsn=lsn, encryption=[NEW, OLD])
    with wal.open(tmp_path / "r", encryption=[NEW, OLD]) as store:
        assert store.get("a") == SECRET and store.get("c") == b"new" and store.get("d") is None


@pytest.mark.parametrize("sized", [False, True], ids=["rotation-only", "with-size-snapshots"])
def test_a_rotation_snapshot_that_finds_its_lsn_shipped_under_the_old_key_is_taken_once_the_state_moves(
        tmp_path: Path, sized: bool) -> None:
    """sized: a snapshot due to its size, taken while the state (applied lazily) is still at the
    LSN whose name is taken, collides too, and must not count as the rotation's."""
    url = (tmp_path / "archive").as_uri()
    with wal.open(tmp_path / "s", archive=url, encryption=OLD) as store:
        store.put("a", SECRET)
        old_lsn = store._ship_snapshot_now()  # the archive's newest snapshot, under OLD, of the state's LSN
    opts: dict[str, int] = {"archive_snapshot_bytes": 1, "apply_interval_ms": 30_000} if sized else {}
    with wal.open(tmp_path / "s", archive=url, encryption=[NEW, OLD], **opts) as store:
        # The writer's first snapshot, due to the rotation, is of that LSN again: its name is taken.
        wait_until(lambda: store.stats()["archive_snapshots"] >= 1)
        lsn = store.put("b", b"new")
        if sized:
            wait_until(lambda: store.stats()["archive_snapshots"] >= 2)  # of old_lsn again: not applied yet
            assert store.stats()["applied_lsn"] == old_lsn
    assert lsn == old_lsn + 1
    newest = sorted((tmp_path / "archive" / "snap").iterdir())[-1]
    assert newest.name == f"{lsn:020d}.snap" and newest.read_bytes()[1:9] == key_id(NEW)
    # The new key alone opens the archive's newest objects; "a" is sealed under OLD in them still.
    wal.restore(url, tmp_path / "r", encryption=NEW)
    with wal.open(tmp_path / "r", encryption=[NEW, OLD]) as store:
        assert store.get("a") == SECRET and store.get("b") == b"new"


def test_rekey_of_a_store_unchanged_since_its_archived_snapshot_moves_to_a_new_lsn_for_the_new_keys_snapshot(
        tmp_path: Path, keys: tuple[str, str]) -> None:
    """Nothing to rewrite (its one value deleted), and the archive's newest snapshot, under the
    old key, is of the state's LSN: a snapshot under the new key cannot take that name."""
    old_file, new_file = keys
    url = (tmp_path / "archive").as_uri()
    with wal.open(tmp_path / "s", archive=url, encryption=OLD) as store:
        store.put("a", SECRET)
        store.delete("a")
        assert store._ship_snapshot_now() == 2
    r = run("rekey", str(tmp_path / "s"), "--key-file", new_file, "--key-file", old_file)
    assert r.returncode == 0, r.stderr
    newest = sorted((tmp_path / "archive" / "snap").iterdir())[-1]
    assert newest.name == "00000000000000000003.snap" and newest.read_bytes()[1:9] == key_id(NEW)
    wal.restore(url, tmp_path / "r", encryption=NEW)  # the retired key is not needed
    with wal.open(tmp_path / "r", encryption=NEW) as store:
        assert store.get("a") is None and store.stats()["applied_lsn"] == 3


def test_an_import_into_an_encrypted_store_checks_every_value_against_its_limit_before_writing_any(
        tmp_path: Path, keys: tuple[str, str]) -> None:
    """A value under the plain limit but over an encrypted store's was refused only at its own
    batch, after the batches before it were committed: "a bad line means nothing is written"."""
    import base64  # noqa: PLC0415

    _, new_file = keys
    source = tmp_path / "in.jsonl"
    with open(source, "w") as f:
        for i in range(3):
            f.write(json.dumps({"key": f"k{i}", "value": "v"}) + "\n")
        huge = base64.b64encode(bytes(16_773_100)).decode()
        f.write(json.dumps({"key": "huge", "value": {"base64": huge}}) + "\n")
    r = run("import", str(tmp_path / "s"), str(source), "--create", "--unframed", "--key-file", new_file,
            "--batch", "1")
    assert r.returncode == 2 and "nothing was imported" in r.stderr, r.stderr
    with wal.open(tmp_path / "s", encryption=NEW) as store:
        assert list(store.scan("")) == []


def test_the_command_asked_for_a_key_names_its_option(tmp_path: Path, keys: tuple[str, str]) -> None:
    """The messages named only wal.open's encryption= argument."""
    _, new_file = keys
    with wal.open(tmp_path / "s", encryption=OLD) as store:
        store.put("old", SECRET)
    with wal.open(tmp_path / "s", encryption=[NEW, OLD]) as store:
        store.put("new", b"v")
    r = run("put", str(tmp_path / "s"), "k2", "v")
    assert r.returncode == 1 and "--key-file" in r.stderr, r.stderr
    r = run("get", str(tmp_path / "s"), "old", "--key-file", new_file)  # its value needs OLD too
    assert r.returncode == 1 and "one more --key-file" in r.stderr, r.stderr


def test_export_of_an_encrypted_store_needs_no_key_holds_no_plaintext_and_imports_with_the_key(
        tmp_path: Path, keys: tuple[str, str]) -> None:
    _, new_file = keys
    with wal.open(tmp_path / "src", encryption=NEW, compression="zstd") as store:
        for i in range(50):
            store.put(f"k/{i}", SECRET * 5 + b" %d" % i)
    r = run("export", str(tmp_path / "src"), "-o", str(tmp_path / "backup.jsonl"))
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "backup.jsonl").read_text()
    lines = [json.loads(line) for line in text.splitlines()[1:-1]]  # between the export's first and end lines
    assert len(lines) == 50 and all("sealed" in line and "value" not in line for line in lines)
    assert SECRET.decode() not in text and "board" not in text
    for command in (["info"], ["verify"], ["scan", "k/", "--keys-only"]):  # reading needs no key
        r = run(command[0], str(tmp_path / "src"), *command[1:])
        assert r.returncode == 0, (command, r.stderr)
        assert SECRET.decode() not in r.stdout
    r = run("import", str(tmp_path / "copy"), str(tmp_path / "backup.jsonl"), "--create")
    assert r.returncode == 1 and f"encrypted under key id {key_id(NEW).hex()}" in r.stderr  # no key: refused
    assert not (tmp_path / "copy").exists()  # before anything was created
    r = run("import", str(tmp_path / "copy"), str(tmp_path / "backup.jsonl"), "--create", "--key-file", new_file)
    assert r.returncode == 0, r.stderr
    with wal.open(tmp_path / "copy", encryption=NEW) as copy:  # a new store made with the key: encrypted
        assert copy.get("k/3") == SECRET * 5 + b" 3"
    with wal.open(tmp_path / "dst", encryption=OLD):
        pass
    r = run("import", str(tmp_path / "dst"), str(tmp_path / "backup.jsonl"), "--key-file", keys[0],
            "--key-file", new_file)
    assert r.returncode == 0, r.stderr
    with wal.open(tmp_path / "dst", encryption=OLD) as dst:  # sealed again under the target's key
        assert dst.get("k/49") == SECRET * 5 + b" 49" and Store.get(dst, b"k/49")[1:9] == key_id(OLD)


def test_a_compressed_stores_export_imports_into_an_encrypted_store_and_a_mixed_export_is_refused(
        tmp_path: Path, keys: tuple[str, str]) -> None:
    """The README's way to encrypt an existing store, from a compressed one: its export's
    envelopes are not encrypted, and are opened without the target's key (a sealer with keys
    refused them as a downgrade). An export mixing encrypted and unencrypted values (changed
    after it was made) is refused before anything is written."""
    _, new_file = keys
    long_value = b'{"role": "user", "content": "' + SECRET * 20 + b'"}'
    with wal.open(tmp_path / "src", compression="zstd") as store:
        store.put("long", long_value)  # compressed: codec 0x01
        store.put("short", b"tiny")  # under the threshold: codec 0x00
    assert run("export", str(tmp_path / "src"), "-o", str(tmp_path / "plain.jsonl")).returncode == 0
    r = run("import", str(tmp_path / "enc"), str(tmp_path / "plain.jsonl"), "--create", "--key-file", new_file)
    assert r.returncode == 0, r.stderr
    with wal.open(tmp_path / "enc", encryption=NEW) as store:
        assert store.get("long") == long_value and store.get("short") == b"tiny"
        assert {env[0] & 0x80 for _, env in Store.scan(store)} == {0x80}  # sealed again, encrypted

    with wal.open(tmp_path / "sealed", encryption=NEW) as store:
        store.put("secret", SECRET)
    assert run("export", str(tmp_path / "sealed"), "-o", str(tmp_path / "enc.jsonl")).returncode == 0
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text((tmp_path / "plain.jsonl").read_text() + (tmp_path / "enc.jsonl").read_text())
    r = run("import", str(tmp_path / "other"), str(mixed), "--create", "--key-file", new_file)
    assert r.returncode == 1 and "a line after the export's end line" in r.stderr, r.stderr  # two joined
    # Their key lines alone, unframed (as lines written by hand are):
    key_lines = [line for name in ("plain.jsonl", "enc.jsonl")
                 for line in (tmp_path / name).read_text().splitlines()[1:-1]]
    mixed.write_text("\n".join(key_lines) + "\n")
    r = run("import", str(tmp_path / "other"), str(mixed), "--create", "--key-file", new_file, "--unframed")
    assert r.returncode == 2 and "mixes encrypted and unencrypted values" in r.stderr, r.stderr
    assert not (tmp_path / "other").exists()


def test_a_plaintext_line_forged_into_an_encrypted_export_is_refused(tmp_path: Path, keys: tuple[str, str]) -> None:
    """A "value" line among an encrypted export's lines, under checksums made again (they are
    not keyed: anyone can make them): no store exports one, so it can only be forged. It was
    imported, and the new encrypted store answered the forged value beside the real ones."""
    _, new_file = keys
    with wal.open(tmp_path / "sealed", encryption=NEW) as store:
        store.put("k/0", SECRET)
        store.put("k/1", SECRET + b"-1")
    with wal.open(tmp_path / "plain") as store:
        store.put("k/1", b"FORGED")
    for name in ("sealed", "plain"):
        assert run("export", str(tmp_path / name), "-o", str(tmp_path / f"{name}.jsonl")).returncode == 0
    sealed_lines = (tmp_path / "sealed.jsonl").read_text().splitlines()
    forged_line = (tmp_path / "plain.jsonl").read_text().splitlines()[1]
    assert json.loads(forged_line)["value"]
    body = [sealed_lines[1], forged_line]
    end = {"end": {"lines": 2, "crc32c": _crc32c("".join(line + "\n" for line in body).encode())}}
    forged = tmp_path / "forged.jsonl"
    forged.write_text("\n".join([sealed_lines[0], *body, json.dumps(end)]) + "\n")
    r = run("import", str(tmp_path / "new"), str(forged), "--create", "--key-file", new_file)
    assert r.returncode == 2 and "mixes encrypted and unencrypted values" in r.stderr, r.stderr
    assert not (tmp_path / "new").exists()
    # The same lines with the encrypted one in place of the forged one: imported.
    sealed_body = sealed_lines[1:-1]
    end = {"end": {"lines": 2, "crc32c": _crc32c("".join(line + "\n" for line in sealed_body).encode())}}
    forged.write_text("\n".join([sealed_lines[0], *sealed_body, json.dumps(end)]) + "\n")
    r = run("import", str(tmp_path / "new"), str(forged), "--create", "--key-file", new_file)
    assert r.returncode == 0, r.stderr
    with wal.open(tmp_path / "new", encryption=NEW) as store:
        assert store.get("k/1") == SECRET + b"-1"


def test_a_plain_stores_export_imports_into_a_new_compressed_store_as_the_refusal_says(tmp_path: Path) -> None:
    """`compression=` on a plain store is refused with the way to a compressed copy: export, then
    import with --create and --compression zstd. `agentwal import` had no --compression: the way
    the message gave could not be taken."""
    long_value = b'{"role": "user", "content": "' + SECRET * 20 + b'"}'
    with wal.open(tmp_path / "src") as store:
        store.put("long", long_value)
    with pytest.raises(wal.ArgumentError, match="--compression zstd") as refused:
        wal.open(tmp_path / "src", compression="zstd")
    assert "agentwal import NEW all.jsonl --create" in str(refused.value)
    assert run("export", str(tmp_path / "src"), "-o", str(tmp_path / "all.jsonl")).returncode == 0
    r = run("import", str(tmp_path / "zstd"), str(tmp_path / "all.jsonl"), "--create", "--compression", "zstd")
    assert r.returncode == 0, r.stderr
    with wal.open(tmp_path / "zstd") as store:  # a compressed store: it opens without the option
        assert store.get("long") == long_value
        assert [env[0] for _, env in Store.scan(store)] == [0x01]  # stored compressed (codec zstd)


def test_export_of_a_store_with_blob_files_is_refused_rather_than_carry_references_to_missing_files(
        tmp_path: Path) -> None:
    """An AgentStore's large values are blob files its keys reference: an export carried the
    references without the files, and its import reported success with the values missing."""
    from wal.agents import AgentStore  # noqa: PLC0415

    with wal.open(tmp_path / "src") as store:
        AgentStore(store, "a", blob_threshold=64).append("t", SECRET * 10)
    r = run("export", str(tmp_path / "src"), "-o", str(tmp_path / "backup.jsonl"))
    assert r.returncode == 2 and "blob file(s)" in r.stderr and "does not carry" in r.stderr, r.stderr
    assert not (tmp_path / "backup.jsonl").exists() and not (tmp_path / "backup.jsonl.tmp").exists()
    with wal.open(tmp_path / "small") as store:
        AgentStore(store, "a").append("t", SECRET)  # under the threshold: inline, no blob file
    assert run("export", str(tmp_path / "small"), "-o", str(tmp_path / "small.jsonl")).returncode == 0


def test_get_and_scan_show_a_compressed_stores_values_without_a_key(tmp_path: Path) -> None:
    value = b'{"role": "assistant", "content": "' + b"the tool returned forty rows " * 40 + b'"}'
    with wal.open(tmp_path / "s", compression="zstd") as store:
        store.put("m/1", value)
        store.put("m/2", b"short")  # under the threshold: stored uncompressed, in a plain envelope
        assert Store.get(store, b"m/1")[0] == 0x01  # really a zstd envelope on disk
    r = run("get", str(tmp_path / "s"), "m/1")
    assert r.returncode == 0 and r.stdout.encode() == value, r.stderr
    (tmp_path / "k.key").write_bytes(OLD)
    for extra in ([], ["--key-file", str(tmp_path / "k.key")]):  # a key given for it opens nothing: ignored
        r = run("scan", str(tmp_path / "s"), "m/", "--json", *extra)
        assert r.returncode == 0, r.stderr
        assert [(d["key"], d["value"]) for d in map(json.loads, r.stdout.splitlines())] == [
            ("m/1", value.decode()), ("m/2", "short")]


def test_get_and_scan_of_an_encrypted_store_decrypt_with_key_file_and_refuse_without_it(
        tmp_path: Path, keys: tuple[str, str]) -> None:
    old_file, new_file = keys
    store_dir = str(tmp_path / "s")
    with wal.open(store_dir, encryption=OLD, compression="zstd") as store:
        store.put("k/a", SECRET)
        store.put("k/b", SECRET * 20)  # compressed, then encrypted
    with wal.open(store_dir, encryption=[NEW, OLD]) as store:
        store.put("k/c", b"under the new key")  # written by the process that now holds the store
        for command in (["get", store_dir, "k/b", "--key-file", new_file, "--key-file", old_file],
                        ["scan", store_dir, "k/", "--key-file", new_file, "--key-file", old_file]):
            r = run(*command)  # read-only: works beside the writer, the commit read from the log
            assert r.returncode == 0, (command, r.stderr)
    r = run("get", store_dir, "k/b", "--key-file", new_file, "--key-file", old_file)
    assert r.returncode == 0 and r.stdout.encode() == SECRET * 20, r.stderr
    r = run("scan", store_dir, "k/", "--json", "--key-file", new_file, "--key-file", old_file)
    assert r.returncode == 0, r.stderr
    assert [(d["key"], d["value"]) for d in map(json.loads, r.stdout.splitlines())] == [
        ("k/a", SECRET.decode()), ("k/b", (SECRET * 20).decode()), ("k/c", "under the new key")]
    ids = f"{key_id(OLD).hex()}, {key_id(NEW).hex()}"
    for command in (["get", store_dir, "k/a"], ["scan", store_dir, "k/"], ["scan", store_dir, "--json"]):
        r = run(*command)  # no key: a clear error naming the option, and no bytes of any value
        assert r.returncode == 1 and r.stdout == "", (command, r.stdout)
        assert f"the store at {store_dir} is encrypted (key ids {ids})" in r.stderr and "--key-file" in r.stderr
    r = run("get", store_dir, "k/c", "--key-file", old_file)  # the old key alone: k/c is not under it
    assert r.returncode == 1 and f"encrypted under key id {key_id(NEW).hex()}" in r.stderr and SECRET.decode() \
        not in r.stdout
    (tmp_path / "other.key").write_bytes(bytes(range(200, 232)))
    r = run("scan", store_dir, "--key-file", str(tmp_path / "other.key"))  # none of its keys: refused first
    assert r.returncode == 1 and "a wrong key?" in r.stderr and r.stdout == ""
    r = run("scan", store_dir, "k/", "--keys-only")  # the keys are plain: listing them needs no key
    assert r.returncode == 0 and r.stdout.split() == ["k/a", "k/b", "k/c"], r.stderr


def test_retention_after_the_old_key_is_retired_keeps_shipping_and_keeps_what_it_cannot_read(
        tmp_path: Path, keys: tuple[str, str], caplog: pytest.LogCaptureFixture) -> None:
    """After `agentwal rekey` the old key may go, while the objects and snapshots sealed under it
    are still in the archive. Retention reads headers (a snapshot's taken time, a group object's
    end): one under a key no longer given raised MissingKeyError out of the maintenance job, and
    every retention check stopped shipping with an ERROR. Such objects are now kept, unread."""
    old_file, new_file = keys
    url = (tmp_path / "archive").as_uri()
    store_dir = tmp_path / "store"
    with wal.open(store_dir, archive=url, encryption=OLD, archive_snapshot_bytes=4096, archive_rpo_ms=50) as store:
        for i in range(120):
            store.put(f"k/{i}", SECRET + b" %d" % i)
            if i % 40 == 0:
                time.sleep(0.3)
    time.sleep(1.5)
    assert run("rekey", str(store_dir), "--key-file", new_file, "--key-file", old_file).returncode == 0
    caplog.set_level(logging.ERROR, logger="wal")
    with wal.open(store_dir, archive=url, encryption=NEW, archive_retention_s=1.0, archive_rpo_ms=50) as store:
        for i in range(25):
            end = store.put(f"n/{i}", b"new")
            time.sleep(0.1)
        deadline = time.monotonic() + 10
        while store.stats()["archived_lsn"] < end and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.stats()["archive_error"] is None and store.stats()["archived_lsn"] == end
    assert not [r for r in caplog.records if "stopped" in r.getMessage()]
    wal.restore(url, tmp_path / "r", encryption=NEW)
    with wal.open(tmp_path / "r", encryption=NEW) as restored:
        assert restored.get("n/24") == b"new" and restored.get("k/7") == SECRET + b" 7"


def test_rekey_reports_the_applied_lsn_of_the_state_its_new_snapshot_holds(tmp_path: Path) -> None:
    """Where the snapshot needed an empty transaction of its own, the report gave the LSN before
    it: applied_lsn 2 beside archive_snapshot_lsn 3."""
    from wal.ops import rekey, use_sealing  # noqa: PLC0415

    url = (tmp_path / "archive").as_uri()
    with wal.open(tmp_path / "s", archive=url, encryption=OLD) as store:
        store.put("a", SECRET)
        store.delete("a")
        assert store._ship_snapshot_now() == 2
    use_sealing(encryption=[NEW, OLD])
    try:
        result = rekey(str(tmp_path / "s"))
    finally:
        use_sealing()
    assert result["archive_snapshot_lsn"] == result["applied_lsn"] == 3
