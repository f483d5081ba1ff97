"""Every operation of the service the client calls: its method, path
template, request body model and answer model.

``tests/test_document.py`` walks the API document and fails when one of
its operations is missing here or its bodies differ from these models.
"""

import re
from typing import Any, Dict, List, NamedTuple, Optional

from . import models as m


class Op(NamedTuple):
    method: str
    path: str
    answer: Any
    """A model class, ``m.JsonObject`` for a free-form object, ``List[str]``
    for an array of text, ``str`` for a text body, ``None`` for no body."""
    request: Any = None
    """The body's model, a union of models, ``m.JsonObject``, or ``None`` for no body."""


P = "/v1/products/{product_id}"

OPERATIONS: Dict[str, Op] = {
    # probes and the document
    "healthz": Op("GET", "/healthz", m.Health),
    "readyz": Op("GET", "/readyz", m.Readiness),
    "document": Op("GET", "/openapi.json", m.JsonObject),
    "metrics": Op("GET", "/metrics", str),
    # the key
    "get_me": Op("GET", "/v1/me", m.Me),
    # sessions
    "get_session": Op("GET", P + "/sessions/{session_id}", m.SessionView),
    "post_event": Op("POST", P + "/sessions/{session_id}/events", m.EventView, m.SessionEvent),
    "get_gate": Op("GET", P + "/sessions/{session_id}/proactive-gate", m.GateView),
    "get_audit": Op("GET", P + "/sessions/{session_id}/audit", m.AuditPage),
    "get_tours": Op("GET", P + "/tours", m.TourCatalog),
    "put_tours": Op("PUT", P + "/tours", m.TourCatalog, m.TourCatalog),
    # user adoption
    "get_adoption": Op("GET", P + "/users/{user_id}/adoption", m.AdoptionRecord),
    "adoption_audit": Op("GET", P + "/users/{user_id}/adoption/audit", m.AuditPage),
    "put_adoption": Op("PUT", P + "/users/{user_id}/adoption", m.AdoptionRecord, m.AdoptionReplace),
    "delete_adoption": Op("DELETE", P + "/users/{user_id}/adoption", None),
    "post_adoption_events": Op(
        "POST", P + "/users/{user_id}/adoption/events", m.AdoptionRecord, m.AdoptionEvents
    ),
    "post_adoption_activity": Op(
        "POST", P + "/users/{user_id}/adoption/activity", m.AdoptionActivityResult, m.AdoptionActivity
    ),
    "post_adoption_gate": Op(
        "POST", P + "/users/{user_id}/adoption/gate", m.AdoptionGate, m.AdoptionGateRequest
    ),
    "get_prompt_block": Op("GET", P + "/users/{user_id}/adoption/prompt-block", m.PromptBlock),
    "post_judge": Op("POST", P + "/users/{user_id}/adoption/judge", m.JudgeRun, m.JudgeRequest),
    "post_welcome": Op("POST", P + "/users/{user_id}/adoption/welcome", m.WelcomeRun, m.WelcomeRequest),
    "post_followup": Op(
        "POST", P + "/users/{user_id}/adoption/followup", m.FollowupRun, m.FollowupRequest
    ),
    "post_session_summary": Op(
        "POST", P + "/users/{user_id}/adoption/session-summary", m.SummaryRun, m.SummaryRequest
    ),
    "post_tour_match": Op("POST", P + "/tours/match", m.TourMatch, m.TourMatchRequest),
    "get_plan": Op("GET", P + "/onboarding-plan", m.OnboardingPlan),
    "put_plan": Op("PUT", P + "/onboarding-plan", m.OnboardingPlanStored, m.OnboardingPlanPut),
    "get_catalog": Op("GET", P + "/tour-catalog", m.RoleTourCatalog),
    "put_catalog": Op("PUT", P + "/tour-catalog", m.TourCatalogStored, m.TourCatalogPut),
    # conversations
    "create_conversation": Op(
        "POST", P + "/conversations", m.ConversationView, m.ConversationCreate
    ),
    "list_conversations": Op("GET", P + "/conversations", m.ConversationList),
    "get_conversation": Op("GET", P + "/conversations/{id}", m.ConversationView),
    "reply": Op("POST", P + "/conversations/{id}/replies", m.ConversationChange, m.Text),
    "contact_reply": Op(
        "POST", P + "/contacts/{contact_id}/replies", m.ConversationChange, m.Text
    ),
    "pause": Op("POST", P + "/conversations/{id}/pause", m.ConversationChange),
    "resume": Op("POST", P + "/conversations/{id}/resume", m.ConversationChange),
    "cancel": Op("POST", P + "/conversations/{id}/cancel", m.ConversationChange),
    "send": Op("POST", P + "/conversations/{id}/send", m.ConversationChange, m.Text),
    "conversation_audit": Op("GET", P + "/conversations/{id}/audit", m.ConversationAudit),
    # agent turns
    "turn": Op("POST", P + "/agent/turns", m.AgentOutput, m.AgentInput),
    "get_thread": Op("GET", P + "/agent/threads/{id}", m.Thread),
    "resume_thread": Op("POST", P + "/agent/threads/{id}/resume", m.AgentOutput, m.ResumeThread),
    "end_thread": Op("POST", P + "/agent/threads/{id}/end", m.MemoryEntry, m.EndThread),
    "list_memory": Op("GET", P + "/agent/memory/{owner}", m.MemoryList),
    "add_memory": Op("POST", P + "/agent/memory/{owner}", m.MemoryEntry, m.AddMemory),
    "delete_memory": Op("DELETE", P + "/agent/memory/{owner}/{id}", None),
    "crisis_log": Op("GET", P + "/agent/crisis-log/{owner}", m.CrisisLog),
    # agent threads: lists, history, time travel, forks, updates, deletion, erasure
    "list_threads": Op("GET", P + "/agent/threads", m.ThreadList),
    "thread_history": Op("GET", P + "/agent/threads/{id}/history", m.ThreadHistory),
    "get_checkpoint": Op("GET", P + "/agent/threads/{id}/checkpoints/{version}", m.Thread),
    "fork_thread": Op("POST", P + "/agent/threads/{id}/fork", m.CheckpointMeta, m.ForkThread),
    "update_thread": Op("POST", P + "/agent/threads/{id}/state", m.StateUpdated, m.StateUpdate),
    "delete_thread": Op("DELETE", P + "/agent/threads/{id}", None),
    "erase_memory": Op("DELETE", P + "/agent/memory/{owner}", m.MemoryErased),
    # flows
    "start_session_get": Op("GET", "/v1/ai/{flow}/start_session", m.FlowAnswer),
    "start_session": Op("POST", "/v1/ai/{flow}/start_session", m.FlowAnswer, m.FlowStart),
    "start_ephemeral_session": Op(
        "POST", "/v1/ai/{flow}/start_ephemeral_session", m.FlowAnswer, m.FlowEphemeralStart
    ),
    "flow_event": Op("POST", "/v1/ai/{flow}/event", m.FlowAnswer, m.FlowEvent),
    "task_state": Op("GET", "/v1/ai/{flow}/task_state/{session_id}", m.TaskState),
    "flow_model": Op("GET", "/v1/ai/{flow}/model/{session_id}", m.FlowAnswer),
    "flow_audit": Op("GET", "/v1/ai/{flow}/audit/{session_id}", m.AuditPage),
    "user_sessions": Op("POST", "/v1/ai/{flow}/user_sessions", List[str], m.FlowUser),
    "list_flows": Op("GET", P + "/flows", m.FlowList),
}


def _shape(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)


def find(method: str, path: str) -> Optional[str]:
    """The name of the operation at ``method path`` (a document's template;
    path parameters match whatever their names)."""
    for name, op in OPERATIONS.items():
        if op.method == method.upper() and _shape(op.path) == _shape(path):
            return name
    return None
