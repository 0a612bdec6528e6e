"""Run fuzz inputs through a target without atheris and say what happened.

    python fuzz/repro.py segment|open FILE...

Uses whatever `wal` the interpreter imports (the plain build in the project's venv, or the
sanitizer build when run with fuzz/.venv-asan/bin/python and the environment in
fuzz/.venv-asan/asan-env). Exit status 1 if any input is a finding.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("segment", "open"):
        print(__doc__, file=sys.stderr)
        return 2
    target = importlib.import_module(f"fuzz_{argv[0]}")
    status = 0
    for path in argv[1:]:
        with open(path, "rb") as f:
            data = f.read()
        try:
            signature = target.run_one(data)
        except Exception:
            status = 1
            print(f"FINDING {path}:\n{traceback.format_exc()}")
        else:
            print(f"ok      {path}: {' '.join(s for s in signature if s)}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
