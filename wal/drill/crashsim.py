"""A simulated power cut, for tests: journal a real process's file changes, then rewind them offline.

How it works
------------
A child process is started with the LD_PRELOAD shim ``wal/_crashsim*.so`` (native/crashsim.c;
`env_for` builds its environment). The shim journals, before performing it, every change the
process makes under a root directory -- with the old bytes, old sizes and replaced names needed to
undo it -- and every fsync/fdatasync/sync that returned. The process is then killed (SIGKILL at any
moment) or simply exits without syncing; its page cache, and so the files and the journal, are
intact. `apply_power_cut` reads the journal and rewinds the files to a state a disk could hold had
the power failed at that moment. Because it works at the libc boundary of a real process, it covers
our C log writer, Python's own file I/O and LMDB (whose liblmdb, linked into py-lmdb's extension,
calls pwrite/writev/fdatasync through the PLT) alike.

The model (what a power cut does to the files)
----------------------------------------------
Data of a file (by inode, so renames and hard links do not matter):
  - a change (write/pwrite/writev/pwritev, ftruncate/truncate, O_TRUNC, fallocate) is durable once
    an fsync or fdatasync of that file (or a write on an O_DSYNC/O_SYNC descriptor, or with
    RWF_DSYNC, or a sync()/syncfs()) returned after it. fdatasync also makes the size durable.
  - what is not durable is, per file and by `mode`:
      ``drop``    all undone: the file holds exactly its durable content and size;
      ``prefix``  a random prefix (in issue order) of the unsynced changes kept, the rest undone;
      ``garble``  the byte ranges touched by unsynced changes are decided per 512-byte sector:
                  a sector inside the durable size ends up old or new (sector writes are atomic,
                  which is what keeps LMDB's meta pages sound); a sector beyond the durable size
                  ends up new, zeros or random bytes (stale blocks); the size is the durable size
                  or the size at the crash. ``garble_overwrites=True`` also allows zeros and
                  random bytes inside the durable size (a device that tears sectors);
      ``random``  each file picks one of the three, with the directory entries kept as a prefix.
Directory entries (by the inode of the directory that holds them):
  - creating a file (open O_CREAT of a missing name, link, symlink), mkdir, rename, unlink and
    rmdir are durable once an fsync of that directory (or sync()/syncfs()) returned after them. A
    rename counts as durable with the new name's directory; it is atomic (old name or new name).
  - the ones that are not durable are undone, newest first: new names removed, renames reverted,
    unlinked files restored (the very inode, hard-linked aside by the shim, so they come back with
    their durable content), removed directories recreated. In modes ``prefix`` and ``random`` a
    random prefix (in issue order) of them is kept instead -- e.g. a rename that reached the disk
    while the renamed file's data did not, the classic zero-length-file-after-rename state.
  - a directory whose creation is undone takes everything under it along (``orphans="remove"``,
    the strict POSIX reading: its entry never reached the disk, so nothing under it is reachable;
    on ext4 with data=ordered it would usually survive). ``orphans="keep"`` only removes it when
    it is empty.
  - a file created and fsynced whose directory was never fsynced disappears; a file whose
    creation is durable but whose data was never synced is there with its durable (maybe empty)
    content.
The machine restarts: `apply_power_cut` sets a new boot id in this process's environment
($AGENTWAL_BOOT_ID, read by wal._fs.boot_id), inherited by the children started afterwards, so
the store knows its unsynced writes are gone, as it would after a real restart.
`at=` cuts the history at a journal position first (everything journaled from there on is undone
exactly), so one run can be cut at every fsync boundary or at a `note` the child wrote.

What the model does NOT cover
-----------------------------
  - reordering beyond "a prefix of the unsynced changes" per file, and across files (each file is
    decided on its own; real disks may persist a later write to file A and not an earlier one to
    file B, which this allows, but never a later write to A without an earlier one to A in
    ``prefix`` mode); torn sectors smaller than 512 bytes; torn writes inside the durable size
    other than per sector old/new unless ``garble_overwrites``;
  - quirks of a particular filesystem: ext4's data=ordered (which makes many unsynced renames
    safe), delayed allocation heuristics (auto_da_alloc), btrfs/xfs log ordering, fast commits;
    metadata other than names and sizes (mode, owner, times, xattrs) is not modelled at all;
  - writes through mmap(MAP_SHARED) and msync (not seen; LMDB is used without MDB_WRITEMAP, and
    its lock file is only mmapped state it rebuilds), stdio (fopen/fwrite bypass the PLT),
    copy_file_range/sendfile/splice into tracked files, raw syscall(2), io_uring and AIO;
  - O_DIRECT is treated like buffered I/O; sync_file_range is (correctly) no durability;
  - other processes: only processes carrying the shim are journaled (children inherit it); the
    page cache of processes without it, and two processes writing one file at once, are not
    modelled;
  - the device's write cache is assumed honest: an fsync that returned means durable.
  - an unlinked file that could not be hard-linked aside (journal on another filesystem) is saved
    as a copy: changes made through a still-open descriptor after the unlink are then lost from it.
Keep the journal next to the root (same filesystem), outside it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import json
import os
import random
import shutil
import stat
import struct
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal, cast

from wal._fs import BOOT_ID_ENV

__all__ = [
    "EntryOutcome",
    "FileOutcome",
    "Journal",
    "PowerCutReport",
    "Record",
    "apply_power_cut",
    "clone",
    "env_for",
    "journal_summary",
    "note",
    "read_journal",
    "shim_path",
]

Mode = Literal["drop", "prefix", "garble", "random"]
ROOT_ENV = "AGENTWAL_CRASHSIM_ROOT"
JOURNAL_ENV = "AGENTWAL_CRASHSIM_JOURNAL"
SECTOR = 512
FORMAT_VERSION = 1

# Journal format: see the header comment of native/crashsim.c.
_HDR = struct.Struct("<IIQIIQQQQQIIQ")
_MAGIC = 0x314A5343
_TRAILER = 0x21444E45
START, WRITE, TRUNC, FSYNC, DIRSYNC, SYNCALL, CREATE, MKDIR, UNLINK, RMDIR, RENAME, CANCEL, NOTE = range(1, 14)
_NAMES = {START: "START", WRITE: "WRITE", TRUNC: "TRUNC", FSYNC: "FSYNC", DIRSYNC: "DIRSYNC",
          SYNCALL: "SYNCALL", CREATE: "CREATE", MKDIR: "MKDIR", UNLINK: "UNLINK", RMDIR: "RMDIR",
          RENAME: "RENAME", CANCEL: "CANCEL", NOTE: "NOTE"}
_DATA = (WRITE, TRUNC)
_ENTRIES = (CREATE, MKDIR, UNLINK, RMDIR, RENAME)
_RENAME_EXCHANGE = 2
_SYNC_KINDS = {0: "fsync", 1: "fdatasync", 2: "O_DSYNC write", 3: "RWF_DSYNC write"}

Inode = tuple[int, int]


# ---- locating the shim and starting a child ------------------------------------------------


def shim_path() -> str:
    """Absolute path of the built LD_PRELOAD shim (``wal/_crashsim*.so``)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the `wal` package: setup.py builds it there
    found = sorted(glob.glob(os.path.join(here, "_crashsim*.so")))
    if not found:
        raise FileNotFoundError(
            f"the crash-simulation shim is not built (no _crashsim*.so in {here}); "
            "build it with `pip install -e .` from the project root"
        )
    return found[0]


