"""The operator's command line: `agentwal info`, `verify`, `dump`, `get`/`put`/`delete`/`scan`, `export`/`import`,
`checkpoint`, `repair`, `tail`, `stats`.

Every test runs the real command (``python -m wal ...``) as a subprocess against a real store
made here, damaged by hand where the test says so, the way a person at a terminal would.
Tests marked "while a writer runs" start a second process that holds the writer lock and
commits, to check that the read-only commands never need it and the writing ones refuse
clearly.
"""

from __future__ import annotations

import base64
import io
import json
import mmap
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crcmod.predefined
import lmdb
import pytest

import wal
from wal import cli, ops

COMMANDS = ("info", "verify", "dump", "get", "put", "delete", "scan", "export", "import", "checkpoint", "compact",
            "rekey", "repair", "tail", "stats", "restore", "follow", "archive")


def run(*args: str, stdin: str | bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`agentwal ARGS` in a subprocess; stdin defaults to /dev/null (never a terminal)."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    proc = subprocess.run([sys.executable, "-m", "wal", *args], input=data,
                          stdin=subprocess.DEVNULL if data is None else None, capture_output=True,
                          timeout=timeout, check=False)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(errors="replace"),
                                       proc.stderr.decode(errors="replace"))


def run_bytes(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "wal", *args], stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=60, check=False)


BINARY_KEY = b"\xff\x00bin/key"
BINARY_VALUE = bytes(range(256))


def make_store(path: Path, commits: int = 120, segment_bytes: int = 4096) -> Path:
    """A closed store with several sealed segments: agent keys, a deletion, binary data, an idempotent txn."""
    with wal.open(path, segment_bytes=segment_bytes) as store:
        for i in range(commits):
            store.put(f"agent/{i % 4}/step", str(i).encode())
        store.put("agent/7/msg/000001", b'{"role": "user", "content": "hi\\nthere"}')
        store.put("scratch", b"x")
        store.delete("scratch")
        store.put(BINARY_KEY, BINARY_VALUE)
        with store.transaction(idempotency_key="step-1") as tx:
            tx.put("agent/7/step", b"1")
            tx.put("agent/7/tool/000001", b"{}")
    return path


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return make_store(tmp_path / "store")


def records(path: Path) -> list[dict[str, object]]:
    """The log's records with their segment and offset, read in-process (no LMDB handle involved)."""
    return list(ops.dump(str(path)))


def segment_files(path: Path) -> list[Path]:
    return sorted((path / "log").glob("*.wal"))


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(1)
        f.seek(offset)
        f.write(bytes([old[0] ^ 0x5A]))


