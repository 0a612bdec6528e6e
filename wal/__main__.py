"""``python -m wal``: the `agentwal` command line (see `wal.cli`)."""

from wal.cli import main

raise SystemExit(main())
