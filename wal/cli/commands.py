"""The `agentwal` command line (also ``python -m wal``).

Why argparse: it is in the standard library, so an embedded engine whose only runtime
dependencies are cffi and lmdb gains none for its CLI; it has subcommands
(``add_subparsers``), and ``--help`` at both levels is generated from the same declarations
the parser uses, so the help cannot drift from what is accepted. click or typer would add a
dependency for nothing argparse cannot do here.

Structure: every subcommand is one `Command` in `COMMANDS` -- a name, a one-line summary
(shown by ``agentwal --help``), a description (shown by ``agentwal NAME --help``), a function
declaring its arguments and one function running it, ``cmd_NAME(args) -> exit status``.
The operator commands (``info``, ``verify``, ``dump``, ``get``/``put``/``delete``/``scan``,
``export``/``import``, ``checkpoint``, ``repair``, ``tail``, ``stats``) do their work in `wal.ops`,
one function per command returning data; the ``cmd_*`` functions here only parse, call it and
print. Read-only commands never take the writer lock, so they work while an agent runtime has
the store open; writing ones open the store as its one writer and say who holds it when
another process does.

Output: data to stdout (JSON lines where a program is the likely reader), messages, warnings
and progress bars to stderr. ``-v`` shows the library's INFO log lines (recovery summaries,
checkpoints) on stderr; WARNINGs (a torn tail cut, a slow fsync) show by default.

Exit status: 0 success; 1 the command ran and found a failure (damage, a missing key, the
demo's check) or the store raised a `wal.WalError` (e.g. another writer holds the lock); 2 bad
usage (argparse's convention; also a refused confirmation); 130 interrupted (Ctrl-C), except
``tail -f``, for which Ctrl-C is the normal way to stop (0).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

import wal
from wal import ops
from wal._fs import fsync_dir
from wal.cli import archive as _archive_cli
from wal.drill import demo
from wal.log import durability as dur
from wal.ops import metrics
from wal.store.store import read_archive_status

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the descriptions' own line breaks (examples, lists); wraps argument help."""


@dataclass(frozen=True)
class Command:
    """One subcommand: `arguments` declares its options on its parser; `run` returns the exit status."""

    name: str
    summary: str
    description: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


_INT_MAX = (1 << 63) - 1  # what the C core takes (an LSN, a count): a larger one was an OverflowError


def _int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse `type` accepting an integer in [low, high] (high: at most 2^63 - 1)."""
    top = _INT_MAX if high is None else high

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low or value > top:
            bound = f"between {low} and {top}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return parse


# ---- demo ------------------------------------------------------------------------------------------

_DEMO_DESCRIPTION = """\
Simulate AI agents whose whole state lives in an agentwal store, kill their process
with SIGKILL at random moments, restart it, and prove nothing acknowledged was lost.

A worker process runs N agents (asyncio tasks), each a multi-step workflow (research:
search, read, summarize; support: classify, lookup, reply; ...). Every step is one
transaction writing the agent's step counter, a conversation message and a tool-call
result, guarded by if_version on the counter and an idempotency key. The worker prints an
ACK line per acknowledged step. The demo SIGKILLs it K times (during start-up, during
recovery, mid-workflow), restarts it each time -- every agent resumes from its stored
counter -- and lets the last run finish. Then it opens the store itself and checks that
every acknowledged step is present, at the LSN it was acknowledged at, and that no step
was applied twice.

It prints a table (per run: how it ended, recovery time, records replayed, commits,
fsyncs, group size) and a verdict line. Exit status 0 when the check passed, 1 when it
failed (the failures are listed), 2 on bad usage (e.g. DIR not empty).

examples:
  agentwal demo                                  # 8 agents x 60 steps, 5 kills, temp dir
  agentwal demo ./demo-store --kills 20 --seed 7
  agentwal demo --durability buffered --rpo-ms 50  # losses within 50 ms are allowed