def env_for(root: str | os.PathLike[str], journal: str | os.PathLike[str], *,
            base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment to start a child with so its changes under `root` are journaled.

    Returns a copy of `base` (default: ``os.environ``) with LD_PRELOAD (the shim first),
    AGENTWAL_CRASHSIM_ROOT and AGENTWAL_CRASHSIM_JOURNAL set. Creates `root` and the journal's
    directory. The journal must be outside the root; keep it on the same filesystem.
    """
    root_s = os.path.realpath(os.fspath(root))
    journal_s = os.path.abspath(os.fspath(journal))
    if root_s == "/":
        raise ValueError("the crash-simulation root cannot be /")
    jdir = os.path.realpath(os.path.dirname(journal_s))
    if jdir == root_s or jdir.startswith(root_s + os.sep):
        raise ValueError(f"the journal {journal_s} must be outside the root {root_s}")
    os.makedirs(root_s, exist_ok=True)
    os.makedirs(jdir, exist_ok=True)
    env = dict(os.environ if base is None else base)
    preload = env.get("LD_PRELOAD", "").strip()
    env["LD_PRELOAD"] = shim_path() + (" " + preload if preload else "")
    env[ROOT_ENV] = root_s
    env[JOURNAL_ENV] = os.path.join(jdir, os.path.basename(journal_s))
    return env


@functools.cache
def _note_fn() -> Callable[[bytes], None] | None:
    try:
        fn = ctypes.CDLL(None).agentwal_crashsim_note
    except AttributeError:
        return None
    fn.argtypes = [ctypes.c_char_p]
    fn.restype = None
    return cast(Callable[[bytes], None], fn)


def note(text: str) -> None:
    """In a child running under the shim: journal a NOTE (e.g. "ack 17") to cut at later. Else a no-op."""
    fn = _note_fn()
    if fn is not None:
        fn(text.encode())


# ---- reading the journal ----------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One journal record; `pos` is its byte offset in the journal (the global order)."""

    pos: int
    kind: int
    pid: int
    flags: int
    dev: int
    ino: int
    a: int
    b: int
    c: int
    path: str
    path2: str
    data: bytes

    @property
    def name(self) -> str:
        return _NAMES.get(self.kind, f"type{self.kind}")

    @property
    def inode(self) -> Inode:
        """The file (data and sync records) or the parent directory (directory-entry records)."""
        return (self.dev, self.ino)

    def describe(self) -> str:
        k = self.kind
        if k == WRITE:
            return f"{self.path!r} [{self.a}, {self.a + self.b}) over size {self.c} ({len(self.data)} old bytes)"
        if k == TRUNC:
            return f"{self.path!r} size {self.c} -> {self.a}"
        if k in (FSYNC, DIRSYNC):
            return f"{self.path!r} {_SYNC_KINDS.get(self.b, '?') if k == FSYNC else 'fsync'} covers < {self.a}"
        if k == SYNCALL:
            return f"covers < {self.a}"
        if k == RENAME:
            return f"{self.path!r} -> {self.path2!r}" + (" (replaced a file)" if self.flags & 1 else "")
        if k == UNLINK:
            return f"{self.path!r} (saved as {self.path2 or 'nothing'})"
        if k == CANCEL:
            return f"record at {self.a} failed"
        if k == START:
            return f"root {self.path!r}, format {self.a}"
        return repr(self.path)


@dataclass(frozen=True)
class Journal:
    records: list[Record]
    size: int
    torn_bytes: int  # bytes of a last record the kill cut short (ignored)


def read_journal(journal: str | os.PathLike[str]) -> Journal:
    """Parse a journal. A missing journal is an empty one; an incomplete last record is ignored."""
    try:
        with open(journal, "rb") as f:
            buf = f.read()
    except FileNotFoundError:
        return Journal([], 0, 0)
    out: list[Record] = []
    pos = 0
    size = len(buf)
    while pos + _HDR.size <= size:
        (magic, kind, length, pid, flags, dev, ino, a, b, c, len1, len2, datalen) = _HDR.unpack_from(buf, pos)
        if magic != _MAGIC or length != _HDR.size + len1 + len2 + datalen + 4:
            if pos + length > size and magic == _MAGIC:
                break
            raise ValueError(f"journal {os.fspath(journal)}: bad record at offset {pos}")
        if pos + length > size:
            break
        (trailer,) = struct.unpack_from("<I", buf, pos + length - 4)
        if trailer != _TRAILER:
            raise ValueError(f"journal {os.fspath(journal)}: bad trailer of the record at offset {pos}")
        p = pos + _HDR.size
        path = os.fsdecode(buf[p:p + len1])
        path2 = os.fsdecode(buf[p + len1:p + len1 + len2])
        data = buf[p + len1 + len2:p + len1 + len2 + datalen]
        out.append(Record(pos, kind, pid, flags, dev, ino, a, b, c, path, path2, data))
        pos += length
    return Journal(out, size, size - pos)


def journal_summary(journal: str | os.PathLike[str], *, limit: int = 200) -> str:
    """A readable listing of a journal (first `limit` records), for debugging a test."""
    j = read_journal(journal)
    counts = Counter(r.name for r in j.records)
    lines = [f"journal {os.fspath(journal)}: {len(j.records)} records, {j.size} bytes"
             + (f", {j.torn_bytes} bytes of a torn last record ignored" if j.torn_bytes else ""),
             "  " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))]
    for r in j.records[:limit]:
        lines.append(f"  @{r.pos:<9} pid {r.pid:<7} {r.name:<8} {r.describe()}")
    if len(j.records) > limit:
        lines.append(f"  ... {len(j.records) - limit} more")
    return "\n".join(lines)


