"""The archive's commands for `agentwal` (wal/cli/commands.py lists them): restore, follow, archive status,
and `verify URL` (wal/cli/commands.py's verify hands a URL here)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from wal.errors import TargetNotHeldError, WalError
from wal.ops.target import lock_holder, sealing_options  # sealing_options: the command line's --key-file
from wal.store.store import ARCHIVE_STATUS_FILE, LOG_DIR, following_archive, read_archive_status

EXIT_OK, EXIT_FAILED = 0, 1

Bar = Callable[[str, int, int], None]

RESTORE_DESCRIPTION = """\
Restore an archive (s3://bucket/prefix or file:///dir) into a new store in DIR: the newest
state snapshot at or before the target, then the log up to it. Every object is verified (its
SHA-256 and each record's CRC-32C); a gap or a damaged object is refused, naming the LSNs; a
target past the archive's end is refused, naming the end. Downloads run in parallel.
S3 endpoint and credentials come from the standard AWS environment (AWS_ENDPOINT_URL, ...).

Writes: opens the store as its one writer -- a new one, in DIR, which must not exist or be
empty; the archive is only read.

examples:
  agentwal restore s3://backups/agent7 /var/lib/agent/restored
  agentwal restore s3://backups/agent7 /tmp/at-lsn --lsn 120345
  agentwal restore file:///mnt/nas/agent7 /tmp/before --time 2026-11-25T20:00:00Z
"""

FOLLOW_DESCRIPTION = """\
Keep a read-only copy of an archive in DIR (restored first if DIR is new), applying new
objects as the writer ships them; prints the follower's LSN and lag every --every seconds.
Ctrl-C stops it. --promote makes it the archive's writer at once (fencing the old one) and exits.

Writes: opens the store as its one writer -- the follower's own store in DIR (the archive is
only read, except by --promote, which writes the fence object).

examples:
  agentwal follow s3://backups/agent7 /var/lib/agent/replica
  agentwal follow s3://backups/agent7 /var/lib/agent/replica --promote
"""

STATUS_DESCRIPTION = """\
Show a store's archive as its writer last reported it (STORE/archive.json, updated about
once a second): the archive URL, the archived LSN against the log's last LSN, the lag,
PUT counts, the current error (an unreachable object store) and whether it was fenced.

Read-only: takes no lock, so it works while an agent runtime (the writer) has the store
open, and changes nothing.

examples:
  agentwal archive status /var/lib/agent/store
  agentwal archive status /var/lib/agent/store --json
"""


def restore_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", metavar="URL", help="the archive: s3://bucket/prefix or file:///dir")
    p.add_argument("dir", metavar="DIR", help="a new (or empty) directory for the restored store")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--lsn", type=int, default=None, help="restore up to this LSN")
    target.add_argument("--time", default=None,
                        help="restore the log up to the first commit stamped after this ISO 8601 time "
                             "(every commit acknowledged at or before it is kept)")
    p.add_argument("--parallel", type=int, default=16, help="concurrent downloads (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")


def cmd_restore(args: argparse.Namespace, bar: Any) -> int:
    from wal.archive.restore import restore  # noqa: PLC0415

    try:
        report = restore(args.url, args.dir, lsn=args.lsn, time=args.time, parallel=args.parallel,
                         progress=lambda done, total: bar("downloading", done, total), **sealing_options())
    except TargetNotHeldError as exc:  # sound arguments the archive cannot serve: a failure, not bad usage
        bar.close()
        print(f"agentwal restore: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        bar.close()
    out = report._asdict() | {"mb_per_s": round(report.mb_per_s, 2)}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"restored {args.url} into {report.path}: LSN {report.lsn} (snapshot at LSN {report.snapshot_lsn} "
              f"+ {report.records} log record(s)); {report.objects} object(s), {report.bytes / 1e6:.1f} MB in "
              f"{report.download_seconds:.2f} s ({report.mb_per_s:.1f} MB/s), {report.seconds:.2f} s in all")
    return EXIT_OK


def verify_url(url: str, as_json: bool, bar: Any) -> int:
    from wal.archive.restore import verify  # noqa: PLC0415

    try:
        report = verify(url, progress=lambda done, total: bar("reading objects", done, total), **sealing_options())
    finally:
        bar.close()
    if as_json:
        print(json.dumps(report._asdict() | {"sound": report.ok}))
        return EXIT_OK if report.ok else EXIT_FAILED
    print(f"verifying archive {report.url}")
    if report.objects == 0 and report.snapshots == 0 and len(report.problems) == 1:
        print(f"  {report.problems[0]}")
        print("EMPTY")
        return EXIT_FAILED
    log = (f"log LSN {report.first_lsn}..{report.last_lsn}" if report.last_lsn >= report.first_lsn else
           f"no log readable from LSN {report.first_lsn}")
    print(f"  {report.objects} object(s), {report.bytes / 1e6:.1f} MB read; {report.snapshots} snapshot(s); {log}")
    for problem in report.problems:
        print(f"  DAMAGE: {problem}")
    if report.unfinished_tail:
        # Not damage by the archive's rules (FORMAT.md §18), but what a restore to the end leaves
        # out: an operator who knows no writer stopped with PUTs in flight should look.
        ends = "a restore to the end ends before it" if report.ok else "past the damage above"
        print(f"  unfinished tail past LSN {report.last_lsn} (a writer stopped or fenced with PUTs in flight; "
              f"{ends}): {', '.join(report.unfinished_tail)}")
    print("sound" if report.ok else "DAMAGED")
    return EXIT_OK if report.ok else EXIT_FAILED


def seconds(text: str) -> float:
    """An argparse `type` accepting seconds: a finite number > 0 (infinity was a traceback, a
    negative one a busy loop). For this module's and the other commands' intervals."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < 1e6:
        raise argparse.ArgumentTypeError(f"must be seconds > 0 and finite, got {text}")
    return value


