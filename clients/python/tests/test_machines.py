"""Each machine once through the sync client and once through the async
one, against the live service, and the typed errors."""

import asyncio
import time
import uuid

import httpx
import pytest

from parlance_client import (
    BadRequest,
    Client,
    Invalid,
    LimitExceeded,
    MethodNotAllowed,
    NotAllowed,
    NotFound,
    RateLimited,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
    models as m,
)


def new_id(kind):
    return f"py-{kind}-{uuid.uuid4()}"


def run(coro):
    return asyncio.run(coro)


# Probes -----------------------------------------------------------------


def test_probes(client):
    assert client.healthz().status == "ok"
    assert client.readyz().status == "ready"


# Sessions ---------------------------------------------------------------


def test_sessions_sync(client):
    sid = new_id("session")
    opened = client.sessions.post_event(sid, m.OpenChat())
    assert opened.version >= 1
    assert opened.result.transition.from_ == "thinking"
    assert opened.result.transition.to == "reactive_assistance"
    view = client.sessions.get(sid)
    assert view.snapshot.session_id == sid and view.version == opened.version
    gate = client.sessions.gate(sid)
    assert gate.allowed is False and gate.current_state == "reactive_assistance"
    records = client.sessions.audit(sid, limit=10).records
    assert [(r.from_, r.to, r.cause) for r in records] == [("thinking", "reactive_assistance", "transition_to_reactive")]
    # A plain dict is sent as it is.
    again = client.sessions.post_event(sid, {"type": "user_message"})
    assert again.version == opened.version + 1


def test_sessions_async(make_async_client):
    async def go():
        async with make_async_client() as client:
            sid = new_id("session")
            answer = await client.sessions.post_event(sid, m.ProactiveTrigger(trigger_id="welcome"))
            assert answer.snapshot.current_state == "proactive_assistance"
            assert (await client.sessions.get(sid)).proactive_gate.allowed in (True, False)
            with pytest.raises(NotFound):
                await client.sessions.get(new_id("missing"))

    run(go())


# User adoption ----------------------------------------------------------


def test_adoption_sync(client):
    user = new_id("user")
    with pytest.raises(NotFound):
        client.adoption.get(user)
    client.adoption.events(user, [{"kind": "set_journey_state", "state": "onboarding"}], metadata={"plan": "pro"})
    record = client.adoption.get(user)
    assert record.user_id == user and record.version == 1
    assert record.state.journey_state == "onboarding"
    gate = client.adoption.gate(user, seconds_on_app=1)
    assert gate.passed is False and gate.code
    assert "journey: onboarding" in client.adoption.prompt_block(user).prompt_block
    with pytest.raises(Invalid) as refused:
        client.adoption.events(user, [{"kind": "set_journey_state", "state": "exploring"}])
    assert refused.value.status == 422
    client.adoption.delete(user)
    with pytest.raises(NotFound):
        client.adoption.get(user)


def test_adoption_async(make_async_client):
    async def go():
        async with make_async_client() as client:
            user = new_id("user")
            await client.adoption.events(user, [{"kind": "set_journey_state", "state": "onboarded"}])
            record = await client.adoption.get(user)
            assert record.state.journey_state == "onboarded"
            assert (await client.adoption.prompt_block(user)).prompt_block

    run(go())


# Conversations ----------------------------------------------------------


def test_conversations_sync(client):
    contact = new_id("contact")
    created = client.conversations.create(contact, "book a demo", todos=["find a day", m.Todo(text="confirm")])
    conv = created.conversation
    assert conv.contact_id == contact and [t.text for t in conv.todos] == ["find a day", "confirm"]
    deadline = time.monotonic() + 20
    while client.conversations.get(conv.instance_id).conversation.state != "WAITING_FOR_REPLY":
        assert time.monotonic() < deadline, "the opening message was not sent"
        time.sleep(0.05)
    replied = client.conversations.contact_reply(contact, "Tuesday works")
    assert replied.conversation.instance_id == conv.instance_id
    assert replied.transitions
    assert client.conversations.pause(conv.instance_id).conversation.state == "PAUSED"
    assert client.conversations.resume(conv.instance_id).conversation.state != "PAUSED"
    listed = client.conversations.list(contact_id=contact)
    assert [c.instance_id for c in listed.items] == [conv.instance_id]
    client.conversations.cancel(conv.instance_id)
    with pytest.raises(NotAllowed) as refused:
        client.conversations.pause(conv.instance_id)
    problem = refused.value
    assert problem.status == 409 and problem.kind == "not-allowed"
    assert problem.command == "pause" and problem.state == problem.extra["state"]
    assert isinstance(client.conversations.audit(conv.instance_id).items, list)


def test_conversations_async(make_async_client):
    async def go():
        async with make_async_client() as client:
            created = await client.conversations.create(new_id("contact"), "confirm the order")
            id = created.conversation.instance_id
            assert (await client.conversations.get(id)).conversation.version >= created.conversation.version
            cancelled = (await client.conversations.cancel(id)).conversation
            assert cancelled.state == "FAILED" and cancelled.ended_at is not None

    run(go())