# ---- the report ---------------------------------------------------------------------------------


@dataclass
class FileOutcome:
    """What the power cut did to one file's data."""

    path: str  # where the file is (root-relative; "<side>/..." for a file unlinked at the crash)
    inode: Inode
    mode: str  # "drop" | "prefix" | "garble" | "cut" (only undone past `at`) | "missing"
    unsynced: int  # changes not covered by an fsync
    kept: int
    dropped: int
    dropped_bytes: int  # bytes written by the undone changes
    size_at_crash: int
    size_after: int
    sectors: dict[str, int] = field(default_factory=dict)  # garble: sectors per outcome


@dataclass
class EntryOutcome:
    """What the power cut did to one directory-entry operation that was not durable."""

    op: str
    path: str
    path2: str
    result: str  # "undone", "kept", "cut" (past `at`, undone) or "skipped: <why>"


@dataclass
class PowerCutReport:
    mode: str
    seed: int
    at: int | None
    records: int
    torn_journal_bytes: int
    files: list[FileOutcome] = field(default_factory=list)
    entries: list[EntryOutcome] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)  # lost with a directory whose creation was undone

    @property
    def dropped_records(self) -> int:
        return sum(f.dropped for f in self.files)

    @property
    def kept_records(self) -> int:
        return sum(f.kept for f in self.files)

    @property
    def undone_entries(self) -> int:
        return sum(1 for e in self.entries if e.result in ("undone", "cut"))

    def __str__(self) -> str:
        head = (f"power cut mode={self.mode} seed={self.seed}" + (f" at={self.at}" if self.at is not None else "")
                + f": {self.records} journal records; data changes dropped {self.dropped_records}, "
                f"kept unsynced {self.kept_records}; directory operations undone {self.undone_entries}")
        lines = [head]
        for f in self.files:
            extra = f" sectors {dict(f.sectors)}" if f.sectors else ""
            lines.append(f"  file {f.path!r} {f.mode}: unsynced {f.unsynced}, kept {f.kept}, dropped {f.dropped} "
                         f"({f.dropped_bytes} bytes), size {f.size_at_crash} -> {f.size_after}{extra}")
        for e in self.entries:
            lines.append(f"  {e.op} {e.path!r}" + (f" -> {e.path2!r}" if e.path2 else "") + f": {e.result}")
        for p in self.removed:
            lines.append(f"  lost with its undone directory: {p!r}")
        return "\n".join(lines)


