"""A LangGraph graph (plain Python nodes, no LLM) checkpointed by agentwal; kill it, run it again.

    python examples/langgraph_resume.py /tmp/demo.db            # Ctrl-C / kill -9 it mid-run ...
    python examples/langgraph_resume.py /tmp/demo.db            # ... and it resumes at its last checkpoint

Each step of the graph is one super-step; with LangGraph ``durability="sync"`` its checkpoint
is committed to the store (level ``sync``: fsynced) before the next step starts, so a kill
loses at most the step that was running -- which LangGraph then simply runs again.
"""

from __future__ import annotations

import argparse
import operator
import time
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

import wal
from wal.integrations.langgraph import AgentwalSaver

STEPS = 10


class State(TypedDict):
    step: int
    log: Annotated[list[str], operator.add]  # each step appends exactly one entry


def build(saver: AgentwalSaver, delay: float) -> Any:
    def work(state: State) -> dict[str, Any]:
        n = state["step"] + 1
        time.sleep(delay)  # "work"
        print(f"did step {n}", flush=True)
        return {"step": n, "log": [f"step{n}"]}

    def more(state: State) -> str:
        return "work" if state["step"] < STEPS else END

    g = StateGraph(State)
    g.add_node("work", work)
    g.add_edge(START, "work")
    g.add_conditional_edges("work", more)
    return g.compile(checkpointer=saver)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("db")
    ap.add_argument("--thread", default="demo")
    ap.add_argument("--delay", type=float, default=0.2)
    args = ap.parse_args()
    with wal.open(args.db) as store:
        graph = build(AgentwalSaver(store), args.delay)
        cfg = {"configurable": {"thread_id": args.thread}, "recursion_limit": 100}
        snapshot = graph.get_state(cfg)
        if snapshot.values and snapshot.next:
            print(f"resuming from checkpoint at step {snapshot.values['step']}", flush=True)
            result = graph.invoke(None, cfg, durability="sync")  # None: continue from the checkpoint
        elif snapshot.values:
            print("already finished", flush=True)
            result = snapshot.values
        else:
            print("starting fresh", flush=True)
            result = graph.invoke({"step": 0, "log": []}, cfg, durability="sync")
        print(f"DONE step={result['step']} log={','.join(result['log'])}", flush=True)


if __name__ == "__main__":
    main()