# Agent turns ------------------------------------------------------------


def test_agent_sync(client):
    owner, thread = new_id("owner"), new_id("thread")
    out = client.agent.turn("How do I export my notes?", user_id=owner, session_id=thread, channel="TEST")
    assert out.response_text and out.crisis.level == 0
    t = client.agent.thread(thread, user_id=owner)
    assert t.owner == owner and t.version == 1
    stored = client.agent.remember(owner, {
            "type": "semantic",
            "category": "preference",
            "subject": "User",
            "predicate": "PREFERS",
            "object": "short answers",
        })
    assert stored.owner == owner
    assert any(e.id == stored.id for e in client.agent.memory(owner, kind="semantic").entries)
    client.agent.forget(owner, stored.id)
    with pytest.raises(NotFound):
        client.agent.forget(owner, stored.id)
    assert isinstance(client.agent.crisis_log(owner).records, list)
    with pytest.raises(Invalid):
        client.agent.turn("", user_id=owner, session_id=thread)


def test_agent_async(make_async_client):
    async def go():
        async with make_async_client() as client:
            owner, thread = new_id("owner"), new_id("thread")
            await client.agent.turn("hello", user_id=owner, session_id=thread)
            await client.agent.turn("thanks", user_id=owner, session_id=thread)
            assert (await client.agent.thread(thread, user_id=owner)).version == 2
            ended = await client.agent.end(thread, user_id=owner)
            assert ended.entry.type == "episodic"

    run(go())


# Flows ------------------------------------------------------------------


def wait_ready(client, flow, sid):
    deadline = time.monotonic() + 20
    while not client.flows.task_state(flow, sid).ready:
        assert time.monotonic() < deadline, "the flow's task graph did not finish"
        time.sleep(0.05)


def test_flows_sync(client):
    assert {"qa", "extraction"} <= {f.name for f in client.flows.list().flows}
    started = client.flows.start("qa")
    assert started.next_actions == ["user_input"] and started.response
    polled = client.flows.event("qa", started.session_id, "user_input", "What is a flow?")
    assert polled.session_id == started.session_id
    wait_ready(client, "qa", started.session_id)
    assert client.flows.task_state("qa", started.session_id).next_actions == ["user_input", "done"]
    with pytest.raises(NotAllowed) as refused:
        client.flows.event("qa", started.session_id, "advance")
    assert refused.value.command == "advance"
    assert client.flows.model("qa", started.session_id).response


def test_flows_async(make_async_client):
    async def go():
        async with make_async_client() as client:
            started = await client.flows.start("qa")
            await client.flows.event("qa", started.session_id, "user_input", "Why?")
            for _ in range(400):
                if (await client.flows.task_state("qa", started.session_id)).ready:
                    break
                await asyncio.sleep(0.05)
            done = await client.flows.event("qa", started.session_id, "done")
            assert done.next_actions == []
            with pytest.raises(NotFound):
                await client.flows.start("no-such-flow")

    run(go())


# Typed errors -----------------------------------------------------------


def test_unknown_key_is_unauthorized(service):
    with Client(service["url"], api_key="pk_wrong") as c:
        with pytest.raises(Unauthorized) as refused:
            c.sessions.get("s")
    assert refused.value.status == 401 and refused.value.title


def test_raw_requests_map_to_their_classes(client):
    http = client._http
    with pytest.raises(BadRequest):
        client.sessions.audit("s", after_seq="not-a-number")  # type: ignore[arg-type]
    from parlance_client.errors import raise_for_problem

    answer = http.post("/v1/products/default/sessions/s/events", content=b"{}", headers={"content-type": "text/plain"})
    with pytest.raises(UnsupportedMediaType):
        raise_for_problem(answer)
    answer = http.delete("/v1/products/default/sessions/s/events")
    with pytest.raises(MethodNotAllowed):
        raise_for_problem(answer)
    with pytest.raises(LimitExceeded) as refused:
        client.conversations.create(new_id("contact"), "too much", todos=["a"] * 1001)
    assert isinstance(refused.value, Invalid) and refused.value.status == 422
    assert refused.value.field == "todos" and refused.value["max"] == 1000


def test_retry_after_is_read_from_429_and_503():
    def answer(request):
        status = 429 if request.url.path.endswith("/a") else 503
        kind = "rate-limited" if status == 429 else "contended"
        return httpx.Response(
            status,
            headers={"content-type": "application/problem+json", "retry-after": "3"},
            json={"type": f"urn:parlance:problem:{kind}", "title": "t", "status": status, "detail": "d", "n": 1},
        )

    with Client("http://service.invalid", api_key="k", transport=httpx.MockTransport(answer)) as c:
        with pytest.raises(RateLimited) as limited:
            c.sessions.get("a")
        with pytest.raises(Unavailable) as unavailable:
            c.sessions.get("b")
    assert limited.value.retry_after == 3.0 and unavailable.value.retry_after == 3.0
    assert unavailable.value.kind == "contended" and unavailable.value["n"] == 1
