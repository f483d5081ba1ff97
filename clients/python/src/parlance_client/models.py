"""The service's request and answer bodies.

Every body the API document (``GET /openapi.json``) describes has its model
here, checked against the document member by member
(``tests/test_document.py``); the model names follow the client's calls,
the docstrings name the document's schema where it differs. Every model
keeps members it does not declare (``extra="allow"``), so a newer service
does not break an older client. Members the document closes to a set of
values (states, levels, statuses) are ``str``: the service checks them and
answers a typed :class:`~parlance_client.Invalid` for a value it does not
take, and a value a newer service adds still reads. A union tagged by
``type`` or ``kind`` is read by its tag.
"""

from typing import Annotated, Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

JsonObject = Dict[str, Any]
"""A free-form JSON object, where the document does not fix its members."""


class Model(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


# Probes -----------------------------------------------------------------


class Health(Model):
    status: str


class Me(Model):
    product_id: str


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
    event: str
    """``NEW`` or ``REPLY_EXISTING``."""
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


class TourDefinition(Model):
    id: str
    user_tour_id: Optional[str] = None
    user_tour_name: Optional[str] = None
    interaction_timeout_s: Optional[float] = None
    cooldown_period_s: Optional[float] = None


class TourCatalog(Model):
    """A product's tours (``GET``/``PUT .../tours``)."""

    tours: List[TourDefinition] = Field(default_factory=list)
    default_interaction_timeout_s: Optional[float] = None
    default_cooldown_period_s: Optional[float] = None


# User adoption: the state -------------------------------------------------


class MasterySnapshot(Model):
    rating: int
    level: str
    description: str


class StepProgressSnapshot(Model):
    step_id: str
    status: str
    confidence: float
    evidence: str
    last_evaluated_at: float
    completed_at: Optional[float] = None


class WorkflowProgressSnapshot(Model):
    workflow_id: str
    status: str
    """``not_started``, ``in_progress`` or ``completed``."""
    confidence: float
    evidence: str
    source: str
    last_evaluated_at: float
    steps: Dict[str, StepProgressSnapshot]
    first_detected_at: Optional[float] = None
    completed_at: Optional[float] = None


class StepInSnapshot(Model):
    decided_at: float
    should_step_in: bool
    timing_assessment: str
    reason: str
    suggested_workflow_ids: List[str]


class OnboardingSnapshot(Model):
    welcomed: bool
    exploration_started_at: float
    distinct_features_seen: int
    explore_gate_passed: bool
    workflow_progress: Dict[str, WorkflowProgressSnapshot]
    proactive_support_count: int
    completion_rate: float
    last_welcome_at: Optional[float] = None
    last_reasoned_at: Optional[float] = None
    onboarding_completed_at: Optional[float] = None
    last_step_in: Optional[StepInSnapshot] = None
    summary: Optional[str] = None


class SessionIndexSnapshot(Model):
    session_id: str
    session_number: int
    started_at: float
    captured_at: float


class SessionsSnapshot(Model):
    count: int
    index: List[SessionIndexSnapshot]
    current_session_id: Optional[str] = None


class AdoptionSnapshot(Model):
    """A user's adoption state (``_v: 1``); ``PUT .../adoption`` takes it."""

    v: int = Field(alias="_v")
    user_id: str
    metadata: JsonObject
    journey_state: str
    """``onboarding`` or ``onboarded``."""
    mastery: MasterySnapshot
    discovered_features: List[str]
    onboarding: OnboardingSnapshot
    first_seen_at: float
    last_updated_at: float
    sessions: SessionsSnapshot
    last_judged_at: Optional[float] = None


class AdoptionRecord(Model):
    """The adoption snapshot of one user (``state``) and its version."""

    user_id: str
    version: int
    state: AdoptionSnapshot


class AdoptionReplace(Model):
    """``PUT .../adoption``: the whole state; ``expected_version`` absent to create."""

    state: AdoptionSnapshot
    expected_version: Optional[int] = None


# User adoption: events and activity ----------------------------------------


class SetJourneyState(Model):
    kind: Literal["set_journey_state"] = "set_journey_state"
    state: str


class SetMastery(Model):
    kind: Literal["set_mastery"] = "set_mastery"
    rating: float
    level: str
    description: Optional[str] = None


class RecordDiscoveredFeatures(Model):
    kind: Literal["record_discovered_features"] = "record_discovered_features"
    features: List[str]


class UpsertWorkflowProgress(Model):
    kind: Literal["upsert_workflow_progress"] = "upsert_workflow_progress"
    workflow_id: str
    status: str
    confidence: float
    evidence: Optional[str] = None
    source: Optional[str] = None


class UpsertStepProgress(Model):
    kind: Literal["upsert_step_progress"] = "upsert_step_progress"
    workflow_id: str
    step_id: str
    status: str
    confidence: float
    evidence: Optional[str] = None


class MarkWelcomed(Model):
    kind: Literal["mark_welcomed"] = "mark_welcomed"


class MarkJudged(Model):
    kind: Literal["mark_judged"] = "mark_judged"


class MarkOnboardingComplete(Model):
    kind: Literal["mark_onboarding_complete"] = "mark_onboarding_complete"


class SetCurrentSession(Model):
    kind: Literal["set_current_session"] = "set_current_session"
    session_id: str


class RecordSession(Model):
    kind: Literal["record_session"] = "record_session"
    session_id: str
    session_number: int
    started_at: float


class SetMetadata(Model):
    kind: Literal["set_metadata"] = "set_metadata"
    metadata: JsonObject


AdoptionEvent = Annotated[
    Union[
        SetJourneyState,
        SetMastery,
        RecordDiscoveredFeatures,
        UpsertWorkflowProgress,
        UpsertStepProgress,
        MarkWelcomed,
        MarkJudged,
        MarkOnboardingComplete,
        SetCurrentSession,
        RecordSession,
        SetMetadata,
    ],
    Field(discriminator="kind"),
]
"""One change to a user's adoption state, by its ``kind``."""


class AdoptionEvents(Model):
    events: List[AdoptionEvent]
    metadata: Optional[JsonObject] = None


class Activity(Model):
    """One observed user action; absent members never match a rule."""

    type: Optional[str] = None
    event_type: Optional[str] = None
    canonical_url: Optional[str] = None
    title: Optional[str] = None


class AdoptionActivity(Model):
    actions: Optional[List[Activity]] = None
    discovered_features: Optional[List[str]] = None
    metadata: Optional[JsonObject] = None


class DetectedItem(Model):
    workflow_id: str
    evidence: str
    step_id: Optional[str] = None


class Detected(Model):
    workflows: List[DetectedItem]
    steps: List[DetectedItem]
    onboarding_completed: bool


class AdoptionActivityResult(AdoptionRecord):
    """The record after an activity batch, and what the batch completed."""

    detected: Optional[Detected] = None


class ExplorationGateConfig(Model):
    min_seconds_on_app: Optional[float] = None
    min_distinct_features: Optional[int] = None
    max_proactive_support: Optional[int] = None
    welcome_cooldown_s: Optional[float] = None
    role_allowlist: Optional[List[str]] = None


class AdoptionGateRequest(Model):
    seconds_on_app: float
    distinct_features_seen: Optional[int] = None
    config: Optional[ExplorationGateConfig] = None


class AdoptionGate(Model):
    passed: bool
    code: str
    reason: str


class PromptBlock(Model):
    prompt_block: str


# User adoption: the runners ------------------------------------------------


class SuggestedFlow(Model):
    tour_id: str
    flow_name: str
    short_description: str


class SendWelcome(Model):
    kind: Literal["send_welcome"] = "send_welcome"
    message: str
    suggested_flows: List[SuggestedFlow]


class SendFollowup(Model):
    kind: Literal["send_followup"] = "send_followup"
    message: str
    suggested_flows: List[SuggestedFlow]


class DetectedEffect(Detected):
    kind: Literal["detected"] = "detected"


AdoptionEffect = Annotated[Union[SendWelcome, SendFollowup, DetectedEffect], Field(discriminator="kind")]
"""What the caller must deliver after a runner, by its ``kind``."""


class AdoptionLlmCall(Model):
    prompt: str
    version: str
    model: str
    parse_status: str
    schema_violations: List[str]


class JourneyChange(Model):
    from_: Optional[str] = Field(default=None, alias="from")
    to: str
    cause: str


class JudgedMastery(Model):
    rating: int
    level: str


class JudgeOutput(Model):
    status: str
    mastery_description: str
    reasoning: str
    journey_state: Optional[str] = None
    mastery: Optional[JudgedMastery] = None


class WorkflowCompletion(Model):
    workflow_id: str
    status: str
    confidence: float
    evidence: str


class WelcomeOutput(Model):
    status: str
    should_send: bool
    timing_assessment: str
    reasoning: str
    workflow_completion: List[WorkflowCompletion]
    onboarding_complete: bool
    message: str
    suggested_flows: List[SuggestedFlow]


class FollowupOutput(Model):
    status: str
    acknowledgement: str
    why_it_mattered: str
    suggested_flows: List[SuggestedFlow]
    onboarding_complete: bool
    reasoning: str


class SessionSummarySnapshot(Model):
    v: int = Field(alias="_v")
    frozen: bool = Field(alias="_frozen")
    session_id: str
    session_number: int
    user_id: str
    started_at: float
    captured_at: float
    duration_s: float
    journey_state: str
    mastery: MasterySnapshot
    proactive_support_count: int
    distinct_features_seen: int
    discovered_features: List[str]
    reached_onboarding_complete: bool
    completion_rate: float
    completion_rate_denominator: str
    total_catalog_workflows: int
    completed_workflow_ids: List[str]
    in_progress_workflow_ids: List[str]
    untouched_workflow_ids: List[str]
    workflow_progress: Dict[str, WorkflowProgressSnapshot]


class SummaryAnswer(Model):
    status: str
    text: str
    snapshot: SessionSummarySnapshot


class RunView(AdoptionRecord):
    """A runner's report with the record after it. ``answer`` is the parsed
    answer as the service sent it (null when the model was not asked);
    :attr:`output` reads it as the runner's model."""

    applied: bool
    transitions: List[JourneyChange]
    effects: List[AdoptionEffect]
    answer: Optional[JsonObject] = None
    gate: Optional[AdoptionGate] = None
    llm: Optional[AdoptionLlmCall] = None


class JudgeRun(RunView):
    @property
    def output(self) -> Optional[JudgeOutput]:
        return None if self.answer is None else JudgeOutput.model_validate(self.answer)


class WelcomeRun(RunView):
    @property
    def output(self) -> Optional[WelcomeOutput]:
        return None if self.answer is None else WelcomeOutput.model_validate(self.answer)


class FollowupRun(RunView):
    @property
    def output(self) -> Optional[FollowupOutput]:
        return None if self.answer is None else FollowupOutput.model_validate(self.answer)


class SummaryRun(RunView):
    @property
    def output(self) -> Optional[SummaryAnswer]:
        return None if self.answer is None else SummaryAnswer.model_validate(self.answer)


class JudgeRequest(Model):
    activity: Optional[List[Activity]] = None
    signals: Optional[JsonObject] = None


class WelcomeRequest(Model):
    seconds_on_app: float
    distinct_features_seen: Optional[int] = None
    config: Optional[ExplorationGateConfig] = None
    recent_activity: Optional[List[Activity]] = None


class FollowupRequest(Model):
    workflow_id: str
    event: str
    """``completed`` or ``abandoned``."""
    abandoned_at_step: Optional[str] = None
    recent_activity: Optional[List[Activity]] = None


class SummaryRequest(Model):
    session_id: str
    started_at: float
    session_number: Optional[int] = None


# User adoption: plans, catalogs, tour matching ------------------------------


class ActivitySignalRule(Model):
    min_count: Optional[int] = None
    type: Optional[str] = None
    event_type: Optional[str] = None
    title_contains: Optional[str] = None
    canonical_url_prefix: Optional[str] = None
    canonical_url_glob: Optional[str] = None


class ActivitySignals(Model):
    any_of: List[ActivitySignalRule]
    completion_threshold: Optional[int] = None


class WorkflowStep(Model):
    step_id: str
    name: str
    description: Optional[str] = None
    required: Optional[bool] = None
    activity_signals: Optional[ActivitySignals] = None


class OnboardingWorkflow(Model):
    workflow_id: str
    name: str
    description: Optional[str] = None
    why: Optional[str] = None
    role: Optional[str] = None
    prerequisite_workflow_ids: Optional[List[str]] = None
    steps: Optional[List[WorkflowStep]] = None
    activity_signals: Optional[ActivitySignals] = None


class PlanIssue(Model):
    path: str
    problem: str


class OnboardingPlan(Model):
    """An onboarding plan as stored (``role`` null for the product-wide plan)."""

    workflows: List[OnboardingWorkflow]
    role: Optional[str] = None


class OnboardingPlanPut(Model):
    workflows: List[OnboardingWorkflow]
    role: Optional[str] = None


class OnboardingPlanStored(OnboardingPlan):
    skipped: List[PlanIssue]


class TourCatalogEntry(Model):
    tour_id: str
    name: Optional[str] = None
    use_when: Optional[str] = None
    role: Optional[str] = None


class RoleTourCatalog(Model):
    """A tour catalog as stored (``role`` null for the product-wide catalog)."""

    tours: List[TourCatalogEntry]
    role: Optional[str] = None


class TourCatalogPut(Model):
    tours: List[TourCatalogEntry]
    role: Optional[str] = None


class TourCatalogStored(RoleTourCatalog):
    skipped: List[PlanIssue]


class TourMatchRequest(Model):
    query: str
    user_id: Optional[str] = None
    role: Optional[str] = None
    current_page: Optional[str] = None
    history: Optional[List[str]] = None


class TourMatch(Model):
    """Tour matching's answer, with what the prompt allowed."""

    status: str
    related_tour_ids: List[str]
    reasoning: str
    dropped_ids: List[str]
    allowed_tour_ids: List[str]
    primary_tour_id: Optional[str] = None
    role: Optional[str] = None
    llm: Optional[AdoptionLlmCall] = None


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


class ConversationMessage(Model):
    role: str
    """``agent``, ``contact`` or ``human``."""
    text: str
    at: float
    outbound_seq: Optional[int] = None


class ConversationView(Model):
    conversation: Conversation
    transcript: List[ConversationMessage]


class Transition(Model):
    from_: Optional[str] = Field(default=None, alias="from")
    to: str
    cause: str


class ConversationChange(Model):
    conversation: Conversation
    transitions: List[Transition]
    promoted: Optional[Conversation] = None


class ConversationList(Model):
    items: List[Conversation]
    next_cursor: Optional[str] = None


class ConversationAudit(Model):
    items: List[AuditRecord]


class Text(Model):
    text: str


# Agent turns ------------------------------------------------------------


class SemanticEntry(Model):
    """A fact: ``[category] subject PREDICATE object``."""

    type: Literal["semantic"] = "semantic"
    category: str
    subject: str
    predicate: str
    object: str
    evidence_quote: Optional[str] = None


class EpisodicEntry(Model):
    """A summary of an earlier session."""

    type: Literal["episodic"] = "episodic"
    summary: str
    primary_themes: Optional[List[str]] = None
    approach_used: Optional[str] = None
    approach_context: Optional[str] = None
    is_catch_up: Optional[bool] = None


MemoryContent = Annotated[Union[SemanticEntry, EpisodicEntry], Field(discriminator="type")]
"""What a memory entry says, by its ``type`` (the document's ``MemoryEntry``)."""


class TurnMessage(Model):
    role: str
    """``user`` or ``assistant``."""
    content: str
    response_style: Optional[str] = None


class AgentInput(Model):
    message: str
    user_id: Optional[str] = None
    session_id: Optional[str] = None
    channel: Optional[str] = None
    """``TEST``, ``WEB`` or ``VOICE``."""
    history: Optional[List[TurnMessage]] = None
    working_memory: Optional[List[Union[MemoryContent, str]]] = None
    """Structured entries, or lines kept from older checkpoints."""
    installed_skills: Optional[List[str]] = None


class Crisis(Model):
    level: int
    confidence: float
    reason: str
    needs_crisis_response: bool
    needs_clarification: bool


class AgentOutput(Model):
    response_text: str
    response_type: str
    """``crisis``, ``reply``, ``memory_control`` or ``grounded_answer``."""
    crisis: Crisis
    response_style: Optional[str] = None
    response_style_type: str = "none"
    """``therapeutic``, ``exercise``, ``safety``, ``utility`` or ``none``."""
    response_style_source: str = "none"
    """``exercise``, ``gate``, ``model`` or ``none``."""
    therapeutic_approach: Optional[str] = None
    should_persist_memory: bool = False
    diagnostics: JsonObject = Field(default_factory=dict)
    interrupt: Optional[JsonObject] = None
    """Set when the turn waits for the person's answer: what it asks
    (resume the thread with the answer)."""


class Thread(Model):
    thread_id: str
    owner: str
    version: int
    transcript: List[TurnMessage]
    state: JsonObject
    interrupt: Optional[JsonObject] = None
    """What the turn the thread waits on asks; absent when none waits."""


class ResumeThread(Model):
    """The document's ``AgentResumeRequest``: the answer to the question a
    turn waits on."""

    user_id: Optional[str] = None
    value: Any


class EndThread(Model):
    user_id: Optional[str] = None


class MemoryEntry(Model):
    """A stored memory entry (the document's ``AgentMemoryView``)."""

    id: str
    owner: str
    entry: MemoryContent
    at: float


class AddMemory(Model):
    entry: MemoryContent


class MemoryList(Model):
    entries: List[MemoryEntry]


class CrisisAudit(Model):
    classifier_path: str
    llm_failure_occurred: bool
    override_kind: Optional[str] = None


class CrisisLogRecord(Model):
    seq: int
    product_id: str
    owner: str
    thread: str
    turn: int
    at: float
    assessment: Crisis
    audit: CrisisAudit
    route: str


class CrisisLog(Model):
    records: List[CrisisLogRecord]


class ThreadSummary(Model):
    """One of an owner's threads (the document's ``AgentThreadSummary``)."""

    thread_id: str
    version: int
    updated_at: float
    interrupted: bool


class ThreadList(Model):
    """A page of an owner's threads, newest first (``AgentThreadList``)."""

    threads: List[ThreadSummary]
    next_cursor: Optional[str] = None


class CheckpointParent(Model):
    """The checkpoint another follows (``AgentCheckpointParent``)."""

    owner: str
    thread_id: str
    version: int


class CheckpointMeta(Model):
    """One checkpoint of a thread's history (``AgentCheckpointMeta``)."""

    version: int
    parent: Optional[CheckpointParent] = None
    at: float
    source: str
    interrupted: bool


class ThreadHistory(Model):
    """A page of a thread's history, newest first (``AgentThreadHistory``)."""

    checkpoints: List[CheckpointMeta]
    next_before: Optional[int] = None


class ForkThread(Model):
    """The document's ``AgentForkRequest``."""

    user_id: Optional[str] = None
    version: int
    new_thread_id: str


class StateUpdate(Model):
    """An operator's update of a thread (``AgentStateUpdate``)."""

    user_id: Optional[str] = None
    expected_version: Optional[int] = None
    objects: Optional[JsonObject] = None
    appends: Optional[Dict[str, List[Any]]] = None


class StateUpdated(Model):
    """The thread after an update (``AgentStateUpdated``)."""

    thread_id: str
    version: int


class MemoryErased(Model):
    """What an erasure removed (``AgentMemoryErased``)."""

    entries_deleted: int
    crisis_records_deleted: int


# Flows ------------------------------------------------------------------


class FlowTaskError(Model):
    invocation_id: str
    task: str
    message: str


class FlowProgress(Model):
    total_number_of_subtasks: int
    number_of_subtasks_executed: int
    label: str


class FlowAnswer(Model):
    """The answer to ``start_session``, to an event and to ``model``."""

    session_id: str
    next_actions: List[str]
    error: Optional[str] = None
    errors: List[FlowTaskError] = Field(default_factory=list)
    response: Optional[str] = None
    progress: Optional[FlowProgress] = None


class FlowUser(Model):
    """The user a flow session is started for (the reference's ``User``):
    kept with the session, and what ``user_sessions`` finds it by."""

    email: str
    firstname: str
    lastname: str
    custom_properties: Optional[Dict[str, str]] = None


class FlowStart(Model):
    """The optional body of ``start_session``: the user, and seed data the
    initial state's enter hooks and the greeting see (not kept)."""

    seed_data: Optional[str] = None
    user_info: Optional[FlowUser] = None


class FlowEphemeralStart(Model):
    """The body of ``start_ephemeral_session``: the first event."""

    event: str
    event_input: str = ""
    user_info: Optional[FlowUser] = None


class FlowEvent(Model):
    session_id: str
    event: str
    event_input: str = ""


class TaskState(Model):
    session_id: str
    ready: bool
    next_actions: List[str]


class FlowStateSummary(Model):
    id: str
    kind: str
    """``user`` or ``invoker``."""
    events: List[str]


class FlowTransitionSummary(Model):
    event: str
    from_: str = Field(alias="from")
    to: str


class FlowSummary(Model):
    name: str
    description: str
    states: List[FlowStateSummary]
    transitions: List[FlowTransitionSummary]
    initial: Optional[str] = None


class FlowList(Model):
    flows: List[FlowSummary]