# ---- applying a power cut -------------------------------------------------------------------------


def _side_dir(journal: str) -> str:
    return journal + ".side"


def _map_path(journal: str) -> str:
    return journal + ".inodes"


def _locate(root: str, journal: str) -> dict[Inode, str]:
    """inode -> a path holding it now (in the root, or in the side directory if unlinked)."""
    side = _side_dir(journal)
    mapped = _map_path(journal)
    found: dict[Inode, str] = {}
    if os.path.exists(mapped):  # a clone(): inode numbers are those of the original files
        with open(mapped, encoding="utf-8") as f:
            raw: dict[str, list[str]] = json.load(f)
        for key, (where, rel) in raw.items():
            dev, ino = (int(x) for x in key.split(":"))
            found[(dev, ino)] = os.path.join(root if where == "root" else side, rel)
        return found
    for top in (root, side):
        for dirpath, _dirs, files in os.walk(top):
            for name in files:
                p = os.path.join(dirpath, name)
                st = os.lstat(p)
                if stat.S_ISREG(st.st_mode):
                    found.setdefault((st.st_dev, st.st_ino), p)
    return found


def _undo_data(fd: int, r: Record) -> None:
    if r.kind == WRITE:
        if r.data:
            os.pwrite(fd, r.data, r.a)
        if os.fstat(fd).st_size != r.c:
            os.ftruncate(fd, r.c)
    else:  # TRUNC: size c -> a
        os.ftruncate(fd, r.c)
        if r.data:
            os.pwrite(fd, r.data, r.a)


def _span(r: Record) -> tuple[int, int]:
    if r.kind == WRITE:
        return r.a, r.a + r.b
    return min(r.a, r.c), max(r.a, r.c)