"""


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", metavar="DIR", nargs="?", default=None,
                   help="directory for the store; must be absent or empty "
                        "(default: a new temporary directory, printed and kept)")
    p.add_argument("--agents", type=_int_in(1, demo.MAX_AGENTS), default=8, metavar="N",
                   help="number of simulated agents (default: %(default)s)")
    p.add_argument("--kills", type=_int_in(0), default=5, metavar="K",
                   help="times the worker is SIGKILLed and restarted (default: %(default)s)")
    p.add_argument("--steps", type=_int_in(1, demo.MAX_STEPS), default=60, metavar="N",
                   help="workflow steps per agent (default: %(default)s)")
    p.add_argument("--seed", type=int, default=None, metavar="S",
                   help="seed for the workflows and the kill plan; the run is repeatable given it, "
                        "apart from kill timing (default: random, printed)")
    p.add_argument("--durability", choices=dur.LEVELS, default=None,
                   help="the store's durability level (default: sync, or interval when --rpo-ms > 0)")
    p.add_argument("--rpo-ms", type=_int_in(0), default=None, metavar="T",
                   help="RPO bound in ms for interval/buffered (default: 1000 for those levels)")


def cmd_demo(args: argparse.Namespace) -> int:
    """`agentwal demo`: see `wal.drill.demo`."""
    try:
        dur.parse(args.durability, args.rpo_ms)
        return demo.run_demo(args.dir, agents=args.agents, kills=args.kills, steps=args.steps, seed=args.seed,
                             durability=args.durability, rpo_ms=args.rpo_ms)
    except (demo.DemoError, wal.ArgumentError) as exc:
        print(f"agentwal demo: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


# ---- shared by the operator commands ---------------------------------------------------------------

_READ_ONLY = ("Read-only: takes no lock, so it works while an agent runtime (the writer) has the store\n"
              "open, and changes nothing.")
_SEALED_READ = ("A sealed store's values are shown as the application wrote them: a compressed one's\n"
                "decompressed (no key needed), an encrypted one's decrypted with --key-file (the key the\n"
                "store was written under; repeat it for older keys), without which it is an error.")
_WRITER = ("Writes: opens the store as its one writer, so it fails (exit status 1, naming the process)\n"
           "while another process has the store open for writing; stop that process first, or make the\n"
           "change through it.")


def _store_argument(p: argparse.ArgumentParser, *, log_ok: bool = False) -> None:
    what = "an agentwal store (a directory with a STORE file)"
    if log_ok:
        what += ", or a bare log directory"
    p.add_argument("store", metavar="STORE", help=what)


def _key_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("key", metavar="KEY", help="the key, as UTF-8 text (see --base64-key)")
    p.add_argument("--base64-key", action="store_true", help="KEY is base64 (for binary keys)")


def _err(command: str, message: str) -> None:
    print(f"agentwal {command}: {message}", file=sys.stderr)


def _print_json(obj: object, out: TextIO | None = None) -> None:
    stream = out if out is not None else sys.stdout
    stream.write(json.dumps(obj, ensure_ascii=False) + "\n")


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 120:
        return f"{seconds:.1f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.1f} days ago"


class _ProgressBar:
    """A one-line progress bar on stderr, only when stderr is a terminal and the work lasts > 0.5 s."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty()
        self.started = time.monotonic()
        self.last = 0.0
        self.shown = False

    def __call__(self, phase: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.started < 0.5 or (now - self.last < 0.1 and done < total):
            return
        self.last = now
        frac = min(1.0, done / total) if total else 1.0
        filled = int(frac * 30)
        self.stream.write(f"\r{phase:<20} [{'#' * filled}{'.' * (30 - filled)}] {frac * 100:5.1f}%")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r" + " " * 62 + "\r")
            self.stream.flush()


# ---- info --------------------------------------------------------------------------------------------

_INFO_DESCRIPTION = f"""\
Show what a store (or bare log) holds: format versions, the writer (running or not), the
watermarks (last LSN in the log, LSN applied to the state, records the next open replays),
every segment with its size, status and LSN range, the total size, the newest and oldest
retained commit, and warnings about the storage under it (tmpfs, network filesystems,
barriers off, low free space).

{_READ_ONLY}

examples:
  agentwal info /var/lib/agent/store
  agentwal info /var/lib/agent/store --json | jq .watermarks
"""


def _info_arguments(p: argparse.ArgumentParser) -> None:
    _store_argument(p, log_ok=True)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def cmd_info(args: argparse.Namespace) -> int:
    """`agentwal info`: see `wal.ops.info`."""
    data = ops.info(args.store)
    archive = read_archive_status(args.store)  # STORE/archive.json, written by an archived store
    if archive is not None:
        data["archive"] = archive
    if args.json:
        _print_json(data)
        return EXIT_OK
    h = ops.human_bytes
    kind = "agentwal store" if data["kind"] == "store" else "bare agentwal log"
    versions = []
    if "store_format" in data:
        versions.append(f"store format {data['store_format'].get('version')}")
    if data["log_format_version"] is not None:
        versions.append(f"log format {data['log_format_version']}")
    print(f"{data['path']}: {kind}" + (f" ({', '.join(versions)})" if versions else ""))
    pid = data["writer_pid"]
    print(f"  writer:      {'running, pid ' + str(pid) if pid else 'not running'}")
    if data.get("follower_of") is not None:  # it writes only what it applies from the archive
        print(f"  role:        follower of the archive {data['follower_of']}: read-only until promoted "
              "(`agentwal follow URL DIR --promote`)")
    else:
        print(f"  durability:  {data['durability']}")
    if "sealing" in data:
        sealing = data["sealing"]
        ids = sealing["key_ids"]
        named = f" (key id{'s' if len(ids) > 1 else ''} {', '.join(ids)})" if ids else ""
        encrypted = f"encrypted{named}" if sealing["encrypted"] else "not encrypted"
        codec = sealing["compression"]
        print(f"  values:      {encrypted}, {'not compressed' if codec == 'none' else f'compressed ({codec})'}")
    if archive is not None:
        print(f"  archive:     {archive.get('archive_url')}: archived LSN {archive.get('archived_lsn')}, lag "
              f"{float(archive.get('archive_lag_ms', 0)):.0f} ms"
              + (f", ERROR: {archive['archive_error']}" if archive.get("archive_error") else "")
              + (", FENCED (another writer took over)" if archive.get("archive_fenced") else ""))
    log = data["log"]
    span = f"LSN {log['first_lsn']}..{log['last_lsn']}" if log["last_lsn"] >= log["first_lsn"] else "empty"
    print(f"  log:         {span}, {log['records']} record(s) in {log['segments']} segment(s), "
          f"{h(log['bytes'])} ({h(log['disk_bytes'])} allocated)")
    if "watermarks" in data:
        w, st = data["watermarks"], data["state"]
        print(f"  state:       applied LSN {w['applied_lsn']}, {st['keys']} key(s), {h(st['map_bytes_used'])} "
              "of LMDB map used")
        print(f"  state space: {h(st['file_bytes'])} file, {h(st['used_bytes'])} in use, {h(st['free_bytes'])} free "
              f"({st['free_pages']} page(s); `agentwal compact` returns them), "
              f"{h(st['checkpoint_reclaims_bytes'])} reusable after the next checkpoint")
        print(f"  to replay:   {w['unapplied_records']} record(s) after the applied LSN (replayed by the next open)")
        c = data["commits"]
        if c["newest"]:
            print(f"  commits:     newest {c['newest']} ({_ago(c['newest_age_s'])}), oldest retained "
                  f"{c['oldest_retained']} ({_ago(c['oldest_retained_age_s'])})")
        ckpt = data["checkpoint"]
        if isinstance(ckpt, dict):
            ckpt = f"last at {ckpt['last']} ({ckpt['age_s']} s ago), applied LSN {ckpt['applied_lsn']}"
        print(f"  checkpoint:  {ckpt}")
    print(f"  total size:  {h(data['total_bytes'])} ({h(data['total_disk_bytes'])} allocated)")
    if data["segments"]:
        print("  segments:")
        print(f"    {'NAME':<22} {'STATUS':<8} {'LSNs':<21} {'RECORDS':>8} {'DATA':>10} {'SIZE':>10}")
        for s in data["segments"]:
            lsns = f"{s['first_lsn']}..{s['last_lsn']}" if s["records"] else "-"
            status = s["status"] + (f" ({s['reason']} at {s['bad_offset']})" if s["reason"] else "")
            print(f"    {s['name']:<22} {s['status']:<8} {lsns:<21} {s['records']:>8} "
                  f"{h(s['end_offset']):>10} {h(s['size']):>10}"
                  + (f"  {status}" if s["reason"] else ""))
    if data["broken_files"]:
        print(f"  .broken files (cut by earlier recoveries; safe to delete once inspected): "
              f"{', '.join(data['broken_files'])}")
    if log["damaged"]:
        for problem in log["problems"]:
            print(f"  DAMAGE: {problem}")
        print(f"  the log is damaged: `agentwal verify {args.store}` checks everything, "
              f"`agentwal repair {args.store}` opens it at the last good record")
    elif log["torn_tail"]:
        print("  torn tail: the newest segment ends in a partial record (a crash, or a commit being written); "
              "the next writable open cuts it")
    for warning in data["warnings"]:
        print(f"  warning: {warning}")
    return EXIT_OK


# ---- verify ------------------------------------------------------------------------------------------

_VERIFY_DESCRIPTION = f"""\
Check a store end to end and say whether it is sound.

1. The log: every segment is scanned by the C reader, checking each header and record
   CRC-32C, the LSN sequence (no gaps, no reordering), seals, and the rules across
   segments (consecutive numbers, one log id, each segment starting where the last ended).
2. The state (stores only), against the log: the retained log is replayed in memory up to
   the state's applied LSN; every key's version and value in LMDB must be what the last
   record that wrote it says (deleted keys must be absent); the applied LSN must not pass
   the end of the log. Keys last written before the oldest retained segment (a checkpoint
   removed it) are counted, not checked.

A torn tail (a partial last record after a crash) is a warning, not damage: the next
writable open cuts it. --strict counts warnings as damage. A progress bar is shown on
stderr for long runs when it is a terminal.

Given an object archive's URL (s3://bucket/prefix, file:///dir) instead of a STORE, it
reads every object of the archive: each one's checksum and records, the LSNs continuous
from each snapshot on, the snapshots sound (an encrypted archive needs --key-file).

{_READ_ONLY}

exit status: 0 sound, 1 damaged (the problems name the file, offset and LSN, or the key),
2 bad usage.

examples:
  agentwal verify /var/lib/agent/store
  agentwal verify /var/lib/agent/store --json > verify.json || alert "store damaged"
  agentwal verify s3://agent-archive/prod
"""


def _verify_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", metavar="STORE", help="an agentwal store (a directory with a STORE file), a bare log "
                                                  "directory, or an object archive's URL")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--strict", action="store_true", help="treat warnings (a torn tail) as damage: exit status 1")


