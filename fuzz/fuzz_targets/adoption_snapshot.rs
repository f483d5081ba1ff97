//! Adoption snapshots and onboarding plans: decoding any text never panics,
//! and a decoded state's own snapshot decodes again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use parlance_core::Timestamp;
use parlance_core::adoption::{OnboardingPlan, UserAdoptionState};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let now = Timestamp::from_secs(1_767_225_600).expect("a valid time");
    if let Ok(state) = UserAdoptionState::from_snapshot_str(text, now) {
        let written = state.to_snapshot_string();
        UserAdoptionState::from_snapshot_str(&written, now)
            .expect("a snapshot the decoder wrote decodes");
    }
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(text) {
        let _ = OnboardingPlan::from_config(&v);
    }
});
