"""The `agentwal` command line: argument parsing and printing over the operator functions
(wal/ops/), the object archive (wal/archive/) and the crash drill (wal/drill/).

`main` (wal/cli/commands.py) is the entry point; each subcommand is one ``cmd_*`` function there,
and the archive's commands (restore, follow, archive status, verify of a URL) are in
wal/cli/archive.py.
"""

from wal.cli.commands import COMMANDS, main

__all__ = ["COMMANDS", "main"]