def follow_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", metavar="URL", help="the archive: s3://bucket/prefix or file:///dir")
    p.add_argument("dir", metavar="DIR", help="the follower's directory")
    p.add_argument("--every", type=seconds, default=5.0, help="seconds between status lines (default: %(default)s)")
    p.add_argument("--poll-ms", type=int, default=200, help="milliseconds between listings (default: %(default)s)")
    p.add_argument("--promote", action="store_true", help="catch up, fence the old writer, become the writer")


def cmd_follow(args: argparse.Namespace) -> int:
    import wal  # noqa: PLC0415
    from wal.archive.follow import Follower  # noqa: PLC0415

    replica = wal.follow(args.url, args.dir, poll_ms=args.poll_ms, **sealing_options())
    assert isinstance(replica, Follower)
    if args.promote:
        store = replica.promote()
        print(f"promoted {args.dir}: the writer of {args.url} from LSN {store.watermarks.durable}")
        store.close()
        return EXIT_OK
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(args.every):
            lag = replica.lag()
            err = replica.stats()["follower_error"]
            print(f"LSN {replica.lsn}  lag {int(lag['lag_lsns'])} LSN(s), {lag['lag_seconds']:.1f} s"
                  + (f"  error: {err}" if err else ""), flush=True)
    finally:
        replica.close()
    return EXIT_OK


def status_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("what", metavar="status", choices=("status",), help="status: the archive state of STORE")
    p.add_argument("store", metavar="STORE", help="an agentwal store shipping to an archive")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def cmd_status(args: argparse.Namespace) -> int:
    from wal import ops  # noqa: PLC0415

    data = read_archive_status(args.store)
    if data is None:
        following = following_archive(args.store)
        if following is not None:
            print(f"agentwal archive: {args.store} is a follower of the archive {following}: it ships nothing until "
                  "promoted; `agentwal info` shows what it has applied", file=sys.stderr)
        else:
            print(f"agentwal archive: {args.store} has no archive state ({ARCHIVE_STATUS_FILE}): it was never opened "
                  "with archive='s3://...' or 'file:///...'", file=sys.stderr)
        return EXIT_FAILED
    try:
        last = int(ops.info(args.store)["log"]["last_lsn"])
    except (WalError, OSError, KeyError, ValueError):
        last = None
    data["log_last_lsn"] = last
    # The figures are the writer's last report: a writer no longer running reported them last
    # before it stopped (its lag, its pid) and nothing ships until the store is opened again.
    data["writer_running"] = lock_holder(os.path.join(args.store, LOG_DIR)) is not None
    data["unarchived_lsns"] = None if last is None else max(last - int(data.get("archived_lsn", 0)), 0)
    data["age_s"] = round(time.time() - int(data.get("updated_unix_ms", 0)) / 1000, 1)
    if args.json:
        print(json.dumps(data))
        return EXIT_OK
    print(f"{args.store}: archive {data.get('archive_url')}")
    print(f"  archived:   LSN {data.get('archived_lsn')} of {last} in the log "
          f"({data['unarchived_lsns']} not archived yet)")
    print(f"  lag:        {float(data.get('archive_lag_ms', 0)):.0f} ms (bound archive_rpo_ms="
          f"{data.get('archive_rpo_ms')}), reported {data['age_s']} s ago by pid {data.get('pid')}"
          + ("" if data["writer_running"] else ", which is not running" if data.get("archive_fenced")
             else ", which is not running: nothing ships until the store is opened with its archive again"))
    print(f"  requests:   {data.get('archive_puts')} PUT(s), {data.get('archive_put_bytes')} bytes, "
          f"{data.get('archive_put_errors')} failed; {data.get('archive_merges')} merge(s); "
          f"last snapshot at LSN {data.get('archive_last_snapshot_lsn')}")
    if data.get("archive_error"):
        print(f"  ERROR:      {data['archive_error']}")
    if data.get("archive_waiting_for"):
        print(f"  WAITING:    a request for {data['archive_waiting_for']} unanswered for "
              f"{float(data.get('archive_request_wait_s', 0)):.0f} s (the object store is slow or not answering)")
    if data.get("archive_fenced"):
        print("  FENCED:     another writer took the archive over (a follower was promoted, or a copy of this "
              "store shipped); this store stopped")
    return EXIT_OK