def cmd_verify(args: argparse.Namespace) -> int:
    """`agentwal verify`: see `wal.ops.verify` (an archive URL: `wal.archive.restore.verify`)."""
    bar = _ProgressBar()
    if "://" in args.store:
        from wal.cli import archive as archive_cli  # noqa: PLC0415

        return archive_cli.verify_url(args.store, args.json, bar)
    try:
        report = ops.verify(args.store, progress=bar)
    finally:
        bar.close()
    sound = report.sound and not (args.strict and report.warnings)
    if args.json:
        _print_json(report.as_dict() | {"sound": sound})
        return EXIT_OK if sound else EXIT_FAILED
    t = report.target
    print(f"verifying {t.path} ({'store' if t.is_store else 'bare log'})")
    span = f"LSN {report.first_lsn}..{report.last_lsn}" if report.last_lsn >= report.first_lsn else "no records"
    print(f"  log:   {len(report.segments)} segment(s), {report.log_records} record(s), {span}, "
          f"{ops.human_bytes(report.log_bytes)} of records checked")
    for s in report.segments:
        verdict = "ok" if s.status in ("open", "sealed") else f"{s.status.upper()}: {s.reason} at offset {s.bad_offset}"
        lsns = f"LSN {s.first_lsn}..{s.last_lsn}" if s.records else "no records"
        print(f"    {s.name}  {s.status:<6}  {lsns:<24} {verdict}")
    if report.applied_lsn is not None:
        print(f"  state: applied LSN {report.applied_lsn}, {report.state_keys} key(s); {report.keys_checked} "
              f"checked against the log, {report.keys_before_log} from before the oldest retained segment; "
              f"{report.records_to_replay} log record(s) after the applied LSN (replayed by the next open)")
    for note in report.notes:
        print(f"  note: {note}")
    for warning in report.warnings:
        print(f"  warning: {warning}")
    for problem in report.problems:
        print(f"  DAMAGE ({problem.area}): {problem.message}")
    if sound:
        print(f"result: sound ({report.seconds:.2f} s)")
        return EXIT_OK
    count = len(report.problems) or len(report.warnings)
    areas = {problem.area for problem in report.problems}
    advice = []
    if "log" in areas or not areas:
        advice.append(f"to open at the log's last good record, keeping a backup: agentwal repair {t.path}")
    if "store" in areas:  # nothing rebuilds STORE: it names the format and an encrypted store's key ids
        advice.append(f"no repair rewrites {t.path}/STORE (it names the store's format version and an encrypted "
                      "store's key ids): as the problem above says, put it back from a backup or use the agentwal "
                      "that wrote it")
    if "state" in areas and report.first_lsn <= 1:  # `repair` alone sees a sound log and leaves the state
        advice.append(f"to rebuild the state from the log, keeping a backup: agentwal repair --rebuild-state {t.path}")
    elif "state" in areas:  # checkpoints removed the log's start: nothing rebuilds the state from it
        advice.append("the log no longer starts at LSN 1, so the state cannot be rebuilt from it: `agentwal export` "
                      "the store and import the file into a new one (where its state can be read), put back a copy "
                      "of the store, or restore it from its object archive (agentwal restore)")
    print(f"result: DAMAGED ({count} problem(s)). " + "; ".join(a[0].upper() + a[1:] for a in advice))
    return EXIT_FAILED


# ---- dump --------------------------------------------------------------------------------------------

_DUMP_DESCRIPTION = f"""\
Print log records as JSON lines, oldest first: {{"lsn", "segment", "offset", "bytes", ...}}.
In a store each record is one transaction, shown decoded: "time", optional
"idempotency_key", and "ops" (each {{"op": "put", "key", "value"}} or {{"op": "delete",
"key"}}). Keys and values are JSON strings when they are printable UTF-8, otherwise
{{"base64": "..."}}. --raw prints each payload as it is ("payload"), as for a bare log.

By default dump stops at the first damage with exit status 1, after printing the records
before it. --salvage reads past damage instead: each segment is scanned by the C reader
and after a bad region it continues at the next valid record; every region it skipped
(file, byte range, reason, LSNs lost) is reported on stderr.

{_READ_ONLY}

examples:
  agentwal dump /var/lib/agent/store --from-lsn 1200 --to-lsn 1210
  agentwal dump /var/lib/agent/store | grep '"agent/7/step"'
  agentwal dump /var/lib/agent/store --salvage > salvaged.jsonl 2> skipped.txt
"""


def _dump_arguments(p: argparse.ArgumentParser) -> None:
    _store_argument(p, log_ok=True)
    p.add_argument("--from-lsn", type=_int_in(1), default=1, metavar="LSN",
                   help="first LSN to print (default: the oldest retained)")
    p.add_argument("--to-lsn", type=_int_in(1), default=None, metavar="LSN",
                   help="last LSN to print (default: the end)")
    p.add_argument("--raw", action="store_true", help="do not decode store transactions; print payloads")
    p.add_argument("--salvage", action="store_true",
                   help="read past damage, reporting what was skipped on stderr")


def cmd_dump(args: argparse.Namespace) -> int:
    """`agentwal dump`: see `wal.ops.dump`."""
    skipped: list[ops.Skip] = []

    def on_skip(skip: ops.Skip) -> None:
        skipped.append(skip)
        _err("dump", skip.describe())

    count = 0
    try:
        for obj in ops.dump(args.store, args.from_lsn, args.to_lsn, raw=args.raw, salvage=args.salvage,
                            on_skip=on_skip, on_note=lambda text: _err("dump", f"note: {text}")):
            _print_json(obj)
            count += 1
    except wal.CorruptionError as exc:
        sys.stdout.flush()
        _err("dump", f"error: {exc}")
        _err("dump", f"{count} record(s) printed before the damage; --salvage reads past it")
        return EXIT_FAILED
    if args.salvage:
        sys.stdout.flush()
        _err("dump", f"salvage: {count} record(s) printed, {len(skipped)} damaged region(s) skipped")
    return EXIT_OK


