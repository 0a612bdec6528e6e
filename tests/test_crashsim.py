"""The simulated power cut (wal.drill.crashsim): the model proved on small real child processes, then used.

Every child runs with the LD_PRELOAD shim (wal/_crashsim*.so), does real os.* file calls under a
root, and is SIGKILLed (by itself at a scripted moment, or by the parent at an arbitrary one).
`apply_power_cut` then rewinds the root; `crashsim.clone` lets one crash be cut several ways.

The end-to-end tests run the real agentwal log and store under the shim: at ``sync`` every
acknowledged commit survives every kind of power cut; at ``interval`` without an fsync the
simulator really drops the unsynced records and the log still reopens cleanly.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Literal

import pytest

import wal
from wal.drill import crashsim

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the shim is LD_PRELOAD on glibc")

MODES: tuple[crashsim.Mode, ...] = ("drop", "prefix", "garble", "random")

PRELUDE = '''
import os, signal, sys, threading
ROOT = sys.argv[1]
def P(*parts): return os.path.join(ROOT, *parts)
def dsync(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)
def durable_file(name, data):
    """A file whose content and directory entry are both durable."""
    fd = os.open(P(name), os.O_CREAT | os.O_RDWR, 0o644)
    os.write(fd, data)
    os.fdatasync(fd)
    os.close(fd)
    dsync(os.path.dirname(P(name)))
_say_lock = threading.Lock()
def say(*args):
    """One whole line per call, also from many threads (print() may interleave them)."""
    with _say_lock:
        sys.stdout.write(" ".join(map(str, args)) + "\\n")
        sys.stdout.flush()
def crash():
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)
'''


class Crash:
    """One child run under the shim: its root and journal after it died."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.root = base / "root"
        self.journal = base / "journal"
        self.script = base / "child.py"
        self.cuts = itertools.count()

    def start(self, body: str) -> subprocess.Popen[str]:
        self.script.write_text(PRELUDE + textwrap.dedent(body))
        env = crashsim.env_for(self.root, self.journal)
        return subprocess.Popen([sys.executable, str(self.script), str(self.root)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def run(self, body: str) -> list[str]:
        """Run a child that ends by crash() (SIGKILL of itself); return its stdout lines."""
        proc = self.start(body)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, f"child did not reach crash(): rc {proc.returncode}\n{err}"
        return out.splitlines()

    def cut(self, mode: crashsim.Mode = "drop", seed: int = 0, *, at: int | None = None,
            orphans: Literal["remove", "keep"] = "remove") -> tuple[Path, crashsim.PowerCutReport]:
        """Apply a power cut to a fresh copy of the crash; returns the copy's root and the report."""
        dest = self.base / f"cut{next(self.cuts)}"
        crashsim.clone(self.root, self.journal, dest / "root", dest / "journal")
        report = crashsim.apply_power_cut(dest / "root", dest / "journal", mode=mode, seed=seed, at=at,
                                          orphans=orphans)
        return dest / "root", report


@pytest.fixture
def crash(tmp_path: Path) -> Crash:
    return Crash(tmp_path)


def listing(root: Path) -> dict[str, bytes | None]:
    """Every entry under root: path -> content (None for a directory)."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = None
        for f in files:
            out[os.path.relpath(os.path.join(dirpath, f), root)] = Path(dirpath, f).read_bytes()
    return out


# ---- the model, on plain os.* calls -------------------------------------------------------------


def test_fdatasynced_data_survives_every_mode(crash: Crash) -> None:
    crash.run('''
        durable_file("f", b"A" * 3000)
        fd = os.open(P("f"), os.O_RDWR | os.O_APPEND)
        os.write(fd, b"B" * 2000)          # after the last fdatasync: not durable
        os.pwrite(fd, b"C" * 100, 6000)    # leaves a hole
        crash()
    ''')
    for mode in MODES:
        for seed in range(3):
            root, report = crash.cut(mode, seed)
            data = (root / "f").read_bytes()
            assert data[:3000] == b"A" * 3000, (mode, seed, str(report))
            if mode == "drop":
                assert data == b"A" * 3000
                assert report.dropped_records == 2


def test_unsynced_changes_are_dropped_in_mode_drop_and_a_prefix_is_kept_in_mode_prefix(crash: Crash) -> None:
    ops: list[tuple[str, int, bytes]] = [
        ("w", 10, b"bbbb"), ("w", 2, b"zz"), ("t", 4, b""), ("w", 4, b"cccc" * 10),
        ("t", 100, b""), ("w", 0, b"Q"), ("w", 200, b"tail"),
    ]
    calls = "\n".join(f"os.pwrite(fd, {d!r}, {n})" if k == "w" else f"os.ftruncate(fd, {n})" for k, n, d in ops)
    crash.run('durable_file("f", b"base-data!")\nfd = os.open(P("f"), os.O_RDWR)\n' + calls + "\ncrash()\n")
    states = [b"base-data!"]
    for kind, n, data in ops:
        cur = bytearray(states[-1])
        if kind == "w":
            cur.extend(bytes(max(0, n + len(data) - len(cur))))
            cur[n:n + len(data)] = data
        else:
            cur = cur[:n] + bytes(max(0, n - len(cur)))
        states.append(bytes(cur))

    root, report = crash.cut("drop")
    assert (root / "f").read_bytes() == states[0]
    assert report.files[0].dropped == len(ops) and report.files[0].kept == 0

    kept = set()
    for seed in range(16):
        root, report = crash.cut("prefix", seed)
        k = report.files[0].kept
        assert (root / "f").read_bytes() == states[k], (seed, k)
        kept.add(k)
    assert len(kept) >= 4, f"prefix mode should keep prefixes of many lengths, kept {sorted(kept)}"


def test_garble_decides_unsynced_sectors_old_or_new_inside_the_durable_size(crash: Crash) -> None:
    crash.run('''
        durable_file("f", bytes(range(256)) * 16)     # 4096 durable bytes
        fd = os.open(P("f"), os.O_RDWR)
        os.pwrite(fd, b"N" * 4096, 0)                 # overwrite everything, unsynced
        os.pwrite(fd, b"X" * 2048, 4096)              # and extend
        crash()
    ''')
    old = bytes(range(256)) * 16
    seen = set()
    for seed in range(8):
        root, report = crash.cut("garble", seed)
        data = (root / "f").read_bytes()
        assert len(data) in (4096, 6144)
        for s in range(8):
            sector = data[s * 512:(s + 1) * 512]
            assert sector in (old[s * 512:(s + 1) * 512], b"N" * 512), (seed, s)
            seen.add(sector == b"N" * 512)
        for s in range(8, len(data) // 512):  # beyond the durable size: new, zeros or stale
            assert len(data[s * 512:(s + 1) * 512]) == 512
        assert sum(report.files[0].sectors.values()) >= 8
    assert seen == {True, False}


def test_a_file_created_and_fdatasynced_disappears_unless_its_directory_is_fsynced(crash: Crash) -> None:
    crash.run('''
        durable_file("kept", b"k" * 100)              # created, data synced, directory fsynced
        fd = os.open(P("lost"), os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, b"l" * 100)
        os.fdatasync(fd)                               # data durable, the name is not
        crash()
    ''')
    root, report = crash.cut("drop")
    assert listing(root) == {"kept": b"k" * 100}
    assert [(e.op, e.path, e.result) for e in report.entries] == [("CREATE", "lost", "undone")]
    for seed in range(6):  # kept or not, never a name without its synced data
        root, _ = crash.cut("prefix", seed)
        assert listing(root) in ({"kept": b"k" * 100}, {"kept": b"k" * 100, "lost": b"l" * 100})


def test_a_durable_file_whose_data_was_never_synced_keeps_its_durable_empty_content(crash: Crash) -> None:
    crash.run('''
        fd = os.open(P("f"), os.O_CREAT | os.O_WRONLY, 0o644)
        dsync(ROOT)                                   # the name is durable, empty
        os.write(fd, b"never synced")
        crash()
    ''')
    root, _ = crash.cut("drop")
    assert listing(root) == {"f": b""}


def test_a_rename_is_undone_without_a_directory_fsync(crash: Crash) -> None:
    crash.run('''
        durable_file("a", b"aaa")
        durable_file("c", b"ccc")
        durable_file("d", b"ddd")
        os.rename(P("a"), P("b"))
        os.rename(P("c"), P("d"))                     # replaces d
        crash()
    ''')
    root, report = crash.cut("drop")
    assert listing(root) == {"a": b"aaa", "c": b"ccc", "d": b"ddd"}
    assert [e.result for e in report.entries] == ["undone", "undone"]


def test_a_rename_stays_after_a_directory_fsync(crash: Crash) -> None:
    crash.run('''
        durable_file("a", b"aaa")
        durable_file("c", b"ccc")
        durable_file("d", b"ddd")
        os.mkdir(P("sub"))
        dsync(ROOT)
        os.rename(P("a"), P("b"))
        os.rename(P("c"), P("d"))
        os.rename(P("b"), P("sub", "b"))              # across directories: the new one is fsynced
        dsync(ROOT)
        dsync(P("sub"))
        crash()
    ''')
    for mode in MODES:
        root, _ = crash.cut(mode, 1)
        assert listing(root) == {"d": b"ccc", "sub": None, "sub/b": b"aaa"}, mode


def test_an_unlink_is_undone_without_a_directory_fsync_and_the_file_has_its_durable_content(crash: Crash) -> None:
    crash.run('''
        durable_file("a", b"durable content")
        durable_file("gone", b"x")
        os.mkdir(P("empty"))
        dsync(ROOT)
        fd = os.open(P("a"), os.O_WRONLY)
        os.pwrite(fd, b"UNSYNCED", 0)
        os.unlink(P("a"))
        os.pwrite(fd, b"after unlink", 0)             # through the still-open descriptor
        os.rmdir(P("empty"))
        os.unlink(P("gone"))
        dsync(ROOT)                                    # makes all three removals durable ...
        durable_file("b", b"bbb")
        os.unlink(P("b"))                              # ... but not this one
        crash()
    ''')
    root, report = crash.cut("drop")
    assert listing(root) == {"b": b"bbb"}
    # Without the first directory fsync everything comes back, a with its durable content.
    crash2 = Crash(crash.base / "second")
    crash2.base.mkdir()
    crash2.run('''
        durable_file("a", b"durable content")
        os.mkdir(P("empty"))
        dsync(ROOT)
        fd = os.open(P("a"), os.O_WRONLY)
        os.pwrite(fd, b"UNSYNCED", 0)
        os.unlink(P("a"))
        os.pwrite(fd, b"after unlink", 0)
        os.rmdir(P("empty"))
        crash()
    ''')
    root, report = crash2.cut("drop")
    assert listing(root) == {"a": b"durable content", "empty": None}
    assert {e.op: e.result for e in report.entries} == {"UNLINK": "undone", "RMDIR": "undone"}


def test_o_trunc_and_ftruncate_are_undone_when_unsynced_and_kept_when_synced(crash: Crash) -> None:
    crash.run('''
        for name in "tuvw":
            durable_file(name, b"0123456789" * 100)
        fd = os.open(P("t"), os.O_RDWR)
        os.ftruncate(fd, 10)
        fd = os.open(P("u"), os.O_WRONLY | os.O_TRUNC)
        os.write(fd, b"new")
        fd = os.open(P("v"), os.O_RDWR)
        os.ftruncate(fd, 10)
        os.fdatasync(fd)
        fd = os.open(P("w"), os.O_WRONLY | os.O_TRUNC)
        os.write(fd, b"new")
        os.fsync(fd)
        crash()
    ''')
    root, _ = crash.cut("drop")
    assert listing(root) == {"t": b"0123456789" * 100, "u": b"0123456789" * 100, "v": b"0123456789", "w": b"new"}


def test_a_directory_whose_creation_is_not_durable_takes_its_content_along(crash: Crash) -> None:
    crash.run('''
        os.mkdir(P("e"))
        dsync(ROOT)
        os.mkdir(P("d"))                              # never made durable in ROOT
        durable_file("d/x", b"x")                     # d fsynced: x durable inside d
        os.mkdir(P("e", "new"))
        crash()
    ''')
    root, report = crash.cut("drop")
    assert listing(root) == {"e": None}
    assert report.removed == ["d/x"]
    root, _ = crash.cut("drop", orphans="keep")
    assert listing(root) == {"d": None, "d/x": b"x", "e": None}


def test_the_atomic_replace_pattern_survives_a_power_cut_at_every_journal_position(crash: Crash) -> None:
    crash.run('''
        durable_file("final", b"old")
        fd = os.open(P("tmp"), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        os.write(fd, b"new")
        os.fsync(fd)
        os.close(fd)
        os.rename(P("tmp"), P("final"))
        dsync(ROOT)
        crash()
    ''')
    records = crashsim.read_journal(crash.journal).records
    first_dirsync = next(i for i, r in enumerate(records) if r.kind == crashsim.DIRSYNC)
    cuts = [r.pos for r in records[first_dirsync + 1:]] + [None]  # from when "final" is durable on
    assert len(cuts) >= 6
    three: tuple[crashsim.Mode, ...] = ("drop", "prefix", "garble")
    for pos, mode, seed in itertools.product(cuts, three, (0, 1)):
        root, _ = crash.cut(mode, seed, at=pos)
        assert (root / "final").read_bytes() in (b"old", b"new"), (pos, mode, seed)
    root, _ = crash.cut("drop", at=None)
    assert listing(root) == {"final": b"new"}


def test_the_simulator_finds_the_rename_without_fsync_bug(crash: Crash) -> None:
    """The classic application bug: replace by rename without fsyncing the new file first."""
    crash.run('''
        durable_file("final", b"old")
        fd = os.open(P("tmp"), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        os.write(fd, b"new")
        os.close(fd)                                  # no fsync
        os.rename(P("tmp"), P("final"))
        dsync(ROOT)
        crash()
    ''')
    contents = {crash.cut(mode, seed)[0].joinpath("final").read_bytes()
                for mode in ("drop", "prefix", "random") for seed in range(4)}
    assert b"" in contents, contents  # the new name durable, its data not: an empty file


def test_a_sigkill_amid_writes_from_many_threads_leaves_a_consistent_journal(crash: Crash) -> None:
    threads, block = 4, 256
    proc = crash.start(f'''
        THREADS, BLOCK = {threads}, {block}
        def content(t, i):
            return (f"t{{t}}b{{i}}:".encode() * BLOCK)[:BLOCK]
        for t in range(THREADS):
            fd = os.open(P(f"t{{t}}"), os.O_CREAT | os.O_RDWR, 0o644)
            os.close(fd)
        os.open(P("shared"), os.O_CREAT | os.O_RDWR, 0o644)
        dsync(ROOT)
        shared = os.open(P("shared"), os.O_RDWR)
        def work(t):
            fd = os.open(P(f"t{{t}}"), os.O_WRONLY | os.O_APPEND)   # write-only: old bytes via /proc
            for i in range(10**9):
                os.write(fd, content(t, i))
                os.pwrite(shared, content(t, i), (i * THREADS + t) * BLOCK)
                if i % 8 == 7:
                    os.fdatasync(fd)
                    os.fdatasync(shared)
                    say(t, i + 1)
        for t in range(THREADS):
            threading.Thread(target=work, args=(t,), daemon=True).start()
        threading.Event().wait()
    ''')
    assert proc.stdout is not None
    synced = dict.fromkeys(range(threads), 0)
    deadline = time.monotonic() + 30
    while min(synced.values()) < 24 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        t, n = map(int, line.split())
        synced[t] = max(synced[t], n)
    proc.send_signal(signal.SIGKILL)
    rest, _ = proc.communicate()
    for line in rest.splitlines():
        parts = line.split()
        if len(parts) == 2:
            t, n = map(int, parts)
            synced[t] = max(synced[t], n)

    journal = crashsim.read_journal(crash.journal)
    kinds = {r.kind for r in journal.records}
    assert {crashsim.WRITE, crashsim.FSYNC} <= kinds
    assert all(b.pos > a.pos for a, b in itertools.pairwise(journal.records))
    assert "records" in crashsim.journal_summary(crash.journal, limit=5)

    def content(t: int, i: int) -> bytes:
        return (f"t{t}b{i}:".encode() * block)[:block]

    plan: list[tuple[crashsim.Mode, int]] = [("drop", 0), ("prefix", 1), ("prefix", 2), ("garble", 3)]
    for mode, seed in plan:
        root, report = crash.cut(mode, seed)
        shared = (root / "shared").read_bytes()
        for t in range(threads):
            data = (root / f"t{t}").read_bytes()
            n = len(data) // block
            if mode == "drop":
                assert len(data) % (8 * block) == 0, (t, len(data))
            assert n >= synced[t], (mode, t, n, synced[t], str(report))
            if mode != "garble":
                assert data == b"".join(content(t, i) for i in range(n)) + data[n * block:], (mode, t)
            else:
                assert data[:synced[t] * block] == b"".join(content(t, i) for i in range(synced[t]))
            for i in range(synced[t]):  # every block synced by thread t is in the shared file
                off = (i * threads + t) * block
                assert shared[off:off + block] == content(t, i), (mode, t, i)


# ---- end to end: the real log and store ---------------------------------------------------------------------------


LOG_CHILD = '''
    import wal
    os.mkdir(P("log")); dsync(ROOT)                  # the log directory itself durable
    log = wal.Log.open(P("log"), durability={durability!r}, rpo_ms={rpo_ms!r}, segment_bytes=64 << 10)
    def payload(t, k):
        return f"t{{t}}:k{{k}}:".encode() + bytes([65 + (t + k) % 26]) * (50 + (k * 37) % 400)
    def work(t):
        for k in range(10**9):
            lsn = log.append(payload(t, k))
            say(lsn, t, k)
    for t in range({threads}):
        threading.Thread(target=work, args=(t,), daemon=True).start()
    threading.Event().wait()
'''


def _payload(t: int, k: int) -> bytes:
    return f"t{t}:k{k}:".encode() + bytes([65 + (t + k) % 26]) * (50 + (k * 37) % 400)


def _run_until(crash: Crash, body: str, lines: int) -> list[str]:
    """Start the child, SIGKILL it once it printed `lines` lines; return every complete line."""
    proc = crash.start(body)
    assert proc.stdout is not None
    got: list[str] = []
    deadline = time.monotonic() + 60
    while len(got) < lines and time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        got.append(line)
    proc.send_signal(signal.SIGKILL)
    rest, _ = proc.communicate()
    got.extend(rest.splitlines(keepends=True))
    return [g.strip() for g in got if g.endswith("\n")]


def _read_log(root: Path) -> dict[int, bytes]:
    """All records of the log under root, opened strictly: damage other than a torn tail raises."""
    with wal.Log.open(root / "log") as log:
        return dict(log.read(1))


def test_log_at_sync_keeps_every_acknowledged_record_through_random_power_cuts(crash: Crash) -> None:
    lines = _run_until(crash, LOG_CHILD.format(durability="sync", rpo_ms=None, threads=3), 600)
    acked = {int(lsn): _payload(int(t), int(k)) for lsn, t, k in (line.split() for line in lines)}
    assert len(acked) >= 600
    for seed in range(4):
        root, report = crash.cut("random", seed)
        records = _read_log(root)
        assert sorted(records) == list(range(1, len(records) + 1)), "I3: a gap-free prefix"
        missing = [lsn for lsn in acked if records.get(lsn) != acked[lsn]]
        assert not missing, f"I2: acknowledged LSNs lost: {missing[:10]}\n{report}"
        assert len(list(crash.root.joinpath("log").glob("*"))) > 2, "the run should span several segments"


def test_log_at_interval_without_an_fsync_loses_the_unsynced_records_and_reopens_cleanly(tmp_path: Path) -> None:
    body = '''
        import wal
        os.mkdir(P("log")); dsync(ROOT)
        log = wal.Log.open(P("log"), durability="interval", rpo_ms=50, segment_bytes=1 << 20)
        for k in range(3000):
            lsn = log.append(b"k%d:" % k + b"x" * 200)
        marks = log.watermarks
        say(marks.written, marks.durable)
        crash()                                       # before the 50 ms flusher syncs it all
    '''
    expect = {k + 1: b"k%d:" % k + b"x" * 200 for k in range(3000)}
    for attempt in range(3):  # the flusher may, rarely, sync everything before the kill: run again
        crash = Crash(tmp_path / f"run{attempt}")
        crash.base.mkdir()
        written, durable = map(int, crash.run(body)[0].split())
        root, report = crash.cut("drop")
        if report.dropped_records:
            break
    assert written == 3000 and durable < written, "the flusher synced everything before the kill, 3 times"

    records = _read_log(root)
    assert durable <= len(records) < written, f"drop mode must lose the unsynced records\n{report}"
    assert records == {lsn: expect[lsn] for lsn in range(1, len(records) + 1)}

    plan: list[tuple[crashsim.Mode, int]] = [("prefix", 0), ("prefix", 1), ("garble", 2), ("garble", 3), ("random", 4)]
    for mode, seed in plan:
        root, report = crash.cut(mode, seed)
        records = _read_log(root)  # strict: whatever the mode, a power cut leaves only a torn tail
        assert durable <= len(records) <= written, (mode, seed)
        assert records == {lsn: expect[lsn] for lsn in range(1, len(records) + 1)}, (mode, seed)


def test_a_note_marks_a_moment_to_cut_the_history_at(crash: Crash) -> None:
    crash.run('''
        from wal.drill import crashsim
        durable_file("f", b"one")
        crashsim.note("one is durable")
        fd = os.open(P("f"), os.O_WRONLY | os.O_APPEND)
        os.write(fd, b" two")
        os.fsync(fd)
        crashsim.note("two is durable")
        os.unlink(P("f"))
        dsync(ROOT)
        crash()
    ''')
    notes = {r.path: r.pos for r in crashsim.read_journal(crash.journal).records if r.kind == crashsim.NOTE}
    assert list(notes) == ["one is durable", "two is durable"]
    assert listing(crash.cut("drop")[0]) == {}
    assert listing(crash.cut("drop", at=notes["two is durable"])[0]) == {"f": b"one two"}
    assert listing(crash.cut("garble", 5, at=notes["one is durable"])[0]) == {"f": b"one"}


def test_log_opens_strictly_after_a_power_cut_during_a_group_fsync(crash: Crash) -> None:
    """A later sector of the group kept and an earlier one lost is a torn tail (FORMAT.md rule T)."""
    crash.run('''
        import wal
        os.mkdir(P("log")); dsync(ROOT)
        log = wal.Log.open(P("log"), durability="sync", segment_bytes=64 << 10)
        for k in range(5):
            log.append(b"acked %d " % k + b"a" * 300)
        log.append_many([b"group %d " % k + b"g" * 100 for k in range(24)])   # one write(), one fdatasync
        crash()
    ''')
    records = crashsim.read_journal(crash.journal).records
    last_fsync = [r for r in records if r.kind == crashsim.FSYNC and r.path.endswith(".wal")][-1]
    for seed in range(8):  # the power fails while that last fdatasync runs
        root, _ = crash.cut("garble", seed, at=last_fsync.pos)
        records = _read_log(root)  # strict recovery opens it ...
        assert all(records[lsn].startswith(b"acked %d " % (lsn - 1)) for lsn in range(1, 6))  # every acked one


STORE_CHILD = '''
    import wal
    os.mkdir(P("store")); dsync(ROOT)                # the store's directory itself durable
    store = wal.open(P("store"), durability="sync", segment_bytes=64 << 10, checkpoint_bytes={checkpoint_bytes})
    for i in range(10**9):
        lsn = store.put(f"key{{i:05d}}", b"v%d" % i * 100)
        say(i, lsn)
        if {checkpoint_every} and i % {checkpoint_every} == {checkpoint_every} - 1:
            store.checkpoint()
'''


def _check_store(root: Path, acked: dict[int, int], report: crashsim.PowerCutReport) -> None:
    with wal.open(root / "store") as store:  # strict recovery: a power cut leaves only a torn tail
        present = [k for k, _ in store.scan(b"key")]
        n = len(present)
        assert present == [f"key{i:05d}".encode() for i in range(n)], "I3: a gap-free prefix of the commits"
        for i, lsn in acked.items():
            assert store.get(f"key{i:05d}") == b"v%d" % i * 100, f"I2: acknowledged commit {i} lost\n{report}"
            assert store.version(f"key{i:05d}") == lsn


def test_store_at_sync_keeps_every_acknowledged_commit_through_random_power_cuts(crash: Crash) -> None:
    lines = _run_until(crash, STORE_CHILD.format(checkpoint_every=0, checkpoint_bytes=1 << 40), 400)
    acked = {int(i): int(lsn) for i, lsn in (line.split() for line in lines)}
    for seed in range(3):
        root, report = crash.cut("random", seed)
        _check_store(root, acked, report)


def test_store_at_sync_with_checkpoints_keeps_every_acknowledged_commit_through_power_cuts(crash: Crash) -> None:
    lines = _run_until(crash, STORE_CHILD.format(checkpoint_every=100, checkpoint_bytes=1 << 16), 400)
    acked = {int(i): int(lsn) for i, lsn in (line.split() for line in lines)}
    root, report = crash.cut("drop")
    _check_store(root, acked, report)


def test_a_new_store_survives_a_power_cut_without_the_caller_fsyncing_its_parent(crash: Crash) -> None:
    lines = crash.run('''
        import wal
        store = wal.open(P("store"), durability="sync")
        print(store.put("k", b"v"), flush=True)
        crash()
    ''')
    root, report = crash.cut("drop")
    with wal.open(root / "store") as store:
        assert store.get("k") == b"v", f"acknowledged LSN {lines[0]} lost\n{report}"


def test_env_for_refuses_a_journal_inside_the_root(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="outside the root"):
        crashsim.env_for(tmp_path / "root", tmp_path / "root" / "journal")
    env = crashsim.env_for(tmp_path / "root", tmp_path / "journal")
    assert env["LD_PRELOAD"].split()[0] == crashsim.shim_path()
    assert env[crashsim.ROOT_ENV] == str((tmp_path / "root").resolve())


def test_a_child_without_changes_or_journal_is_a_no_op(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "f").write_bytes(b"x")
    report = crashsim.apply_power_cut(tmp_path / "root", tmp_path / "journal", mode="random", seed=3)
    assert report.records == 0 and not report.files and not report.entries
    assert (tmp_path / "root" / "f").read_bytes() == b"x"
