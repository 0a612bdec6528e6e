"""A pytest plugin that runs the OpenAI Agents SDK's own session tests against AgentwalSession.

The SDK's tests (tests/memory/test_session.py, test_session_limit.py in its repository) build
``SQLiteSession(session_id, db_path, session_settings=...)``; this plugin puts, in its place,
an AgentwalSession made the same way (``db_path`` becomes the store's directory; ``:memory:``
a fresh temporary one). From a checkout of the SDK whose version matches the installed one:

    PYTHONPATH=/path/to/agentwal/tests/helpers python -m pytest -p agents_sdk_shim \\
        tests/memory/test_session.py tests/memory/test_session_limit.py

Tests that open the SQLite file with ``sqlite3`` to corrupt rows or count connections test
SQLite itself and do not apply.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import agents
import agents.memory
import agents.memory.sqlite_session

from wal.integrations.openai_agents import AgentwalSession


class AgentwalAsSQLiteSession(AgentwalSession):
    def __init__(self, session_id: str, db_path: str | os.PathLike[str] = ":memory:",
                 sessions_table: str = "agent_sessions", messages_table: str = "agent_messages",
                 session_settings: Any = None) -> None:
        if str(db_path) == ":memory:":
            self._tmp = tempfile.TemporaryDirectory()
            db_path = os.path.join(self._tmp.name, "db")
        super().__init__(session_id, db_path, session_settings=session_settings)


agents.SQLiteSession = AgentwalAsSQLiteSession  # type: ignore[misc,assignment]
agents.memory.SQLiteSession = AgentwalAsSQLiteSession  # type: ignore[misc,assignment]
