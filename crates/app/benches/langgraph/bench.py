#!/usr/bin/env python3
"""The reference side of `cargo xtask bench turn`: LangGraph's StateGraph on
its PostgreSQL checkpointer (langgraph-checkpoint-postgres), no LLM.

The state is shaped like the seed agent's: two history lists growing by one
user and one assistant message a turn (history, transcript), dict-merge
reducer fields, a diagnostics dict merged by several nodes, a loaded
working_memory list rewritten every turn, and turn-scoped scalars. The graph
is three trivial nodes: crisis_gate and memory_context run in one superstep
(fan-out), reply joins them. User messages are 30 words (~180 characters),
replies 90 words (~550 characters), from a fixed vocabulary. Every turn is
`ainvoke(..., durability="async")`, LangGraph's default: a checkpoint per
superstep, written while the next superstep runs, all of them written when
`ainvoke` returns.

Parts (`--parts`, comma-separated; the bench runs all four):

  single      1 thread x --turns turns on one AsyncPostgresSaver (pool of 2)
  concurrent  --threads threads x --turns-each turns, asyncio, one shared
              AsyncPostgresSaver over a pool of --threads connections
  size        one thread of --turns turns; after turn 1, --turns - 1 and
              --turns, what the thread's rows hold: pg_column_size of the
              payload columns (checkpoints.checkpoint + metadata,
              checkpoint_blobs.blob, checkpoint_writes.blob) and their
              octet_length; and the three tables' growth on disk
              (pg_total_relation_size) over the run
  history     one thread of --long-turns turns; then --reads times
              aget_state at the checkpoint that ended turn --long-turns / 2
              (by its checkpoint_id) and --lists times aget_state_history of
              the whole thread, each timed alone (median and p95), with the
              three tables' size on disk after the thread was written

The database in --dsn is the script's own (the caller creates and drops it);
the script creates the saver's tables and empties them before each part.
Progress goes to stderr; the results are one JSON object on stdout.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import operator
import random
import statistics
import string
import sys
import time
import uuid
from typing import Annotated, Any, Optional

from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph
from psycopg import Connection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from typing_extensions import TypedDict

DURABILITY = "async"
USER_WORDS = 30
ASSISTANT_WORDS = 90

_RNG = random.Random(1234)
_VOCAB = [
    "".join(_RNG.choice(string.ascii_lowercase) for _ in range(_RNG.randint(2, 10)))
    for _ in range(4000)
]


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_VOCAB) for _ in range(n))


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# State and graph
# --------------------------------------------------------------------------


def merge_dicts(left: Optional[dict], right: Optional[dict]) -> dict:
    """Shallow merge, right wins per key."""
    out = dict(left or {})
    out.update(right or {})
    return out


class AgentState(TypedDict, total=False):
    # input
    message: str
    channel: str
    user_id: Optional[str]
    session_id: Optional[str]
    installed_skills: list[str]
    # reducers
    history: Annotated[list[dict], operator.add]
    transcript: Annotated[list[dict], operator.add]
    session_memory: Annotated[dict, merge_dicts]
    procedural_profile: Annotated[dict, merge_dicts]
    session_progress: Annotated[dict, merge_dicts]
    exercise_state: Annotated[dict, merge_dicts]
    memory_control: Annotated[dict, merge_dicts]
    diagnostics: Annotated[dict, merge_dicts]
    # loaded
    working_memory: list[dict]
    # turn-scoped
    crisis: dict
    crisis_audit: dict
    route: str
    response_text: str
    response_style: str
    therapeutic_approach: Optional[str]
    should_persist_memory: bool


def crisis_gate(state: dict) -> dict:
    t0 = time.perf_counter()
    return {
        "crisis": {
            "level": 0,
            "confidence": 0.93,
            "reason": "no risk indicators",
            "needs_crisis_response": False,
            "needs_clarification": False,
        },
        "crisis_audit": {
            "override_kind": None,
            "classifier_path": "llm_primary",
            "llm_failure_occurred": False,
        },
        "route": "therapeutic",
        "diagnostics": {
            "crisis_gate_ms": (time.perf_counter() - t0) * 1e3,
            "crisis_classifier_path": "llm_primary",
        },
    }


def working_memory(rng: random.Random) -> list[dict]:
    semantic = [
        {
            "kind": "semantic",
            "category": "relationship",
            "subject": "User",
            "predicate": "WORRIES_ABOUT",
            "object": words(rng, 2),
            "evidence_quote": words(rng, 8),
        }
        for _ in range(4)
    ]
    episodic = [
        {
            "kind": "episodic",
            "summary": words(rng, 20),
            "primary_themes": [words(rng, 1), words(rng, 1)],
            "is_catch_up": False,
            "approach_used": "cbt",
            "approach_context": words(rng, 6),
        }
        for _ in range(2)
    ]
    return semantic + episodic


def memory_context(state: dict) -> dict:
    t0 = time.perf_counter()
    rng = random.Random(len(state.get("history", [])))
    return {
        "working_memory": working_memory(rng),
        "session_memory": {
            "summary": words(rng, 40),
            "active_concerns": [words(rng, 3), words(rng, 3)],
            "open_loops": [words(rng, 5)],
            "current_goal": words(rng, 6),
        },
        "procedural_profile": {
            "procedural_rules": [words(rng, 8) for _ in range(3)],
            "proactive_recall_enabled": True,
        },
        "diagnostics": {
            "load_memory_ms": (time.perf_counter() - t0) * 1e3,
            "retrieval_path": "hybrid_rrf",
        },
    }


def reply(state: dict) -> dict:
    """The reply, with the turn's finalization (the assistant message
    appended to both lists) folded in."""
    t0 = time.perf_counter()
    n = len(state.get("history", []))
    rng = random.Random(n * 7919)
    text = words(rng, ASSISTANT_WORDS)
    turn = {"role": "assistant", "content": text, "response_style": "reflective"}
    out = {
        "response_text": text,
        "response_style": "reflective",
        "therapeutic_approach": "cbt",
        "should_persist_memory": False,
        "history": [turn],
        "transcript": [turn],
        "diagnostics": {"reply_ms": (time.perf_counter() - t0) * 1e3},
    }
    if n % 20 == 0:  # an occasional exercise-state update
        out["exercise_state"] = {
            "exercise_type": "grounding_5_4_3_2_1",
            "exercise_step": (n // 20) % 5,
            "exercise_therapeutic_approach": "dbt_skills",
        }
    return out


def build_graph(checkpointer):
    g = StateGraph(AgentState)
    g.add_node("crisis_gate", crisis_gate)
    g.add_node("memory_context", memory_context)
    g.add_node("reply", reply)
    g.add_edge(START, "crisis_gate")
    g.add_edge(START, "memory_context")
    g.add_edge(["crisis_gate", "memory_context"], "reply")
    g.add_edge("reply", END)
    return g.compile(checkpointer=checkpointer)


def turn_input(thread_id: str, turn: int) -> dict:
    rng = random.Random(f"{thread_id}:{turn}")
    msg = words(rng, USER_WORDS)
    user_turn = {"role": "user", "content": msg}
    return {
        "message": msg,
        "channel": "WEB",
        "user_id": "user-" + thread_id[:8],
        "session_id": thread_id,
        "installed_skills": ["grounding", "journaling"],
        "history": [user_turn],
        "transcript": [user_turn],
        "session_progress": {"turn_count": turn},
    }


def config(thread_id: str, checkpoint_id: Optional[str] = None) -> dict:
    c: dict[str, Any] = {"thread_id": thread_id}
    if checkpoint_id is not None:
        c["checkpoint_id"] = checkpoint_id
    return {"configurable": c}


async def turn(graph, thread_id: str, n: int) -> None:
    await graph.ainvoke(turn_input(thread_id, n), config(thread_id), durability=DURABILITY)


# --------------------------------------------------------------------------
# Database
# --------------------------------------------------------------------------

CONNECTION = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")


def setup(dsn: str) -> dict:
    """Creates the saver's tables; returns the server's version and settings."""
    with Connection.connect(dsn, **CONNECTION) as c:
        PostgresSaver(c).setup()
        return {
            k: c.execute(f"SHOW {k}").fetchone()[k]
            for k in ("server_version", "fsync", "synchronous_commit", "shared_buffers")
        }


def empty(dsn: str) -> None:
    with Connection.connect(dsn, autocommit=True) as c:
        c.execute("TRUNCATE " + ", ".join(TABLES))


async def open_pool(dsn: str, size: int) -> AsyncConnectionPool:
    pool = AsyncConnectionPool(dsn, min_size=size, max_size=size, kwargs=CONNECTION, open=False)
    await pool.open(wait=True)
    return pool


THREAD_BYTES = """
SELECT
 (SELECT count(*) FROM checkpoints WHERE thread_id = %(t)s) AS checkpoints,
 (SELECT count(*) FROM checkpoint_blobs WHERE thread_id = %(t)s) AS blobs,
 (SELECT count(*) FROM checkpoint_writes WHERE thread_id = %(t)s) AS writes,
 (SELECT coalesce(sum(pg_column_size(checkpoint) + pg_column_size(metadata)), 0)
    FROM checkpoints WHERE thread_id = %(t)s)
 + (SELECT coalesce(sum(pg_column_size(blob)), 0) FROM checkpoint_blobs WHERE thread_id = %(t)s)
 + (SELECT coalesce(sum(pg_column_size(blob)), 0) FROM checkpoint_writes WHERE thread_id = %(t)s)
   AS stored,
 (SELECT coalesce(sum(octet_length(checkpoint::text) + octet_length(metadata::text)), 0)
    FROM checkpoints WHERE thread_id = %(t)s)
 + (SELECT coalesce(sum(octet_length(blob)), 0) FROM checkpoint_blobs WHERE thread_id = %(t)s)
 + (SELECT coalesce(sum(octet_length(blob)), 0) FROM checkpoint_writes WHERE thread_id = %(t)s)
   AS logical
