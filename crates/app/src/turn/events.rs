//! What a turn reports while it runs ([`TurnEvent`]), where it goes
//! ([`TurnEvents`]), and how a stage that calls the model streams its tokens
//! ([`complete`]).
//!
//! Events of one turn arrive in order. A turn whose commit is lost to
//! another writer runs again on the new checkpoint: every stage and token
//! event carries the `attempt` it belongs to (1 first), and the events of a
//! later attempt supersede those of an earlier one. `interrupt` and `output`
//! are sent once, after the commit, so they are always the committed turn's.

use futures::StreamExt as _;
use parlance_ports::{
    ChunkAccumulator, CompletionChunk, CompletionRequest, CompletionResponse, LlmClient, LlmResult,
};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::mpsc;

/// Something a turn reports while it runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TurnEvent {
    /// A stage began.
    StageStarted {
        /// The attempt of the turn (1 first; more after a lost commit).
        attempt: u32,
        /// The step it runs in (1 first).
        step: usize,
        /// The stage.
        stage: &'static str,
    },
    /// A stage returned (its delta, an interrupt or an error).
    StageFinished {
        /// The attempt of the turn.
        attempt: u32,
        /// The step it ran in.
        step: usize,
        /// The stage.
        stage: &'static str,
        /// Its wall time in milliseconds.
        millis: f64,
    },
    /// Model text, as it arrives.
    Token {
        /// The attempt of the turn.
        attempt: u32,
        /// The stage that called the model.
        stage: &'static str,
        /// The text.
        text: String,
    },
    /// The turn stopped to wait for a person; committed.
    Interrupt {
        /// What the stage asks.
        payload: Value,
    },
    /// The turn's output; committed. The last event of a turn that
    /// completed or was interrupted.
    Output {
        /// The output view, as JSON.
        output: Value,
    },
    /// The turn failed and committed nothing; the last event.
    Error {
        /// What went wrong, as the API's problem JSON.
        problem: Value,
    },
}

impl TurnEvent {
    /// Its name: `stage_started`, `stage_finished`, `token`, `interrupt`,
    /// `output` or `error`.
    pub fn name(&self) -> &'static str {
        match self {
            TurnEvent::StageStarted { .. } => "stage_started",
            TurnEvent::StageFinished { .. } => "stage_finished",
            TurnEvent::Token { .. } => "token",
            TurnEvent::Interrupt { .. } => "interrupt",
            TurnEvent::Output { .. } => "output",
            TurnEvent::Error { .. } => "error",
        }
    }

    /// What a client reads of it: the output for `output`, the problem for
    /// `error`, the payload for `interrupt`, the event's fields otherwise.
    pub fn data(&self) -> Value {
        match self {
            TurnEvent::Output { output } => output.clone(),
            TurnEvent::Error { problem } => problem.clone(),
            TurnEvent::Interrupt { payload } => payload.clone(),
            other => {
                let mut v = serde_json::to_value(other).unwrap_or(Value::Null);
                if let Some(m) = v.as_object_mut() {
                    m.remove("event");
                }
                v
            }
        }
    }
}

/// Where a turn's events go: an unbounded channel, so a slow reader never
/// holds the turn up. Once the reader is gone, events are dropped and the
/// turn goes on to its commit.
#[derive(Debug, Clone)]
pub struct TurnEvents {
    tx: mpsc::UnboundedSender<TurnEvent>,
}

impl TurnEvents {
    /// A sink and the receiver of its events.
    pub fn channel() -> (Self, mpsc::UnboundedReceiver<TurnEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { tx }, rx)
    }

    /// Sends `event`; nothing happens when nobody reads any more.
    pub fn send(&self, event: TurnEvent) {
        let _ = self.tx.send(event);
    }
}

/// The running stage, for its token events.
#[derive(Debug, Clone)]
pub(super) struct StageScope {
    pub(super) events: TurnEvents,
    pub(super) attempt: u32,
    pub(super) stage: &'static str,
}

tokio::task_local! {
    pub(super) static STAGE: StageScope;
}

/// True when the running stage belongs to a turn that reports events.
pub fn streaming() -> bool {
    STAGE.try_with(|_| ()).is_ok()
}

/// Reports `text` as a token of the running stage, when its turn reports
/// events.
pub fn token(text: &str) {
    let _ = STAGE.try_with(|s| {
        s.events.send(TurnEvent::Token {
            attempt: s.attempt,
            stage: s.stage,
            text: text.to_owned(),
        });
    });
}

/// Asks `llm` for the whole answer to `request`. When the running stage's
/// turn reports events, the answer is streamed ([`LlmClient::stream`]) and
/// each piece of text reported as a token as it arrives; the answer
/// returned is the same either way.
///
/// # Errors
///
/// The model's error; a stream that fails part-way fails the call.
pub async fn complete(
    llm: &dyn LlmClient,
    request: &CompletionRequest,
) -> LlmResult<CompletionResponse> {
    if !streaming() {
        return llm.complete(request).await;
    }
    let mut stream = llm.stream(request).await?;
    let mut answer = ChunkAccumulator::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if let CompletionChunk::Content { text } = &chunk {
            token(text);
        }
        answer.push(chunk);
    }
    Ok(answer.finish())
}
