"""The reference side of `cargo xtask bench session replay`: autoplay-sdk's
SessionState replaying the recorded session FSM traces.

    python autoplay_session.py TRACES.jsonl ROUNDS

Run by `crates/app/benches/replay/mod.rs` with the interpreter of a virtual
environment holding autoplay-sdk 0.13.0. The traces are parsed and every step
is compiled to an opcode and its arguments before any timing; the timed loops
run only the SDK's operations (and the clock advances the traces record).
Prints one JSON object: steps per pass and the best of ROUNDS passes in
seconds, with and without the snapshot round trips, and the best time of one
snapshot round trip (`to_dict`, `json.dumps`, `json.loads`, `from_dict`).
"""

import json
import sys
import time

# The SDK reads `time.monotonic()` (and binds it as a dataclass default at
# import), so the recorded clock replaces it before the import.
clock = [0.0]
time.monotonic = lambda: clock[0]
time.time = lambda: clock[0]

from autoplay_sdk.agent_state.v2 import InvalidTransitionError, SessionState  # noqa: E402
from autoplay_sdk.chat.chatbot import ConversationEventType, ConversationLink  # noqa: E402
from autoplay_sdk.proactive.triggers.tour_registry import TourRegistry  # noqa: E402

perf = time.perf_counter

(ADVANCE, TICK, TICK_REGISTRY, PROACTIVE, REACTIVE, USER, CLICK, REACTION, TOUR_STEP,
 GUIDANCE, LINK, CAN_DELIVER, ROUNDTRIP) = range(13)

SIMPLE = {
    "transition_to_reactive": REACTIVE,
    "record_user_interaction": USER,
    "record_option_click": CLICK,
    "record_reaction": REACTION,
    "record_tour_step": TOUR_STEP,
    "can_deliver_proactive": CAN_DELIVER,
    "snapshot_roundtrip": ROUNDTRIP,
}


def compile_step(st):
    op, a = st["op"], st.get("args", {})
    if op == "advance":
        return (ADVANCE, a["dt"])
    if op == "tick":
        return (TICK_REGISTRY if a.get("with_registry") else TICK, None)
    if op == "transition_to_proactive":
        return (PROACTIVE, a["trigger_id"])
    if op == "set_visual_guidance":
        return (GUIDANCE, (a["active"], a.get("tour_id")))
    if op == "on_conversation_linked":
        return (LINK, (ConversationEventType(a["event"]), a["conversation_id"]))
    return (SIMPLE[op], None)


def load(path):
    cases = []
    for line in open(path):
        if not line.strip():
            continue
        c = json.loads(line)["input"]
        reg = TourRegistry.from_dict(c["tour_registry"]) if c.get("tour_registry") else None
        cases.append((c["clock_start"], c["init"], reg))
    return cases


def roundtrip(s):
    return SessionState.from_dict(json.loads(json.dumps(s.to_dict())))


def replay(cases, steps_of, with_snapshots, keep=None):
    n = 0
    for (clock_start, init, reg), steps in zip(cases, steps_of):
        clock[0] = clock_start
        s = SessionState(**init)
        for code, arg in steps:
            n += 1
            try:
                if code == ADVANCE:
                    clock[0] += arg
                elif code == TICK:
                    s.tick(None)
                elif code == TICK_REGISTRY:
                    s.tick(reg)
                elif code == PROACTIVE:
                    s.transition_to_proactive(arg)
                elif code == REACTIVE:
                    s.transition_to_reactive()
                elif code == USER:
                    s.record_user_interaction()
                elif code == CLICK:
                    s.record_option_click()
                elif code == REACTION:
                    s.record_reaction()
                elif code == TOUR_STEP:
                    s.record_tour_step()
                elif code == GUIDANCE:
                    s.set_visual_guidance(arg[0], arg[1])
                elif code == LINK:
                    s.on_conversation_linked(
                        ConversationLink(session_id=s.session_id, conversation_id=arg[1], event=arg[0])
                    )
                elif code == CAN_DELIVER:
                    s.can_deliver_proactive()
                elif code == ROUNDTRIP:
                    if keep is not None:
                        keep.append(s)
                    s = roundtrip(s)
            except InvalidTransitionError:
                pass
    return n


def best_of(rounds, f):
    best = None
    for _ in range(rounds):
        t0 = perf()
        n = f()
        dt = perf() - t0
        best = dt if best is None or dt < best else best
    return n, best


def main():
    import logging

    logging.disable(logging.CRITICAL)
    path, rounds = sys.argv[1], int(sys.argv[2])
    raw = [json.loads(line)["steps"] for line in open(path) if line.strip()]
    cases = load(path)
    full = [[compile_step(st) for st in steps] for steps in raw]
    lean = [[st for st in steps if st[0] != ROUNDTRIP] for steps in full]
    states = []
    replay(cases, full, True, keep=states)
    n_full, t_full = best_of(rounds, lambda: replay(cases, full, True))
    n_lean, t_lean = best_of(rounds, lambda: replay(cases, lean, False))

    def all_roundtrips():
        for s in states:
            roundtrip(s)
        return len(states)

    n_rt, t_rt = best_of(rounds, all_roundtrips)
    print(json.dumps({
        "version": __import__("importlib.metadata").metadata.version("autoplay-sdk"),
        "steps": n_full,
        "best_s": t_full,
        "steps_without_snapshots": n_lean,
        "best_s_without_snapshots": t_lean,
        "roundtrips": n_rt,
        "best_s_roundtrips": t_rt,
    }))


if __name__ == "__main__":
    main()