# ---- get / put / delete / scan -------------------------------------------------------------------------

_GET_DESCRIPTION = f"""\
Print the value of KEY. The value is written to stdout as its bytes (binary-safe; a
newline is added only when stdout is a terminal); --json prints {{"key", "version",
"value"}} instead. The state is read as of the newest commit in the log: commits a writer
made that are not yet applied to LMDB are read from the log.

{_SEALED_READ}

{_READ_ONLY}

exit status: 0 found, 1 no such key (or an encrypted store without its key).

examples:
  agentwal get /var/lib/agent/store agent/7/step
  agentwal get /var/lib/agent/store agent/7/msg/000004 --json
  agentwal get /var/lib/agent/store agent/7/step --key-file agent.key   # an encrypted store
"""


def _get_arguments(p: argparse.ArgumentParser) -> None:
    _store_argument(p)
    _key_arguments(p)
    p.add_argument("--json", action="store_true", help="print {\"key\", \"version\", \"value\"} as JSON")


def cmd_get(args: argparse.Namespace) -> int:
    """`agentwal get`: see `wal.ops.get`."""
    key = ops.key_bytes(args.key, base64_key=args.base64_key)
    found, warning = ops.get(args.store, key)
    if warning:
        _err("get", f"warning: {warning}")
    if found is None:
        _err("get", f"no key {ops.text_preview(key)!r} in {args.store}")
        return EXIT_FAILED
    version, value = found
    if args.json:
        _print_json({"key": ops.render_bytes(key), "version": version, "value": ops.render_bytes(value)})
        return EXIT_OK
    sys.stdout.flush()
    sys.stdout.buffer.write(value)
    if sys.stdout.isatty() and not value.endswith(b"\n"):
        sys.stdout.buffer.write(b"\n")
    sys.stdout.buffer.flush()
    return EXIT_OK


_PUT_DESCRIPTION = f"""\
Set KEY to a value, committed through the log like any commit of the store (durability
sync: the command returns once it is on disk) and printed with its LSN. The value is
VALUE (UTF-8 text), or the bytes of --file, or stdin when neither is given.
--if-version N commits only if the key's version is still N (0: the key must be absent),
as `tx.put(..., if_version=N)` does; otherwise exit status 1 and nothing is written.

{_WRITER}

examples:
  agentwal put /var/lib/agent/store agent/7/step 5
  agentwal put /var/lib/agent/store agent/7/plan --file plan.json
  echo '{{"paused": true}}' | agentwal put /var/lib/agent/store agent/7/control
  agentwal put /var/lib/agent/store agent/7/step 6 --if-version 1234
"""


def _put_arguments(p: argparse.ArgumentParser) -> None:
    _store_argument(p)
    _key_arguments(p)
    p.add_argument("value", metavar="VALUE", nargs="?", default=None,
                   help="the value as UTF-8 text (default: --file, else stdin)")
    p.add_argument("--file", metavar="FILE", default=None, help="read the value from FILE ('-': stdin)")
    p.add_argument("--if-version", type=_int_in(0), default=None, metavar="N",
                   help="commit only if KEY's version is N (0: KEY must not exist)")
    p.add_argument("--create", action="store_true", help="create the store if STORE does not exist")


def cmd_put(args: argparse.Namespace) -> int:
    """`agentwal put`: see `wal.ops.put`."""
    key = ops.key_bytes(args.key, base64_key=args.base64_key)
    if args.value is not None and args.file is not None:
        _err("put", "error: give VALUE or --file, not both")
        return EXIT_USAGE
    if args.value is not None:
        value = args.value.encode("utf-8", errors="surrogateescape")
    elif args.file is not None and args.file != "-":
        with open(args.file, "rb") as f:
            value = f.read()
    else:
        if sys.stdin.isatty() and args.file is None:
            _err("put", "error: no value: give VALUE, --file FILE, or pipe the value to stdin")
            return EXIT_USAGE
        value = sys.stdin.buffer.read()
    try:
        lsn = ops.put(args.store, key, value, if_version=args.if_version, create=args.create)
    except wal.ConflictError as exc:
        _err("put", f"error: {exc}; nothing was written")
        return EXIT_FAILED
    print(f"put {ops.text_preview(key)!r} ({len(value)} byte{'' if len(value) == 1 else 's'}) at LSN {lsn}")
    return EXIT_OK


_DELETE_DESCRIPTION = f"""\
Delete KEY, committed through the log like any commit (durability sync). If KEY does not
exist nothing is committed and the exit status is 1. --if-version N deletes only if the
key's version is still N.

{_WRITER}

examples:
  agentwal delete /var/lib/agent/store agent/7/lock
  agentwal delete /var/lib/agent/store agent/7/step --if-version 1234
"""


def _delete_arguments(p: argparse.ArgumentParser) -> None:
    _store_argument(p)
    _key_arguments(p)
    p.add_argument("--if-version", type=_int_in(1), default=None, metavar="N",
                   help="delete only if KEY's version is N")


def cmd_delete(args: argparse.Namespace) -> int:
    """`agentwal delete`: see `wal.ops.delete`."""
    key = ops.key_bytes(args.key, base64_key=args.base64_key)
    try:
        lsn = ops.delete(args.store, key, if_version=args.if_version)
    except wal.ConflictError as exc:
        _err("delete", f"error: {exc}; nothing was written")
        return EXIT_FAILED
    if lsn is None:
        _err("delete", f"no key {ops.text_preview(key)!r} in {args.store}; nothing was committed")
        return EXIT_FAILED
    print(f"deleted {ops.text_preview(key)!r} at LSN {lsn}")
    return EXIT_OK


_SCAN_DESCRIPTION = f"""\
List the keys starting with PREFIX (default: all) in key order, one per line as
"KEY = VALUE" (unprintable bytes escaped), or as JSON lines with --json (the export
format: {{"key", "value", "version"}}). The listing is one consistent snapshot: the LMDB
state plus the commits in the log not yet applied to it.

{_SEALED_READ} --keys-only needs no key.

{_READ_ONLY}

examples:
  agentwal scan /var/lib/agent/store agent/7/
  agentwal scan /var/lib/agent/store agent/7/ --key-file agent.key    # an encrypted store
  agentwal scan /var/lib/agent/store agent/ --keys-only --limit 20
  agentwal scan /var/lib/agent/store agent/7/msg/ --json
"""


def _scan_arguments(p: argparse.ArgumentParser) -> None:
    _store_argument(p)
    p.add_argument("prefix", metavar="PREFIX", nargs="?", default="", help="key prefix, UTF-8 (default: every key)")
    p.add_argument("--base64-prefix", action="store_true", help="PREFIX is base64")
    p.add_argument("--json", action="store_true", help="JSON lines {\"key\", \"value\", \"version\"}")
    p.add_argument("--keys-only", action="store_true", help="print only the keys")
    p.add_argument("--limit", type=_int_in(1), default=None, metavar="N", help="stop after N keys")


