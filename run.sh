#!/usr/bin/env bash
# One entry point for a fresh machine (Python 3.11+, a C compiler):
#   ./run.sh demo [DIR]   set up, then run the crash-and-resume demo (agentwal demo)
#   ./run.sh test         set up, then lint, type-check and run the test suite
# Set-up is idempotent: a virtual environment in .venv (or $AGENTWAL_VENV) with
# agentwal installed editable, which builds the C core with cffi.
set -euo pipefail
cd "$(dirname "$0")"
VENV="${AGENTWAL_VENV:-.venv}"

setup() {
    if [ ! -x "$VENV/bin/python" ]; then
        python3 -m venv "$VENV"
    fi
    # The build's own requirements (pyproject.toml [build-system]) in the venv too, so that
    # `pip install --no-build-isolation -e .` after a C change builds with them.
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "setuptools>=77" "cffi>=1.16"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[test,bench,langgraph,openai-agents]"
}

cmd="${1:-}"
shift || true
case "$cmd" in
    demo)
        setup
        exec "$VENV/bin/agentwal" demo "$@"
        ;;
    test)
        setup
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
