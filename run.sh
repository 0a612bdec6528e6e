#!/usr/bin/env bash
# One entry point for a fresh machine (Python 3.11+, a C compiler):
#   ./run.sh demo [DIR]   set up, then run the crash-and-resume demo (agentwal demo)
#   ./run.sh test         set up, then lint, type-check and run the test suite
# Set-up is idempotent: a virtual environment in .venv (or $AGENTWAL_VENV) with
# agentwal installed editable, which builds the C core with cffi. Each command installs
# what it runs and no more, so a first demo is quick: the demo needs agentwal alone (cffi,
# lmdb); the tests also need the [test] tools, the integrations' frameworks (their tests
# drive them for real) and the two parts of [bench] the benchmarks' smoke tests run:
# matplotlib (the plots) and SqliteSaver (the integrations' peer). The other peers of
# [bench] (RocksDB, LevelDB, PostgreSQL) are for benchmark runs: pip install -e '.[bench]'.
set -euo pipefail
cd "$(dirname "$0")"
VENV="${AGENTWAL_VENV:-.venv}"

setup() {  # $1: extras, e.g. "[test]", or "" for agentwal alone; then any further packages
    if [ ! -x "$VENV/bin/python" ]; then
        python3 -m venv "$VENV"
    fi
    # The build's own requirements (pyproject.toml [build-system]) in the venv too, so that
    # `pip install --no-build-isolation -e .` after a C change builds with them.
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "setuptools>=77" "cffi>=1.16"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".$1" "${@:2}"
}

cmd="${1:-}"
shift || true
case "$cmd" in
    demo)
        setup ""
        exec "$VENV/bin/agentwal" demo "$@"
        ;;
    test)
        # Same ranges as pyproject.toml's [bench] extra.
        setup "[test,langgraph,openai-agents]" "matplotlib>=3.7" "langgraph-checkpoint-sqlite>=3"
        "$VENV/bin/ruff" check wal tests
        "$VENV/bin/mypy"
        "$VENV/bin/lint-imports" --no-cache  # the floors: pyproject.toml [tool.importlinter]
        if [ $# -gt 0 ]; then
            exec "$VENV/bin/python" -m pytest -q "$@"
        fi
        # The whole suite: first everything that holds no wall-clock bound, on every core; then
        # the tests that do (marked `alone`: RPO windows, lags), one at a time (tests/conftest.py).
        "$VENV/bin/python" -m pytest -q -n auto -m "not alone"
        exec "$VENV/bin/python" -m pytest -q -m alone
        ;;
    *)
        echo "usage: ./run.sh demo [DIR] | ./run.sh test [pytest args]" >&2
        exit 2
        ;;
esac