def cmd_scan(args: argparse.Namespace) -> int:
    """`agentwal scan`: see `wal.ops.scan`."""
    prefix = ops.key_bytes(args.prefix, base64_key=args.base64_prefix) if args.prefix else b""
    for key, version, value in ops.scan(args.store, prefix, args.limit,
                                        on_warning=lambda w: _err("scan", f"warning: {w}"), opened=not args.keys_only):
        if args.json:
            obj: dict[str, Any] = {"key": ops.render_bytes(key), "version": version}
            if not args.keys_only:
                obj["value"] = ops.render_bytes(value)
            _print_json(obj)
        elif args.keys_only:
            print(ops.text_preview(key))
        else:
            print(f"{ops.text_preview(key)} = {ops.text_preview(value)}")
    return EXIT_OK


# ---- export / import -----------------------------------------------------------------------------------

_EXPORT_DESCRIPTION = f"""\
Write every key (or those starting with --prefix) as JSON lines {{"key", "value",
"version", "crc32c"}}, in key order, from one consistent snapshot, between a first line
{{"agentwal_export": 1}} and an end line that counts and checksums them (so an import
refuses an export cut short). Keys and values are JSON strings when printable UTF-8,
otherwise {{"base64": "..."}}, so binary data round-trips. -o FILE is fsynced before it
is renamed into place. `agentwal import` reads the same format.

{_READ_ONLY}

examples:
  agentwal export /var/lib/agent/store > backup.jsonl
  agentwal export /var/lib/agent/store --prefix agent/7/ -o agent7.jsonl
"""


def _export_arguments(p: argparse.ArgumentParser) -> None:
    _store_argument(p)
    p.add_argument("-o", "--output", metavar="FILE", default=None, help="write to FILE (default: stdout)")
    p.add_argument("--prefix", default="", help="only keys starting with this (UTF-8)")


def cmd_export(args: argparse.Namespace) -> int:
    """`agentwal export`: see `wal.ops.export_lines`."""
    prefix = args.prefix.encode("utf-8", errors="surrogateescape")
    count = 0
    # A store it refuses is refused before any output; a log it cannot read to its end is said.
    lines = ops.export_lines(args.store, prefix, on_warning=lambda w: _err("export", f"warning: {w}"))
    if args.output is None:
        for line in lines:
            sys.stdout.write(line + "\n")
        return EXIT_OK
    tmp = args.output + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for line in lines:
                f.write(line + "\n")
                count += line.startswith('{"key"')  # not the first and end lines, nor a dictionary's
            # A backup: durable once the command says it is written (then renamed into place).
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, args.output)
        fsync_dir(os.path.dirname(os.path.abspath(args.output)))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # never left beside the output as if it were an export
        raise
    _err("export", f"{count} key(s) written to {args.output}")
    return EXIT_OK


_IMPORT_DESCRIPTION = f"""\
Read JSON lines {{"key", "value"}} (the `agentwal export` format; other fields are
ignored) from FILE or stdin and put every key. An export's first and end lines frame it:
one cut short, or with lines dropped, moved or changed, is refused, and so is input without
the first line unless --unframed says it is an older export or lines written by hand.
The values of a sealed store's export ({{"key", "sealed"}} lines) are opened with
--key-file and the dictionaries the export carries ({{"zstd_dictionary", "sealed"}} lines),
and sealed again as the target store seals.
The whole input is parsed and checked first: a bad line means nothing is written. Then
the keys are committed in transactions of up to --batch keys; each is atomic, the import as
a whole is not, and running it again is harmless (it puts the same values). Keys not in the input are left alone.

{_WRITER}

examples:
  agentwal import /var/lib/agent/store backup.jsonl
  agentwal export /old/store | agentwal import /new/store --create
  agentwal export /old/store | agentwal import /new/store --create --compression zstd --key-file new.key
"""


def _import_arguments(p: argparse.ArgumentParser) -> None:
    _store_argument(p)
    p.add_argument("file", metavar="FILE", nargs="?", default="-", help="JSON lines to read (default: stdin)")
    p.add_argument("--batch", type=_int_in(1, 100_000), default=1000, metavar="N",
                   help="keys per transaction (default: %(default)s)")
    p.add_argument("--create", action="store_true", help="create the store if STORE does not exist")
    p.add_argument("--compression", choices=("zstd",), default=None,
                   help="store the values compressed (a store --create makes is a compressed one)")
    p.add_argument("--unframed", action="store_true",
                   help="take input without an export's first line: an export of an agentwal before exports "
                        "were framed, or lines written by hand (each line is still checked); without it such "
                        "input is refused, as an export that lost its beginning would be")


def cmd_import(args: argparse.Namespace) -> int:
    """`agentwal import`: see `wal.ops.parse_import` and `wal.ops.import_pairs`."""
    if args.file == "-":
        if sys.stdin.isatty():
            _err("import", "error: no input: give FILE or pipe JSON lines to stdin")
            return EXIT_USAGE
        source, data = "stdin", sys.stdin.buffer.read()
    else:
        source = args.file
        with open(args.file, "rb") as f:
            data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:  # export writes UTF-8 JSON (bytes that are not text go as base64)
        raise wal.ArgumentError(f"{source} is not UTF-8 text (byte {exc.start}): not an `agentwal export` "
                                "file") from None
    read = ops.parse_import(iter(text.splitlines()), source, unframed=args.unframed)
    result = ops.import_pairs(args.store, read.pairs, batch=args.batch, create=args.create,
                              dictionaries=read.dictionaries, compression=args.compression)
    print(f"imported {result['keys']} key(s) in {result['commits']} commit(s)"
          + (f", last LSN {result['last_lsn']}" if result["commits"] else ""))
    return EXIT_OK


# ---- checkpoint / repair -------------------------------------------------------------------------------

_CHECKPOINT_DESCRIPTION = f"""\
Apply every commit in the log to the state, make the state durable, and release the log
segments wholly below its applied LSN (deleted, or moved to STORE/archive/ when that
directory exists, as with archive=True), so the next open replays less and the log takes
less space. A running writer checkpoints by itself (once the state's pages freed, or the log
written, since the last checkpoint reach 1/8 of the state's pages in use, at most
checkpoint_bytes); this is for a store whose writer is stopped.

{_WRITER}

example:
  agentwal checkpoint /var/lib/agent/store
"""


def _checkpoint_arguments(p: argparse.ArgumentParser) -> None:
    _store_argument(p)


def cmd_checkpoint(args: argparse.Namespace) -> int:
    """`agentwal checkpoint`: see `wal.ops.checkpoint`."""
    result = ops.checkpoint(args.store)
    removed = result["segments_removed"]
    print(f"checkpoint at applied LSN {result['applied_lsn']}: {len(removed)} segment(s) removed"
          + (f" ({', '.join(removed)})" if removed else "") + f", {result['segments_left']} left")
    return EXIT_OK


