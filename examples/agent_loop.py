"""A plain agent loop on `wal.agents`: an event stream plus tool-call intents, reconciled after a crash.

    python examples/agent_loop.py /tmp/loop.db /tmp/ledger.txt     # kill -9 it at any moment ...
    python examples/agent_loop.py /tmp/loop.db /tmp/ledger.txt     # ... and it reconciles and finishes

The "tools" have an external side effect: they append a line to a ledger file (think: a
payment provider). The loop follows the intent/outcome protocol:

1. ``begin_call`` makes the intent durable *before* the side effect;
2. the tool runs (the side effect happens);
3. ``end_call`` records the outcome, and the loop appends an event to the thread's stream.

A kill between 1 and 3 leaves a pending call. On restart the loop does not re-run it
blindly: it asks the outside world (the ledger, by call id) whether the effect happened
and records the outcome it finds, re-running the tool only if it did not happen.
``AGENT_LOOP_PAUSE_AT=<call_id>`` pauses between side effect and outcome (for the test).
"""

from __future__ import annotations

import json
import os
import sys
import time

import wal
from wal.agents import AgentStore

THREAD = "demo"
PLAN = [("charge", {"eur": 10 * i}) for i in range(1, 7)]  # what a "model" decided to do


def ledger_lookup(ledger: str, call_id: str) -> str | None:
    """Ask the external system whether call_id's effect happened (its receipt) or not (None)."""
    if not os.path.exists(ledger):
        return None
    with open(ledger, encoding="utf-8") as f:
        for line in f:
            entry = json.loads(line)
            if entry["call_id"] == call_id:
                return str(entry["receipt"])
    return None


def run_tool(ledger: str, call_id: str, tool: str, args: dict[str, int]) -> str:
    receipt = f"{tool}:{args['eur']}EUR:{call_id}"
    with open(ledger, "a", encoding="utf-8") as f:
        f.write(json.dumps({"call_id": call_id, "receipt": receipt}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return receipt


def main() -> None:
    db, ledger = sys.argv[1], sys.argv[2]
    pause_at = os.environ.get("AGENT_LOOP_PAUSE_AT")
    with wal.open(db, durability="interval", rpo_ms=50) as store:  # begin_call is fsynced regardless
        agent = AgentStore(store, "example")
        # reconcile: intents without outcome from a previous, killed run
        for call in agent.pending_calls(THREAD):
            receipt = ledger_lookup(ledger, call.call_id)
            if receipt is not None:
                print(f"reconciled {call.call_id}: effect found, recording outcome", flush=True)
            else:
                print(f"reconciled {call.call_id}: effect not found, running it", flush=True)
                receipt = run_tool(ledger, call.call_id, call.tool, json.loads(call.args))
            agent.end_call(THREAD, call.call_id, receipt.encode())
            seq = agent.append(THREAD, json.dumps({"tool_result": call.call_id}).encode())
            print(f"event {seq}", flush=True)
        for i, (tool, args) in enumerate(PLAN, start=1):
            call_id = f"call-{i}"
            rec = agent.begin_call(THREAD, call_id, tool, json.dumps(args).encode())
            if rec.status == "done":
                continue  # finished in an earlier run: its recorded result stands
            receipt = run_tool(ledger, call_id, tool, args)
            print(f"effect done {call_id}", flush=True)
            if pause_at == call_id:
                print(f"PAUSED between intent and outcome of {call_id}", flush=True)
                time.sleep(120)
            agent.end_call(THREAD, call_id, receipt.encode())
            event = json.dumps({"tool_result": call_id}).encode()
            seq = agent.append(THREAD, event, state={"progress": str(i).encode()})
            print(f"event {seq}", flush=True)
        results = [agent.call_result(f"call-{i}") for i in range(1, len(PLAN) + 1)]
        assert all(r is not None and r.status == "done" for r in results)
        print(f"DONE calls={len(results)} events={agent.last_seq(THREAD)} pending={len(agent.pending_calls())}",
              flush=True)


if __name__ == "__main__":
    main()
