"""The sync and async clients.

Both share the namespaces below (``sessions``, ``adoption``,
``conversations``, ``agent``, ``flows``); a call on :class:`Client` returns
the answer, on :class:`AsyncClient` an awaitable of it.
"""

from typing import Any, Dict, List, Optional, Sequence, Union

import httpx
from pydantic import BaseModel, TypeAdapter

from . import models as m
from ._operations import OPERATIONS, Op
from .errors import raise_for_problem

DEFAULT_URL = "http://127.0.0.1:8080"


def _body(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return _prune(value, value.model_dump(mode="json", by_alias=True))
    return value


def _prune(model: Any, data: Any) -> Any:
    """Drops the members left ``None`` by default, keeping those set to
    ``None`` on purpose: for the service an absent member and ``null`` can
    differ (a tour catalog's absent default timeout is 20 s, ``null`` the
    session's own)."""
    if isinstance(model, BaseModel) and isinstance(data, dict):
        for name, field in type(model).model_fields.items():
            key = field.serialization_alias or field.alias or name
            if key not in data:
                continue
            value = getattr(model, name)
            if value is None and name not in model.model_fields_set:
                del data[key]
            else:
                _prune(value, data[key])
    elif isinstance(model, (list, tuple)) and isinstance(data, list):
        for item, dumped in zip(model, data):
            _prune(item, dumped)
    elif isinstance(model, dict) and isinstance(data, dict):
        for key, item in model.items():
            if key in data:
                _prune(item, data[key])
    return data


def _make(model: Any, **fields: Any) -> Any:
    """A request body from a call's arguments: an argument left ``None``
    is left out, so the service applies its default (passing a model
    instead sends exactly what it holds)."""
    return model(**{k: v for k, v in fields.items() if v is not None})


def _list(items: Optional[Sequence[Any]]) -> Optional[list]:
    return None if items is None else list(items)


def _query(params: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}


def _decode(op: Op, response: httpx.Response) -> Any:
    raise_for_problem(response)
    if op.answer is None:
        return None
    if op.answer is str:
        return response.text
    data = response.json()
    if op.answer is m.JsonObject:
        return data
    return TypeAdapter(op.answer).validate_python(data)


class _Base:
    def __init__(self, send: Any, product: str) -> None:
        self._send = send
        self._product = product

    def _call(
        self,
        name: str,
        json: Any = None,
        params: Optional[Dict[str, Any]] = None,
        **path: str,
    ) -> Any:
        op = OPERATIONS[name]
        url = op.path.format(product_id=self._product, **path)
        return self._send(op, url, _body(json), _query(params or {}))


class Sessions(_Base):
    """The session assistance machine."""

    def post_event(self, session_id: str, event: Union[m.SessionEvent, Dict[str, Any]]) -> m.EventView:
        return self._call("post_event", event, session_id=session_id)

    def get(self, session_id: str) -> m.SessionView:
        return self._call("get_session", session_id=session_id)

    def gate(self, session_id: str) -> m.GateView:
        return self._call("get_gate", session_id=session_id)

    def audit(self, session_id: str, after_seq: Optional[int] = None, limit: Optional[int] = None) -> m.AuditPage:
        return self._call("get_audit", params={"after_seq": after_seq, "limit": limit}, session_id=session_id)

    def get_tours(self) -> m.TourCatalog:
        return self._call("get_tours")

    def put_tours(self, catalog: Union[m.TourCatalog, m.JsonObject]) -> m.TourCatalog:
        return self._call("put_tours", m.TourCatalog.model_validate(catalog))


class Adoption(_Base):
    """User adoption: state, events, activity, the explore-first gate, plans
    and catalogs, and the runners."""

    def get(self, user_id: str) -> m.AdoptionRecord:
        return self._call("get_adoption", user_id=user_id)

    def audit(self, user_id: str, after_seq: Optional[int] = None, limit: Optional[int] = None) -> m.AuditPage:
        """The user's journey transitions, oldest first."""
        return self._call("adoption_audit", params={"after_seq": after_seq, "limit": limit}, user_id=user_id)

    def put(
        self,
        user_id: str,
        state: Union[m.AdoptionSnapshot, m.JsonObject],
        expected_version: Optional[int] = None,
    ) -> m.AdoptionRecord:
        body = _make(m.AdoptionReplace, state=state, expected_version=expected_version)
        return self._call("put_adoption", body, user_id=user_id)

    def delete(self, user_id: str) -> None:
        return self._call("delete_adoption", user_id=user_id)

    def events(
        self,
        user_id: str,
        events: Sequence[Union[m.AdoptionEvent, m.JsonObject]],
        metadata: Optional[m.JsonObject] = None,
    ) -> m.AdoptionRecord:
        body = _make(m.AdoptionEvents, events=list(events), metadata=metadata)
        return self._call("post_adoption_events", body, user_id=user_id)

    def activity(
        self,
        user_id: str,
        actions: Optional[Sequence[Union[m.Activity, m.JsonObject]]] = None,
        discovered_features: Optional[Sequence[str]] = None,
        metadata: Optional[m.JsonObject] = None,
    ) -> m.AdoptionActivityResult:
        body = _make(m.AdoptionActivity,
            actions=_list(actions), discovered_features=_list(discovered_features), metadata=metadata
        )
        return self._call("post_adoption_activity", body, user_id=user_id)

    def gate(
        self,
        user_id: str,
        seconds_on_app: float,
        distinct_features_seen: Optional[int] = None,
        config: Optional[Union[m.ExplorationGateConfig, m.JsonObject]] = None,
    ) -> m.AdoptionGate:
        body = _make(m.AdoptionGateRequest,
            seconds_on_app=seconds_on_app, distinct_features_seen=distinct_features_seen, config=config
        )
        return self._call("post_adoption_gate", body, user_id=user_id)

    def prompt_block(self, user_id: str) -> m.PromptBlock:
        return self._call("get_prompt_block", user_id=user_id)

    def judge(
        self,
        user_id: str,
        activity: Optional[Sequence[Union[m.Activity, m.JsonObject]]] = None,
        signals: Optional[m.JsonObject] = None,
    ) -> m.JudgeRun:
        body = _make(m.JudgeRequest, activity=_list(activity), signals=signals)
        return self._call("post_judge", body, user_id=user_id)

    def welcome(
        self,
        user_id: str,
        seconds_on_app: float,
        distinct_features_seen: Optional[int] = None,
        config: Optional[Union[m.ExplorationGateConfig, m.JsonObject]] = None,
        recent_activity: Optional[Sequence[Union[m.Activity, m.JsonObject]]] = None,
    ) -> m.WelcomeRun:
        body = _make(m.WelcomeRequest,
            seconds_on_app=seconds_on_app,
            distinct_features_seen=distinct_features_seen,
            config=config,
            recent_activity=_list(recent_activity),
        )
        return self._call("post_welcome", body, user_id=user_id)

    def followup(
        self,
        user_id: str,
        workflow_id: str,
        event: str,
        abandoned_at_step: Optional[str] = None,
        recent_activity: Optional[Sequence[Union[m.Activity, m.JsonObject]]] = None,
    ) -> m.FollowupRun:
        body = _make(m.FollowupRequest,
            workflow_id=workflow_id,
            event=event,
            abandoned_at_step=abandoned_at_step,
            recent_activity=_list(recent_activity),
        )
        return self._call("post_followup", body, user_id=user_id)

    def session_summary(
        self, user_id: str, session_id: str, started_at: float, session_number: Optional[int] = None
    ) -> m.SummaryRun:
        body = _make(m.SummaryRequest, session_id=session_id, started_at=started_at, session_number=session_number)
        return self._call("post_session_summary", body, user_id=user_id)

    def match_tours(
        self,
        query: str,
        user_id: Optional[str] = None,
        role: Optional[str] = None,
        current_page: Optional[str] = None,
        history: Optional[Sequence[str]] = None,
    ) -> m.TourMatch:
        body = _make(m.TourMatchRequest,
            query=query, user_id=user_id, role=role, current_page=current_page, history=_list(history)
        )
        return self._call("post_tour_match", body)

    def get_plan(self, role: Optional[str] = None) -> m.OnboardingPlan:
        return self._call("get_plan", params={"role": role})

    def put_plan(
        self, workflows: Sequence[Union[m.OnboardingWorkflow, m.JsonObject]], role: Optional[str] = None
    ) -> m.OnboardingPlanStored:
        return self._call("put_plan", _make(m.OnboardingPlanPut, workflows=list(workflows), role=role))

    def get_catalog(self, role: Optional[str] = None) -> m.RoleTourCatalog:
        return self._call("get_catalog", params={"role": role})

    def put_catalog(
        self, tours: Sequence[Union[m.TourCatalogEntry, m.JsonObject]], role: Optional[str] = None
    ) -> m.TourCatalogStored:
        return self._call("put_catalog", _make(m.TourCatalogPut, tours=list(tours), role=role))


class Conversations(_Base):
    """Conversation instances: replies, follow-ups, pause, hand-off."""

    def create(self, contact_id: str, objective: str, **fields: Any) -> m.ConversationView:
        return self._call("create_conversation", _make(m.ConversationCreate, contact_id=contact_id, objective=objective, **fields))

    def list(
        self,
        contact_id: Optional[str] = None,
        state: Union[str, Sequence[str], None] = None,
        limit: Optional[int] = None,
        order: Optional[str] = None,
        after: Optional[str] = None,
    ) -> m.ConversationList:
        """A page of conversations: ``state`` is one state or several,
        ``order`` ``"oldest"`` (the default) or ``"newest"``; pass a page's
        ``next_cursor`` as ``after`` for the next page."""
        states = state if state is None or isinstance(state, str) else ",".join(state)
        params = {"contact_id": contact_id, "state": states, "limit": limit, "order": order, "after": after}
        return self._call("list_conversations", params=params)

    def get(self, id: str) -> m.ConversationView:
        return self._call("get_conversation", id=id)

    def reply(self, id: str, text: str) -> m.ConversationChange:
        return self._call("reply", m.Text(text=text), id=id)

    def contact_reply(self, contact_id: str, text: str) -> m.ConversationChange:
        return self._call("contact_reply", m.Text(text=text), contact_id=contact_id)

    def pause(self, id: str) -> m.ConversationChange:
        return self._call("pause", id=id)

    def resume(self, id: str) -> m.ConversationChange:
        return self._call("resume", id=id)

    def cancel(self, id: str) -> m.ConversationChange:
        return self._call("cancel", id=id)

    def send(self, id: str, text: str) -> m.ConversationChange:
        return self._call("send", m.Text(text=text), id=id)

    def audit(self, id: str) -> m.ConversationAudit:
        return self._call("conversation_audit", id=id)


class Agent(_Base):
    """Agent turns of the reference support agent, threads and memory."""

    def turn(self, message: str, user_id: str, session_id: str, **fields: Any) -> m.AgentOutput:
        body = _make(m.AgentInput, message=message, user_id=user_id, session_id=session_id, **fields)
        return self._call("turn", body)

    def thread(self, id: str, user_id: Optional[str] = None) -> m.Thread:
        return self._call("get_thread", params={"user_id": user_id}, id=id)

    def resume(self, id: str, value: Any, user_id: Optional[str] = None) -> m.AgentOutput:
        """Answers the question the thread's turn waits on and runs the turn on."""
        return self._call("resume_thread", _make(m.ResumeThread, value=value, user_id=user_id), id=id)

    def end(self, id: str, user_id: Optional[str] = None) -> m.MemoryEntry:
        return self._call("end_thread", _make(m.EndThread, user_id=user_id), id=id)

    def memory(self, owner: str, kind: Optional[str] = None) -> m.MemoryList:
        return self._call("list_memory", params={"kind": kind}, owner=owner)

    def remember(
        self, owner: str, entry: Union[m.SemanticEntry, m.EpisodicEntry, m.JsonObject]
    ) -> m.MemoryEntry:
        return self._call("add_memory", _make(m.AddMemory, entry=entry), owner=owner)

    def forget(self, owner: str, id: str) -> None:
        return self._call("delete_memory", owner=owner, id=id)

    def crisis_log(self, owner: str, after_seq: Optional[int] = None, limit: Optional[int] = None) -> m.CrisisLog:
        return self._call("crisis_log", params={"after_seq": after_seq, "limit": limit}, owner=owner)

    def threads(self, owner: str, limit: Optional[int] = None, cursor: Optional[str] = None) -> m.ThreadList:
        return self._call("list_threads", params={"owner": owner, "limit": limit, "cursor": cursor})

    def history(
        self, id: str, user_id: Optional[str] = None, before: Optional[int] = None, limit: Optional[int] = None
    ) -> m.ThreadHistory:
        return self._call("thread_history", params={"user_id": user_id, "before": before, "limit": limit}, id=id)

    def checkpoint(self, id: str, version: int, user_id: Optional[str] = None) -> m.Thread:
        return self._call("get_checkpoint", params={"user_id": user_id}, id=id, version=str(version))

    def fork(self, id: str, version: int, new_thread_id: str, user_id: Optional[str] = None) -> m.CheckpointMeta:
        body = _make(m.ForkThread, version=version, new_thread_id=new_thread_id, user_id=user_id)
        return self._call("fork_thread", body, id=id)

    def update_state(
        self,
        id: str,
        user_id: Optional[str] = None,
        expected_version: Optional[int] = None,
        objects: Optional[Dict[str, Any]] = None,
        appends: Optional[Dict[str, List[Any]]] = None,
    ) -> m.StateUpdated:
        body = _make(
            m.StateUpdate, user_id=user_id, expected_version=expected_version, objects=objects, appends=appends
        )
        return self._call("update_thread", body, id=id)

    def delete_thread(self, id: str, user_id: Optional[str] = None) -> None:
        return self._call("delete_thread", params={"user_id": user_id}, id=id)

    def erase(self, owner: str) -> m.MemoryErased:
        return self._call("erase_memory", owner=owner)


class Flows(_Base):
    """Flows loaded with ``serve --flows``, on the reference-compatible routes."""

    def start(
        self,
        flow: str,
        seed_data: Optional[str] = None,
        user_info: Optional[Union[m.FlowUser, m.JsonObject]] = None,
    ) -> m.FlowAnswer:
        """A new session for ``user_info`` (kept with the session); the
        initial state's enter hooks and the greeting see ``seed_data``."""
        return self._call("start_session", _make(m.FlowStart, seed_data=seed_data, user_info=user_info), flow=flow)

    def start_ephemeral(
        self,
        flow: str,
        event: str,
        event_input: str = "",
        user_info: Optional[Union[m.FlowUser, m.JsonObject]] = None,
    ) -> m.FlowAnswer:
        """A new session that takes ``event`` at once, in one commit (no
        greeting); a refused event leaves no session."""
        body = _make(m.FlowEphemeralStart, event=event, event_input=event_input, user_info=user_info)
        return self._call("start_ephemeral_session", body, flow=flow)

    def user_sessions(self, flow: str, user: Union[m.FlowUser, m.JsonObject]) -> List[str]:
        """The ids of the flow's sessions started for ``user``'s email,
        newest first (at most 100)."""
        return self._call("user_sessions", m.FlowUser.model_validate(user), flow=flow)

    def event(self, flow: str, session_id: str, event: str, event_input: Any = "") -> m.FlowAnswer:
        body = _make(m.FlowEvent, session_id=session_id, event=event, event_input=event_input)
        return self._call("flow_event", body, flow=flow)

    def task_state(self, flow: str, session_id: str) -> m.TaskState:
        return self._call("task_state", flow=flow, session_id=session_id)

    def audit(
        self, flow: str, session_id: str, after_seq: Optional[int] = None, limit: Optional[int] = None
    ) -> m.AuditPage:
        """The session's transitions, oldest first."""
        params = {"after_seq": after_seq, "limit": limit}
        return self._call("flow_audit", params=params, flow=flow, session_id=session_id)

    def model(self, flow: str, session_id: str, path: Optional[str] = None) -> m.FlowAnswer:
        """The session as a JSON string in ``response``; with ``path`` (a
        JMESPath expression), what it selects from that JSON."""
        return self._call("flow_model", params={"path": path}, flow=flow, session_id=session_id)

    def list(self) -> m.FlowList:
        return self._call("list_flows")


class _Namespaces:
    def _mount(self, send: Any, product: str) -> None:
        self.sessions = Sessions(send, product)
        self.adoption = Adoption(send, product)
        self.conversations = Conversations(send, product)
        self.agent = Agent(send, product)
        self.flows = Flows(send, product)


def _headers(api_key: str) -> Dict[str, str]:
    return {"authorization": f"Bearer {api_key}", "accept": "application/json"}


class Client(_Namespaces):
    """A blocking client: ``Client(url, api_key)``; the product is the key's
    (``default`` for the key ``serve`` prints)."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        api_key: str = "",
        product: str = "default",
        timeout: float = 40.0,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        self._http = httpx.Client(base_url=base_url, headers=_headers(api_key), timeout=timeout, transport=transport)
        self._mount(self._send, product)

    def _send(self, op: Op, url: str, json: Any, params: Dict[str, Any]) -> Any:
        kwargs: Dict[str, Any] = {"params": params}
        if op.request is not None or json is not None:
            kwargs["json"] = json if json is not None else {}
        return _decode(op, self._http.request(op.method, url, **kwargs))

    def healthz(self) -> m.Health:
        return self._send(OPERATIONS["healthz"], "/healthz", None, {})

    def readyz(self) -> m.Readiness:
        return self._send(OPERATIONS["readyz"], "/readyz", None, {})

    def me(self) -> m.Me:
        """The product the client's key opens."""
        return self._send(OPERATIONS["get_me"], "/v1/me", None, {})

    def document(self) -> m.JsonObject:
        """The API document (OpenAPI 3.1)."""
        return self._send(OPERATIONS["document"], "/openapi.json", None, {})

    def metrics(self) -> str:
        """The process's metrics, in the Prometheus text format."""
        return self._send(OPERATIONS["metrics"], "/metrics", None, {})

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncClient(_Namespaces):
    """The asyncio client: the same calls as :class:`Client`, awaited."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        api_key: str = "",
        product: str = "default",
        timeout: float = 40.0,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        self._http = httpx.AsyncClient(base_url=base_url, headers=_headers(api_key), timeout=timeout, transport=transport)
        self._mount(self._send, product)

    async def _send(self, op: Op, url: str, json: Any, params: Dict[str, Any]) -> Any:
        kwargs: Dict[str, Any] = {"params": params}
        if op.request is not None or json is not None:
            kwargs["json"] = json if json is not None else {}
        return _decode(op, await self._http.request(op.method, url, **kwargs))

    async def healthz(self) -> m.Health:
        return await self._send(OPERATIONS["healthz"], "/healthz", None, {})

    async def readyz(self) -> m.Readiness:
        return await self._send(OPERATIONS["readyz"], "/readyz", None, {})

    async def me(self) -> m.Me:
        """The product the client's key opens."""
        return await self._send(OPERATIONS["get_me"], "/v1/me", None, {})

    async def document(self) -> m.JsonObject:
        return await self._send(OPERATIONS["document"], "/openapi.json", None, {})

    async def metrics(self) -> str:
        return await self._send(OPERATIONS["metrics"], "/metrics", None, {})

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