def damage_sealed_segment(store_path: Path) -> tuple[Path, int, int]:
    """Flip a payload byte of a record in the first (sealed) segment; returns (segment, record offset, LSN)."""
    first_segment = segment_files(store_path)[0].name
    recs = [r for r in records(store_path) if r["segment"] == first_segment]
    victim = recs[len(recs) // 2]
    seg = store_path / "log" / first_segment
    flip_byte(seg, int(victim["offset"]) + 24 + 2)  # type: ignore[call-overload]
    return seg, int(victim["offset"]), int(victim["lsn"])  # type: ignore[call-overload]


def tear_tail(store_path: Path) -> tuple[Path, int]:
    """Write a partial record after the last one of the newest segment, as a crash mid-write leaves."""
    last = segment_files(store_path)[-1]
    end = max(int(r["offset"]) + 24 + ((int(r["bytes"]) + 7) & ~7)  # type: ignore[call-overload]
              for r in records(store_path) if r["segment"] == last.name)
    with open(last, "r+b") as f:
        f.seek(end)
        f.write(b"\x11\x22\x33\x44" + b"\x40\x00\x00\x00" + b"partial record")
    return last, end


# ---- a writer in another process ----------------------------------------------------------------------

# Commits one put per line read on stdin ("put KEY VALUE"), prints "ok LSN"; exits on EOF.
STEPPED_WRITER = r"""
import sys, wal
store = wal.open(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    _, key, value = line.split()
    print("ok", store.put(key, value.encode()), flush=True)
store.close()
"""


class Writer:
    """A process holding the store's writer lock; `put` commits through it."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", STEPPED_WRITER, str(path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def put(self, key: str, value: str) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"put {key} {value}\n")
        self.proc.stdin.flush()
        word, lsn = self.proc.stdout.readline().split()
        assert word == "ok"
        return int(lsn)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture
def writer(store: Path) -> Iterator[Writer]:
    w = Writer(store)
    try:
        yield w
    finally:
        if w.proc.poll() is None:
            w.close()


class LineReader:
    """Lines of a running process's stdout, read by one thread, taken with a timeout."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self._lines: queue.Queue[str] = queue.Queue()

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self._lines.put(line)

        threading.Thread(target=pump, daemon=True).start()

    def take(self, count: int, timeout: float) -> list[str]:
        """Up to `count` lines, waiting at most `timeout` seconds in all."""
        out: list[str] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            try:
                out.append(self._lines.get(timeout=max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                break
        return out


# ---- help -------------------------------------------------------------------------------------------------


def test_every_command_has_help_saying_what_it_does_and_whether_it_needs_the_writer_lock() -> None:
    top = run("--help")
    assert top.returncode == 0
    for name in COMMANDS:
        assert name in top.stdout
        result = run(name, "--help")
        assert result.returncode == 0, result.stderr
        assert "example" in result.stdout
        assert ("Read-only" in result.stdout) != ("Writes: opens the store as its one writer" in result.stdout), name


def test_the_top_help_names_every_command_that_needs_the_writer_lock() -> None:
    """Its list, written by hand, left out compact and rekey: it names those README does."""
    top = " ".join(run("--help").stdout.split())
    listed = re.search(r"open; (.*?) need the writer lock", top)
    assert listed is not None, top
    named = set(re.split(r", | and ", listed.group(1)))
    readme = " ".join((Path(__file__).parent.parent / "README.md").read_text().split())
    documented = re.search(r"Commands that write \((.*?)\) open the store as its one writer", readme)
    assert documented is not None
    assert named == set(re.findall(r"`(\w+)`", documented.group(1))), named
    assert {"compact", "rekey"} <= named


def test_the_command_table_keeps_the_demo() -> None:
    assert cli.COMMANDS[0].name == "demo"
    assert {c.name for c in cli.COMMANDS} == {"demo", "crashtest", *COMMANDS}


def test_a_path_that_is_not_a_store_is_a_usage_error(tmp_path: Path) -> None:
    result = run("info", str(tmp_path / "missing"))
    assert result.returncode == 2
    assert "no such directory" in result.stderr
    (tmp_path / "empty").mkdir()
    result = run("get", str(tmp_path / "empty"), "k")
    assert result.returncode == 2
    assert "not an agentwal store" in result.stderr
    (tmp_path / "notes.txt").write_text("hi")
    result = run("info", str(tmp_path / "notes.txt"))
    assert result.returncode == 2 and "a file, not a directory" in result.stderr


def test_a_missing_input_file_is_named_without_python_errno_text(tmp_path: Path) -> None:
    result = run("import", str(tmp_path / "s"), str(tmp_path / "missing.jsonl"))
    assert result.returncode == 1
    assert result.stderr.strip() == f"agentwal import: error: {tmp_path / 'missing.jsonl'}: No such file or directory"
    assert not (tmp_path / "s").exists()


# ---- info ----------------------------------------------------------------------------------------------


def test_info_shows_versions_watermarks_segments_and_size(store: Path) -> None:
    result = run("info", str(store))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "store format 6" in out and "log format 1" in out
    assert "writer:      not running" in out
    assert "values:      not encrypted, not compressed" in out and "role:" not in out
    assert "applied LSN" in out and "to replay" in out
    for seg in segment_files(store):
        assert seg.name in out
    data = json.loads(run("info", str(store), "--json").stdout)
    assert data["kind"] == "store" and data["follower_of"] is None
    assert data["sealing"] == {"encrypted": False, "key_ids": [], "compression": "none"}
    assert data["log"]["last_lsn"] == data["watermarks"]["applied_lsn"] == len(records(store))
    assert data["log"]["segments"] == len(segment_files(store)) > 2
    assert [s["status"] for s in data["segments"]][:-1] == ["sealed"] * (len(data["segments"]) - 1)
    assert data["total_bytes"] > 0
    assert isinstance(data["warnings"], list)
    # The store was closed, which checkpoints it: info said "none yet" (close wrote no note).
    assert data["checkpoint"]["applied_lsn"] == data["watermarks"]["applied_lsn"], data["checkpoint"]


def test_info_verify_dump_and_tail_work_on_a_bare_log(tmp_path: Path) -> None:
    with wal.Log.open(tmp_path / "log") as log:
        log.append_many([b"event-%d" % i for i in range(5)])
    info = json.loads(run("info", str(tmp_path / "log"), "--json").stdout)
    assert info["kind"] == "log" and info["log"]["records"] == 5
    assert run("verify", str(tmp_path / "log")).returncode == 0
    dumped = [json.loads(line) for line in run("dump", str(tmp_path / "log")).stdout.splitlines()]
    assert [d["payload"] for d in dumped] == [f"event-{i}" for i in range(5)]
    tailed = [json.loads(line) for line in run("tail", str(tmp_path / "log"), "-n", "2").stdout.splitlines()]
    assert [d["lsn"] for d in tailed] == [4, 5]


# ---- verify --------------------------------------------------------------------------------------------


def test_verify_says_a_sound_store_is_sound(store: Path) -> None:
    result = run("verify", str(store))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "result: sound" in result.stdout
    report = json.loads(run("verify", str(store), "--json").stdout)
    assert report["sound"] is True and report["problems"] == []
    assert report["keys_checked"] == report["state_keys"] > 0


def test_verify_finds_a_flipped_byte_in_a_sealed_segment_naming_file_and_offset(store: Path) -> None:
    seg, offset, _lsn = damage_sealed_segment(store)
    result = run("verify", str(store))
    assert result.returncode == 1, result.stdout
    assert "DAMAGED" in result.stdout
    damage = [line for line in result.stdout.splitlines() if "DAMAGE (log)" in line]
    assert damage and str(seg) in damage[0] and f"offset {offset}" in damage[0]
    report = json.loads(run("verify", str(store), "--json").stdout)
    assert report["sound"] is False
    assert any(p["path"] == str(seg) and p["offset"] == offset for p in report["problems"])


def test_verify_finds_the_state_disagreeing_with_the_log(store: Path) -> None:
    env = lmdb.open(str(store / "state"), max_dbs=4, subdir=True)
    data = env.open_db(b"data")
    with env.begin(write=True, db=data) as txn:
        raw = txn.get(b"agent/1/step")
        # A well-formed entry (FORMAT.md §16: version with its flag, CRC-32C, value) whose value no
        # commit wrote: its own checksum holds, only the log can tell.
        version = int.from_bytes(raw[:8], "little") & ~(3 << 62)
        crc = crcmod.predefined.mkCrcFun("crc-32c")(b"agent/1/step" + version.to_bytes(8, "little") + b"tampered")
        txn.put(b"agent/1/step", raw[:8] + crc.to_bytes(4, "little") + b"tampered")
    env.close()
    result = run("verify", str(store))
    assert result.returncode == 1
    assert "agent/1/step" in result.stdout and "differs" in result.stdout


def test_verify_reports_a_torn_tail_as_a_warning_and_strict_makes_it_damage(store: Path) -> None:
    tear_tail(store)
    result = run("verify", str(store))
    assert result.returncode == 0, result.stdout
    assert "warning: torn tail" in result.stdout
    assert run("verify", str(store), "--strict").returncode == 1


# ---- dump ----------------------------------------------------------------------------------------------


def test_dump_prints_transactions_as_json_lines_with_binary_data_marked(store: Path) -> None:
    result = run("dump", str(store))
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["lsn"] for r in lines] == list(range(1, len(lines) + 1))
    ops_seen = [op for r in lines for op in r["ops"]]
    assert {"op": "delete", "key": "scratch"} in ops_seen
    binary = next(op for op in ops_seen if op["op"] == "put" and isinstance(op["key"], dict))
    assert base64.b64decode(binary["key"]["base64"]) == BINARY_KEY
    assert base64.b64decode(binary["value"]["base64"]) == BINARY_VALUE
    assert lines[-1]["idempotency_key"] == "step-1"
    assert {"time", "time_ms", "segment", "offset", "bytes"} <= set(lines[-1])
    assert any(op.get("value") == '{"role": "user", "content": "hi\\nthere"}' for op in ops_seen)


def test_dump_from_and_to_lsn_and_raw(store: Path) -> None:
    lines = [json.loads(x) for x in run("dump", str(store), "--from-lsn", "5", "--to-lsn", "9").stdout.splitlines()]
    assert [r["lsn"] for r in lines] == [5, 6, 7, 8, 9]
    raw = [json.loads(x) for x in
           run("dump", str(store), "--from-lsn", "5", "--to-lsn", "5", "--raw").stdout.splitlines()]
    assert "payload" in raw[0] and "ops" not in raw[0]
    assert run("dump", str(store), "--from-lsn", "9", "--to-lsn", "5").returncode == 2


def test_dump_stops_at_damage_and_salvage_reads_past_it(store: Path) -> None:
    total = len(records(store))
    seg, offset, lsn = damage_sealed_segment(store)
    strict = run("dump", str(store))
    assert strict.returncode == 1
    assert [json.loads(x)["lsn"] for x in strict.stdout.splitlines()] == list(range(1, lsn))
    assert "--salvage" in strict.stderr and str(seg) in strict.stderr
    salvage = run("dump", str(store), "--salvage")
    assert salvage.returncode == 0, salvage.stderr
    got = [json.loads(x)["lsn"] for x in salvage.stdout.splitlines()]
    assert got == [n for n in range(1, total + 1) if n != lsn]  # everything but the damaged record
    assert f"skipped {seg.name} bytes {offset}.." in salvage.stderr
    assert f"LSN {lsn} lost" in salvage.stderr


def test_dump_salvage_reads_records_of_a_segment_whose_header_is_damaged(store: Path) -> None:
    total = len(records(store))
    second = segment_files(store)[1]
    in_second = [int(r["lsn"]) for r in records(store) if r["segment"] == second.name]  # type: ignore[call-overload]
    flip_byte(second, 40)  # the salt, under the header CRC
    salvage = run("dump", str(store), "--salvage")
    assert salvage.returncode == 0
    assert [json.loads(x)["lsn"] for x in salvage.stdout.splitlines()] == list(range(1, total + 1))
    assert "segment header" in salvage.stderr
    assert in_second


# ---- get / put / delete / scan ----------------------------------------------------------------------------


def test_get_prints_the_value_exactly_and_json_on_request(store: Path) -> None:
    result = run_bytes("get", str(store), "agent/7/step")
    assert result.returncode == 0 and result.stdout == b"1"
    key64 = base64.b64encode(BINARY_KEY).decode()
    assert run_bytes("get", str(store), key64, "--base64-key").stdout == BINARY_VALUE
    data = json.loads(run("get", str(store), "agent/7/step", "--json").stdout)
    assert data["key"] == "agent/7/step" and data["value"] == "1" and data["version"] == len(records(store))
    missing = run("get", str(store), "no/such/key")
    assert missing.returncode == 1 and "no key" in missing.stderr


def test_get_sees_commits_the_state_has_not_applied_yet(tmp_path: Path) -> None:
    """After a writer is killed, the log may hold commits LMDB does not; get reads them from the log."""
    path = tmp_path / "store"
    child = subprocess.run([sys.executable, "-c", (
        "import os, sys, wal\n"
        "s = wal.open(sys.argv[1], apply_interval_ms=60000)\n"
        "s.put('k', b'v1')\n"
        "s.put('late', b'only in the log')\n"
        "os._exit(0)\n"), str(path)], check=False, timeout=60)
    assert child.returncode == 0
    assert run_bytes("get", str(path), "late").stdout == b"only in the log"
    assert "late" in run("scan", str(path)).stdout


def test_put_from_argument_file_and_stdin_then_delete(store: Path, tmp_path: Path) -> None:
    result = run("put", str(store), "agent/9/note", "hello")
    assert result.returncode == 0, result.stderr
    lsn = int(re.search(r"at LSN (\d+)", result.stdout).group(1))  # type: ignore[union-attr]
    assert json.loads(run("get", str(store), "agent/9/note", "--json").stdout)["version"] == lsn
    (tmp_path / "plan.bin").write_bytes(b"\x00\x01plan")
    assert run("put", str(store), "agent/9/plan", "--file", str(tmp_path / "plan.bin")).returncode == 0
    assert run_bytes("get", str(store), "agent/9/plan").stdout == b"\x00\x01plan"
    assert run("put", str(store), "agent/9/piped", stdin='{"paused": true}').returncode == 0
    assert run("get", str(store), "agent/9/piped").stdout == '{"paused": true}'
    # The commit went through the log like any other.
    assert records(store)[-1]["ops"] == [{"op": "put", "key": "agent/9/piped", "value": '{"paused": true}'}]
    deleted = run("delete", str(store), "agent/9/note")
    assert deleted.returncode == 0 and "deleted" in deleted.stdout
    assert run("get", str(store), "agent/9/note").returncode == 1
    again = run("delete", str(store), "agent/9/note")
    assert again.returncode == 1 and "nothing was committed" in again.stderr


def test_put_if_version_refuses_a_stale_version(store: Path) -> None:
    version = json.loads(run("get", str(store), "agent/7/step", "--json").stdout)["version"]
    stale = run("put", str(store), "agent/7/step", "2", "--if-version", str(version - 1))
    assert stale.returncode == 1 and "conflict on key" in stale.stderr
    assert run("put", str(store), "agent/7/step", "2", "--if-version", str(version)).returncode == 0
    assert run("put", str(store), "brand/new", "x", "--if-version", "0").returncode == 0


def test_put_needs_a_value_and_an_existing_store_unless_create(tmp_path: Path) -> None:
    assert run("put", str(tmp_path / "new"), "k", "v").returncode == 2
    assert run("put", str(tmp_path / "new"), "k", "v", "--create").returncode == 0
    assert run("get", str(tmp_path / "new"), "k").stdout == "v"


def test_scan_lists_keys_under_a_prefix_in_order(store: Path) -> None:
    result = run("scan", str(store), "agent/")
    assert result.returncode == 0
    keys = [line.split(" = ")[0] for line in result.stdout.splitlines()]
    assert keys == sorted(keys) and keys[0] == "agent/0/step" and "agent/7/tool/000001" in keys
    assert "scratch" not in run("scan", str(store)).stdout
    assert run("scan", str(store), "agent/", "--keys-only", "--limit", "2").stdout.split() == [
        "agent/0/step", "agent/1/step"]
    as_json = [json.loads(x) for x in run("scan", str(store), "agent/7/", "--json").stdout.splitlines()]
    assert [x["key"] for x in as_json] == ["agent/7/msg/000001", "agent/7/step", "agent/7/tool/000001"]


# ---- export / import -----------------------------------------------------------------------------------


def key_lines(lines: list[str]) -> list[str]:
    """An export's key lines: not its first line and its end line (wal/ops/transfer.py)."""
    assert json.loads(lines[0]) == {"agentwal_export": 1} and "end" in json.loads(lines[-1])
    return lines[1:-1]


def test_export_import_round_trip_with_binary_keys_and_values(store: Path, tmp_path: Path) -> None:
    with wal.open(store) as s:
        s.put(b"\x00\x01", b"\xff\xfe\x00")
        s.put("text/\u00e9t\u00e9", "\u00e9t\u00e9 \u2603\n".encode())
        s.put("bell", b"ring\x07")
        expected = {k: v for k, v in s.scan()}
    exported = run("export", str(store), "-o", str(tmp_path / "backup.jsonl"))
    assert exported.returncode == 0, exported.stderr
    lines = key_lines((tmp_path / "backup.jsonl").read_text(encoding="utf-8").splitlines())
    assert len(lines) == len(expected)
    assert any(json.loads(x)["key"] == {"base64": base64.b64encode(b"\x00\x01").decode()} for x in lines)
    imported = run("import", str(tmp_path / "copy"), str(tmp_path / "backup.jsonl"), "--create")
    assert imported.returncode == 0, imported.stderr
    with wal.open(tmp_path / "copy", readonly=True) as copy:
        assert dict(copy.scan()) == expected
    # stdin works too, and importing twice changes nothing.
    piped = run("import", str(tmp_path / "copy"), "--batch", "2", stdin=(tmp_path / "backup.jsonl").read_text())
    assert piped.returncode == 0 and f"imported {len(expected)} key(s)" in piped.stdout
    again = key_lines(run("export", str(tmp_path / "copy")).stdout.splitlines())
    assert [{k: v for k, v in json.loads(x).items() if k != "version"} for x in again] == [
        {k: v for k, v in json.loads(x).items() if k != "version"} for x in lines]


def test_import_checks_every_line_before_writing_anything(store: Path, tmp_path: Path) -> None:
    before = len(records(store))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"key": "a", "value": "1"}\n{"key": "b"}\n', encoding="utf-8")
    result = run("import", str(store), str(bad), "--unframed")
    assert result.returncode == 2 and "line 2" in result.stderr
    assert len(records(store)) == before


def test_an_export_line_changed_after_the_export_is_refused_and_nothing_is_imported(store: Path,
                                                                                     tmp_path: Path) -> None:
    """Each line carries a CRC-32C of its key and value: a character changed in a value (still
    JSON, still a value) was imported as a wrong value. Lines without one are imported as before."""
    with wal.open(tmp_path / "src") as s:
        s.put("a", b"first value")
        s.put("b", b"second value")
    exported = run("export", str(tmp_path / "src"))
    assert exported.returncode == 0, exported.stderr
    lines = exported.stdout.splitlines()
    assert all(isinstance(json.loads(x)["crc32c"], int) for x in key_lines(lines))
    changed = [x.replace("second", "sekond") for x in lines]
    assert changed[2] != lines[2]
    result = run("import", str(tmp_path / "copy"), "--create", stdin="\n".join(changed) + "\n")
    assert result.returncode != 0 and "line 3" in result.stderr and "crc32c" in result.stderr, result.stderr
    assert not (tmp_path / "copy").exists() or run("export", str(tmp_path / "copy")).stdout == ""
    unchecked = [json.dumps({k: v for k, v in json.loads(x).items() if k != "crc32c"}) for x in key_lines(lines)]
    result = run("import", str(tmp_path / "copy"), "--create", "--unframed", stdin="\n".join(unchecked) + "\n")
    assert result.returncode == 0, result.stderr
    with wal.open(tmp_path / "copy", readonly=True) as copy:
        assert dict(copy.scan()) == {b"a": b"first value", b"b": b"second value"}


@pytest.mark.parametrize("cut", ["end line", "last key line", "mid-line", "a middle line", "moved", "header",
                                 "beginning", "a slice", "nothing"])
def test_an_export_cut_short_or_with_lines_dropped_or_moved_is_refused_and_nothing_is_imported(
        tmp_path: Path, cut: str) -> None:
    """An export cut short at a line's end (a full disk, a copy interrupted) imported as a
    smaller store, and so did one with lines dropped or moved: every line was sound on its own.
    The export's first and last lines frame it now; an import checks the last."""
    with wal.open(tmp_path / "src") as s:
        for i in range(5):
            s.put(f"k{i}", f"value {i}".encode())
    lines = run("export", str(tmp_path / "src")).stdout.splitlines()
    assert len(key_lines(lines)) == 5
    damaged = {"end line": lines[:-1], "last key line": lines[:-2], "mid-line": [*lines[:3], lines[3][:20]],
               "a middle line": lines[:3] + lines[4:], "moved": [lines[0], lines[2], lines[1], *lines[3:]],
               "header": [lines[1], lines[0], *lines[2:]], "beginning": lines[1:], "a slice": lines[2:5],
               "nothing": []}[cut]
    result = run("import", str(tmp_path / "copy"), "--create", stdin="\n".join(damaged) + "\n")
    assert result.returncode == 1, result.stderr
    assert {"end line": "without the export's end line", "last key line": "without the export's end line",
            "mid-line": "line 4: not JSON", "beginning": "not a whole agentwal export",
            "a slice": "not a whole agentwal export", "nothing": "it is empty"}.get(
        cut, "nothing was imported") in result.stderr, result.stderr
    assert not (tmp_path / "copy").exists()
    whole = run("import", str(tmp_path / "copy"), "--create", stdin="\n".join(lines) + "\n")
    assert whole.returncode == 0 and "imported 5 key(s)" in whole.stdout, whole.stderr


def test_an_export_of_what_is_not_a_store_writes_nothing(tmp_path: Path) -> None:
    """The export's first line was written before the store was looked for: refused, it left a
    file holding that line alone, which an import then called an export cut short."""
    result = run("export", str(tmp_path / "missing"))
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert run("export", str(tmp_path / "missing"), "-o", str(tmp_path / "out.jsonl")).returncode == 2
    assert not (tmp_path / "out.jsonl").exists()


def test_an_export_of_a_newer_format_is_refused_naming_it(tmp_path: Path) -> None:
    newer = '{"agentwal_export": 2}\n{"key": "a", "value": "1"}\n{"end": {"lines": 1, "crc32c": 0}}\n'
    result = run("import", str(tmp_path / "copy"), "--create", stdin=newer)
    assert result.returncode == 1 and "export of format 2, written by a newer agentwal" in result.stderr
    assert not (tmp_path / "copy").exists()


# ---- checkpoint ------------------------------------------------------------------------------------------


def test_checkpoint_releases_old_segments(store: Path) -> None:
    before = segment_files(store)
    result = run("checkpoint", str(store))
    assert result.returncode == 0, result.stderr
    assert "segment(s) removed" in result.stdout
    after = segment_files(store)
    assert len(after) < len(before)
    assert run("verify", str(store)).returncode == 0
    assert run("get", str(store), "agent/7/step").stdout == "1"


def test_checkpoint_of_an_archiving_store_archives(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with wal.open(path, segment_bytes=4096, archive=True) as s:
        for i in range(100):
            s.put(f"k{i}", b"v" * 40)
        s.checkpoint()  # the application's own checkpoint creates archive/
        for i in range(100):
            s.put(f"j{i}", b"v" * 40)
    first_archived = {p.name for p in (path / "archive").glob("*.wal")}
    before = {p.name for p in segment_files(path)}
    assert first_archived and run("checkpoint", str(path)).returncode == 0
    archived = {p.name for p in (path / "archive").glob("*.wal")} - first_archived
    assert archived and archived <= before


# ---- repair --------------------------------------------------------------------------------------------


def test_repair_cuts_a_torn_tail_after_a_backup(store: Path) -> None:
    seg, offset = tear_tail(store)
    result = run("repair", str(store), "--yes")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "torn tail cut" in result.stdout
    backups = list(store.glob("log.backup-*"))
    assert len(backups) == 1
    assert (backups[0] / seg.name).read_bytes()[offset:offset + 4] == b"\x11\x22\x33\x44"  # the backup has it
    assert (store / "log" / f"{seg.name}.{offset:016x}.broken").exists()
    assert "WARNING: torn tail cut" in result.stderr  # the library's log line
    assert run("verify", str(store), "--strict").returncode == 0
    assert run("repair", str(store), "--yes").stdout.endswith("nothing to repair\n")


def test_repair_cuts_mid_log_damage_at_the_last_good_record_then_verify_passes(store: Path) -> None:
    _seg, _offset, lsn = damage_sealed_segment(store)
    assert run("verify", str(store)).returncode == 1
    result = run("repair", str(store), "--yes")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"the log now ends at LSN {lsn - 1}" in result.stdout
    assert f"gave up LSNs {lsn}.." in result.stdout
    assert list(store.glob("log.backup-*")) and list(store.glob("state.backup-*"))
    export = next(store.glob("state.backup-*.jsonl"))  # the old state, to import again if wanted
    assert any(json.loads(x)["key"] == "agent/7/step" for x in key_lines(export.read_text().splitlines()))
    verify = run("verify", str(store))
    assert verify.returncode == 0, verify.stdout
    # The store opens and takes writes again.
    assert run("put", str(store), "after/repair", "ok").returncode == 0
    assert run("import", str(store), str(export)).returncode == 0
    assert run("get", str(store), "agent/7/step").stdout == "1"


def test_repair_of_damage_in_the_newest_segment_names_every_lsn_it_gives_up(tmp_path: Path) -> None:
    # One segment: the scan of the damaged segment stops at the damage, but every valid record
    # after it (here the log's whole rest) goes into the .broken file with it, and the plan and
    # the result must say so, not only the damaged record's LSN.
    store = make_store(tmp_path / "store", commits=40, segment_bytes=64 << 20)
    recs = records(store)
    victim = recs[len(recs) // 2]
    flip_byte(store / "log" / str(victim["segment"]), int(victim["offset"]) + 24 + 2)  # type: ignore[call-overload]
    last = max(int(r["lsn"]) for r in recs)  # type: ignore[call-overload]
    plan = run("repair", str(store))
    assert f"LSNs {victim['lsn']}..{last} are given up" in plan.stdout, plan.stdout
    verify = run("verify", str(store))
    assert verify.returncode == 1
    assert "invariant I1" not in verify.stdout  # the log's damage explains the state being ahead
    assert "past the log's damage" in verify.stdout, verify.stdout
    done = run("repair", "--yes", str(store))  # and what it did says what its plan said
    assert f"gave up LSNs {victim['lsn']}..{last}" in done.stdout, done.stdout


@pytest.mark.parametrize("cut", ["at_a_record_end", "mid_record"])
def test_verify_refuses_a_segment_cut_shorter_than_it_was_created_as_an_open_does(tmp_path: Path, cut: str) -> None:
    store = make_store(tmp_path / "store", commits=40, segment_bytes=64 << 20)
    seg = segment_files(store)[-1]
    recs = [r for r in records(store) if r["segment"] == seg.name]
    end = max(int(r["offset"]) + 24 + ((int(r["bytes"]) + 7) & ~7) for r in recs)  # type: ignore[call-overload]
    os.truncate(seg, end if cut == "at_a_record_end" else end - 40)
    with pytest.raises(wal.CorruptionError, match="segment truncated"):
        wal.open(store).close()
    verify = run("verify", str(store))
    assert verify.returncode == 1, verify.stdout
    assert "segment truncated" in verify.stdout and "A crash leaves this" not in verify.stdout


def test_repair_asks_first_and_refuses_without_a_terminal_or_yes(store: Path) -> None:
    damage_sealed_segment(store)
    before = {p.name: p.read_bytes() for p in (store / "log").iterdir() if p.is_file()}
    result = run("repair", str(store))  # stdin is /dev/null, not a terminal
    assert result.returncode == 2
    assert "--yes" in result.stderr and "will:" in result.stdout
    assert {p.name: p.read_bytes() for p in (store / "log").iterdir() if p.is_file()} == before
    assert not list(store.glob("log.backup-*"))


@pytest.mark.parametrize("answer", ["y", "n"])
def test_repair_on_a_terminal_proceeds_only_when_the_answer_is_yes(store: Path, answer: str) -> None:
    tear_tail(store)
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "wal", "repair", str(store)], stdin=slave,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        os.write(master, f"{answer}\n".encode())
        out, _err = proc.communicate(timeout=60)
    finally:
        os.close(master)
        os.close(slave)
    assert "Proceed? [y/N]" in out
    if answer == "y":
        assert proc.returncode == 0 and "torn tail cut" in out
        assert run("verify", str(store), "--strict").returncode == 0
    else:
        assert proc.returncode == 2 and "nothing was changed" in out
        assert not list(store.glob("log.backup-*"))
        assert run("verify", str(store), "--strict").returncode == 1


# ---- the writer lock -----------------------------------------------------------------------------------


def test_writes_while_another_process_holds_the_writer_lock_fail_clearly(store: Path, writer: Writer) -> None:
    for args in (("put", str(store), "k", "v"), ("delete", str(store), "agent/1/step"), ("checkpoint", str(store)),
                 ("import", str(store), os.devnull, "--unframed")):
        result = run(*args)
        assert result.returncode == 1, args
        assert f"process {writer.proc.pid}" in result.stderr, result.stderr
        assert "stop it" in result.stderr
    tear_tail_free = run("repair", str(store), "--yes", "--rebuild-state")
    assert tear_tail_free.returncode == 1 and f"process {writer.proc.pid}" in tear_tail_free.stderr
    # On a sound store too: it said "nothing to repair" and exited 0 beside the running writer.
    sound = run("repair", str(store), "--yes")
    assert sound.returncode == 1 and f"process {writer.proc.pid}" in sound.stderr, (sound.stdout, sound.stderr)
    assert "nothing to repair" not in sound.stdout


def test_read_commands_work_while_a_writer_process_runs(store: Path, writer: Writer) -> None:
    lsn = writer.put("live/k", "v1")
    assert run("get", str(store), "live/k").stdout == "v1"
    assert "live/k = v1" in run("scan", str(store), "live/").stdout
    dumped = run("dump", str(store), "--from-lsn", str(lsn))
    assert dumped.returncode == 0 and json.loads(dumped.stdout.splitlines()[0])["lsn"] == lsn
    info = json.loads(run("info", str(store), "--json").stdout)
    assert info["writer_pid"] == writer.proc.pid
    tail = run("tail", str(store), "-n", "1")
    assert json.loads(tail.stdout)["ops"][0]["key"] == "live/k"
    assert run("verify", str(store)).returncode == 0
    assert json.loads(run("stats", str(store), "--format", "json").stdout)["writer_running"] is True
    assert run("export", str(store)).returncode == 0


# ---- tail -f ----------------------------------------------------------------------------------------------


def test_tail_follows_commits_another_process_makes_after_it_started(store: Path, writer: Writer) -> None:
    before = writer.put("before-tail", "v")
    tail = subprocess.Popen([sys.executable, "-m", "wal", "tail", "-f", str(store), "-n", "1", "--interval", "0.05"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        reader = LineReader(tail)
        # The last record before it started, printed once it reached the end of the log: from here
        # on, everything it prints was committed after it started.
        assert json.loads(reader.take(1, timeout=30)[0])["lsn"] == before
        lsns = [writer.put(f"followed/{i}", f"v{i}") for i in range(5)]
        lines = reader.take(5, timeout=30)
        got = [json.loads(line) for line in lines]
        assert [g["lsn"] for g in got] == lsns
        assert [g["ops"][0]["key"] for g in got] == [f"followed/{i}" for i in range(5)]
    finally:
        tail.send_signal(signal.SIGINT)
        assert tail.wait(timeout=30) == 0  # Ctrl-C is the normal way out
    assert tail.stderr is not None and "Traceback" not in tail.stderr.read()


def test_tail_follows_across_segments_and_checkpoints_without_gaps(tmp_path: Path) -> None:
    """The follower crosses sealed segments and survives checkpoints deleting them behind it: no gap."""
    path = tmp_path / "store"
    with wal.open(path, segment_bytes=4096):
        pass
    # -n 1000: from LSN 1 however late it starts (no checkpoint runs before it printed a batch).
    tail = subprocess.Popen([sys.executable, "-m", "wal", "tail", "-f", str(path), "-n", "1000",
                             "--interval", "0.01"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        reader = LineReader(tail)
        got: list[int] = []
        with wal.open(path, segment_bytes=4096) as store:
            for batch in range(6):
                for i in range(50):
                    store.put(f"k/{batch}/{i}", b"x" * 40)  # about two segments per batch
                # Once the follower printed the batch, the checkpoint deletes segments it read or holds open.
                got += [json.loads(line)["lsn"] for line in reader.take(50, timeout=30)]
                store.checkpoint()
        assert got == list(range(1, 301))
    finally:
        tail.send_signal(signal.SIGINT)
        assert tail.wait(timeout=30) == 0
    assert tail.stderr is not None and tail.stderr.read() == ""


def test_a_follower_that_starts_behind_the_oldest_segment_reports_what_it_cannot_show(tmp_path: Path) -> None:
    with wal.open(tmp_path, segment_bytes=4096) as store:
        for i in range(200):
            store.put(f"k/{i}", b"x" * 40)
        store.checkpoint()
    first, last = ops.last_lsn(str(tmp_path / "log"))
    assert first > 1
    skips: list[ops.Skip] = []
    follower = ops.Follower(str(tmp_path / "log"), 1, on_skip=skips.append)
    try:
        assert [r.lsn for r in follower.poll()] == list(range(first, last + 1))
    finally:
        follower.close()
    assert [s.lost for s in skips] == [(1, first - 1)]
    assert "removed by a checkpoint" in skips[0].describe()


# ---- stats -----------------------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*=\"(?:[^\"\\]|\\.)*\""
                     r"(,[a-zA-Z_][a-zA-Z0-9_]*=\"(?:[^\"\\]|\\.)*\")*\})? [-+]?(\d+(\.\d*)?([eE][-+]?\d+)?|NaN|Inf)$")


def test_stats_prometheus_output_parses(store: Path) -> None:
    result = run("stats", str(store), "--format", "prometheus")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    samples = [line for line in lines if not line.startswith("#")]
    assert samples
    for line in samples:
        assert _SAMPLE.match(line), line
    for line in lines:
        if line.startswith("# TYPE"):
            assert line.split()[3] in ("counter", "gauge")
    assert any(line.startswith("agentwal_applied_lsn{") for line in samples)


def test_stats_text_and_json(store: Path) -> None:
    data = json.loads(run("stats", str(store), "--format", "json").stdout)
    assert data["applied_lsn"] == data["log_last_lsn"] == len(records(store))
    assert data["unapplied_records"] == 0 and data["writer_running"] is False
    text = run("stats", str(store)).stdout
    assert re.search(r"^state_keys\s+\d+$", text, re.M)


# ---- ops as a library --------------------------------------------------------------------------------------


def test_the_progress_bar_shows_only_on_a_terminal_and_only_for_long_work() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    quiet = io.StringIO()
    cli.commands._ProgressBar(quiet)("scanning the log", 5, 10)
    assert quiet.getvalue() == ""  # not a terminal
    term = Terminal()
    bar = cli.commands._ProgressBar(term)
    bar("scanning the log", 5, 10)
    assert term.getvalue() == ""  # the work has not lasted half a second yet
    bar.started -= 1.0
    bar("scanning the log", 5, 10)
    assert "scanning the log" in term.getvalue() and "50.0%" in term.getvalue()
    bar.close()
    assert term.getvalue().endswith("\r")


def test_render_and_parse_bytes_round_trip() -> None:
    for data in (b"", b"text", "\u00e9\n\t".encode(), b"\x00", b"\xff", b"bell\x07", BINARY_VALUE):
        rendered = ops.render_bytes(data)
        assert ops.parse_bytes(json.loads(json.dumps(rendered)), "x") == data
    assert ops.render_bytes(b"plain") == "plain"
    assert ops.render_bytes(b"\x00") == {"base64": "AA=="}


def test_repair_of_a_bare_log_backs_it_up_beside_it(tmp_path: Path) -> None:
    log_dir = tmp_path / "events"
    with wal.Log.open(log_dir) as log:
        log.append_many([b"e%d" % i for i in range(10)])
    seg = sorted(log_dir.glob("*.wal"))[0]
    end = max(int(r["offset"]) + 24 + 8 for r in ops.dump(str(log_dir)))  # type: ignore[call-overload]
    with open(seg, "r+b") as f:
        f.seek(end)
        f.write(b"\x01torn")
    result = run("repair", str(log_dir), "-y")
    assert result.returncode == 0, result.stdout + result.stderr
    assert list(tmp_path.glob("events.backup-*"))
    shutil.rmtree(next(tmp_path.glob("events.backup-*")))
    assert run("verify", str(log_dir), "--strict").returncode == 0


def test_export_of_a_store_whose_log_is_damaged_past_its_state_says_what_it_leaves_out(tmp_path: Path) -> None:
    """`scan` warns when the log cannot be read to its end (it shows the store as of the last
    readable record); `export` said nothing, exit 0, with the commits past the damage missing."""
    path = tmp_path / "store"
    writer = textwrap.dedent("""
        import sys, time, wal
        s = wal.open(sys.argv[1], apply_interval_ms=100_000, max_unapplied=100_000)
        s.put("key/base", b"applied")
        s.checkpoint()
        for i in range(40):
            s.put(f"key/{i:02d}", b"v" * 20)
        print("ready", flush=True)
        time.sleep(60)
    """)
    child = subprocess.Popen([sys.executable, "-c", writer, str(path)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGKILL)  # 40 commits acknowledged, none applied
    child.wait()
    segment = ops.info(str(path))["segments"][0]
    with open(segment["path"], "r+b") as f:  # one of them damaged
        f.seek(segment["end_offset"] * 3 // 4)
        byte = f.read(1)
        f.seek(segment["end_offset"] * 3 // 4)
        f.write(bytes([byte[0] ^ 0xFF]))
    r = run("export", str(path))
    assert r.returncode == 0 and 1 < len(r.stdout.splitlines()) < 41
    assert "agentwal export: warning: the log after LSN" in r.stderr and "could not be read" in r.stderr, r.stderr


def test_verify_of_a_damaged_state_names_the_repair_that_rebuilds_it(tmp_path: Path) -> None:
    """verify advised `agentwal repair STORE` for every damage; for a state that lost a key,
    that repair found a sound log and did nothing. It now names `repair --rebuild-state`, which
    fixes it."""
    path = tmp_path / "store"
    with wal.open(path) as s:
        for i in range(10):
            s.put(f"key/{i}", b"v%d" % i)
    env = lmdb.open(str(path / "state"), max_dbs=8, subdir=True)
    with env.begin(write=True, db=env.open_db(b"data")) as txn:  # the state loses a key behind the store
        assert txn.delete(b"key/3")
    env.close()
    r = run("verify", str(path))
    assert r.returncode == 1 and "DAMAGE (state)" in r.stdout
    assert f"agentwal repair --rebuild-state {path}" in r.stdout and "agentwal repair " + str(path) not in r.stdout
    assert run("repair", "--rebuild-state", str(path), "--yes").returncode == 0
    assert run("verify", str(path)).returncode == 0
    with wal.open(path) as s:
        assert s.get("key/3") == b"v3"


@pytest.mark.parametrize("content", ["garbage\n", '{"format": "agentwal-store", "version": 99}\n'])
def test_an_unusable_store_file_is_reported_and_no_repair_touches_the_store(store: Path, content: str) -> None:
    (store / "STORE").write_text(content)
    before = sorted(p.name for p in store.iterdir())
    verify = run("verify", str(store))
    assert verify.returncode == 1
    assert "DAMAGE (store)" in verify.stdout and "--rebuild-state" not in verify.stdout, verify.stdout
    for args in (["repair", "--rebuild-state", "--yes"], ["repair", "--yes"]):
        result = run(*args, str(store))
        assert result.returncode == 1 and "Nothing was changed" in result.stderr, result.stderr
    assert sorted(p.name for p in store.iterdir()) == before  # the state was not moved aside
    info = run("info", str(store))
    assert info.returncode == 1 and info.stderr.startswith("agentwal info: error:"), info.stderr


@pytest.mark.parametrize("damage", ["value byte", "checkpoint.meta", "meta pages"])
def test_the_rebuild_verify_names_repairs_a_small_state_an_open_refuses(tmp_path: Path, damage: str) -> None:
    """A flipped value byte in a small state (an open checks every entry of one), or a damaged
    checkpoint.meta: verify named `repair --rebuild-state`, and that repair exited 1 with the
    same damage, changing nothing: it planned by opening the store, which refused the state.
    A byte changed in both LMDB meta pages: a writable open refused it, and verify said sound."""
    path = tmp_path / "store"
    with wal.open(path) as s:
        for i in range(200):
            s.put(f"k/{i:03d}", b"VALUE-%03d-" % i + b"z" * 300)
    if damage == "value byte":
        data_file = path / "state" / "data.mdb"
        data = bytearray(data_file.read_bytes())
        at = data.find(b"VALUE-123-")
        while at >= 0:  # every copy: LMDB may keep an older one in a free page
            data[at + 7] ^= 1
            at = data.find(b"VALUE-123-", at + 1)
        data_file.write_bytes(bytes(data))
    elif damage == "checkpoint.meta":
        meta = path / "state" / "checkpoint.meta"
        data = bytearray(meta.read_bytes())
        data[len(data) // 2] ^= 1
        meta.write_bytes(bytes(data))
    else:
        data_file = path / "state" / "data.mdb"
        data = bytearray(data_file.read_bytes())
        for page in (0, 1):  # a field of the main tree's record in each meta page
            data[mmap.PAGESIZE * page + 100] ^= 0x04
        data_file.write_bytes(bytes(data))
        with pytest.raises(wal.CorruptionError, match="meta page"):
            wal.open(path)
    r = run("verify", str(path))
    assert r.returncode == 1 and f"agentwal repair --rebuild-state {path}" in r.stdout, r.stdout
    r = run("repair", "--rebuild-state", str(path), "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    assert run("verify", str(path)).returncode == 0
    with wal.open(path) as s:
        assert s.get("k/123") == b"VALUE-123-" + b"z" * 300 and len(list(s.scan("k/"))) == 200


def test_a_damaged_state_the_log_cannot_rebuild_is_refused_naming_the_damage_not_a_bogus_lsn(tmp_path: Path) -> None:
    # The log no longer starts at LSN 1: the refusal said "the state reflects LSN 0" (the open
    # that reads it had refused) and advised an export, which that same open refuses.
    path = tmp_path / "store"
    with wal.open(path, segment_bytes=4096) as s:
        for i in range(200):
            s.put(f"k/{i:03d}", b"VALUE-%03d-" % i + b"z" * 300)
        s.checkpoint()
    assert not (path / "log" / "0000000000000001.wal").exists()
    data_file = path / "state" / "data.mdb"
    data = bytearray(data_file.read_bytes())
    at = data.find(b"VALUE-010-")
    while at >= 0:
        data[at + 7] ^= 1
        at = data.find(b"VALUE-010-", at + 1)
    data_file.write_bytes(bytes(data))
    before = sorted(p.name for p in path.iterdir())
    r = run("repair", "--rebuild-state", str(path), "--yes")
    assert r.returncode == 1 and "the state is damaged" in r.stderr and "reflects LSN 0" not in r.stderr, r.stderr
    assert "agentwal restore" in r.stderr and "export" not in r.stderr, r.stderr
    assert sorted(p.name for p in path.iterdir()) == before


def test_verify_names_no_rebuild_for_a_state_the_log_no_longer_starts_at_lsn_1_for(tmp_path: Path) -> None:
    # The state ahead of damage in the newest segment, with checkpoints past LSN 1: verify said
    # "a repair ... rebuilds the state" and named --rebuild-state, which repair then refused.
    path = tmp_path / "store"
    with wal.open(path, segment_bytes=1 << 16) as s:
        for i in range(400):
            s.put(b"k%04d" % i, b"v" * 300)
        s.checkpoint()
    seg = segment_files(path)[-1]
    recs = [r for r in records(path) if r["segment"] == seg.name]
    flip_byte(seg, int(recs[len(recs) // 2]["offset"]) + 24 + 2)  # type: ignore[call-overload]
    verify = run("verify", str(path))
    assert verify.returncode == 1 and "no repair can rebuild the state" in verify.stdout, verify.stdout
    assert "--rebuild-state" not in verify.stdout


def test_bad_numbers_and_input_are_usage_errors_not_tracebacks(tmp_path: Path, store: Path) -> None:
    """Each of these ended in a Python traceback (OverflowError, UnicodeDecodeError,
    FileExistsError, ValueError), or ran a busy loop, or a drill of nothing that passed."""
    (tmp_path / "latin1.jsonl").write_bytes(b'{"key": "caf\xe9", "value": "x"}\n')
    (tmp_path / "afile").write_text("")
    cases = [
        ("dump", str(store), "--from-lsn", "99999999999999999999999"),
        ("tail", str(store), "-f", "--interval", "inf"),
        ("tail", str(store), "-f", "--interval", "-1"),
        ("import", str(store), str(tmp_path / "latin1.jsonl")),
        ("follow", f"file://{tmp_path}/a", str(tmp_path / "f"), "--every", "-1"),
        ("crashtest", str(tmp_path / "afile"), "--kills", "1", "--power-cuts", "0", "--level", "sync"),
        ("crashtest", str(tmp_path / "w"), "--kills", "1", "--power-cuts", "0", "--run-ms", "-5"),
        ("crashtest", str(tmp_path / "w"), "--kills", "0", "--power-cuts", "0"),
    ]
    for args in cases:
        r = run(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr and "error:" in r.stderr, (args, r.stderr)
    r = run("import", str(store), stdin=b'{"key": "caf\xe9"}\n')
    assert r.returncode == 2 and "stdin is not UTF-8 text" in r.stderr, r.stderr


def test_an_argument_with_a_nul_byte_is_a_usage_error(tmp_path: Path, store: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Only a caller of cli.main can pass one (a command line cannot): restore's directory, import
    --create's file and --key-file raised the OS call's raw ValueError."""
    url = f"file://{tmp_path}/a"
    with wal.open(tmp_path / "p", archive=url) as primary:
        primary.put("k", b"v")
    for argv in (["restore", url, f"{tmp_path}/r\0"], ["import", str(tmp_path / "new"), "x\0", "--create"],
                 ["get", str(store), "k", "--key-file", "k\0"]):
        assert cli.main(argv) == 2, argv
        assert "contains a NUL byte" in capsys.readouterr().err
    assert not (tmp_path / "r").exists() and not (tmp_path / "new").exists()


def test_tail_of_a_log_damaged_before_its_newest_records_says_so_and_fails(tmp_path: Path) -> None:
    """Without -f, tail printed the records before the damage as the newest and exited 0; now it
    names the damage (once it has stayed put: a write in progress looks the same) and exits 1."""
    path = tmp_path / "store"
    with wal.open(path) as s:
        for i in range(30):
            s.put(f"k/{i}", b"v" * 40)
    recs = records(path)
    victim = recs[len(recs) // 2]
    flip_byte(path / "log" / str(victim["segment"]), int(victim["offset"]) + 24 + 2)  # type: ignore[call-overload]
    r = run("tail", str(path), "-n", "3", timeout=60)
    assert r.returncode == 1 and "log damaged" in r.stderr, (r.stdout, r.stderr)


def test_repair_holds_the_writer_lock_from_its_backups_to_the_truncation(store: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """repair probed the lock and let it go: a writer that opened during the backups had the
    state moved from under it, and the repair failed as "nothing was changed" with the state set
    aside. A writer trying to open then is now refused, and the repair completes."""
    repair_module = sys.modules["wal.ops.repair"]  # the module (wal.ops.repair is also its function)
    damage_sealed_segment(store)
    backup_log = repair_module.backup_log
    refused: list[BaseException] = []

    def backup_then_a_writer_tries(log_dir: str, dest: str) -> Any:
        out = backup_log(log_dir, dest)
        try:
            wal.open(store).close()
        except wal.LockedError as exc:
            refused.append(exc)
        return out

    monkeypatch.setattr(repair_module, "backup_log", backup_then_a_writer_tries)
    plan = ops.plan_repair(str(store), rebuild_state=True)
    result = ops.repair(plan)
    assert len(refused) == 1 and result.applied_lsn == result.last_lsn
    assert run("verify", str(store)).returncode == 0
