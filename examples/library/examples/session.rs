//! The session machine alone, driven by a manual clock: an event opens the
//! chat, the interaction timeout passes as the clock moves, and the cooldown
//! that follows holds back a proactive offer until it has run out.
//!
//! No storage, no async: `parlance-core` decides, the caller keeps the state.
//! Run with `cargo run -p parlance-examples --example session`.

#![allow(clippy::print_stdout)] // an example prints what it shows

use parlance_core::session::{
    AssistState, SessionCommand, SessionEvent, SessionReport, SessionState, TourCatalog,
};
use parlance_core::{Machine, ProductId, session::SessionId};
use parlance_ports::{Clock, ManualClock};

fn main() -> anyhow::Result<()> {
    let clock = ManualClock::new();
    let tours = TourCatalog::default();
    let key = parlance_core::session::SessionKey::new(
        ProductId::parse("acme")?,
        SessionId::parse("visitor-1")?,
    );
    let (mut session, _) =
        SessionState::create(&key, &tours, &SessionCommand::Create, clock.now())?
            .expect("`create` makes a session");
    assert_eq!(session.current_state(), AssistState::Thinking);

    // The user opens the chat: thinking -> reactive_assistance.
    let decision = session.decide(&tours, &SessionEvent::OpenChat.into(), clock.now())?;
    assert_eq!(session.current_state(), AssistState::Reactive);
    println!(
        "open_chat: {:?}, next deadline {:?}",
        session.current_state(),
        decision.next_deadline
    );

    // Quiet for longer than the interaction timeout (20 s by default): the
    // next command's tick times the session out and starts a cooldown.
    clock.advance_secs(session.interaction_timeout_s() + 1.0);
    let decision = session.decide(&tours, &SessionCommand::Tick, clock.now())?;
    let report = SessionReport::of(&decision);
    assert_eq!(session.current_state(), AssistState::Thinking);
    assert!(report.tick.changed_state() && session.thinking().cooldown_active);
    println!(
        "tick after {} s: {:?}, cooldown started",
        session.interaction_timeout_s() + 1.0,
        session.current_state()
    );

    // During the cooldown a proactive trigger is ignored...
    let offer = SessionCommand::from(SessionEvent::ProactiveTrigger {
        trigger_id: "pricing-page".to_owned(),
    });
    let decision = session.decide(&tours, &offer, clock.now())?;
    assert_eq!(
        SessionReport::of(&decision).result.ignored,
        Some("v2_cooldown_active")
    );
    println!("proactive trigger during the cooldown: ignored");

    // ...and once the cooldown period (60 s by default) has passed, it offers help.
    clock.advance_secs(session.cooldown_period_s());
    session.decide(&tours, &offer, clock.now())?;
    assert_eq!(session.current_state(), AssistState::Proactive);
    println!(
        "proactive trigger after the cooldown: {:?}",
        session.current_state()
    );
    Ok(())
}
