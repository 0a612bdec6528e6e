"""Adapters that plug agentwal into agent runtimes.

* `wal.integrations.langgraph`: `AgentwalSaver`, a LangGraph `BaseCheckpointSaver` (extra ``[langgraph]``).
* `wal.integrations.openai_agents`: `AgentwalSession`, an OpenAI Agents SDK session (extra ``[openai-agents]``).

Each module imports its runtime on import; this package imports neither.
"""