_COMPACT_DESCRIPTION = f"""\
Give a bloated state file's space back to the filesystem.

The LMDB state keeps the pages it freed (it reuses them before it grows the file) and pages
that splits left half full. compact takes a checkpoint, rebuilds the state into a new file
with no free page and its pages filled in key order, and swaps it in atomically (a crash
leaves the old or the new state, both whole). It reads and writes the state once: minutes
for many gigabytes. `agentwal info` shows the free bytes it would return.

{_WRITER}

example:
  agentwal compact /var/lib/agent/store
"""


def _compact_arguments(p: argparse.ArgumentParser) -> None:
    _store_argument(p)


def cmd_compact(args: argparse.Namespace) -> int:
    """`agentwal compact`: see `wal.ops.compact`."""
    result = ops.compact(args.store)
    h = ops.human_bytes
    print(f"compacted the state: {h(result['state_file_bytes_before'])} -> {h(result['state_file_bytes'])} "
          f"({h(result['state_used_bytes_before'])} -> {h(result['state_used_bytes'])} in use); "
          f"the store now allocates {h(result['total_disk_bytes'])}")
    return EXIT_OK


_REKEY_DESCRIPTION = f"""\
Finish a key rotation of an encrypted store: rewrite every value and blob file still sealed
under an older key with the current one (the first --key-file), checkpoint, compact the state,
and list only the current key in STORE. Give the older keys too (more --key-file), so the old
values can be read. Afterwards the older keys can be retired: the store opens with the
current key alone, and an open with only an old key is refused. A store that holds compressed
values is rewritten compressed.

A store that ships to an object archive (its archive.json names one) is opened with it: the
rewrite is shipped, then a snapshot of the rewritten state, so a restore to any point from then
on, and the store's next open with the archive, need the current key alone. Objects shipped
before stay under the keys they were shipped with (a restore to a point among them needs those
keys) until retention removes them. The archive's endpoint and credentials come from the
environment, as for the application.

{_WRITER}

example:
  agentwal rekey /var/lib/agent/store --key-file new.key --key-file old.key
"""


def _rekey_arguments(p: argparse.ArgumentParser) -> None:
    _store_argument(p)
    p.add_argument("--batch", type=int, default=1000,
                   help="keys per transaction at most (default 1000; fewer when their values pass 8 MiB)")
    p.add_argument("--no-compact", action="store_true", help="skip compacting the state afterwards")


def cmd_rekey(args: argparse.Namespace) -> int:
    """`agentwal rekey`: see `wal.ops.rekey`."""
    if not args.key_file:
        raise wal.ArgumentError("rekey needs --key-file NEW (the current key), then --key-file for each older key")
    result = ops.rekey(args.store, batch=args.batch, compact=not args.no_compact)
    retired = ", ".join(result["key_ids_retired"]) or "none"
    print(f"rekeyed under key id {result['key_id']}: {result['values_rewritten']} value(s) and "
          f"{result['blobs_rewritten']} blob file(s) rewritten; key ids no longer needed: {retired}")
    if result.get("archive_snapshot_lsn") is not None:
        print(f"shipped to its archive, with a snapshot at LSN {result['archive_snapshot_lsn']} under the current key")
    return EXIT_OK


_REPAIR_DESCRIPTION = f"""\
Make a damaged log openable again, at its last good record.

- A torn tail (a partial last record after a crash): cut, as any writable open would.
- Damage elsewhere (a bad record with valid ones after it, a missing or foreign segment,
  an LSN gap): the log is cut at the last good record; the damaged bytes are kept as
  .broken files and later segments renamed to *.broken. The LSNs given up are reported.
- If the state had already applied records that are given up, it is rebuilt from the log
  (the old state/ is moved to state.backup-TIMESTAMP/, and its keys are exported to
  state.backup-TIMESTAMP.jsonl, which `agentwal import` puts back as new commits); this
  needs the log to still start at LSN 1. --rebuild-state rebuilds it even when the log
  is fine (e.g. after verify found the state disagreeing with the log).

First the whole log directory is copied to STORE/log.backup-TIMESTAMP/ (for a bare log:
LOGDIR.backup-TIMESTAMP/ beside it). repair shows what it will do and asks for
confirmation; --yes skips the question, and without a terminal --yes is required (exit
status 2 otherwise). A sound store is left alone.

{_WRITER}

exit status: 0 repaired (or nothing to do), 1 could not repair (nothing was changed),
2 bad usage or not confirmed.

examples:
  agentwal verify /var/lib/agent/store || agentwal repair /var/lib/agent/store
  agentwal repair /var/lib/agent/store --yes
"""


def _repair_arguments(p: argparse.ArgumentParser) -> None:
    _store_argument(p, log_ok=True)
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--rebuild-state", action="store_true",
                   help="also rebuild the state from the log (moves state/ aside first)")


