//! The PostgreSQL adapters under an axum handler of one's own: no
//! `parlance` service, just a route that feeds session events to the
//! session machine and commits each decision with `PgSessionStore`.
//!
//! The example migrates the database `DATABASE_URL` names, serves the route
//! on `127.0.0.1:0`, sends it events with reqwest and checks what
//! PostgreSQL holds. Without `DATABASE_URL` it says so and exits 0, unless
//! `CI` or `PARLANCE_REQUIRE_POSTGRES` is set: then that is an error. Run
//! with `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run -p
//! parlance-examples --example postgres_axum`.

#![allow(clippy::print_stdout)] // an example prints what it shows

use std::sync::Arc;

use axum::extract::{Json, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use parlance_core::session::{AssistState, TourCatalog};
use parlance_core::session::{SessionCommand, SessionEvent, SessionId, SessionKey, SessionState};
use parlance_core::{ErrorClass, Machine, MachineError, ProductId};
use parlance_ports::{
    Clock, Commit, MachineStore, QueueConfig, SessionStore, Stored, SystemClock, Version,
};
use parlance_postgres::{DatabaseUrl, PgSessionStore, PgTaskQueue, PoolOptions};
use serde_json::{Value, json};

/// What the handler shares.
#[derive(Clone)]
struct App {
    store: Arc<PgSessionStore>,
    product: ProductId,
    clock: Arc<dyn Clock>,
}

/// An error answer: a status and a message.
struct Failure(StatusCode, String);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

fn internal(e: impl std::fmt::Display) -> Failure {
    Failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

/// Decides `command` on the stored session (or creates it) and commits
/// the decision when it changed anything.
async fn decide(
    app: &App,
    key: &SessionKey,
    command: &SessionCommand,
) -> Result<Stored<SessionState>, Failure> {
    let tours = TourCatalog::default();
    let now = app.clock.now();
    let (state, decision, expected) = match app.store.load(key).await.map_err(internal)? {
        Some(stored) => {
            let mut state = stored.state;
            let decision = state.decide(&tours, command, now).map_err(|e| {
                let status = match e.class() {
                    ErrorClass::NotAllowed => StatusCode::CONFLICT,
                    _ => StatusCode::UNPROCESSABLE_ENTITY,
                };
                Failure(status, e.to_string())
            })?;
            if !decision.changed {
                return Ok(Stored {
                    state,
                    version: stored.version,
                });
            }
            (state, decision, Some(stored.version))
        }
        None => SessionState::create(key, &tours, command, now)
            .map_err(internal)?
            .map(|(state, decision)| (state, decision, None))
            .ok_or_else(|| Failure(StatusCode::NOT_FOUND, "no such session".to_owned()))?,
    };
    let committed = app
        .store
        .commit(Commit {
            key,
            expected,
            command,
            state: &state,
            decision: &decision,
            now,
        })
        .await
        .map_err(internal)?;
    Ok(Stored {
        state,
        version: committed.version,
    })
}

/// `POST /sessions/{id}/events`: creates the session on first use, then
/// applies the event; answers the session's state and version.
async fn event(
    State(app): State<App>,
    Path(id): Path<String>,
    Json(event): Json<SessionEvent>,
) -> Result<Json<Value>, Failure> {
    let id = SessionId::parse(id).map_err(|e| Failure(StatusCode::BAD_REQUEST, e.to_string()))?;
    let key = SessionKey::new(app.product.clone(), id);
    if app.store.load(&key).await.map_err(internal)?.is_none() {
        decide(&app, &key, &SessionCommand::Create).await?;
    }
    let stored = decide(&app, &key, &event.into()).await?;
    Ok(Json(json!({
        "state": stored.state.current_state().as_str(),
        "version": stored.version.0,
    })))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Some(url) = std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty()) else {
        let required = ["CI", "PARLANCE_REQUIRE_POSTGRES"]
            .iter()
            .any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()));
        anyhow::ensure!(
            !required,
            "DATABASE_URL is not set: this example needs PostgreSQL"
        );
        println!("skipped: set DATABASE_URL=postgres://user@host:port/db to run this example");
        return Ok(());
    };

    // The adapters: a pool, the migrations, a queue and the session store.
    let pool = parlance_postgres::connect(&DatabaseUrl::new(url), &PoolOptions::default())?;
    parlance_postgres::migrate(&pool).await?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let queue = PgTaskQueue::new(pool.clone(), clock.clone(), QueueConfig::default());
    let store = Arc::new(PgSessionStore::new(pool, queue));
    let app = App {
        store: store.clone(),
        product: ProductId::parse("example")?,
        clock,
    };

    // The user's own axum application, served on a free port.
    let router = axum::Router::new()
        .route("/sessions/{id}/events", post(event))
        .with_state(app.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    println!("serving on http://{addr}");

    // A session id of this run's own, so runs never meet.
    let id = format!(
        "visitor-{}-{}",
        std::process::id(),
        app.clock.now().as_micros()
    );
    let url = format!("http://{addr}/sessions/{id}/events");
    let http = reqwest::Client::new();

    let answer = http
        .post(&url)
        .json(&json!({"type": "open_chat"}))
        .send()
        .await?;
    assert_eq!(answer.status(), reqwest::StatusCode::OK);
    let body: Value = answer.json().await?;
    println!("open_chat -> {body}");
    assert_eq!(body["state"], "reactive_assistance");

    // Opening the chat again is not allowed in reactive_assistance.
    let answer = http
        .post(&url)
        .json(&json!({"type": "open_chat"}))
        .send()
        .await?;
    println!("open_chat again -> {}", answer.status());
    assert_eq!(answer.status(), reqwest::StatusCode::CONFLICT);

    let answer = http
        .post(&url)
        .json(&json!({"type": "user_message"}))
        .send()
        .await?;
    assert_eq!(answer.status(), reqwest::StatusCode::OK);

    // What PostgreSQL holds: created (version 1), the chat opened (version
    // 2), the message moved the session clock (version 3).
    let key = SessionKey::new(app.product.clone(), SessionId::parse(id)?);
    let stored = store.load(&key).await?.expect("the session is stored");
    println!(
        "stored: {} at version {}",
        stored.state.current_state(),
        stored.version
    );
    assert_eq!(stored.state.current_state(), AssistState::Reactive);
    assert_eq!(stored.version, Version(3));
    assert!(store.delete(&key).await?, "the session is deleted");
    Ok(())
}
