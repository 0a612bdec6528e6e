"""The crash drill: tools that break a store on purpose and check what survives.

Modules: `crashtest` (`agentwal crashtest`: kill and power-cut loops against the durability
table, and the storage-stack report), `crashsim` (the power-cut simulator: unsynced bytes
dropped from the page cache as a real power loss would), `failpoints` (the C core's failpoints
armed from Python, for fault tests), `demo` (`agentwal demo`: agents killed mid-step, resumed,
their state checked).

Nothing in the log or the store imports this floor.
"""
