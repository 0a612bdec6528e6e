"""The `agentwal` command (placeholder until the store lands: `agentwal demo` runs the log demo)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from wal import demo

    return demo.main(argv if argv is not None else sys.argv[1:])
