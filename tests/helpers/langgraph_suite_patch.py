"""Point LangGraph's own graph suites at AgentwalSaver.

LangGraph's tests (libs/langgraph/tests in its repository) run every graph test on a set of
checkpointers (``sync_checkpointer`` / ``async_checkpointer`` in its conftest). This script
rewrites, in a copy of that directory, the ``sqlite`` and ``sqlite_aio`` ones to yield an
``AgentwalSaver.from_conn_string(<temp dir>)`` (``with`` and ``async with``), so that those
parameters run the graph suites on agentwal:

    python tests/helpers/langgraph_suite_patch.py /path/to/langgraph/libs/langgraph/tests
    cd /path/to/langgraph/libs/langgraph && NO_DOCKER=true python -m pytest -o addopts="" \\
        tests/test_pregel.py tests/test_pregel_async.py -k "(sqlite or memory) and not aes and not migrate"

(its test dependencies: pytest-mock, syrupy, redis, pycryptodome, pytest-asyncio). Compare
with the ``memory`` parameter: a test failing for both comes from a LangGraph version other
than the installed one, not from the saver.
"""

from __future__ import annotations

import sys
from pathlib import Path

SYNC_OLD = '''def _checkpointer_sqlite():
    with SqliteSaver.from_conn_string(":memory:") as checkpointer:
'''
SYNC_NEW = '''def _checkpointer_sqlite():
    import tempfile
    from wal.integrations.langgraph import AgentwalSaver
    with tempfile.TemporaryDirectory() as tmp, AgentwalSaver.from_conn_string(tmp + "/db") as checkpointer:
'''
ASYNC_OLD = '''async def _checkpointer_sqlite_aio():
    async with AsyncSqliteSaver.from_conn_string(":memory:") as checkpointer:
        _apply_strict_msgpack(checkpointer)
        yield checkpointer
'''
ASYNC_NEW = '''async def _checkpointer_sqlite_aio():
    import tempfile
    from wal.integrations.langgraph import AgentwalSaver
    with tempfile.TemporaryDirectory() as tmp:
        async with AgentwalSaver.from_conn_string(tmp + "/db") as checkpointer:
            _apply_strict_msgpack(checkpointer)
            yield checkpointer
'''


def main(tests_dir: str) -> int:
    path = Path(tests_dir) / "conftest_checkpointer.py"
    text = path.read_text(encoding="utf-8")
    for old, new in ((SYNC_OLD, SYNC_NEW), (ASYNC_OLD, ASYNC_NEW)):
        if old not in text:
            print(f"{path}: this LangGraph version's fixture differs; patch by hand:\n{old}", file=sys.stderr)
            return 1
        text = text.replace(old, new)
    path.write_text(text, encoding="utf-8")
    print(f"{path}: the sqlite and sqlite_aio checkpointers are now AgentwalSaver")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
