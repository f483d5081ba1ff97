//! A custom turn state declared with `turn_state!`, run through a
//! three-stage graph (`normalize` -> `count` -> `reply`) and kept by the
//! in-memory checkpointer: two turns on one thread, then the thread read
//! back from the store.
//!
//! Each turn loads the thread, begins the turn on it, runs the graph's
//! steps (applying each stage's delta), finishes the turn and commits only
//! what the reducer fields gained on the version the turn began on.
//! Run with `cargo run -p parlance-examples --example turn_graph`.

#![allow(clippy::print_stdout)] // an example prints what it shows

use std::sync::Arc;

use parlance_core::turn::{
    Checkpoint, END, Graph, OwnerId, ThreadId, ThreadKey, TurnCommand, TurnKey, TurnState,
    TurnView, begin_turn, finish_turn,
};
use parlance_core::{Machine, ProductId, Timestamp, turn_state};
use parlance_memory::{MemoryAuditLog, MemoryCheckpointStore};
use parlance_ports::{Commit, MachineStore, Version};

turn_state! {
    /// A note-taking assistant's turn.
    pub struct Notes {
        input NotesInput {
            /// The user's message.
            message: String, by ["caller"];
        }
        loaded NotesLoaded {}
        reducer {
            /// Every message of the thread, the user's and the replies.
            history: Vec<String> => append, by ["begin_turn", "reply"];
            /// Words the user has written so far.
            words: u64 => last, by ["count"];
        }
        turn_scoped {
            /// The message, trimmed and lower-cased.
            normalized: String => last, by ["normalize"];
            /// This turn's reply.
            reply: String => last, by ["reply"];
        }
        delta NotesDelta;
    }
}

impl TurnView for Notes {
    type Output = String;

    /// The user's message joins the history when the turn begins.
    fn opening(&self) -> NotesDelta {
        NotesDelta {
            history: vec![format!("user: {}", self.message)],
            ..NotesDelta::default()
        }
    }

    fn output(&self) -> String {
        self.reply.clone()
    }
}

/// One stage: reads the state, returns what it writes.
fn stage(name: &str, s: &Notes) -> NotesDelta {
    match name {
        "normalize" => NotesDelta {
            normalized: Some(s.message.trim().to_lowercase()),
            ..NotesDelta::default()
        },
        "count" => NotesDelta {
            words: Some(s.words + s.normalized.split_whitespace().count() as u64),
            ..NotesDelta::default()
        },
        "reply" => {
            let reply = format!("noted \"{}\" ({} words so far)", s.normalized, s.words);
            NotesDelta {
                history: vec![format!("assistant: {reply}")],
                reply: Some(reply),
                ..NotesDelta::default()
            }
        }
        other => unreachable!("no stage {other}"),
    }
}

/// Runs one turn of `message` on `thread` and commits it.
async fn turn(
    store: &MemoryCheckpointStore,
    graph: &Graph<Notes>,
    thread: &ThreadKey,
    message: &str,
    now: Timestamp,
) -> anyhow::Result<String> {
    let key = TurnKey::new(thread.clone(), Notes::load_window());
    let checkpoint = store.load(&key).await?.map(|s| s.state).unwrap_or_default();
    let base = checkpoint.version;
    let input = NotesInput {
        message: message.to_owned(),
    };
    let mut state: Notes = begin_turn(&checkpoint, input, NotesLoaded::default())?;
    let mut run = graph.start();
    while let Some(step) = run.current() {
        let writes = step.stages.iter().map(|&n| (n, stage(n, &state))).collect();
        state.apply(writes)?;
        run.advance(&state)?;
    }
    let (reply, delta) = finish_turn(state)?;

    // The thread machine decides the commit; the store writes its delta.
    let command = TurnCommand::commit(base, delta);
    let (thread_state, decision) = if base == 0 {
        Checkpoint::create(&key, &(), &command, now)?.expect("a first turn creates the thread")
    } else {
        let mut t = checkpoint;
        let decision = t.decide(&(), &command, now)?;
        (t, decision)
    };
    let committed = store
        .commit(Commit {
            key: &key,
            expected: (base > 0).then_some(Version(base)),
            command: &command,
            state: &thread_state,
            decision: &decision,
            now,
        })
        .await?;
    assert_eq!(committed.version, Version(base + 1));
    Ok(reply)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let store = MemoryCheckpointStore::new(Arc::new(MemoryAuditLog::new()));
    let graph = Graph::<Notes>::builder("notes")
        .stage("normalize")
        .stage("count")
        .stage("reply")
        .edge("normalize", "count")
        .edge("count", "reply")
        .edge("reply", END)
        .build()?;
    let thread = ThreadKey {
        product_id: ProductId::parse("acme")?,
        owner: OwnerId::parse("user-1")?,
        thread: ThreadId::parse("notes")?,
    };
    let now = Timestamp::from_secs(1_767_225_600).expect("in range");

    let first = turn(&store, &graph, &thread, "  Buy Milk ", now).await?;
    println!("turn 1: {first}");
    assert_eq!(first, "noted \"buy milk\" (2 words so far)");
    let second = turn(
        &store,
        &graph,
        &thread,
        "Call the plumber",
        now.plus_seconds(5.0),
    )
    .await?;
    println!("turn 2: {second}");
    assert_eq!(second, "noted \"call the plumber\" (5 words so far)");

    // Read the thread back: the persisted fields only, at version 2.
    let stored = store
        .load(&TurnKey::whole(thread.clone()))
        .await?
        .expect("the thread exists");
    let back = Notes::restore(&stored.state, NotesInput::default(), NotesLoaded::default())?;
    println!(
        "stored at version {}: {:?}, {} words",
        stored.version, back.history, back.words
    );
    assert_eq!(stored.version, Version(2));
    assert_eq!(back.history.len(), 4);
    assert_eq!(back.history[3], format!("assistant: {second}"));
    assert_eq!(back.words, 5);
    assert!(back.reply.is_empty(), "turn-scoped fields are never stored");
    Ok(())
}
