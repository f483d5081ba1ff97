//! The explore-first hard gate: a pure floor that keeps a user from being
//! interrupted too early. Timing above the floor is the LLM's call.

use serde::{Deserialize, Serialize};

use crate::Timestamp;

use super::model::UserAdoptionState;

/// Gate thresholds (per product).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExplorationGateConfig {
    /// Roles admitted (compared trimmed and lowercased); empty admits everyone.
    pub role_allowlist: Vec<String>,
    /// Seconds on the app before a welcome.
    pub min_seconds_on_app: f64,
    /// Distinct features seen before a welcome.
    pub min_distinct_features: u64,
    /// Seconds between two welcomes.
    pub welcome_cooldown_s: f64,
    /// Proactive messages allowed per user.
    pub max_proactive_support: u64,
}

impl Default for ExplorationGateConfig {
    fn default() -> Self {
        Self {
            role_allowlist: Vec::new(),
            min_seconds_on_app: 60.0,
            min_distinct_features: 3,
            welcome_cooldown_s: 600.0,
            max_proactive_support: 3,
        }
    }
}

/// Why the gate decided as it did. The codes are a closed set; the role is
/// carried as data, not as part of the code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "code", rename_all = "snake_case")]
#[non_exhaustive]
pub enum GateReason {
    /// The journey is onboarded or onboarding was stamped complete.
    AlreadyOnboarded,
    /// The role is not on the allowlist.
    RoleNotAllowed {
        /// The trimmed role (on one line), `unknown` when empty.
        role: String,
    },
    /// The proactive message cap is reached.
    NudgeCapReached,
    /// The last welcome is too recent (or in the future).
    WithinCooldown,
    /// Not enough time on the app yet.
    ExploringMinTimeNotMet,
    /// Not enough distinct features seen yet.
    ExploringMinFeaturesNotMet,
    /// Passed.
    Ok,
}

impl GateReason {
    /// The stable code (no user data).
    pub fn code(&self) -> &'static str {
        match self {
            GateReason::AlreadyOnboarded => "already_onboarded",
            GateReason::RoleNotAllowed { .. } => "role_not_allowed",
            GateReason::NudgeCapReached => "nudge_cap_reached",
            GateReason::WithinCooldown => "within_cooldown",
            GateReason::ExploringMinTimeNotMet => "exploring_min_time_not_met",
            GateReason::ExploringMinFeaturesNotMet => "exploring_min_features_not_met",
            GateReason::Ok => "ok",
        }
    }
}

impl std::fmt::Display for GateReason {
    /// The reference's reason string (`role_not_allowed:<role>` for a role).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GateReason::RoleNotAllowed { role } => write!(f, "role_not_allowed:{role}"),
            other => f.write_str(other.code()),
        }
    }
}

/// The gate's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GateDecision {
    /// True when control may pass to the LLM.
    pub passed: bool,
    /// Why.
    pub reason: GateReason,
}

/// The explore-first gate. First failing check wins, in the reference's
/// order: onboarded, role, nudge cap, cooldown, time on app, features.
pub fn evaluate_hard_gate(
    state: &UserAdoptionState,
    now: Timestamp,
    seconds_on_app: f64,
    distinct_features_seen: u64,
    cfg: &ExplorationGateConfig,
) -> GateDecision {
    let fail = |reason| GateDecision {
        passed: false,
        reason,
    };
    if state.is_onboarded() {
        return fail(GateReason::AlreadyOnboarded);
    }
    if !cfg.role_allowlist.is_empty() {
        let role = state.role().unwrap_or("").trim();
        let wanted = role.to_lowercase();
        if !cfg
            .role_allowlist
            .iter()
            .any(|r| r.trim().to_lowercase() == wanted)
        {
            let shown = if role.is_empty() {
                "unknown".to_owned()
            } else {
                super::model::one_line(role)
            };
            return fail(GateReason::RoleNotAllowed { role: shown });
        }
    }
    if state.onboarding.proactive_support_count >= cfg.max_proactive_support {
        return fail(GateReason::NudgeCapReached);
    }
    if let Some(last) = state.onboarding.last_welcome_at
        && now.seconds_since(last) < cfg.welcome_cooldown_s
    {
        return fail(GateReason::WithinCooldown);
    }
    // NaN never passes a minimum.
    if seconds_on_app
        .partial_cmp(&cfg.min_seconds_on_app)
        .is_none()
        || seconds_on_app < cfg.min_seconds_on_app
    {
        return fail(GateReason::ExploringMinTimeNotMet);
    }
    if distinct_features_seen < cfg.min_distinct_features {
        return fail(GateReason::ExploringMinFeaturesNotMet);
    }
    GateDecision {
        passed: true,
        reason: GateReason::Ok,
    }
}
