"""`agentwal crashtest` as a new user runs it (here as ``python -m wal.drill.crashtest``, which is what the
``crashtest`` subcommand calls): small numbers, exit status 0, a PASS line per level, the storage
stack of the directory; and the storage-stack report itself on made-up mount tables and sysfs trees
(partitions, device-mapper, tmpfs, network and overlay filesystems).
"""

from __future__ import annotations

import io
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import wal
from wal.drill import crashtest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the drill's power cuts need Linux")


def test_a_small_crashtest_passes_every_level_and_reports_the_storage_stack(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "wal.drill.crashtest", str(tmp_path), "--kills", "3", "--power-cuts", "2",
         "--threads", "2", "--seed", "11"],
        capture_output=True, text=True, timeout=300, check=False)
    out = proc.stdout
    print(out, proc.stderr)
    assert proc.returncode == 0, out + proc.stderr
    for level in ("sync", "interval", "buffered"):
        line = next(ln for ln in out.splitlines() if ln.startswith(level + " "))
        assert line.rstrip().endswith("PASS"), line
    assert "storage stack of " in out and "filesystem" in out and "fdatasync   p50" in out
    assert "worst loss / RPO" in out and "recovery p50 / max" in out
    assert "--seed 11" in out  # how to rerun it
    assert list(tmp_path.iterdir()) == [], "the drill's stores are removed afterwards"


def test_a_crashtest_of_one_level_prints_one_level_and_keep_leaves_the_stores(tmp_path: Path) -> None:
    out = io.StringIO()
    status = crashtest.main_crashtest([str(tmp_path), "--level", "sync", "--kills", "2", "--power-cuts", "1",
                                       "--threads", "1", "--seed", "3", "--keep"], out=out)
    text = out.getvalue()
    assert status == 0, text
    rows = [ln for ln in text.splitlines() if ln.split()[:1] in (["sync"], ["interval"], ["buffered"])]
    assert len(rows) == 1 and rows[0].startswith("sync") and rows[0].rstrip().endswith("PASS")
    (kept,) = tmp_path.iterdir()
    assert (kept / "sync" / "kill" / "root" / "store" / "STORE").exists()


def test_crashtest_refuses_bad_arguments_with_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert crashtest.main_crashtest(["--level", "fast"]) == 2
    assert "unknown level 'fast'" in capsys.readouterr().err
    assert crashtest.main_crashtest(["--level", "buffered", "--rpo-ms", "0"]) == 2
    assert crashtest.main_crashtest(["--kills", "-1"]) == 2
    # refused before anything runs: an unknown archive scheme, a bound the engine cannot hold,
    # and an archive with no machine loss asked for and nothing else (it drilled nothing, exit 0)
    assert crashtest.main_crashtest(["--kills", "0", "--power-cuts", "0", "--archive", "ftp://host/x"]) == 2
    assert "s3://bucket/prefix or file:///dir" in capsys.readouterr().err
    # a URL of the right scheme that names no bucket or no folder (the drill ran, its children
    # died with a traceback, and it reported the level FAILed: an engine failure)
    for url, said in (("s3://", "names no bucket"), ("s3:///x", "names no bucket"), ("file://host/x", "local path")):
        assert crashtest.main_crashtest(["--kills", "0", "--power-cuts", "0", "--archive", url]) == 2
        assert said in capsys.readouterr().err


