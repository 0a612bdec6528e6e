"""The `agentwal` command line (also ``python -m wal``).

Why argparse: it is in the standard library, so an embedded engine whose only runtime
dependencies are cffi and lmdb gains none for its CLI; it has subcommands
(``add_subparsers``), and ``--help`` at both levels is generated from the same declarations
the parser uses, so the help cannot drift from what is accepted. click or typer would add a
dependency for nothing argparse cannot do here.

Structure: every subcommand is one `Command` in `COMMANDS` -- a name, a one-line summary
(shown by ``agentwal --help``), a description (shown by ``agentwal NAME --help``), a function
declaring its arguments and one function running it, ``cmd_NAME(args) -> exit status``.
Adding ``info``, ``verify``, ``dump``, ``get``/``put``/``delete``/``scan``, ``export``/``import``,
``checkpoint``, ``repair``, ``tail``, ``stats``, ``crashtest`` or ``bench`` means writing those two
functions and appending one `Command`.

Exit status: 0 success; 1 the command ran and found a failure (e.g. the demo's check) or the
store raised a `wal.WalError`; 2 bad usage (argparse's convention); 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

import wal
from wal import demo
from wal import durability as dur

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the descriptions' own line breaks (examples, lists); wraps argument help."""


@dataclass(frozen=True)
class Command:
    """One subcommand: `arguments` declares its options on its parser; `run` returns the exit status."""

    name: str
    summary: str
    description: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse `type` accepting an integer in [low, high]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return parse


# ---- demo ------------------------------------------------------------------------------------------

_DEMO_DESCRIPTION = """\
Simulate AI agents whose whole state lives in an agentwal store, kill their process
with SIGKILL at random moments, restart it, and prove nothing acknowledged was lost.

A worker process runs N agents (asyncio tasks), each a multi-step workflow (research:
search, read, summarize; support: classify, lookup, reply; ...). Every step is one
transaction writing the agent's step counter, a conversation message and a tool-call
result, guarded by if_version on the counter and an idempotency key. The worker prints an
ACK line per acknowledged step. The demo SIGKILLs it K times (during start-up, during
recovery, mid-workflow), restarts it each time -- every agent resumes from its stored
counter -- and lets the last run finish. Then it opens the store itself and checks that
every acknowledged step is present, at the LSN it was acknowledged at, and that no step
was applied twice.

It prints a table (per run: how it ended, recovery time, records replayed, commits,
fsyncs, group size) and a verdict line. Exit status 0 when the check passed, 1 when it
failed (the failures are listed), 2 on bad usage (e.g. DIR not empty).

examples:
  agentwal demo                                  # 8 agents x 60 steps, 5 kills, temp dir
  agentwal demo ./demo-store --kills 20 --seed 7
  agentwal demo --durability buffered --rpo-ms 50  # losses within 50 ms are allowed
"""


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", metavar="DIR", nargs="?", default=None,
                   help="directory for the store; must be absent or empty "
                        "(default: a new temporary directory, printed and kept)")
    p.add_argument("--agents", type=_int_in(1, demo.MAX_AGENTS), default=8, metavar="N",
                   help="number of simulated agents (default: %(default)s)")
    p.add_argument("--kills", type=_int_in(0), default=5, metavar="K",
                   help="times the worker is SIGKILLed and restarted (default: %(default)s)")
    p.add_argument("--steps", type=_int_in(1, demo.MAX_STEPS), default=60, metavar="N",
                   help="workflow steps per agent (default: %(default)s)")
    p.add_argument("--seed", type=int, default=None, metavar="S",
                   help="seed for the workflows and the kill plan; the run is repeatable given it, "
                        "apart from kill timing (default: random, printed)")
    p.add_argument("--durability", choices=dur.LEVELS, default=None,
                   help="the store's durability level (default: sync, or interval when --rpo-ms > 0)")
    p.add_argument("--rpo-ms", type=_int_in(0), default=None, metavar="T",
                   help="RPO bound in ms for interval/buffered (default: 1000 for those levels)")


def cmd_demo(args: argparse.Namespace) -> int:
    """`agentwal demo`: see `wal.demo`."""
    try:
        dur.parse(args.durability, args.rpo_ms)
        return demo.run_demo(args.dir, agents=args.agents, kills=args.kills, steps=args.steps, seed=args.seed,
                             durability=args.durability, rpo_ms=args.rpo_ms)
    except (demo.DemoError, wal.ArgumentError) as exc:
        print(f"agentwal demo: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


# ---- the command table -----------------------------------------------------------------------------

COMMANDS: tuple[Command, ...] = (
    Command("demo", "run agents, SIGKILL their process at random, prove no acknowledged step is lost",
            _DEMO_DESCRIPTION, _demo_arguments, cmd_demo),
)

_MAIN_DESCRIPTION = """\
agentwal: an embedded write-ahead-log storage engine for AI-agent runtimes.
Agent state (conversations, tool results, workflow progress) survives process kills and
power cuts, with the data-loss bound (RPO) you choose.

This command works on agentwal stores from the shell. Start with the demo:
  agentwal demo
"""


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per entry of `COMMANDS`."""
    parser = argparse.ArgumentParser(prog="agentwal", description=_MAIN_DESCRIPTION, formatter_class=_Formatter,
                                     epilog="Run 'agentwal COMMAND --help' for a command's options.")
    parser.add_argument("--version", action="version", version=f"agentwal {wal.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.summary, description=command.description,
                           formatter_class=_Formatter)
        command.arguments(p)
        p.set_defaults(run=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default: ``sys.argv[1:]``); returns the exit status.

    argparse's own exits (``--help``, ``--version``, usage errors) raise SystemExit as usual.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        status: int = args.run(args)
    except KeyboardInterrupt:
        print("\nagentwal: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except wal.WalError as exc:
        print(f"agentwal {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return status
