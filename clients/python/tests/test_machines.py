"""Each machine once through the sync client and once through the async
one, against the live service, and the typed errors."""

import asyncio
import json
import time
import uuid

import httpx
import pytest
from pydantic import BaseModel

from parlance_client import (
    BadRequest,
    Client,
    Conflict,
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


def undocumented(value, path="answer"):
    """The members of an answer, at any depth, that its model does not
    declare (the document does not describe them either)."""
    found = []
    if isinstance(value, BaseModel):
        found += [f"{path}.{k}" for k in value.model_extra or {}]
        for name in type(value).model_fields:
            found += undocumented(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found += undocumented(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            found += undocumented(item, f"{path}[{key!r}]")
    return found


def documented(value):
    assert not undocumented(value), f"members the document does not describe: {undocumented(value)}"
    return value


# Probes -----------------------------------------------------------------


def test_probes(client):
    assert client.healthz().status == "ok"
    assert client.readyz().status == "ready"
    assert "# TYPE parlance_" in client.metrics()


def test_metrics_async(make_async_client):
    async def go():
        async with make_async_client() as client:
            return await client.metrics()

    assert "# HELP " in run(go())


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


def test_tour_catalog_round_trip(client):
    tours = documented(client.sessions.get_tours())
    assert documented(client.sessions.put_tours(tours)) == tours


def test_a_null_set_on_purpose_is_sent(client):
    # For the catalog, `null` (the session's own cooldown) and an absent
    # member (120 s) differ: a model's explicit None must reach the service.
    own = m.TourCatalog(default_cooldown_period_s=None)
    assert client.sessions.put_tours(own).default_cooldown_period_s is None
    assert client.sessions.get_tours().default_cooldown_period_s is None
    defaults = client.sessions.put_tours(m.TourCatalog())
    assert defaults.default_cooldown_period_s == 120.0
    assert defaults.default_interaction_timeout_s == 20.0


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
    client.adoption.events(user, [{"kind": "set_journey_state", "state": "onboarded"}])
    trail = documented(client.adoption.audit(user)).records
    assert trail[-1].entity_id == user and (trail[-1].from_, trail[-1].to) == ("onboarding", "onboarded")
    client.adoption.delete(user)
    with pytest.raises(NotFound):
        client.adoption.get(user)


def test_adoption_state_activity_and_runners(client):
    user, role = new_id("user"), new_id("role")
    plan = documented(client.adoption.put_plan([
        m.OnboardingWorkflow(workflow_id="export", name="Export", steps=[
            m.WorkflowStep(step_id="open", name="Open the export page", activity_signals=m.ActivitySignals(
                any_of=[m.ActivitySignalRule(canonical_url_prefix="/export", min_count=1)])),
        ]),
        {"workflow_id": "", "name": "no id"},
    ], role=role))
    assert [w.workflow_id for w in plan.workflows] == ["export"] and plan.skipped and plan.role == role
    assert documented(client.adoption.get_plan(role=role)).workflows == plan.workflows
    catalog = documented(client.adoption.put_catalog([m.TourCatalogEntry(tour_id="export", name="Export")], role=role))
    assert [t.tour_id for t in catalog.tours] == ["export"] and catalog.skipped == []
    assert documented(client.adoption.get_catalog(role=role)).tours == catalog.tours

    record = documented(client.adoption.events(user, [
        m.SetJourneyState(state="onboarding"),
        m.SetMetadata(metadata={"role": role}),
        m.SetMastery(rating=3, level="beginner", description="new"),
        m.RecordSession(session_id="s-1", session_number=1, started_at=time.time() - 60),
    ]))
    assert record.version == 1 and record.state.mastery.level == "beginner"
    assert record.state.sessions.index[0].session_id == "s-1"
    seen = documented(client.adoption.activity(
        user, actions=[m.Activity(type="click", canonical_url="/export/csv")], discovered_features=["export"]
    ))
    assert [d.step_id for d in seen.detected.steps] == ["open"]
    assert seen.state.onboarding.workflow_progress["export"].steps["open"].status == "completed"
    replaced = documented(client.adoption.put(user, seen.state, expected_version=seen.version))
    assert replaced.version == seen.version + 1 and replaced.state.discovered_features == ["export"]

    gate = documented(client.adoption.gate(user, 600, config=m.ExplorationGateConfig(min_distinct_features=1)))
    assert gate.passed and gate.code == "ok"
    judged = documented(client.adoption.judge(user, activity=[{"type": "click"}], signals={"exports": 1}))
    assert judged.output is not None and judged.output.status and judged.llm is not None
    welcomed = documented(client.adoption.welcome(user, 600, config={"min_distinct_features": 0}))
    assert welcomed.gate is not None and welcomed.output is not None
    followed = documented(client.adoption.followup(user, "export", "completed"))
    assert followed.output is not None and followed.version > welcomed.version
    summary = documented(client.adoption.session_summary(user, "s-1", time.time() - 60))
    assert summary.output is not None and summary.output.snapshot.session_id == "s-1"
    matched = documented(client.adoption.match_tours("how do I export my notes?", user_id=user))
    assert matched.role == role and matched.allowed_tour_ids == ["export"]
    with pytest.raises(Invalid):
        client.adoption.followup(user, "export", "paused")


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
    assert listed.next_cursor is None
    second = client.conversations.create(contact, "a second one").conversation
    assert second.state == "QUEUED"
    states = ["QUEUED", "WAITING_FOR_REPLY", "WAITING_FOR_AGENT", "ACTIVE", "PAUSED"]
    page = client.conversations.list(contact_id=contact, state=states, order="newest", limit=1)
    assert [c.instance_id for c in page.items] == [second.instance_id] and page.next_cursor
    rest = client.conversations.list(contact_id=contact, state=states, order="newest", after=page.next_cursor)
    assert [c.instance_id for c in rest.items] == [conv.instance_id] and rest.next_cursor is None
    client.conversations.cancel(conv.instance_id)
    with pytest.raises(NotAllowed) as refused:
        client.conversations.pause(conv.instance_id)
    problem = refused.value
    assert problem.status == 409 and problem.kind == "not-allowed"
    assert problem.command == "pause" and problem.state == problem.extra["state"]
    audit = documented(client.conversations.audit(conv.instance_id))
    assert audit.items[0].entity_id == conv.instance_id and audit.items[-1].to == "FAILED"
    view = documented(client.conversations.get(conv.instance_id))
    assert view.transcript[0].role == "agent"
    assert ("contact", "Tuesday works") in [(msg.role, msg.text) for msg in view.transcript]


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


def test_agent_asks_before_deleting_and_resumes_with_the_answer(client):
    owner, thread = new_id("owner"), new_id("thread")
    client.agent.remember(owner, {
            "type": "semantic",
            "category": "relationship",
            "subject": "boss",
            "predicate": "WORRIES_ABOUT",
            "object": "boss",
            "evidence_quote": "my boss is terrible",
        })
    asked = client.agent.turn("Please forget what I said about my boss", user_id=owner, session_id=thread)
    assert asked.interrupt is not None and asked.interrupt["question"] == asked.response_text
    assert client.agent.thread(thread, user_id=owner).interrupt == asked.interrupt
    with pytest.raises(NotAllowed) as refused:
        client.agent.turn("hello again", user_id=owner, session_id=thread)
    assert refused.value.reason == "interrupt_pending"
    done = client.agent.resume(thread, True, user_id=owner)
    assert done.interrupt is None
    assert client.agent.memory(owner).entries == []
    with pytest.raises(NotAllowed) as again:
        client.agent.resume(thread, True, user_id=owner)
    assert again.value.reason == "no_interrupt"


def test_agent_async(make_async_client):
    async def go():
        async with make_async_client() as client:
            owner, thread = new_id("owner"), new_id("thread")
            await client.agent.turn("hello", user_id=owner, session_id=thread)
            await client.agent.turn("thanks", user_id=owner, session_id=thread)
            assert (await client.agent.thread(thread, user_id=owner)).version == 2
            ended = await client.agent.end(thread, user_id=owner)
            assert ended.entry.type == "episodic"
            stored = await client.agent.remember(owner, m.EpisodicEntry(summary="talked about work", primary_themes=["work"]))
            assert documented(stored).entry.primary_themes == ["work"]
            assert stored.id in {e.id for e in (await client.agent.memory(owner, kind="episodic")).entries}

    run(go())


def test_agent_typed_input_and_crisis_log(client):
    owner, thread = new_id("owner"), new_id("thread")
    out = documented(client.agent.turn(
        "I want to kill myself",
        user_id=owner,
        session_id=thread,
        history=[m.TurnMessage(role="user", content="hi")],
        working_memory=["a line kept from an older checkpoint",
                        m.SemanticEntry(category="preference", subject="User", predicate="LIKES", object="tea")],
        installed_skills=["journal"],
    ))
    assert out.response_type == "crisis" and out.crisis.level >= 1
    assert out.response_style_type == "safety" and out.response_style_source == "gate"
    records = documented(client.agent.crisis_log(owner)).records
    assert [(r.owner, r.thread, r.turn) for r in records] == [(owner, thread, 1)]
    assert records[0].assessment.level == out.crisis.level and records[0].audit.classifier_path
    # A value outside a closed set is the service's to refuse, as a typed problem.
    with pytest.raises(Invalid):
        client.agent.turn("hello", user_id=owner, session_id=thread, channel="FAX")


def test_agent_threads_history_fork_update_delete_erase(client):
    owner, thread = new_id("owner"), new_id("thread")
    client.agent.turn("hello", user_id=owner, session_id=thread)
    client.agent.turn("thanks", user_id=owner, session_id=thread)
    listed = documented(client.agent.threads(owner))
    assert [t.thread_id for t in listed.threads] == [thread] and listed.next_cursor is None
    history = documented(client.agent.history(thread, user_id=owner))
    assert [c.version for c in history.checkpoints] == [2, 1]
    assert history.checkpoints[0].parent.version == 1 and history.checkpoints[1].parent is None
    first = documented(client.agent.checkpoint(thread, 1, user_id=owner))
    assert first.version == 1 and len(first.transcript) == 2
    fork = new_id("fork")
    meta = documented(client.agent.fork(thread, 1, fork, user_id=owner))
    assert meta.source == "fork" and meta.parent.thread_id == thread
    with pytest.raises(Conflict):
        client.agent.fork(thread, 1, fork, user_id=owner)
    updated = documented(client.agent.update_state(
        thread, user_id=owner, expected_version=2, objects={"session_memory": {"summary": "noted"}}
    ))
    assert updated.version == 3
    with pytest.raises(NotAllowed) as stale:
        client.agent.update_state(thread, user_id=owner, expected_version=2, objects={})
    assert stale.value.reason == "stale_turn"
    with pytest.raises(Invalid) as bad:
        client.agent.update_state(thread, user_id=owner, objects={"no_such_field": 1})
    assert bad.value.field == "objects.no_such_field"
    client.agent.delete_thread(thread, user_id=owner)
    with pytest.raises(NotFound):
        client.agent.history(thread, user_id=owner)
    assert client.agent.thread(fork, user_id=owner).version == 1
    client.agent.remember(owner, m.EpisodicEntry(summary="talked about work", primary_themes=["work"]))
    erased = documented(client.agent.erase(owner))
    assert erased.entries_deleted == 1 and erased.crisis_records_deleted == 0
    assert client.agent.memory(owner).entries == []
    assert len(client.agent.crisis_log(owner).records) == 2, "the crisis log is kept"


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
    trail = documented(client.flows.audit("qa", started.session_id)).records
    assert trail and all(r.entity_id == started.session_id for r in trail)
    with pytest.raises(NotFound):
        client.flows.audit("qa", "never-started")
    flows = documented(client.flows.list()).flows
    qa = next(f for f in flows if f.name == "qa")
    assert qa.initial == qa.states[0].id and qa.states[0].kind in ("user", "invoker")
    ids = {st.id for st in qa.states}
    assert qa.transitions and all(t.from_ in ids and t.to in ids for t in qa.transitions)
    # The optional body of start_session: the user is kept, the seed is not.
    ada = {"email": f"ada-{uuid.uuid4().hex[:8]}@example.com", "firstname": "Ada", "lastname": "Lovelace"}
    seeded = documented(client.flows.start("qa", seed_data="seed", user_info=ada))
    assert seeded.next_actions == ["user_input"] and seeded.session_id != started.session_id
    user = json.loads(documented(client.flows.model("qa", seeded.session_id, path="user_info")).response)
    assert user == {**ada, "custom_properties": {}}
    assert json.loads(client.flows.model("qa", seeded.session_id, path="state").response) == "ask"
    with pytest.raises(Invalid) as bad:
        client.flows.model("qa", seeded.session_id, path="state[")
    assert bad.value.extra.get("field") == "path"
    with pytest.raises(Invalid):
        client.flows.start("qa", user_info=m.FlowUser(email="not an email", firstname="A", lastname="B"))
    # One call starts a session and takes its event; a refused one leaves none.
    eph = documented(client.flows.start_ephemeral("qa", "user_input", "Why?", user_info=m.FlowUser(**ada)))
    assert eph.next_actions == ["poll"] and eph.progress is not None
    with pytest.raises(NotAllowed):
        client.flows.start_ephemeral("qa", "done", user_info=ada)
    assert client.flows.user_sessions("qa", ada) == [eph.session_id, seeded.session_id]
    assert client.flows.user_sessions("extraction", ada) == []


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
            user = {"email": f"bo-{uuid.uuid4().hex[:8]}@example.com", "firstname": "Bo", "lastname": "B"}
            eph = await client.flows.start_ephemeral("qa", "user_input", "How?", user_info=user)
            assert await client.flows.user_sessions("qa", user) == [eph.session_id]
            model = await client.flows.model("qa", eph.session_id, path="ephemeral")
            assert model.response == "true"

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
