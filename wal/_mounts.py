"""Which filesystem holds a path, and what kind of filesystem it is, from /proc/self/mountinfo.

One place for both operator tools that judge the storage under a store: `agentwal crashtest`'s
storage-stack report (wal/drill/crashtest.py) and the warnings of `agentwal info` (wal/ops/).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

# Filesystem types whose fdatasync says nothing certain about stable storage on this host.
NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "9p", "afs", "lustre", "gpfs",
              "beegfs", "ocfs2", "gfs2", "virtiofs", "fuse.sshfs", "fuse.ceph", "fuse.glusterfs", "fuse.s3fs",
              "fuse.rclone", "fuse.gcsfuse", "fuse.juicefs", "fuse.cephfs", "fuse.smbnetfs", "davfs", "fuse.davfs"}
# Filesystem types that keep files in memory: nothing on them survives a reboot or power cut.
MEMORY_FS = {"tmpfs", "ramfs", "devtmpfs", "hugetlbfs", "shm"}
# Union / container-layer filesystems: durability is that of a layer that may be discarded.
OVERLAY_FS = {"overlay", "overlayfs", "aufs", "fuse-overlayfs", "fuse.fuse-overlayfs", "unionfs", "fuse.unionfs"}


@dataclass
class Mount:
    majmin: str
    root: str
    point: str
    options: str  # per-mount options
    fstype: str
    source: str
    super_options: str  # per-superblock options

    @property
    def all_options(self) -> set[str]:
        return set(self.options.split(",")) | set(self.super_options.split(","))


def _unescape(text: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def mounts(mountinfo: str = "/proc/self/mountinfo") -> list[Mount]:
    """Every mount of this process's namespace. Raises OSError when mountinfo cannot be read."""
    found = []
    with open(mountinfo, encoding="utf-8", errors="replace") as f:
        for line in f:
            left, sep, right = line.rstrip("\n").partition(" - ")
            if not sep:
                continue
            a = left.split()
            b = right.split()
            if len(a) < 6 or len(b) < 2:
                continue
            found.append(Mount(a[2], _unescape(a[3]), _unescape(a[4]), a[5], b[0], _unescape(b[1]),
                               b[2] if len(b) > 2 else ""))
    return found


def mount_of(path: str, all_mounts: list[Mount]) -> Mount | None:
    """The mount holding path: the longest mount point that is a prefix of its real path (the last
    such line when several are mounted on one point: later mounts cover earlier ones)."""
    real = os.path.realpath(path)
    best: Mount | None = None
    for m in all_mounts:
        under = m.point in ("/", real) or real.startswith(m.point.rstrip("/") + "/")
        if under and (best is None or len(m.point) >= len(best.point)):
            best = m
    return best