def test_crashtest_of_a_directory_that_does_not_exist_stops_before_making_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A mistyped path or an unmounted volume: the drill made the directory and drilled the disk
    # below it, passing for the disk the user meant, and left the directory behind.
    missing = tmp_path / "not" / "mounted"
    assert crashtest.main_crashtest([str(missing), "--kills", "1", "--power-cuts", "0", "--level", "sync"]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert not (tmp_path / "not").exists()


def test_crashtest_with_an_object_store_that_does_not_answer_stops_with_status_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A wrong endpoint (nothing listens there): said before anything runs, status 2. The drill
    ran, every restore failed, and it reported the level FAILed (status 1), as if the engine had
    lost commits."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens on it
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    out = io.StringIO()
    assert crashtest.main_crashtest([str(tmp_path / "d"), "--level", "sync", "--kills", "0", "--power-cuts", "0",
                                     "--archive", "s3://bucket/prefix", "--machine-losses", "1"], out=out) == 2
    assert "--archive s3://bucket/prefix cannot be used" in capsys.readouterr().err
    assert out.getvalue() == ""  # nothing ran
    assert crashtest.main_crashtest(["--level", "interval", "--rpo-ms", str(2**40)]) == 2
    assert "--rpo-ms must be at most" in capsys.readouterr().err
    assert crashtest.main_crashtest(["--kills", "0", "--power-cuts", "0", "--archive", "file:///tmp/x",
                                     "--machine-losses", "0"]) == 2
    assert "nothing to drill" in capsys.readouterr().err


def test_a_power_cut_drill_whose_simulator_does_not_load_in_the_child_stops_instead_of_passing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A shim the child's loader refuses (here: not a library) journals nothing, and every "power
    cut" rewound nothing: the drill passed while proving no more than kills. It stops with
    status 2 and says why."""
    bogus = tmp_path / "not-a-library.so"
    bogus.write_bytes(b"\0" * 16)
    monkeypatch.setattr(crashtest.crashsim, "shim_path", lambda: str(bogus))
    assert crashtest.main_crashtest([str(tmp_path), "--level", "sync", "--kills", "0",
                                     "--power-cuts", "2", "--seed", "1"], out=io.StringIO()) == 2
    assert "the power-cut simulator did not run in the child" in capsys.readouterr().err


def test_a_level_whose_children_had_no_commit_acknowledged_does_not_pass() -> None:
    """An engine that never answers a commit (or a disk too slow for --run-ms) gives no
    violation: it passed, proving nothing. Now a second of children committing without one
    acknowledgement fails the level."""
    silent = crashtest.LevelResult("sync", 0, 1, kills=20, ready_ms=5000)
    assert not silent.passed and silent.status == "FAIL (no commit acknowledged)"
    assert crashtest.LevelResult("sync", 0, 1, kills=20, acknowledged=5, ready_ms=5000).passed
    # a small drill whose kills all struck before the children committed proves nothing either way
    early = crashtest.LevelResult("sync", 0, 1, kills=1, ready_ms=3)
    assert early.passed and early.status == "INCONCLUSIVE (no commit acknowledged)"


def test_the_drills_single_op_commits_take_the_stores_put_and_the_others_a_transaction(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The child commits through both paths a user takes (a drill of transactions alone passed
    with a put that acknowledged and wrote nothing)."""
    with wal.open(tmp_path / "s") as store:
        with monkeypatch.context() as m:
            m.setattr(wal.Store, "transaction", lambda *a, **k: pytest.fail("a single op went to a transaction"))
            assert crashtest.commit_ops(store, [(b"k", b"v")]) == 1
            assert crashtest.commit_ops(store, [(b"k", None)]) == 2
        monkeypatch.setattr(wal.Store, "put", lambda *a, **k: pytest.fail("a transaction's op went to put"))
        assert crashtest.commit_ops(store, [(b"a", b"1"), (b"b", None)]) == 3
        assert store.get(b"a") == b"1" and store.get(b"k") is None
        single = [crashtest.txn_ops(1, 1, 0, n) for n in range(1, 60)]
        assert any(len(ops) == 1 for ops in single) and any(len(ops) > 1 for ops in single)


def test_the_default_directory_is_a_fresh_one_under_the_system_temp_dir() -> None:
    help_text = crashtest.build_parser().format_help()
    assert "$TMPDIR or /tmp" in help_text and "--power-cuts" in help_text and "--kills" in help_text


# ---- the storage stack on made-up systems --------------------------------------------------------------


def _mountinfo(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "mountinfo"
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def _fake_sysfs(root: Path) -> None:
    """sda (write back, FUA) with partition sda1 = 8:1; dm-0 = 253:0 over sda1; vdb = 252:16 write through."""
    devices = root / "devices"
    sda = devices / "pci0" / "host0" / "block" / "sda"
    (sda / "sda1").mkdir(parents=True)
    (sda / "sda1" / "partition").write_text("1\n")
    (sda / "sda1" / "dev").write_text("8:1\n")
    (sda / "queue").mkdir()
    (sda / "queue" / "write_cache").write_text("write back\n")
    (sda / "queue" / "fua").write_text("1\n")
    dm = devices / "virtual" / "block" / "dm-0"
    (dm / "slaves").mkdir(parents=True)
    (dm / "queue").mkdir()
    (dm / "queue" / "write_cache").write_text("write back\n")
    os.symlink(sda / "sda1", dm / "slaves" / "sda1")
    vdb = devices / "pci0" / "virtio3" / "block" / "vdb"
    (vdb / "queue").mkdir(parents=True)
    (vdb / "queue" / "write_cache").write_text("write through\n")
    (root / "dev" / "block").mkdir(parents=True)
    os.symlink(sda / "sda1", root / "dev" / "block" / "8:1")
    os.symlink(dm, root / "dev" / "block" / "253:0")
    os.symlink(vdb, root / "dev" / "block" / "252:16")


def test_storage_stack_climbs_from_a_partition_to_its_disk_and_warns_about_its_volatile_cache(tmp_path: Path) -> None:
    _fake_sysfs(tmp_path / "sys")
    info = _mountinfo(tmp_path, "27 1 254:0 / / rw - ext4 /dev/vda rw",
                      f"40 27 8:1 / {tmp_path} rw,noatime - xfs /dev/sda1 rw")
    st = crashtest.storage_stack(tmp_path, measure=False, mountinfo=info, sys_root=str(tmp_path / "sys"))
    assert (st.fstype, st.source, st.mount_point) == ("xfs", "/dev/sda1", str(tmp_path))
    assert [(d.name, d.write_cache, d.fua) for d in st.devices] == [("sda", "write back", True)]
    assert any("volatile write cache" in w and "honours cache flushes" in w for w in st.warnings)
    assert "device      sda (disk): write cache \"write back\", FUA yes" in "\n".join(st.lines())


def test_storage_stack_follows_device_mapper_to_the_disks_below(tmp_path: Path) -> None:
    _fake_sysfs(tmp_path / "sys")
    info = _mountinfo(tmp_path, f"40 1 253:0 / {tmp_path} rw - ext4 /dev/mapper/vg-root rw")
    st = crashtest.storage_stack(tmp_path, measure=False, mountinfo=info, sys_root=str(tmp_path / "sys"))
    assert [d.name for d in st.devices] == ["dm-0", "sda"]
    assert st.devices[0].kind == "dm"


def test_storage_stack_without_sysfs_entries_or_write_cache_says_so_instead_of_failing(tmp_path: Path) -> None:
    _fake_sysfs(tmp_path / "sys")
    info = _mountinfo(tmp_path, f"40 1 252:16 / {tmp_path} rw - ext4 /dev/vdb rw",
                      f"41 40 9:9 / {tmp_path}/sub rw - ext4 /dev/nowhere rw")
    st = crashtest.storage_stack(tmp_path, measure=False, mountinfo=info, sys_root=str(tmp_path / "sys"))
    assert [(d.name, d.kind, d.write_cache) for d in st.devices] == [("vdb", "virtio", "write through")]
    assert st.warnings == []
    (tmp_path / "sub").mkdir()
    st = crashtest.storage_stack(tmp_path / "sub", measure=False, mountinfo=info, sys_root=str(tmp_path / "sys"))
    assert st.devices == [] and "no block device" in "\n".join(st.lines())


@pytest.mark.parametrize(("fstype", "source", "options", "expect"), [
    ("tmpfs", "tmpfs", "rw", "nothing survives a power cut"),
    ("ramfs", "none", "rw", "nothing survives a power cut"),
    ("nfs4", "server:/export", "rw,vers=4.2", "network or shared filesystem"),
    ("cifs", "//server/share", "rw", "network or shared filesystem"),
    ("fuse.sshfs", "me@host:/", "rw", "network or shared filesystem"),
    ("ceph", "10.0.0.1:/", "rw", "network or shared filesystem"),
    ("overlay", "overlay", "rw,lowerdir=/l,upperdir=/var/lib/docker/u,workdir=/w", "overlay (container) filesystem"),
    ("fuse.myfs", "myfs", "rw", "FUSE filesystem"),
    ("ext4", "/dev/sdz1", "rw,nobarrier", "nobarrier"),
])
def test_storage_stack_warns_where_the_guarantee_cannot_be_trusted(
        tmp_path: Path, fstype: str, source: str, options: str, expect: str) -> None:
    info = _mountinfo(tmp_path, f"40 1 0:99 / {tmp_path} rw - {fstype} {source} {options}")
    st = crashtest.storage_stack(tmp_path, measure=False, mountinfo=info, sys_root=str(tmp_path / "nosys"))
    assert st.fstype == fstype
    assert any(expect in w for w in st.warnings), st.warnings
    if fstype == "overlay":
        assert any("/var/lib/docker/u" in w for w in st.warnings)


def test_storage_stack_unescapes_mount_points_with_spaces(tmp_path: Path) -> None:
    spaced = tmp_path / "my disk"
    spaced.mkdir()
    info = _mountinfo(tmp_path, "27 1 254:0 / / rw - ext4 /dev/vda rw",
                      f"40 27 0:50 / {str(spaced).replace(' ', chr(92) + '040')} rw - tmpfs tmpfs rw")
    st = crashtest.storage_stack(spaced, measure=False, mountinfo=info)
    assert (st.mount_point, st.fstype) == (str(spaced), "tmpfs")


def test_storage_stack_measures_fdatasync_on_this_machine(tmp_path: Path) -> None:
    st = crashtest.storage_stack(tmp_path)
    assert st.fdatasync_samples >= 10
    assert st.fdatasync_p50_ms is not None and st.fdatasync_p99_ms is not None
    assert 0 <= st.fdatasync_p50_ms <= st.fdatasync_p99_ms
    assert st.fstype != "?" and st.mount_point != "?"
    assert not list(tmp_path.iterdir()), "the probe file is removed"


def test_half_the_power_cuts_at_a_level_with_an_rpo_drop_everything_not_synced() -> None:
    """Only mode "drop" loses the whole span since the last fdatasync, which is what the RPO
    bound is about: at interval and buffered it is half the cuts (drawn uniformly from the four
    modes, a store flushing at 2.5 times its rpo_ms passed about half the drills); at sync,
    whose bound is zero, each mode a quarter."""
    for level, low, high in (("interval", 0.58, 0.68), ("buffered", 0.58, 0.68), ("sync", 0.2, 0.3)):
        rng = random.Random(7)
        modes = [crashtest._power_cut_mode(rng, level) for _ in range(4000)]
        assert set(modes) == set(crashtest.MODES)
        assert low < modes.count("drop") / len(modes) < high, (level, modes.count("drop"))
