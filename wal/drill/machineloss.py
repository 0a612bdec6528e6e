"""The machine-loss drill of ``agentwal crashtest --archive URL``: lose the whole machine, restore
from the archive, and check what came back.

Round after round, at one durability level:

1. A child (``python -m wal.drill.crashtest --child``, the kill drill's workload and output)
   opens a *new* store with ``archive=<URL>/<round prefix>`` and ``archive_rpo_ms`` and commits
   from its threads, printing every acknowledgement with its CLOCK_MONOTONIC time.
2. At a seeded random moment (sometimes within its first commits) the parent SIGKILLs it and
   deletes its whole directory: the machine is gone, only the archive is left.
3. ``wal.restore`` of that archive into a new directory; the restored store is opened (timed:
   restore plus open is the reported recovery time) and read whole.
4. The kill drill's oracle (`crashtest.Oracle`, crash kind "machine") checks it: the state is a
   gap-free prefix of the commits with nothing partial or foreign (I3), every commit in it at the
   LSN it was acknowledged with, and the acknowledged commits that are missing were lost within
   the machine-loss column of the durability table: none at ``replicated``; at ``sync``,
   ``interval`` and ``buffered`` none acknowledged more than ``archive_rpo_ms`` (+ SLACK_MS)
   before the loss.

An archive that holds nothing yet (the child was killed before its first object) restores to an
empty store. Each round uses its own prefix under URL, named by seed, level and round, and
deletes it after the check unless asked to keep it.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from urllib.parse import urlparse

from wal.drill.crashtest import LevelResult, Oracle, Recovered, _Child, _child_argv, _rmtree, recover

LEVELS = ("replicated", "sync", "interval", "buffered")


def round_url(archive: str, tag: str) -> str:
    """A fresh archive location under `archive` (an s3:// or file:// URL) for one round."""
    parsed = urlparse(archive)
    if parsed.scheme not in ("s3", "file"):
        raise ValueError(f"the machine-loss drill needs an s3:// or file:// archive URL, got {archive!r}")
    return archive.rstrip("/") + "/" + tag


def _delete_archive(url: str) -> None:
    # Only this drill needs the archive.
    from wal.archive.layout import LOG_PREFIX, MERGED_PREFIX, SNAP_PREFIX  # noqa: PLC0415
    from wal.archive.objects import PROBE_PREFIX, open_objects  # noqa: PLC0415
    from wal.archive.sealed import DICT_PREFIX, KEY_PREFIX, MANIFEST  # noqa: PLC0415

    objects = open_objects(url)
    for prefix in (LOG_PREFIX, MERGED_PREFIX, SNAP_PREFIX, PROBE_PREFIX, KEY_PREFIX, DICT_PREFIX):
        for name, _ in list(objects.list(prefix)):
            objects.delete(name)
    objects.delete(MANIFEST)  # a sealed store's archive manifest (FORMAT.md §19), if any


def _restore_and_read(url: str, directory: str) -> Recovered:
    """Restore the archive into `directory` and read it whole; an empty archive gives an empty
    state (nothing was shipped before the loss)."""
    from wal.archive.restore import restore  # noqa: PLC0415

    started = time.monotonic()
    try:
        restore(url, directory)
    except Exception as exc:
        return Recovered({}, 0, time.monotonic() - started, None, f"restore failed: {type(exc).__name__}: {exc}")
    got = recover(directory)
    got.seconds = time.monotonic() - started
    return got


def run_machine_losses(directory: str | os.PathLike[str], level: str, *, archive: str, archive_rpo_ms: int,
                       losses: int, rpo_ms: int = 50, threads: int = 1, seed: int = 0, run_max_s: float = 1.0,
                       keep: bool = False, result: LevelResult | None = None) -> LevelResult:
    """`losses` rounds of: a child commits with an archive, SIGKILL, its directory deleted, a
    restore from the archive, the oracle's check (module docstring). `rpo_ms` is the local log's
    bound at interval/buffered; `archive_rpo_ms` the machine-loss bound the oracle holds them to."""
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}; use one of {', '.join(LEVELS)}")
    result = result or LevelResult(level, 0 if level == "replicated" else archive_rpo_ms, threads)
    work = os.path.abspath(os.fspath(directory))
    os.makedirs(work, exist_ok=True)
    rng = random.Random(f"{seed}/{level}/machine")
    run_tag = uuid.uuid4().hex[:8]
    for round_no in range(1, losses + 1):
        url = round_url(archive, f"agentwal-crashtest-{seed}-{run_tag}-{level}-{round_no}")
        store = os.path.join(work, f"machine{round_no}")
        argv = _child_argv(store, level, rpo_ms if level in ("interval", "buffered") else 0, threads=threads,
                           seed=seed, round_no=round_no, apply_interval_ms=20)
        argv += ["--archive", url, "--archive-rpo-ms", str(archive_rpo_ms)]
        child = _Child(argv, os.path.join(work, "child.out"), os.path.join(work, "child.err"))
        try:
            ready = child.wait_for("READY", 120)
            if ready:
                time.sleep(rng.uniform(0, 0.005) if rng.random() < 0.15 else rng.uniform(0, run_max_s))
            died = child.proc.poll() is not None
            kill_ns = child.kill()
        except BaseException:
            child.kill()
            raise
        output = child.output()
        what = f"machine loss round {round_no}"
        if not ready or died or output.errors:
            msg = "; ".join(output.errors) or f"exit status {child.proc.returncode}"
            result.add_violations([f"[{what}] the child failed by itself before the kill: {msg}\n"
                                   f"{child.stderr_tail()}"])
            break
        _rmtree(store)  # the machine is gone: only the archive is left
        result.machine_losses += 1
        restored = os.path.join(work, f"restored{round_no}")
        got = _restore_and_read(url, restored)
        _rmtree(restored)
        if got.error is None:
            result.recovery_ms.append(got.seconds * 1000)
        oracle = Oracle(level, archive_rpo_ms, seed)
        outcome = oracle.check(got, round_no, output, kill_ns, "machine", where=f"{what} ({url})")
        result.record(outcome, "machine")
        if not keep:
            try:
                _delete_archive(url)
            except Exception as exc:  # the verdict stands; say what was left behind
                result.notes.append(f"could not delete {url}: {exc}")
        if outcome.violations:
            break
    return result


__all__ = ["LEVELS", "round_url", "run_machine_losses"]
