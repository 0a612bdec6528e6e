"""Docs test: every ``$ agentwal ...`` line of README.md's "Operating a store (CLI)" section runs.

The lines run in README order, through a shell (so ``> backup.jsonl`` works), against a store
made here the way the README's "Using it" example makes one, with ``/path/to/`` replaced by a
temporary directory. Each must exit 0 unless the line ends with ``# exit status N``. A line
with ``tail -f`` follows forever: once it has printed the store's last records it is stopped
with Ctrl-C (SIGINT), which must also give 0.
"""

from __future__ import annotations

import os
import re
import select
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import wal

README = Path(__file__).resolve().parent.parent / "README.md"
SECTION = "## Operating a store (CLI)"
_STATUS = re.compile(r"\s+#\s*exit status (\d+)\s*$")


def cli_lines() -> list[tuple[str, int]]:
    """(command line, expected exit status) for each ``$ agentwal`` line of the section, in order."""
    text = README.read_text(encoding="utf-8")
    assert SECTION in text, f"README.md has no {SECTION!r} section"
    body = text.split(SECTION, 1)[1]
    body = re.split(r"^## ", body, maxsplit=1, flags=re.M)[0]
    out = []
    for line in body.splitlines():
        if line.startswith("$ agentwal "):
            command = line[2:]
            status = 0
            m = _STATUS.search(command)
            if m:
                status, command = int(m.group(1)), command[: m.start()]
            out.append((command, status))
    return out


def make_readme_store(path: Path) -> None:
    """The store of the README's "Using it" example."""
    with wal.open(path) as store:
        lsn = store.put("agent/7/step", b"3")
        with store.transaction(idempotency_key="agent-7-step-4") as tx:
            tx.put("agent/7/step", b"4", if_version=lsn)
            tx.put("agent/7/msg/000004", b'{"role": "tool", "content": "42"}')


def shell_env(tmp_path: Path) -> dict[str, str]:
    """PATH with an `agentwal` that is this interpreter's `python -m wal`, whatever is installed."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "agentwal"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m wal "$@"\n', encoding="utf-8")
    script.chmod(0o755)
    return {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_the_readme_section_has_examples_of_every_operator_command() -> None:
    commands = {line.split()[1] for line, _ in cli_lines()}
    assert {"info", "verify", "dump", "get", "put", "delete", "scan", "export", "import", "checkpoint", "repair",
            "tail", "stats"} <= commands


def test_every_agentwal_line_of_the_readme_section_runs(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    make_readme_store(work / "store")
    env = shell_env(tmp_path)
    lines = cli_lines()
    assert lines
    for command, expected in lines:
        concrete = command.replace("/path/to/", f"{work}/")
        if " tail " in f" {command} " and " -f" in command:
            proc = subprocess.Popen(["/bin/sh", "-c", f"exec {concrete}"], cwd=work, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            # Interrupted once it is following: after its first line (the store's last records).
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            assert ready, f"{command!r} printed nothing in 60 s"
            first = proc.stdout.readline()
            assert proc.poll() is None, f"{command!r} exited early: {proc.communicate()}"
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
            out = first + out
            assert proc.returncode == expected, f"{command!r}: exit {proc.returncode}\n{out!r}\n{err!r}"
            continue
        result = subprocess.run(["/bin/sh", "-c", concrete], cwd=work, env=env, capture_output=True, text=True,
                                timeout=120, check=False)
        assert result.returncode == expected, (
            f"README line {command!r} exited {result.returncode}, expected {expected}\n"
            f"stdout: {result.stdout}\nstderr: {result.stderr}")
