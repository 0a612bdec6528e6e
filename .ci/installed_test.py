"""Copied beside the chosen tests by .ci/packaging: the suite it runs must be testing the install.

Fails the run if `wal` (or anything of the source tree) was imported from anywhere but this
interpreter's site-packages -- e.g. a source tree on sys.path through the current directory,
PYTHONPATH or an editable install.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import wal


def test_the_tests_import_the_installed_wal_not_a_source_tree() -> None:
    site = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    assert Path(wal.__file__).resolve().parent.parent in site, wal.__file__
    assert not (Path(wal.__file__).resolve().parent.parent / "native" / "build.py").exists()
