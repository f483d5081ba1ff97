"""The service's request and answer bodies.

Models whose operation the API document (``GET /openapi.json``) describes
are checked against it field by field (``tests/test_document.py``). Every
model keeps members it does not declare (``extra="allow"``), so a newer
service does not break an older client.
"""

from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

JsonObject = Dict[str, Any]
"""A free-form JSON object, where the document does not fix its members."""


class Model(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


# Probes -----------------------------------------------------------------


class Health(Model):
    status: str


class Readiness(Model):
    status: str
    database: str
    error: Optional[str] = None


# Sessions ---------------------------------------------------------------


class ProactiveGate(Model):
    allowed: bool
    reason: str


class ThinkingSnapshot(Model):
    cooldown_active: bool
    active_cooldown_period_s: Optional[float] = None
    cooldown_started_at: Optional[float] = None


class ProactiveSnapshot(Model):
    user_clicked_option: bool
    time_since_last_interaction_s: float
    last_message_at: float


class ReactiveSnapshot(Model):
    time_since_last_interaction_s: float
    last_message_at: float


class SessionSnapshot(Model):
    v: int = Field(alias="_v")
    product_id: str
    session_id: str
    metadata: JsonObject
    current_state: str
    last_interaction_at: float
    interaction_timeout_s: float
    cooldown_period_s: float
    visual_guidance_active: bool
    conversation_linked: bool
    thinking: ThinkingSnapshot
    proactive: ProactiveSnapshot
    reactive: ReactiveSnapshot
    active_tour_id: Optional[str] = None
    conversation_id: Optional[str] = None


class SessionView(Model):
    version: int
    proactive_gate: ProactiveGate
    snapshot: SessionSnapshot


class StateChange(Model):
    from_: str = Field(alias="from")
    to: str
    cause: str


class SessionOutcome(Model):
    cooldown: str
    ignored: Optional[str] = None
    transition: Optional[StateChange] = None


class EventView(SessionView):
    event: str
    tick: SessionOutcome
    result: SessionOutcome


class GateView(Model):
    allowed: bool
    reason: str
    current_state: Optional[str] = None


class AuditRecord(Model):
    seq: int
    product_id: str
    entity_kind: str
    entity_id: str
    from_: Optional[str] = Field(default=None, alias="from")
    to: str
    cause: str
    at: float
    payload: Any


class AuditPage(Model):
    records: List[AuditRecord]


class ProactiveTrigger(Model):
    type: Literal["proactive_trigger"] = "proactive_trigger"
    trigger_id: str


class OpenChat(Model):
    type: Literal["open_chat"] = "open_chat"


class UserMessage(Model):
    type: Literal["user_message"] = "user_message"


class OptionClick(Model):
    type: Literal["option_click"] = "option_click"


class Reaction(Model):
    type: Literal["reaction"] = "reaction"


class TourStep(Model):
    type: Literal["tour_step"] = "tour_step"


class VisualGuidance(Model):
    type: Literal["visual_guidance"] = "visual_guidance"
    active: bool
    tour_id: Optional[str] = None


class ConversationLinked(Model):
    type: Literal["conversation_linked"] = "conversation_linked"
    event: Any
    conversation_id: str


SessionEvent = Union[
    ProactiveTrigger,
    OpenChat,
    UserMessage,
    OptionClick,
    Reaction,
    TourStep,
    VisualGuidance,
    ConversationLinked,
]
"""One event of the session machine, by its ``type``."""


# User adoption ----------------------------------------------------------


class AdoptionRecord(Model):
    """The adoption snapshot of one user (``state``) and its version."""

    user_id: str
    version: int
    state: JsonObject


class AdoptionEvents(Model):
    events: List[JsonObject]
    metadata: Optional[JsonObject] = None


class AdoptionGateRequest(Model):
    seconds_on_app: float
    distinct_features_seen: Optional[int] = None
    config: Optional[JsonObject] = None


class AdoptionGate(Model):
    passed: bool
    code: str
    reason: str


class PromptBlock(Model):
    prompt_block: str


# Conversations ----------------------------------------------------------


class Todo(Model):
    text: str
    done: bool = False


class ConversationCreate(Model):
    contact_id: str
    objective: str
    todos: Optional[List[Union[str, Todo]]] = None
    channel: Optional[str] = None
    heartbeat_interval_s: Optional[int] = None
    max_follow_ups: Optional[int] = None
    metadata: Optional[JsonObject] = None
    instance_id: Optional[str] = None


class Conversation(Model):
    product_id: str
    instance_id: str
    contact_id: str
    channel: str
    objective: str
    todos: List[Todo]
    state: str
    previous_state: Optional[str] = None
    follow_ups_sent: int
    max_follow_ups: int
    heartbeat_interval_s: int
    heartbeat_due_at: Optional[float] = None
    paused_remaining_s: Optional[float] = None
    pending_contact_reply: bool
    end_reason: Optional[str] = None
    outcome: Optional[str] = None
    human_reason: Optional[str] = None
    outbound_seq: int
    metadata: JsonObject
    created_at: float
    updated_at: float
    ended_at: Optional[float] = None
    version: int


class ConversationView(Model):
    conversation: Conversation
    transcript: List[JsonObject]


class Transition(Model):
    from_: Optional[str] = Field(default=None, alias="from")
    to: str
    cause: str


class ConversationChange(Model):
    conversation: Conversation
    transitions: List[Transition]
    promoted: Optional[JsonObject] = None


class ConversationList(Model):
    items: List[Conversation]


class Text(Model):
    text: str


# Agent turns ------------------------------------------------------------


class AgentInput(Model):
    message: str
    user_id: Optional[str] = None
    session_id: Optional[str] = None
    channel: Optional[Literal["TEST", "WEB", "VOICE"]] = None
    history: Optional[List[JsonObject]] = None
    working_memory: Optional[List[JsonObject]] = None
    installed_skills: Optional[List[Any]] = None


class Crisis(Model):
    level: int
    confidence: float
    reason: str
    needs_crisis_response: bool
    needs_clarification: bool


class AgentOutput(Model):
    response_text: str
    response_type: str
    crisis: Crisis
    response_style: Optional[str] = None
    should_persist_memory: bool = False
    diagnostics: JsonObject = Field(default_factory=dict)


class Thread(Model):
    thread_id: str
    owner: str
    version: int
    transcript: List[JsonObject]
    state: JsonObject


class MemoryEntry(Model):
    id: str
    owner: str
    entry: JsonObject
    at: float


class MemoryList(Model):
    entries: List[JsonObject]


class CrisisLog(Model):
    records: List[JsonObject]


# Flows ------------------------------------------------------------------


class FlowAnswer(Model):
    """The answer to ``start_session`` and to an event."""

    session_id: str
    next_actions: List[str]
    error: Optional[str] = None
    errors: List[Any] = Field(default_factory=list)
    response: Optional[str] = None
    progress: Optional[JsonObject] = None


class FlowEvent(Model):
    session_id: str
    event: str
    event_input: Any = ""


class TaskState(Model):
    session_id: str
    ready: bool
    next_actions: List[str]


class FlowList(Model):
    flows: List[JsonObject]