def cmd_repair(args: argparse.Namespace) -> int:
    """`agentwal repair`: see `wal.ops.plan_repair` and `wal.ops.repair`."""
    plan = ops.plan_repair(args.store, rebuild_state=args.rebuild_state)
    if plan.refuse:
        _err("repair", f"error: {plan.refuse}")
        return EXIT_FAILED
    if not plan.needed:
        print(f"{plan.target.path}: the log is sound and has no torn tail; nothing to repair")
        return EXIT_OK
    print(f"repair {plan.target.path} will:")
    for action in plan.actions:
        print(f"  - {action}")
    if not args.yes:
        if not sys.stdin.isatty():
            _err("repair", "error: not confirmed: run it from a terminal to answer, or pass --yes")
            return EXIT_USAGE
        answer = input("Proceed? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("nothing was changed")
            return EXIT_USAGE
    result = ops.repair(plan)
    r = result.report
    print(f"backup of the log: {result.backup_dir}")
    if result.state_backup_dir:
        print(f"old state moved to: {result.state_backup_dir}")
    if result.state_export:
        print(f"old state exported to: {result.state_export}\n  to put its newer values back (as new commits): "
              f"agentwal import {plan.target.path} {result.state_export}")
    if r.torn_tail is not None:
        print(f"torn tail cut: {r.torn_tail[2]} byte(s) at offset {r.torn_tail[1]} of {r.torn_tail[0]}")
    if r.lost_lsns is not None:
        first, last = r.lost_lsns
        print(f"gave up LSNs {first}..{last if last is not None else '?'}")
    for broken in r.broken_files:
        print(f"kept: {broken}")
    print(f"the log now ends at LSN {result.last_lsn}"
          + (f"; the state is at applied LSN {result.applied_lsn} ({result.records_replayed} record(s) replayed)"
             if result.applied_lsn is not None else ""))
    print(f"check it: agentwal verify {plan.target.path}")
    return EXIT_OK


# ---- tail ----------------------------------------------------------------------------------------------

_TAIL_DESCRIPTION = f"""\
Print the last N log records (default 10) as JSON lines, in the `dump` format. With -f,
keep following: poll the log and print each new commit as a running writer makes it,
until Ctrl-C (exit status 0). Only records written to the files are seen (at level
buffered, a commit reaches them within rpo_ms).

{_READ_ONLY}

examples:
  agentwal tail /var/lib/agent/store -n 3
  agentwal tail -f /var/lib/agent/store
  agentwal tail -f /var/lib/agent/store -n 0 | grep --line-buffered agent/7/
"""


def _tail_arguments(p: argparse.ArgumentParser) -> None:
    _store_argument(p, log_ok=True)
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new commits until Ctrl-C")
    p.add_argument("-n", "--lines", type=_int_in(0), default=10, metavar="N",
                   help="print the last N records first (default: %(default)s)")
    p.add_argument("--interval", type=_archive_cli.seconds, default=0.2, metavar="SECONDS",
                   help="how often -f polls the log (default: %(default)s)")
    p.add_argument("--raw", action="store_true", help="do not decode store transactions; print payloads")


def cmd_tail(args: argparse.Namespace) -> int:
    """`agentwal tail`: see `wal.ops.Follower`."""
    target = ops.locate(args.store)
    decode = target.is_store and not args.raw
    first, last = ops.last_lsn(target.log_dir) if os.path.isdir(target.log_dir) else (1, 0)
    start = max(first, last - args.lines + 1)
    follower = ops.Follower(target.log_dir, start, on_skip=lambda s: _err("tail", s.describe()))
    try:
        while True:
            for rec in follower.poll():
                if not args.follow and rec.lsn > last:
                    return EXIT_OK
                _print_json(ops.record_json(rec.lsn, rec.payload, segment=rec.path, offset=rec.offset,
                                            decode=decode))
            sys.stdout.flush()
            if not args.follow and not follower.at_damage:
                return EXIT_OK
            # Following, or stopped at damage before the newest records: poll on (damage that
            # stays put raises CorruptionError: exit 1, named). Without -f, the last records
            # printed were not the newest, and it exited 0 without a word.
            time.sleep(max(0.01, args.interval) if args.follow else 0.2)
    except KeyboardInterrupt:
        return EXIT_OK  # Ctrl-C is how -f ends
    finally:
        follower.close()


# ---- stats ---------------------------------------------------------------------------------------------

_STATS_DESCRIPTION = f"""\
Print gauges read from the store's files: log extent (segments, bytes, first and last
LSN), the state (applied LSN, keys, size), records the next open would replay, .broken
files, whether a writer is running, the age of the newest commit, and for a store that
ships to an object archive its archived LSN, lag and requests as its writer last reported
them (archive.json, about once a second; archive_status_age_seconds says how long ago). --format
prometheus prints the Prometheus text exposition format, e.g. for node_exporter's
textfile collector.

The live counters of a running writer (commits, fsyncs, group sizes, fsync latency,
durable lag) are in its process: call store.stats() there and render it with
wal.ops.metrics.prometheus_text().

{_READ_ONLY}

examples:
  agentwal stats /var/lib/agent/store
  agentwal stats /var/lib/agent/store --format prometheus > /var/lib/node_exporter/agentwal.prom
"""


def _stats_arguments(p: argparse.ArgumentParser) -> None:
    _store_argument(p, log_ok=True)
    p.add_argument("--format", choices=("text", "json", "prometheus"), default="text",
                   help="output format (default: %(default)s)")


def cmd_stats(args: argparse.Namespace) -> int:
    """`agentwal stats`: see `wal.ops.stats` and `wal.ops.metrics.prometheus_text`."""
    data = ops.stats(args.store)
    if args.format == "json":
        _print_json(data)
    elif args.format == "prometheus":
        # The error's text stays out of the labels: each new message would start a new series.
        gauges = {k: v for k, v in data.items() if k != "archive_error"}
        sys.stdout.write(metrics.prometheus_text(gauges, labels={"store": os.path.abspath(args.store)}))
    else:
        width = max(len(k) for k in data)
        for key, value in data.items():
            print(f"{key:<{width}}  {value}")
    return EXIT_OK


# ---- the command table -----------------------------------------------------------------------------

COMMANDS: tuple[Command, ...] = (
    Command("demo", "run agents, SIGKILL their process at random, prove no acknowledged step is lost",
            _DEMO_DESCRIPTION, _demo_arguments, cmd_demo),
    Command("crashtest", "the crash drill on your disk: kills and simulated power cuts per durability level",
            "Run `agentwal crashtest --help` for its options (DIR, --level, --kills, --power-cuts, ...).",
            lambda p: None, lambda args: EXIT_USAGE),
    Command("info", "show versions, watermarks, segments, sizes and storage warnings (read-only)",
            _INFO_DESCRIPTION, _info_arguments, cmd_info),
    Command("verify", "check every CRC and LSN, and the state against the log; exit 1 if damaged (read-only)",
            _VERIFY_DESCRIPTION, _verify_arguments, cmd_verify),
    Command("dump", "print log records as JSON lines; --salvage reads past damage (read-only)",
            _DUMP_DESCRIPTION, _dump_arguments, cmd_dump),
    Command("get", "print the value of a key (read-only)", _GET_DESCRIPTION, _get_arguments, cmd_get),
    Command("put", "set a key, committed through the log (needs the writer lock)",
            _PUT_DESCRIPTION, _put_arguments, cmd_put),
    Command("delete", "delete a key, committed through the log (needs the writer lock)",
            _DELETE_DESCRIPTION, _delete_arguments, cmd_delete),
    Command("scan", "list keys (and values) under a prefix (read-only)", _SCAN_DESCRIPTION, _scan_arguments,
            cmd_scan),
    Command("export", "write every key and value as JSON lines (read-only)", _EXPORT_DESCRIPTION,
            _export_arguments, cmd_export),
    Command("import", "put keys and values from JSON lines (needs the writer lock)", _IMPORT_DESCRIPTION,
            _import_arguments, cmd_import),
    Command("checkpoint", "make the state durable and release old log segments (needs the writer lock)",
            _CHECKPOINT_DESCRIPTION, _checkpoint_arguments, cmd_checkpoint),
    Command("compact", "return the state file's free pages to the filesystem (needs the writer lock)",
            _COMPACT_DESCRIPTION, _compact_arguments, cmd_compact),
    Command("rekey", "rewrite an encrypted store's values under its current key (needs the writer lock)",
            _REKEY_DESCRIPTION, _rekey_arguments, cmd_rekey),
    Command("repair", "cut a damaged log at its last good record, after a backup (needs the writer lock)",
            _REPAIR_DESCRIPTION, _repair_arguments, cmd_repair),
    Command("tail", "print the newest commits; -f follows a writer live (read-only)", _TAIL_DESCRIPTION,
            _tail_arguments, cmd_tail),
    Command("stats", "print gauges as text, JSON or Prometheus text format (read-only)", _STATS_DESCRIPTION,
            _stats_arguments, cmd_stats),
    # ---- the object archive (wal/cli/archive.py) ----
    Command("restore", "restore an archive (s3://, file://) into a new store, to an LSN or a time",
            _archive_cli.RESTORE_DESCRIPTION, _archive_cli.restore_arguments,
            lambda args: _archive_cli.cmd_restore(args, _ProgressBar())),
    Command("follow", "keep a read-only copy of an archive up to date; --promote takes over as its writer",
            _archive_cli.FOLLOW_DESCRIPTION, _archive_cli.follow_arguments, _archive_cli.cmd_follow),
    Command("archive", "archive status STORE: the archived LSN, lag, PUTs and errors of a store's archive",
            _archive_cli.STATUS_DESCRIPTION, _archive_cli.status_arguments, _archive_cli.cmd_status),
)

_NEEDS_LOCK = "(needs the writer lock)"
# The commands named as needing it, from their summaries (a list written by hand left out compact and rekey).
_LOCKING = [c.name for c in COMMANDS if c.summary.endswith(_NEEDS_LOCK)]

_MAIN_DESCRIPTION = f"""\
agentwal: an embedded write-ahead-log storage engine for AI-agent runtimes.
Agent state (conversations, tool results, workflow progress) survives process kills and
power cuts, with the data-loss bound (RPO) you choose.

This command works on agentwal stores from the shell: look inside one, check it, fix a
value by hand, repair damage, follow commits live. STORE is always the first argument
after the command. Read-only commands work while an agent runtime has the store open;
{", ".join(_LOCKING[:-1])} and {_LOCKING[-1]} need the writer lock
and say who holds it.
"""

_MAIN_EPILOG = """\
examples:
  agentwal info /var/lib/agent/store           # what is in it, is a writer running
  agentwal verify /var/lib/agent/store         # exit 0 sound, 1 damaged
  agentwal scan /var/lib/agent/store agent/7/  # what agent 7 knows
  agentwal put /var/lib/agent/store agent/7/step 5
  agentwal tail -f /var/lib/agent/store        # watch commits as they happen
  agentwal demo                                # kill-and-resume demo in a temp dir

exit status: 0 success, 1 failure (damage found, key missing, store locked, ...), 2 bad usage.
Run 'agentwal COMMAND --help' for a command's options and examples.
"""


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("logging (stderr)")
    group.add_argument("-v", "--verbose", action="store_true",
                       help="also show the library's INFO lines (recovery summaries, checkpoints)")
    group.add_argument("-q", "--quiet", action="store_true", help="show only errors")
    keys = common.add_argument_group("encrypted stores")
    keys.add_argument("--key-file", action="append", default=None, metavar="FILE",
                      help="a 32-byte key (raw, or 64 hex digits) of an encrypted store, for the commands that "
                           "write (put, delete, import, checkpoint, compact, repair, rekey) and for get and scan, "
                           "which show its values; repeat it for older keys, the current one first. The other "
                           "reading commands (info, verify, dump, export, ...) show values as stored and need none")
    return common


def _read_key(path: str) -> bytes:
    with open(path, "rb") as f:
        raw = f.read(4096)
    text = raw.strip()
    if len(text) == 64:
        try:
            return bytes.fromhex(text.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            pass
    if len(raw) != 32:
        raise wal.ArgumentError(f"{path}: a key file holds 32 bytes, or 64 hex digits (it holds {len(raw)} bytes)")
    return raw


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per entry of `COMMANDS`."""
    parser = argparse.ArgumentParser(prog="agentwal", description=_MAIN_DESCRIPTION, formatter_class=_Formatter,
                                     epilog=_MAIN_EPILOG)
    parser.add_argument("--version", action="version", version=f"agentwal {wal.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    common = _common_options()
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.summary, description=command.description,
                           formatter_class=_Formatter, parents=[common])
        command.arguments(p)
        p.set_defaults(run=command.run)
    return parser


def _command_parser(command: Command) -> argparse.ArgumentParser:
    """A stand-alone parser for one command, the same as its subparser (for intermixed options)."""
    p = argparse.ArgumentParser(prog=f"agentwal {command.name}", description=command.description,
                                formatter_class=_Formatter, parents=[_common_options()])
    command.arguments(p)
    p.set_defaults(run=command.run, command=command.name)
    return p


def _setup_logging(args: argparse.Namespace) -> None:
    """The `wal` logger's records on stderr: WARNING and up by default, INFO with -v, ERROR with -q."""
    logger = logging.getLogger("wal")
    if any(getattr(h, "_agentwal_cli", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler._agentwal_cli = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter(f"agentwal {args.command}: %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    level = logging.INFO if getattr(args, "verbose", False) else logging.WARNING
    if getattr(args, "quiet", False):
        level = logging.ERROR
    logger.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default: ``sys.argv[1:]``); returns the exit status.

    argparse's own exits (``--help``, ``--version``, usage errors) raise SystemExit as usual.
    """
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    nul = next((arg for arg in argv if "\0" in arg), None)
    if nul is not None:  # only a caller of main() can pass one (execve cannot): no path or key holds it
        print(f"agentwal: error: the argument {nul!r} contains a NUL byte, which no file name can hold "
              "and no command line can carry", file=sys.stderr)
        return EXIT_USAGE
    if argv[:1] == ["crashtest"]:
        # The drill has its own parser (wal.drill.crashtest.build_parser): hand it the rest as is.
        from wal.drill.crashtest import main_crashtest  # noqa: PLC0415 - heavy; only this command needs it

        return main_crashtest(argv[1:])
    args, extras = parser.parse_known_args(argv)
    if extras:
        # argparse cannot take an optional between two positionals of which the second is optional
        # (`import STORE --create FILE`); the command's own parser can, with parse_intermixed_args.
        command = next((c for c in COMMANDS if c.name == args.command), None)
        if command is None:
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        args = _command_parser(command).parse_intermixed_args(argv[argv.index(command.name) + 1:])
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    _setup_logging(args)
    try:
        if getattr(args, "key_file", None):
            ops.use_sealing(encryption=[_read_key(path) for path in args.key_file])
        status: int = args.run(args)
        sys.stdout.flush()
    except KeyboardInterrupt:
        print("\nagentwal: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of our output went away (`| head`): not an error of ours; silence the flush at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except (ops.UsageError, wal.ArgumentError) as exc:
        print(f"agentwal {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except wal.WalError as exc:
        print(f"agentwal {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:
        print(f"agentwal {args.command}: error: {_os_error_text(exc)}", file=sys.stderr)
        return EXIT_FAILED
    return status


def _os_error_text(exc: OSError) -> str:
    """`exc` as a person reads it: the file first, without Python's "[Errno N]" prefix."""
    if exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)
