"""Smoke test of an INSTALLED agentwal: run by .ci/packaging (wheel, sdist, each py-lmdb release,
the lowest cffi) and by cibuildwheel (pyproject.toml [tool.cibuildwheel] test-command).

It refuses to run against a source tree: `wal` must come from site-packages. Then it drives a
store the way a user's first program does -- open, commit (put, transaction, delete),
checkpoint, close, reopen, read -- plus the bare log and the console script, and prints one
line of versions so a CI log says which dependency releases were driven.
Usage: python smoke.py            (from any directory outside the source tree)
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path


def main() -> int:
    import wal  # noqa: PLC0415 - after the checks below would be too late for a clear message
    from wal.store import state  # noqa: PLC0415

    location = Path(wal.__file__).resolve().parent
    installed = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    if location.parent not in installed:
        print(f"smoke: wal was imported from {location}, not from this interpreter's site-packages "
              f"({', '.join(map(str, sorted(installed)))}): not testing an install", file=sys.stderr)
        return 1
    version = importlib.metadata.version("agentwal")
    assert wal.__version__ == version, (wal.__version__, version)

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "store")
        with wal.open(path) as store:
            first = store.put("agent/1/step", b"1")
            with store.transaction() as tx:
                tx.put(b"agent/1/step", b"2", if_version=first)
                tx.put(b"agent/1/note", b"hello")
            store.put(b"doomed", b"x")
            store.delete(b"doomed")
            applied = store.checkpoint()
            assert applied == tx.lsn + 2, (applied, tx.lsn)
            store.put(b"agent/1/after", b"tail")  # replayed from the log at the reopen
        with wal.open(path) as store:
            assert store.get(b"agent/1/step") == b"2"
            assert store.version(b"agent/1/step") == tx.lsn
            assert list(store.scan(prefix=b"agent/")) == [
                (b"agent/1/after", b"tail"), (b"agent/1/note", b"hello"), (b"agent/1/step", b"2")]
            assert store.get(b"doomed") is None
            written, durable, _ = store.watermarks
            assert written == durable == applied + 1
        with wal.open(path, readonly=True) as reader:
            assert reader.get(b"agent/1/after") == b"tail"

        log = wal.Log.open(os.path.join(tmp, "log"))
        try:
            last = log.append_many([b"a", b"b", b"c"])
            log.sync()
            assert [p for _, p in log.read(from_lsn=1)] == [b"a", b"b", b"c"] and last == 3
        finally:
            log.close()

    script = shutil.which("agentwal", path=os.path.dirname(sys.executable))
    assert script is not None, f"no agentwal console script beside {sys.executable}"
    out = subprocess.run([script, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    assert out == f"agentwal {version}", out

    print(f"smoke ok: agentwal {version} from {location} | py-lmdb {importlib.metadata.version('lmdb')} "
          f"({state.LMDB_VERSION}) | cffi {importlib.metadata.version('cffi')} | Python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