"""

ON_DISK = "SELECT " + " + ".join(f"pg_total_relation_size('{t}')" for t in TABLES) + " AS bytes"


def added(after: dict, before: dict) -> dict:
    return {k: after[k] - before[k] for k in after}


# --------------------------------------------------------------------------
# Parts
# --------------------------------------------------------------------------


async def part_single(args) -> dict:
    empty(args.dsn)
    pool = await open_pool(args.dsn, 2)
    graph = build_graph(AsyncPostgresSaver(pool))
    tid = str(uuid.uuid4())
    started = time.perf_counter()
    for n in range(1, args.turns + 1):
        await turn(graph, tid, n)
    wall = time.perf_counter() - started
    await pool.close()
    return {"threads": 1, "turns_each": args.turns, "turns": args.turns,
            "seconds": wall, "turns_per_s": args.turns / wall}


async def part_concurrent(args) -> dict:
    empty(args.dsn)
    pool = await open_pool(args.dsn, args.threads)
    graph = build_graph(AsyncPostgresSaver(pool))
    tids = [str(uuid.uuid4()) for _ in range(args.threads)]

    async def thread(tid: str) -> None:
        for n in range(1, args.turns_each + 1):
            await turn(graph, tid, n)

    started = time.perf_counter()
    await asyncio.gather(*(thread(t) for t in tids))
    wall = time.perf_counter() - started
    await pool.close()
    total = args.threads * args.turns_each
    return {"threads": args.threads, "turns_each": args.turns_each, "turns": total,
            "seconds": wall, "turns_per_s": total / wall}


async def part_size(args) -> dict:
    empty(args.dsn)
    pool = await open_pool(args.dsn, 2)
    graph = build_graph(AsyncPostgresSaver(pool))
    tid = str(uuid.uuid4())
    last = args.turns
    with Connection.connect(args.dsn, **CONNECTION) as c:
        disk_before = c.execute(ON_DISK).fetchone()["bytes"]
        zero = {"checkpoints": 0, "blobs": 0, "writes": 0, "stored": 0, "logical": 0}
        seen = {0: zero}
        for n in range(1, last + 1):
            await turn(graph, tid, n)
            if n in (1, last - 1, last):
                seen[n] = dict(c.execute(THREAD_BYTES, {"t": tid}).fetchone())
        disk_after = c.execute(ON_DISK).fetchone()["bytes"]
    await pool.close()
    return {
        "turns": last,
        "turn_1": added(seen[1], seen[0]),
        "turn_last": added(seen[last], seen[last - 1]),
        "thread_total": seen[last],
        "on_disk_per_turn": (disk_after - disk_before) / last,
    }


def spread(samples: list[float]) -> dict:
    """Median and p95 (nearest rank) of timings in seconds, as milliseconds."""
    ordered = sorted(samples)
    rank = max(1, -(-95 * len(ordered) // 100))
    return {
        "n": len(ordered),
        "median_ms": statistics.median(ordered) * 1e3,
        "p95_ms": ordered[rank - 1] * 1e3,
    }


async def part_history(args) -> dict:
    """Reading an older state of a long thread, and listing its history:
    --reads reads of the state at the checkpoint that ended turn
    --long-turns / 2, and --lists listings of the whole history, each timed
    alone."""
    empty(args.dsn)
    pool = await open_pool(args.dsn, 2)
    graph = build_graph(AsyncPostgresSaver(pool))
    tid = str(uuid.uuid4())
    middle = args.long_turns // 2
    middle_id = None
    started = time.perf_counter()
    for n in range(1, args.long_turns + 1):
        await turn(graph, tid, n)
        if n == middle:
            snap = await graph.aget_state(config(tid))
            middle_id = snap.config["configurable"]["checkpoint_id"]
        if n % 100 == 0:
            log(f"langgraph: history: {n} of {args.long_turns} turns written")
    build_s = time.perf_counter() - started
    with Connection.connect(args.dsn, **CONNECTION) as c:
        on_disk = c.execute(ON_DISK).fetchone()["bytes"]

    state_at = []
    for _ in range(args.reads):
        t0 = time.perf_counter()
        snap = await graph.aget_state(config(tid, middle_id))
        state_at.append(time.perf_counter() - t0)
    assert len(snap.values["history"]) == 2 * middle, len(snap.values["history"])
    log(f"langgraph: history: state at turn {middle}: {json.dumps(spread(state_at))}")

    # Each snapshot is counted and dropped: holding all of them (every one
    # with its whole state) takes tens of GB at 1000 turns.
    listing = []
    for _ in range(args.lists):
        entries = 0
        t0 = time.perf_counter()
        async for _snapshot in graph.aget_state_history(config(tid)):
            entries += 1
        listing.append(time.perf_counter() - t0)
        log(f"langgraph: history: listed {entries} checkpoints in {listing[-1]:.1f} s")
    await pool.close()
    return {
        "turns": args.long_turns,
        "build_seconds": build_s,
        "on_disk_bytes": on_disk,
        "state_at_turn": middle,
        "state_at": spread(state_at),
        "history_entries": entries,
        "history": spread(listing),
    }


PARTS = {
    "single": part_single,
    "concurrent": part_concurrent,
    "size": part_size,
    "history": part_history,
}


async def main_async(args) -> dict:
    parts = args.parts.split(",")
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise SystemExit(f"unknown parts {unknown}; known: {sorted(PARTS)}")
    meta = setup(args.dsn)
    meta["durability"] = DURABILITY
    for package in ("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-postgres", "psycopg"):
        meta[package] = importlib.metadata.version(package)
    meta["python"] = sys.version.split()[0]
    result: dict[str, Any] = {"meta": meta}
    for p in parts:
        log(f"langgraph: {p} ...")
        result[p] = await PARTS[p](args)
        log(f"langgraph: {p}: {json.dumps(result[p])}")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", required=True, help="a libpq URL or DSN of the script's own database")
    ap.add_argument("--parts", default="single,concurrent,size,history")
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--turns-each", type=int, default=50)
    ap.add_argument("--long-turns", type=int, default=1000)
    ap.add_argument("--reads", type=int, default=20)
    ap.add_argument("--lists", type=int, default=3)
    args = ap.parse_args()
    if args.turns < 2:
        raise SystemExit("--turns must be at least 2")
    if args.long_turns < 2 or args.reads < 1 or args.lists < 1:
        raise SystemExit("--long-turns must be at least 2, --reads and --lists at least 1")
    print(json.dumps(asyncio.run(main_async(args))), flush=True)


if __name__ == "__main__":
    main()