def _runs(sectors: list[int]) -> Iterator[tuple[int, int]]:
    """Consecutive sector numbers as [first, end) runs."""
    i = 0
    while i < len(sectors):
        j = i
        while j + 1 < len(sectors) and sectors[j + 1] == sectors[j] + 1:
            j += 1
        yield sectors[i], sectors[j] + 1
        i = j + 1


def _pread_padded(fd: int, length: int, offset: int) -> bytes:
    data = os.pread(fd, length, offset) if length > 0 else b""
    return data + bytes(length - len(data))


def _garble(fd: int, unsynced: list[Record], rng: random.Random, overwrites: bool, counts: Counter[str]) -> None:
    size_crash = os.fstat(fd).st_size
    sectors: set[int] = set()
    for r in unsynced:
        lo, hi = _span(r)
        if hi > lo:
            sectors.update(range(lo // SECTOR, (hi + SECTOR - 1) // SECTOR))
    order = sorted(sectors)
    new = {run: _pread_padded(fd, (run[1] - run[0]) * SECTOR, run[0] * SECTOR) for run in _runs(order)}
    for r in reversed(unsynced):
        _undo_data(fd, r)
    size_durable = os.fstat(fd).st_size
    final = size_durable if size_durable == size_crash else rng.choice((size_durable, size_crash))
    if final != size_durable:
        os.ftruncate(fd, final)
    for (first, end), new_bytes in new.items():
        start = first * SECTOR
        if start >= final:
            continue
        stop = min(end * SECTOR, final)
        old_bytes = _pread_padded(fd, stop - start, start)
        out = bytearray()
        for s in range(first, end):
            lo = s * SECTOR
            if lo >= stop:
                break
            n = min(SECTOR, stop - lo)
            if lo < size_durable:  # an overwrite: sector writes are atomic unless told otherwise
                choices: tuple[str, ...] = ("old", "new", "zeros", "random") if overwrites else ("old", "new")
            else:  # newly allocated: the data, never-written zeros, or a stale block
                choices = ("new", "zeros", "random")
            pick = rng.choice(choices)
            counts[pick] += 1
            if pick == "old":
                out += old_bytes[lo - start:lo - start + n]
            elif pick == "new":
                out += new_bytes[lo - start:lo - start + n]
            elif pick == "zeros":
                out += bytes(n)
            else:
                out += rng.randbytes(n)
        os.pwrite(fd, bytes(out), start)


def apply_power_cut(
    root: str | os.PathLike[str],
    journal: str | os.PathLike[str],
    *,
    mode: Mode = "drop",
    seed: int = 0,
    at: int | None = None,
    garble_overwrites: bool = False,
    orphans: Literal["remove", "keep"] = "remove",
    consume: bool = True,
) -> PowerCutReport:
    """Rewind the files under `root` to a state a power cut could leave (see the module docstring).

    The child that wrote `journal` must be dead. `seed` makes the random choices repeatable.
    `at`: cut the history at this journal position first (records from there on are undone
    exactly, as if the process had stopped there). With `consume` (the default) the journal and
    its side directory are deleted afterwards: the files now are the durable state, and a next
    child may start a fresh journal on them.
    """
    if mode not in ("drop", "prefix", "garble", "random"):
        raise ValueError(f"mode must be 'drop', 'prefix', 'garble' or 'random', got {mode!r}")
    if orphans not in ("remove", "keep"):
        raise ValueError(f"orphans must be 'remove' or 'keep', got {orphans!r}")
    root_s = os.path.realpath(os.fspath(root))
    journal_s = os.path.abspath(os.fspath(journal))
    if not os.path.isdir(root_s):
        raise FileNotFoundError(f"no root directory {root_s}")
    j = read_journal(journal_s)
    cut = j.size if at is None else at
    rng = random.Random(seed)
    report = PowerCutReport(mode, seed, at, len(j.records), j.torn_bytes)

    cancelled = {r.a for r in j.records if r.kind == CANCEL}
    live = [r for r in j.records if r.pos not in cancelled and r.kind != CANCEL]
    file_sync: dict[Inode, int] = {}
    dir_sync: dict[Inode, int] = {}
    all_sync = 0
    for r in live:
        if r.pos >= cut:
            continue
        if r.kind == FSYNC:
            file_sync[r.inode] = max(file_sync.get(r.inode, 0), r.a)
        elif r.kind == DIRSYNC:
            dir_sync[r.inode] = max(dir_sync.get(r.inode, 0), r.a)
        elif r.kind == SYNCALL:
            all_sync = max(all_sync, r.a)

    # Data first, by inode: renames and unlinks move names, never inodes, so this commutes with
    # the directory undo below (unlinked inodes are kept alive in the side directory).
    by_inode: dict[Inode, list[Record]] = {}
    for r in live:
        if r.kind in _DATA:
            by_inode.setdefault(r.inode, []).append(r)
    where = _locate(root_s, journal_s) if by_inode else {}
    side = _side_dir(journal_s)
    for key, recs in by_inode.items():
        durable_upto = max(file_sync.get(key, 0), all_sync)
        future = [r for r in recs if r.pos >= cut]
        unsynced = [r for r in recs if durable_upto <= r.pos < cut]
        if not future and not unsynced:
            continue
        path = where.get(key)
        shown = recs[-1].path
        if path is None:
            report.files.append(FileOutcome(shown, key, "missing", len(unsynced), 0, 0, 0, 0, 0))
            continue
        shown = (os.path.relpath(path, root_s) if not path.startswith(side + os.sep)
                 else "<side>/" + os.path.relpath(path, side))
        fmode = rng.choice(("drop", "prefix", "garble")) if mode == "random" else mode
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            for r in reversed(future):
                _undo_data(fd, r)
            size_crash = os.fstat(fd).st_size
            counts: Counter[str] = Counter()
            keep = 0
            if unsynced and fmode == "prefix":
                keep = rng.randint(0, len(unsynced))
            if unsynced and fmode == "garble":
                _garble(fd, unsynced, rng, garble_overwrites, counts)
            else:
                for r in reversed(unsynced[keep:]):
                    _undo_data(fd, r)
            size_after = os.fstat(fd).st_size
        finally:
            os.close(fd)
        dropped = unsynced[keep:] if fmode != "garble" else []
        report.files.append(FileOutcome(
            shown, key, fmode if unsynced else "cut", len(unsynced), keep if fmode != "garble" else 0, len(dropped),
            sum(_span(r)[1] - _span(r)[0] for r in dropped), size_crash, size_after, dict(counts)))

    # Directory entries, newest first.
    entries = [r for r in live if r.kind in _ENTRIES]
    future_e = [r for r in entries if r.pos >= cut]
    nondurable = [r for r in entries if r.pos < cut and r.pos >= max(dir_sync.get(r.inode, 0), all_sync)]
    keep_e = rng.randint(0, len(nondurable)) if mode in ("prefix", "random") else 0
    for r in nondurable[:keep_e]:
        report.entries.append(EntryOutcome(r.name, r.path, r.path2, "kept"))
    for r in [*reversed(future_e), *reversed(nondurable[keep_e:])]:
        result = _undo_entry(root_s, side, r, orphans, report)
        report.entries.append(EntryOutcome(r.name, r.path, r.path2, "cut" if r.pos >= cut and result == "undone"
                                           else result))

    if consume:
        shutil.rmtree(side, ignore_errors=True)
        for p in (journal_s, _map_path(journal_s)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
    simulate_restart()
    return report


def simulate_restart() -> None:
    """A power cut restarts the machine, and what was in its page cache is gone: give this process,
    and the children it starts from now on, a new boot id (wal._fs.boot_id), so a store opened
    after the cut treats what it did not sync as lost (wal/store/state.py restores its last checkpoint)."""
    os.environ[BOOT_ID_ENV] = os.urandom(16).hex()


def _lexists(p: str) -> bool:
    return os.path.lexists(p)


def _isdir(p: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(p).st_mode)
    except FileNotFoundError:
        return False


def _move(src: str, dst: str) -> None:
    try:
        os.rename(src, dst)
    except OSError:
        shutil.move(src, dst)


def _undo_entry(root: str, side: str, r: Record, orphans: str, report: PowerCutReport) -> str:
    p = os.path.join(root, r.path)
    if r.kind == CREATE:
        if not _lexists(p):
            return "skipped: already gone"
        if _isdir(p):
            return "skipped: a directory is there now"
        os.unlink(p)
        return "undone"
    if r.kind == MKDIR:
        if not _isdir(p):
            return "skipped: already gone"
        inside = sorted(os.path.relpath(os.path.join(d, n), root)
                        for d, dirs, files in os.walk(p) for n in (*dirs, *files))
        if inside and orphans == "keep":
            return "skipped: not empty"
        report.removed.extend(inside)
        shutil.rmtree(p)
        return "undone"
    if r.kind == UNLINK:
        saved = os.path.join(side, r.path2)
        if r.flags & 2 or not r.path2 or not _lexists(saved):
            return "skipped: nothing saved"
        if _lexists(p):
            return "skipped: the name is taken"
        if not _isdir(os.path.dirname(p)):
            return "skipped: its directory is gone"
        _move(saved, p)
        return "undone"
    if r.kind == RMDIR:
        if _lexists(p):
            return "skipped: the name is taken"
        os.mkdir(p)
        return "undone"
    # RENAME path -> path2
    new = os.path.join(root, r.path2)
    if r.b & _RENAME_EXCHANGE:
        if not (_lexists(p) and _lexists(new)):
            return "skipped: one side is gone"
        tmp = p + ".crashsim-exchange"
        os.rename(new, tmp)
        os.rename(p, new)
        os.rename(tmp, p)
        return "undone"
    if not _lexists(new):
        return "skipped: renamed again"
    if _lexists(p):
        return "skipped: the old name is taken"
    if not _isdir(os.path.dirname(p)):
        return "skipped: the old directory is gone"
    os.rename(new, p)
    if r.flags & 1:
        saved = os.path.join(side, r.data.decode())
        if _lexists(saved):
            _move(saved, new)
    elif r.flags & 2:
        os.mkdir(new)
    return "undone"


# ---- trying several power cuts on one crash ---------------------------------------------------------


def copy_sparse(src: str, dst: str) -> None:
    """Copy a file, leaving its all-zero megabytes as holes (preallocated segments stay sparse)."""
    chunk = 1 << 20
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        size = os.fstat(fin.fileno()).st_size
        while True:
            buf = fin.read(chunk)
            if not buf:
                break
            if buf.count(0) == len(buf):
                fout.seek(len(buf), os.SEEK_CUR)
            else:
                fout.write(buf)
        fout.truncate(size)
    shutil.copymode(src, dst)


def clone(root: str | os.PathLike[str], journal: str | os.PathLike[str],
          new_root: str | os.PathLike[str], new_journal: str | os.PathLike[str]) -> None:
    """Copy a crashed root with its journal, so several power cuts (seeds, modes, `at`) can be
    tried on one crash. The copy carries a map from the original inodes to its files, which
    `apply_power_cut` uses in place of inode numbers. `new_root` must not exist yet."""
    root_s, journal_s = os.path.realpath(os.fspath(root)), os.path.abspath(os.fspath(journal))
    new_root_s, new_journal_s = os.path.abspath(os.fspath(new_root)), os.path.abspath(os.fspath(new_journal))
    mapping: dict[str, list[str]] = {}
    copied: dict[Inode, str] = {}
    if os.path.exists(_map_path(journal_s)):
        raise ValueError(f"{journal_s} is itself a clone; clone the original")

    def copy_tree(src: str, dst: str, tag: str) -> None:
        os.makedirs(dst)
        for dirpath, dirs, files in os.walk(src):
            target = os.path.join(dst, os.path.relpath(dirpath, src))
            for name in (*dirs, *files):
                s, t = os.path.join(dirpath, name), os.path.join(target, name)
                st = os.lstat(s)
                if stat.S_ISLNK(st.st_mode):
                    os.symlink(os.readlink(s), t)
                elif stat.S_ISDIR(st.st_mode):
                    os.mkdir(t)
                    shutil.copymode(s, t)
                elif stat.S_ISREG(st.st_mode):
                    key = (st.st_dev, st.st_ino)
                    if key in copied:
                        os.link(copied[key], t)
                    else:
                        copy_sparse(s, t)
                        copied[key] = t
                        mapping[f"{key[0]}:{key[1]}"] = [tag, os.path.relpath(t, dst)]

    copy_tree(root_s, new_root_s, "root")
    side = _side_dir(journal_s)
    if os.path.isdir(side):
        copy_tree(side, _side_dir(new_journal_s), "side")
    else:
        os.makedirs(_side_dir(new_journal_s))
    if os.path.exists(journal_s):
        shutil.copyfile(journal_s, new_journal_s)
    else:
        open(new_journal_s, "wb").close()
    with open(_map_path(new_journal_s), "w", encoding="utf-8") as f:
        json.dump(mapping, f)
