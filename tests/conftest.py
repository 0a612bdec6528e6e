"""Shared test fixtures."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Sequence

import pytest

Calls = Sequence[tuple[str, Callable[[], object]]]

# Modules whose assertions hold a bound in wall-clock time -- an RPO window after a kill or a
# power cut, an archive's lag, a file's growth while writing -- marked `alone`: `./run.sh test`
# runs them by themselves, after the rest of the suite ran on every core, so that no other test
# competes with them for the CPU and a bound they report is the store's, not the machine's load.
# A test of such a module that holds none (a kill loop at `sync`, whose promise is exact) is
# marked `no_time_bound` and runs with the rest.
ALONE_MODULES = frozenset({
    "test_archive_faults", "test_crash_kill", "test_crash_powercut", "test_crashtest_cli",
    "test_crashtest_machine_loss", "test_demo", "test_log_commit", "test_space",
    "test_state_checkpoint", "test_store_processes",
})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if (item.module is not None and item.module.__name__.rsplit(".", 1)[-1] in ALONE_MODULES
                and item.get_closest_marker("no_time_bound") is None):
            item.add_marker(pytest.mark.alone)


def _outcome_names(calls: Calls) -> dict[str, str]:
    """Each call's outcome by name: "no error", or the name of the exception it raised."""
    results = {}
    for name, call in calls:
        try:
            call()
            results[name] = "no error"
        except Exception as exc:
            results[name] = type(exc).__name__
    return results


@pytest.fixture
def forked_outcomes() -> Callable[..., dict[str, str]]:
    """run(calls, *, first=None, then=None): fork; the child records `first()` (a dict of
    extra findings, made before the calls), then each call's outcome, then runs `then()`,
    sends the findings back as JSON and exits without returning into pytest. The parent
    asserts the child exited 0 and returns the findings. run forks when called, so a test
    forks where it needs to (e.g. while a lock is held)."""

    def run(calls: Calls, *, first: Callable[[], dict[str, str]] | None = None,
            then: Callable[[], object] | None = None) -> dict[str, str]:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: report, never return into pytest
            code = 0
            try:
                results = first() if first is not None else {}
                results.update(_outcome_names(calls))
                if then is not None:
                    then()
                os.write(write_fd, json.dumps(results).encode())
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(write_fd)
        with os.fdopen(read_fd) as r:
            report = r.read()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        findings: dict[str, str] = json.loads(report)
        return findings

    return run


@pytest.fixture
def starve_materializer() -> Callable[[object], Callable[[], None]]:
    """starve(store) -> wake: from then on the store's materializer thread applies only when
    `wake()` is called (and once more, if the wake-up this costs finds commits durable), or at
    close. The event it waits on is swapped for one only `wake` and close set (commits keep
    setting the old one, which it no longer watches), and the old one is set once so that its
    current wait ends and the next begins on the new one. Open the store with a long
    apply_interval_ms, or the wait times out."""

    def starve(store: object) -> Callable[[], None]:
        old = store._wake  # type: ignore[attr-defined]
        new = threading.Event()
        store._wake = new  # type: ignore[attr-defined]
        old.set()
        return new.set

    return starve
