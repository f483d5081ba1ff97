//! The eleven states of a conversation instance, their wire values and the
//! transition table.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::table::{Edge, TransitionTable};

/// Where a conversation instance is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum ConversationState {
    /// Created; the agent has not yet sent its first message.
    Created,
    /// The agent is processing the conversation.
    Active,
    /// A message went to the contact; the heartbeat timer may be armed.
    WaitingForReply,
    /// The contact replied; an agent turn is queued.
    WaitingForAgent,
    /// The heartbeat fired; the agent is composing a follow-up.
    HeartbeatScheduled,
    /// Suspended by the operator; the previous state is recorded.
    Paused,
    /// Waiting for another instance on the same contact to finish.
    Queued,
    /// The agent asked for a human.
    NeedsHumanIntervention,
    /// Finished successfully (terminal).
    Completed,
    /// The contact did not answer after the last follow-up (terminal).
    Abandoned,
    /// An unrecoverable error or a cancellation (terminal).
    Failed,
}

impl ConversationState {
    /// Every state, in the order of the seed's table.
    pub const ALL: [ConversationState; 11] = [
        Self::Created,
        Self::Active,
        Self::WaitingForReply,
        Self::WaitingForAgent,
        Self::HeartbeatScheduled,
        Self::Paused,
        Self::Queued,
        Self::NeedsHumanIntervention,
        Self::Completed,
        Self::Abandoned,
        Self::Failed,
    ];

    /// The wire value, e.g. `WAITING_FOR_REPLY`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Created => "CREATED",
            Self::Active => "ACTIVE",
            Self::WaitingForReply => "WAITING_FOR_REPLY",
            Self::WaitingForAgent => "WAITING_FOR_AGENT",
            Self::HeartbeatScheduled => "HEARTBEAT_SCHEDULED",
            Self::Paused => "PAUSED",
            Self::Queued => "QUEUED",
            Self::NeedsHumanIntervention => "NEEDS_HUMAN_INTERVENTION",
            Self::Completed => "COMPLETED",
            Self::Abandoned => "ABANDONED",
            Self::Failed => "FAILED",
        }
    }

    /// Parses a wire value.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// `COMPLETED`, `ABANDONED` and `FAILED`: no command leaves them.
    pub const fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Abandoned | Self::Failed)
    }
}

impl fmt::Display for ConversationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

const fn e(from: &'static str, to: &'static str, cause: &'static str) -> Edge {
    Edge { from, to, cause }
}

/// The pseudo-state creation starts from.
pub const CREATION: &str = "[*]";

/// Every allowed transition and the command that causes it. Creation edges
/// start at [`CREATION`].
pub const TABLE: TransitionTable = TransitionTable {
    machine: "conversation",
    states: &[
        "CREATED",
        "ACTIVE",
        "WAITING_FOR_REPLY",
        "WAITING_FOR_AGENT",
        "HEARTBEAT_SCHEDULED",
        "PAUSED",
        "QUEUED",
        "NEEDS_HUMAN_INTERVENTION",
        "COMPLETED",
        "ABANDONED",
        "FAILED",
    ],
    terminal: &["COMPLETED", "ABANDONED", "FAILED"],
    edges: &[
        e(CREATION, "CREATED", "create"),
        e(CREATION, "QUEUED", "create"),
        e("QUEUED", "CREATED", "promote"),
        e("CREATED", "ACTIVE", "begin_agent_turn"),
        e("WAITING_FOR_AGENT", "ACTIVE", "begin_agent_turn"),
        e("ACTIVE", "WAITING_FOR_REPLY", "agent_send"),
        e("WAITING_FOR_REPLY", "HEARTBEAT_SCHEDULED", "timer_fired"),
        e("HEARTBEAT_SCHEDULED", "ABANDONED", "timer_fired"),
        e("HEARTBEAT_SCHEDULED", "WAITING_FOR_REPLY", "send_follow_up"),
        e("WAITING_FOR_REPLY", "WAITING_FOR_AGENT", "contact_reply"),
        e("HEARTBEAT_SCHEDULED", "WAITING_FOR_AGENT", "contact_reply"),
        e("ACTIVE", "COMPLETED", "end_conversation"),
        e("ACTIVE", "NEEDS_HUMAN_INTERVENTION", "request_human"),
        e("NEEDS_HUMAN_INTERVENTION", "ACTIVE", "resume"),
        e("NEEDS_HUMAN_INTERVENTION", "ACTIVE", "operator_send"),
        e("HEARTBEAT_SCHEDULED", "WAITING_FOR_REPLY", "operator_send"),
        e("CREATED", "PAUSED", "pause"),
        e("ACTIVE", "PAUSED", "pause"),
        e("WAITING_FOR_REPLY", "PAUSED", "pause"),
        e("WAITING_FOR_AGENT", "PAUSED", "pause"),
        e("HEARTBEAT_SCHEDULED", "PAUSED", "pause"),
        e("QUEUED", "PAUSED", "pause"),
        e("NEEDS_HUMAN_INTERVENTION", "PAUSED", "pause"),
        e("PAUSED", "CREATED", "resume"),
        e("PAUSED", "ACTIVE", "resume"),
        e("PAUSED", "WAITING_FOR_REPLY", "resume"),
        e("PAUSED", "WAITING_FOR_AGENT", "resume"),
        e("PAUSED", "HEARTBEAT_SCHEDULED", "resume"),
        e("PAUSED", "QUEUED", "resume"),
        e("PAUSED", "NEEDS_HUMAN_INTERVENTION", "resume"),
        e("CREATED", "FAILED", "cancel"),
        e("ACTIVE", "FAILED", "cancel"),
        e("WAITING_FOR_REPLY", "FAILED", "cancel"),
        e("WAITING_FOR_AGENT", "FAILED", "cancel"),
        e("HEARTBEAT_SCHEDULED", "FAILED", "cancel"),
        e("PAUSED", "FAILED", "cancel"),
        e("QUEUED", "FAILED", "cancel"),
        e("NEEDS_HUMAN_INTERVENTION", "FAILED", "cancel"),
        e("CREATED", "FAILED", "fail"),
        e("ACTIVE", "FAILED", "fail"),
        e("WAITING_FOR_REPLY", "FAILED", "fail"),
        e("WAITING_FOR_AGENT", "FAILED", "fail"),
        e("HEARTBEAT_SCHEDULED", "FAILED", "fail"),
        e("PAUSED", "FAILED", "fail"),
        e("QUEUED", "FAILED", "fail"),
        e("NEEDS_HUMAN_INTERVENTION", "FAILED", "fail"),
    ],
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_values_round_trip() {
        for s in ConversationState::ALL {
            assert_eq!(ConversationState::parse(s.as_str()), Some(s));
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(json, format!("\"{}\"", s.as_str()));
            assert!(TABLE.states.contains(&s.as_str()));
        }
        assert_eq!(ConversationState::parse("created"), None);
    }

    #[test]
    fn terminal_states_have_no_outgoing_edges() {
        for t in TABLE.terminal {
            assert!(TABLE.edges.iter().all(|e| e.from != *t), "{t} has an exit");
        }
    }
}
