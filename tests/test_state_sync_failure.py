"""A failed fdatasync of the LMDB state is never retried and trusted (fsyncgate; README, "Failure
policy"): the kernel may drop the pages it could not write, and a second fdatasync then succeeds
with them lost. The store stops its writes, no checkpoint rests on the failure (checkpoint.meta
stays at the last good one and no log segment goes), and the next open, in the same boot too,
reopens the state at that checkpoint and replays the log from there.

The failure is injected at the libc boundary of a child process: an LD_PRELOAD shim, compiled
here, makes the next fdatasync/fsync of the state's data.mdb fail with EIO once a control file
exists. Everything else is real: the store, LMDB, the log and their fsyncs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import wal
from wal.store.state import UNTRUSTED_BOOT_ID, read_checkpoint

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Fails the next sync of a file whose path ends in "/state/data.mdb" while $FAIL_SYNC_ARMED exists. */
static int armed(int fd) {
    const char *flag = getenv("FAIL_SYNC_ARMED");
    char link[64], target[4096];
    if (flag == NULL || access(flag, F_OK) != 0) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n < 15) return 0;
    target[n] = 0;
    if (strcmp(target + n - 15, "/state/data.mdb") != 0) return 0;
    unlink(flag); /* once */
    return 1;
}
#define WRAP(name) int name(int fd) { \
    static int (*real)(int); \
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, #name); \
    if (armed(fd)) { errno = EIO; return -1; } \
    return real(fd); }
WRAP(fdatasync)
WRAP(fsync)
"""

CHILD = textwrap.dedent("""
    import json, os, sys, time
    import wal
    from wal.store.state import read_checkpoint
    path, flag, how = sys.argv[1], sys.argv[2], sys.argv[3]
    out = {}
    s = wal.open(path, checkpoint_bytes=1 << 16, segment_bytes=1 << 20)
    for i in range(200):
        s.put(b"k%04d" % i, b"v" * 1000)
    out["good"] = s.checkpoint()
    out["segments_before"] = len([n for n in os.listdir(os.path.join(path, "log")) if n.endswith(".wal")])
    open(flag, "w").close()  # armed: the state's next fdatasync fails
    acked = 200
    if how == "explicit":
        for i in range(200, 260):
            s.put(b"k%04d" % i, b"v" * 1000)
        acked = 260
        try:
            s.checkpoint()
            out["checkpoint"] = "returned"
        except wal.WalError as exc:
            out["checkpoint"] = type(exc).__name__
    else:  # the automatic checkpoint meets it
        deadline = time.monotonic() + 20
        while s.stats()["failed"] is None and time.monotonic() < deadline:
            try:
                s.put(b"k%04d" % acked, b"v" * 1000)
                acked += 1
            except wal.FailedError:
                break
    out["acked"] = acked
    out["failed"] = s.stats()["failed"]
    try:
        s.put(b"after", b"x")
        out["after"] = "accepted"
    except wal.WalError as exc:
        out["after"] = type(exc).__name__
    try:
        out["second_checkpoint"] = s.checkpoint()
    except wal.WalError as exc:
        out["second_checkpoint"] = type(exc).__name__
    s.close()
    saved = read_checkpoint(os.path.join(path, "state"))
    out["saved_lsn"], out["saved_boot"] = saved.applied_lsn, saved.boot_id.hex()
    out["segments_after"] = len([n for n in os.listdir(os.path.join(path, "log")) if n.endswith(".wal")])
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("a C compiler is needed (the package's own build needs one too)")
    where = tmp_path_factory.mktemp("shim")
    (where / "failsync.c").write_text(SHIM)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(where / "failsync.so"), str(where / "failsync.c"), "-ldl"],
                   check=True)
    return where / "failsync.so"


@pytest.mark.parametrize("how", ["explicit", "automatic"])
def test_a_failed_fdatasync_of_the_state_stops_the_store_and_the_reopen_falls_back_to_the_last_checkpoint(
        tmp_path: Path, shim: Path, how: str) -> None:
    store = tmp_path / "s"
    env = {**os.environ, "LD_PRELOAD": str(shim), "FAIL_SYNC_ARMED": str(tmp_path / "armed")}
    done = subprocess.run([sys.executable, "-c", CHILD, str(store), str(tmp_path / "armed"), how], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert not (tmp_path / "armed").exists(), "the state's fdatasync never ran"
    assert out["failed"] is not None and "fdatasync of the LMDB state" in out["failed"]
    if how == "explicit":
        assert out["checkpoint"] == "FailedError"
    # Never retried and trusted: no commit, no checkpoint after it, nothing of the log let go.
    assert out["after"] == "FailedError" and out["second_checkpoint"] == "FailedError"
    assert out["saved_lsn"] == out["good"] and out["segments_after"] >= out["segments_before"]
    assert bytes.fromhex(out["saved_boot"]) == UNTRUSTED_BOOT_ID
    with wal.open(store) as s:  # this boot: reopened at the checkpoint all the same, the log replayed
        stats = s.stats()
        assert stats["records_replayed"] >= out["acked"] - out["good"]
        for i in range(out["acked"]):
            assert s.get(b"k%04d" % i) == b"v" * 1000, i
        assert s.get(b"after") is None
    assert read_checkpoint(str(store / "state")).boot_id != UNTRUSTED_BOOT_ID  # a good checkpoint again
